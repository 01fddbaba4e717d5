//! The mock's model of CUDA graph capture: beginning and ending a capture,
//! streams joining it through captured events and joined back into the
//! origin, work captured instead of queued, the calls a capture refuses (on
//! its streams and events, and the "potentially unsafe" ones, per mode and
//! thread), the graph a capture ends in and its launches, and the memory a
//! graph owns (graph allocations, blocks held for it).
//!
//! The backend calls are the traits' `unsafe fn`s; the mock's are sound for
//! any handle (see `MockBackend`'s safety section), so each `unsafe` block
//! needs no more than that.
#![cfg(not(loom))]

use std::ptr::NonNull;

use gpupool_core::{
    BackendOp, CaptureStatus, Completion, EventBackend, EventHandle, MemoryBackend, MemoryKind,
    StreamBackend, StreamHandle,
};
use gpupool_mock::{
    CallKind, CaptureMode, HarnessCall, HazardKind, MockBackend, MockError, MockGraph,
};

mod common;
use common::{begin, event, hazard_kinds, mock_with_stream, stream, D0, D1};

use CaptureStatus::{Active, Invalidated, NotCapturing};

const MODES: [CaptureMode; 3] = [
    CaptureMode::Global,
    CaptureMode::ThreadLocal,
    CaptureMode::Relaxed,
];

/// `side` joins the capture `origin` is in: an event recorded on `origin`
/// (captured), waited on by `side`.
fn fork(mock: &MockBackend, origin: StreamHandle, side: StreamHandle) -> EventHandle {
    let e = event(mock, D0);
    // SAFETY: live handles of this mock's device 0.
    unsafe {
        mock.record_event(e, origin, D0).unwrap();
        mock.stream_wait_event(side, D0, e).unwrap();
    }
    e
}

/// The capture statuses of `a` and `b`.
fn statuses(
    mock: &MockBackend,
    a: StreamHandle,
    b: StreamHandle,
) -> (CaptureStatus, CaptureStatus) {
    (status(mock, a), status(mock, b))
}

/// A one-device mock with two streams of device 0, `a` and `b`, and a
/// capture begun on `a` in `mode`.
fn capturing_with_a_second_stream(mode: CaptureMode) -> (MockBackend, StreamHandle, StreamHandle) {
    let (mock, a) = mock_with_stream(1);
    let b = stream(&mock, D0);
    begin(&mock, a, mode).unwrap();
    (mock, a, b)
}

/// Joins `side`'s work so far back into `origin`.
fn join(mock: &MockBackend, origin: StreamHandle, side: StreamHandle) {
    fork(mock, side, origin);
}

/// The capture status of `s`, through the backend call (counted).
fn status(mock: &MockBackend, s: StreamHandle) -> CaptureStatus {
    // SAFETY: a live stream of this mock's device 0.
    unsafe { mock.capture_status(s, D0) }.unwrap()
}

fn device_block(mock: &MockBackend, size: usize) -> NonNull<u8> {
    mock.allocate(MemoryKind::Device, D0, size, 64).unwrap()
}

/// Asserts the one misuse logged so far and forgets nothing else.
#[track_caller]
fn assert_misuses(mock: &MockBackend, expected: &[(CallKind, MockError)]) {
    let got: Vec<_> = mock
        .misuses()
        .into_iter()
        .map(|m| (m.call, m.error))
        .collect();
    assert_eq!(got, expected);
}

// ---- begin, end, status ------------------------------------------------------

#[test]
fn captured_work_is_recorded_not_queued() {
    let (mock, s) = mock_with_stream(1);
    mock.enqueue_work(s).unwrap(); // before the capture: queued
    assert_eq!(status(&mock, s), NotCapturing);
    begin(&mock, s, CaptureMode::Global).unwrap();
    assert_eq!(status(&mock, s), Active);
    assert_eq!(mock.open_captures(), 1);
    for _ in 0..3 {
        mock.enqueue_work(s).unwrap();
    }
    assert_eq!(mock.pending_work(s), Ok(1), "captured work is not queued");
    // Work queued before the capture still completes.
    mock.complete_all(s).unwrap();
    assert_eq!(mock.pending_work(s), Ok(0));

    let graph = mock.end_capture(s).unwrap();
    assert_eq!(graph.node_count(), 3);
    assert_eq!(graph.device(), D0);
    assert_eq!(status(&mock, s), NotCapturing);
    assert_eq!(mock.open_captures(), 0);
    assert_eq!(mock.calls(BackendOp::CaptureStatus), 3);
    assert!(mock.misuses().is_empty());
}

#[test]
fn capture_status_is_never_refused_and_breaks_nothing() {
    for mode in MODES {
        let (mock, s) = mock_with_stream(1);
        let other = stream(&mock, D0);
        begin(&mock, s, mode).unwrap();
        for _ in 0..2 {
            assert_eq!(status(&mock, s), Active);
            assert_eq!(status(&mock, other), NotCapturing);
            let from_thread = std::thread::scope(|t| t.spawn(|| status(&mock, s)).join().unwrap());
            assert_eq!(from_thread, Active);
        }
        assert_eq!(mock.capture_status_of(s), Ok(Active));
        mock.end_capture(s).unwrap();
        assert!(mock.misuses().is_empty(), "{mode:?}");
    }
}

#[test]
fn bad_begins_and_ends_are_misuses_with_no_effect() {
    let (mock, s) = mock_with_stream(1);
    // SAFETY: a handle this mock never made, only compared.
    let bogus = unsafe { StreamHandle::from_raw(0x4242) };
    let special = StreamHandle::NULL;
    assert_eq!(
        begin(&mock, bogus, CaptureMode::Global),
        Err(MockError::InvalidStream(bogus))
    );
    assert_eq!(
        begin(&mock, special, CaptureMode::Global),
        Err(MockError::InvalidStream(special))
    );
    assert_eq!(
        mock.end_capture(s).unwrap_err(),
        MockError::NotCaptureOrigin(s)
    );
    begin(&mock, s, CaptureMode::Relaxed).unwrap();
    assert_eq!(
        begin(&mock, s, CaptureMode::Relaxed),
        Err(MockError::AlreadyCapturing(s))
    );
    assert_eq!(status(&mock, s), Active, "a refused begin changes nothing");
    mock.end_capture(s).unwrap();

    let misuses = mock.misuses();
    let harness: Vec<_> = misuses.iter().map(|m| m.harness.unwrap()).collect();
    assert_eq!(
        harness,
        [
            HarnessCall::BeginCapture,
            HarnessCall::BeginCapture,
            HarnessCall::EndCapture,
            HarnessCall::BeginCapture
        ]
    );
    assert!(misuses.iter().all(|m| m.call == CallKind::CaptureStatus));
    // The stream's creation and one status: the harness calls are not counted.
    assert_eq!(mock.total_calls(), 2);
}

// ---- joins -------------------------------------------------------------------

#[test]
fn fork_and_join_back_end_in_one_graph() {
    let (mock, a, b) = capturing_with_a_second_stream(CaptureMode::Global);
    mock.enqueue_work(a).unwrap();
    fork(&mock, a, b);
    assert_eq!(status(&mock, b), Active, "b joined the capture");
    mock.enqueue_work(b).unwrap();
    mock.enqueue_work(b).unwrap();
    assert_eq!(mock.pending_work(b), Ok(0));
    join(&mock, a, b);
    mock.enqueue_work(a).unwrap();

    let graph = mock.end_capture(a).unwrap();
    assert_eq!(graph.node_count(), 4, "records and waits are not items");
    assert_eq!(statuses(&mock, a, b), (NotCapturing, NotCapturing));
    assert!(mock.misuses().is_empty());
}

#[test]
fn a_stream_not_joined_back_fails_the_end() {
    let (mock, a, b) = capturing_with_a_second_stream(CaptureMode::Global);
    fork(&mock, a, b);
    // The join's event is recorded before b's work: it does not cover it.
    let early = event(&mock, D0);
    // SAFETY: live handles of this mock's device 0.
    unsafe { mock.record_event(early, b, D0) }.unwrap();
    mock.enqueue_work(b).unwrap();
    // SAFETY: as above.
    unsafe { mock.stream_wait_event(a, D0, early) }.unwrap();

    assert_eq!(
        mock.end_capture(a).unwrap_err(),
        MockError::CaptureUnjoined(b)
    );
    assert_eq!(statuses(&mock, a, b), (NotCapturing, NotCapturing));
    assert_eq!(mock.open_captures(), 0);
    let misuses = mock.misuses();
    assert_eq!(misuses.len(), 1);
    assert_eq!(misuses[0].harness, Some(HarnessCall::EndCapture));
}

#[test]
fn a_fork_without_work_needs_no_join() {
    let (mock, a, b) = capturing_with_a_second_stream(CaptureMode::Global);
    fork(&mock, a, b);
    assert!(mock.end_capture(a).is_ok());
}

#[test]
fn joins_are_followed_through_other_streams() {
    let (mock, a) = mock_with_stream(1);
    let (b, c) = (stream(&mock, D0), stream(&mock, D0));
    begin(&mock, a, CaptureMode::Global).unwrap();
    fork(&mock, a, b);
    fork(&mock, b, c);
    mock.enqueue_work(c).unwrap();
    mock.enqueue_work(b).unwrap();
    join(&mock, b, c); // c into b
    join(&mock, a, b); // b (and through it c) into a
    let graph = mock.end_capture(a).unwrap();
    assert_eq!(graph.node_count(), 2);
    assert!(mock.misuses().is_empty());
}

#[test]
fn ending_from_a_joined_stream_breaks_the_capture() {
    let (mock, a, b) = capturing_with_a_second_stream(CaptureMode::Relaxed);
    fork(&mock, a, b);
    assert_eq!(
        mock.end_capture(b).unwrap_err(),
        MockError::NotCaptureOrigin(b)
    );
    assert_eq!(statuses(&mock, a, b), (Invalidated, Invalidated));
    assert_eq!(
        mock.end_capture(a).unwrap_err(),
        MockError::CaptureInvalidated
    );
    assert_eq!(statuses(&mock, a, b), (NotCapturing, NotCapturing));
}

#[test]
fn captured_events_are_complete_once_the_capture_ends() {
    let (mock, a, b) = capturing_with_a_second_stream(CaptureMode::Relaxed);
    let e = fork(&mock, a, b);
    join(&mock, a, b);
    mock.end_capture(a).unwrap();
    // SAFETY: live handles of this mock's device 0.
    unsafe {
        assert_eq!(mock.query_event(e, D0), Ok(Completion::Complete));
        // Recorded again outside a capture, it is an ordinary event.
        mock.enqueue_work(a).unwrap();
        mock.record_event(e, a, D0).unwrap();
        assert_eq!(mock.query_event(e, D0), Ok(Completion::Pending));
    }
    assert!(mock.misuses().is_empty());
}

// ---- the special streams -----------------------------------------------------

/// The legacy default stream (and the null stream, which names it) cannot be
/// part of a capture: a wait on a captured event, which would make it join,
/// is refused, logged, and invalidates the capture, as CUDA refuses it.
#[test]
fn the_legacy_stream_cannot_join_a_capture() {
    for legacy in [StreamHandle::NULL, StreamHandle::LEGACY] {
        let (mock, s) = mock_with_stream(1);
        begin(&mock, s, CaptureMode::Relaxed).unwrap();
        let e = event(&mock, D0);
        // SAFETY: live handles of this mock's device 0 (a special handle
        // always is one).
        let waited = unsafe {
            mock.record_event(e, s, D0).unwrap();
            mock.stream_wait_event(legacy, D0, e)
        };
        let refused = MockError::CaptureImplicit(legacy);
        assert_eq!(waited, Err(refused.clone()));
        assert_misuses(&mock, &[(CallKind::StreamWaitEvent, refused)]);
        assert_eq!(status(&mock, s), Invalidated);
        assert_eq!(
            mock.capture_status_of(legacy),
            Ok(NotCapturing),
            "not joined"
        );
        assert_eq!(
            mock.end_capture(s).unwrap_err(),
            MockError::CaptureInvalidated
        );
    }
}

/// The per-thread default stream may join a capture (CUDA can capture it)
/// and be joined back; it cannot begin one (`begin_capture` takes a created
/// stream). It is a stream apart from the null and legacy handles' one
/// (the driver API makes handle 0 the legacy stream), which stays out of
/// the capture.
#[test]
fn the_per_thread_stream_joins_a_capture_but_does_not_begin_one() {
    let (mock, s) = mock_with_stream(1);
    let per_thread = StreamHandle::PER_THREAD;
    assert_eq!(
        begin(&mock, per_thread, CaptureMode::Global),
        Err(MockError::InvalidStream(per_thread))
    );
    begin(&mock, s, CaptureMode::Relaxed).unwrap();
    fork(&mock, s, per_thread);
    assert_eq!(mock.capture_status_of(per_thread), Ok(Active));
    assert_eq!(
        mock.capture_status_of(StreamHandle::NULL),
        Ok(NotCapturing),
        "the legacy stream is another stream"
    );
    mock.enqueue_work(per_thread).unwrap();
    assert_eq!(mock.pending_work(per_thread), Ok(0), "captured");
    join(&mock, s, per_thread);
    let graph = mock.end_capture(s).unwrap();
    assert_eq!(graph.node_count(), 1);
    assert_eq!(mock.capture_status_of(per_thread), Ok(NotCapturing));
    assert_misuses(
        &mock,
        &[(
            CallKind::CaptureStatus,
            MockError::InvalidStream(per_thread),
        )],
    );
}

// ---- refused calls -----------------------------------------------------------

/// Each call a capture refuses on its own stream or event, in each mode:
/// an error and a misuse, and the capture is invalidated.
#[test]
fn queries_and_syncs_of_capturing_streams_and_captured_events_are_refused() {
    type Refused = fn(&MockBackend, StreamHandle, EventHandle) -> Result<(), MockError>;
    let refused: [(CallKind, Refused); 5] = [
        (CallKind::QueryStream, |m, s, _| {
            // SAFETY: live handles of this mock's device 0 (and every call below).
            unsafe { m.query_stream(s, D0) }.map(drop)
        }),
        (CallKind::SynchronizeStream, |m, s, _| {
            // SAFETY: as above.
            unsafe { m.synchronize_stream(s, D0) }
        }),
        (CallKind::QueryEvent, |m, _, e| {
            // SAFETY: as above.
            unsafe { m.query_event(e, D0) }.map(drop)
        }),
        (CallKind::SynchronizeEvent, |m, _, e| {
            // SAFETY: as above.
            unsafe { m.synchronize_event(e, D0) }
        }),
        (CallKind::DestroyStream, |m, s, _| {
            // SAFETY: as above; a refused destroy destroys nothing.
            unsafe { m.destroy_stream(s, D0) }
        }),
    ];
    for mode in MODES {
        for (kind, call) in refused {
            let (mock, s) = mock_with_stream(1);
            begin(&mock, s, mode).unwrap();
            let e = event(&mock, D0);
            // SAFETY: live handles of this mock's device 0.
            unsafe { mock.record_event(e, s, D0) }.unwrap();
            // From another thread in every mode.
            let got = std::thread::scope(|t| t.spawn(|| call(&mock, s, e)).join().unwrap());
            assert_eq!(got, Err(MockError::CaptureUnsupported), "{mode:?} {kind:?}");
            assert_eq!(status(&mock, s), Invalidated, "{mode:?} {kind:?}");
            assert_misuses(&mock, &[(kind, MockError::CaptureUnsupported)]);
            assert_eq!(
                mock.end_capture(s).unwrap_err(),
                MockError::CaptureInvalidated
            );
            assert!(mock.is_live_stream(s), "a refused destroy destroys nothing");
        }
    }
}

type Unsafe = fn(&MockBackend, StreamHandle) -> Result<(), MockError>;

/// The potentially unsafe calls, each on a stream, event or block that has
/// nothing to do with any capture (the synchronous free has a test of its
/// own: its block must exist before the capture).
fn potentially_unsafe_calls() -> [(CallKind, Unsafe); 6] {
    [
        (CallKind::QueryStream, |m, s| {
            // SAFETY: live handles of this mock's device 0 (and every call below).
            unsafe { m.query_stream(s, D0) }.map(drop)
        }),
        (CallKind::SynchronizeStream, |m, s| {
            // SAFETY: as above.
            unsafe { m.synchronize_stream(s, D0) }
        }),
        (CallKind::QueryEvent, |m, _| {
            let e = event(m, D0);
            // SAFETY: as above.
            unsafe { m.query_event(e, D0) }.map(drop)
        }),
        (CallKind::SynchronizeEvent, |m, _| {
            let e = event(m, D0);
            // SAFETY: as above.
            unsafe { m.synchronize_event(e, D0) }
        }),
        (CallKind::Allocate, |m, _| {
            m.allocate(MemoryKind::Device, D0, 64, 64).map(drop)
        }),
        (CallKind::Allocate, |m, _| {
            m.allocate(MemoryKind::Pinned, D0, 64, 64).map(drop)
        }),
    ]
}

/// Runs `call` on `other` (a stream in no capture) while `capturing` is in a
/// capture of `mode` begun by this thread, on this thread (`same_thread`) or
/// another; returns what it answered and the capture's status after.
fn unsafe_call_during(
    mode: CaptureMode,
    same_thread: bool,
    call: Unsafe,
) -> (Result<(), MockError>, CaptureStatus, MockBackend) {
    let (mock, capturing) = mock_with_stream(1);
    let other = stream(&mock, D0);
    begin(&mock, capturing, mode).unwrap();
    let got = if same_thread {
        call(&mock, other)
    } else {
        std::thread::scope(|t| t.spawn(|| call(&mock, other)).join().unwrap())
    };
    let after = status(&mock, capturing);
    (got, after, mock)
}

#[test]
fn potentially_unsafe_calls_are_refused_by_mode_and_thread() {
    for (kind, call) in potentially_unsafe_calls() {
        for mode in MODES {
            for same_thread in [true, false] {
                let refused = match mode {
                    CaptureMode::Global => true,
                    CaptureMode::ThreadLocal => same_thread,
                    CaptureMode::Relaxed => false,
                };
                let (got, after, mock) = unsafe_call_during(mode, same_thread, call);
                let case = format!("{kind:?} in {mode:?}, same thread: {same_thread}");
                if refused {
                    assert_eq!(got, Err(MockError::CaptureProhibited(mode)), "{case}");
                    assert_eq!(after, Invalidated, "{case}");
                    assert_misuses(&mock, &[(kind, MockError::CaptureProhibited(mode))]);
                } else {
                    assert_eq!(got, Ok(()), "{case}");
                    assert_eq!(after, Active, "{case}");
                    assert!(mock.misuses().is_empty(), "{case}");
                }
            }
        }
    }
}

#[test]
fn synchronous_frees_of_device_visible_memory_are_potentially_unsafe() {
    for kind in [
        MemoryKind::Device,
        MemoryKind::Pinned,
        MemoryKind::Managed,
        MemoryKind::Host,
    ] {
        for mode in MODES {
            let (mock, s) = mock_with_stream(1);
            let p = mock.allocate(kind, D0, 64, 64).unwrap();
            begin(&mock, s, mode).unwrap();
            // SAFETY: the block was allocated with this layout and is not used.
            let got = unsafe { mock.deallocate(kind, D0, p, 64, 64) };
            let refused = mode != CaptureMode::Relaxed && kind != MemoryKind::Host;
            if refused {
                assert_eq!(got, Err(MockError::CaptureProhibited(mode)));
                assert_eq!(mock.live_bytes(kind), 64, "a refused free frees nothing");
                assert_eq!(status(&mock, s), Invalidated);
            } else {
                assert_eq!(got, Ok(()), "{kind:?} {mode:?}");
                assert_eq!(status(&mock, s), Active);
            }
            // A bad pointer is the error it always was, capture or not.
            // SAFETY: a bad address on purpose, only compared.
            let bad = unsafe { mock.deallocate(kind, D0, NonNull::dangling(), 64, 64) };
            assert_eq!(bad, Err(MockError::InvalidPointer(1)));
        }
    }
}

#[test]
fn a_refused_call_breaks_every_global_capture_and_only_its_threads_local_one() {
    let mock = MockBackend::new(1);
    let [g1, g2, local, relaxed, other] = std::array::from_fn(|_| stream(&mock, D0));
    begin(&mock, g1, CaptureMode::Global).unwrap();
    std::thread::scope(|t| {
        t.spawn(|| begin(&mock, g2, CaptureMode::Global).unwrap());
    });
    begin(&mock, local, CaptureMode::ThreadLocal).unwrap();
    begin(&mock, relaxed, CaptureMode::Relaxed).unwrap();
    // Another thread's query: the Global captures break, the thread-local
    // one (this thread's) does not.
    let got = std::thread::scope(|t| {
        // SAFETY: a live stream of this mock's device 0.
        t.spawn(|| unsafe { mock.query_stream(other, D0) })
            .join()
            .unwrap()
    });
    assert_eq!(got, Err(MockError::CaptureProhibited(CaptureMode::Global)));
    let statuses = [g1, g2, local, relaxed].map(|s| status(&mock, s));
    assert_eq!(statuses, [Invalidated, Invalidated, Active, Active]);
}

#[test]
fn a_thread_local_capture_is_broken_by_its_own_thread_only() {
    let mock = MockBackend::new(1);
    let [mine, theirs, other] = std::array::from_fn(|_| stream(&mock, D0));
    begin(&mock, mine, CaptureMode::ThreadLocal).unwrap();
    std::thread::scope(|t| {
        t.spawn(|| begin(&mock, theirs, CaptureMode::ThreadLocal).unwrap());
    });
    // SAFETY: a live stream of this mock's device 0.
    let got = unsafe { mock.query_stream(other, D0) };
    assert_eq!(
        got,
        Err(MockError::CaptureProhibited(CaptureMode::ThreadLocal))
    );
    assert_eq!(
        [status(&mock, mine), status(&mock, theirs)],
        [Invalidated, Active]
    );
}

#[test]
fn waits_across_capture_boundaries_are_refused() {
    let mock = MockBackend::new(1);
    let [a, b, outside] = std::array::from_fn(|_| stream(&mock, D0));
    begin(&mock, a, CaptureMode::Relaxed).unwrap();
    begin(&mock, b, CaptureMode::Relaxed).unwrap();
    let ea = event(&mock, D0);
    let never = event(&mock, D0);
    let eo = event(&mock, D0);
    // SAFETY: live handles of this mock's device 0.
    unsafe {
        mock.record_event(ea, a, D0).unwrap();
        // An event never recorded orders nothing: allowed.
        assert_eq!(mock.stream_wait_event(b, D0, never), Ok(()));
        assert_eq!(status(&mock, b), Active);
        // b's capture waiting on a's: isolation, both broken.
        assert_eq!(
            mock.stream_wait_event(b, D0, ea),
            Err(MockError::CaptureIsolation)
        );
        assert_eq!(
            [status(&mock, a), status(&mock, b)],
            [Invalidated, Invalidated]
        );
    }
    mock.end_capture(a).unwrap_err();
    mock.end_capture(b).unwrap_err();

    begin(&mock, a, CaptureMode::Relaxed).unwrap();
    // SAFETY: as above.
    unsafe {
        mock.record_event(eo, outside, D0).unwrap();
        assert_eq!(
            mock.stream_wait_event(a, D0, eo),
            Err(MockError::CaptureIsolation)
        );
    }
    assert_eq!(status(&mock, a), Invalidated);
    // Two isolations, two failed ends.
    assert_eq!(mock.misuses().len(), 4, "{:?}", mock.misuses());
}

// ---- graphs ------------------------------------------------------------------

#[test]
fn a_launch_queues_the_captured_items_and_their_uses() {
    let (mock, origin) = mock_with_stream(1);
    let (side, launch, other) = (stream(&mock, D0), stream(&mock, D0), stream(&mock, D0));
    let p = device_block(&mock, 256);
    begin(&mock, origin, CaptureMode::Global).unwrap();
    fork(&mock, origin, side);
    mock.use_memory(side, p.as_ptr(), 128).unwrap();
    join(&mock, origin, side);
    mock.use_memory(origin, p.as_ptr(), 256).unwrap();
    let graph = mock.end_capture(origin).unwrap();
    assert_eq!(graph.node_count(), 2);
    assert!(mock.hazards().is_empty(), "the join orders the two uses");

    mock.launch_graph(&graph, launch).unwrap();
    assert_eq!(mock.pending_work(launch), Ok(2));
    // The graph's uses are uses of `launch` now: unordered work elsewhere
    // races them.
    mock.use_memory(other, p.as_ptr(), 8).unwrap();
    let hazards = mock.hazards();
    assert_eq!(hazards.len(), 1);
    assert_eq!(hazards[0].kind, HazardKind::ConcurrentUse);
    assert_eq!(hazards[0].conflict, Some(launch));
    mock.clear_hazards();
    mock.complete_everything();

    // Twice in a row on one stream: ordered, no hazard.
    mock.launch_graph(&graph, launch).unwrap();
    mock.launch_graph(&graph, launch).unwrap();
    assert!(mock.complete_one(launch).unwrap());
    assert_eq!(mock.pending_work(launch), Ok(3));
    mock.complete_all(launch).unwrap();
    assert!(mock.hazards().is_empty());
    assert!(mock.misuses().is_empty());
}

#[test]
fn captured_copies_and_kernels_do_not_run() {
    use gpupool_core::{AccessOrder, Scratchpad};
    let (mock, s) = mock_with_stream(1);
    let order = {
        // SAFETY: a live stream of this mock on device 0, destroyed never
        // (the mock outlives every use of the order).
        unsafe { AccessOrder::from_raw(&mock, s, D0) }
    };
    let scratch = Scratchpad::new(&mock, order).unwrap();
    let x = scratch.to_device(&[1u32, 2, 3]).unwrap();
    let y = scratch.device::<u32>(3).unwrap();
    mock.complete_everything();
    begin(&mock, s, CaptureMode::Relaxed).unwrap();
    let mut called = false;
    mock.launch_map(&order, &x, &y, |v| {
        called = true;
        v * 10
    })
    .unwrap();
    assert!(!called, "a captured kernel does not run");
    let sevens = [7u8; 12];
    let dst = NonNull::new(y.as_ptr().cast::<u8>()).unwrap();
    // SAFETY: `dst` is 12 bytes inside a live block of this mock; the source
    // is a live array of 12 bytes, not touched meanwhile.
    unsafe { mock.copy_async(dst, NonNull::from(&sevens).cast(), 12, s, D0) }.unwrap();
    let graph = mock.end_capture(s).unwrap();
    assert_eq!(graph.node_count(), 2);
    assert_eq!(
        scratch.to_host(&y).unwrap(),
        [0, 0, 0],
        "nothing was written"
    );
    drop(graph);
    drop(scratch);
    assert!(mock.misuses().is_empty() && mock.hazards().is_empty());
}

#[test]
fn graph_launch_refusals() {
    let mock = MockBackend::new(2);
    let [a, b] = std::array::from_fn(|_| stream(&mock, D0));
    let on_d1 = stream(&mock, D1);
    begin(&mock, a, CaptureMode::Relaxed).unwrap();
    mock.enqueue_work(a).unwrap();
    let graph = mock.end_capture(a).unwrap();

    assert_eq!(
        mock.launch_graph(&graph, on_d1),
        Err(MockError::CrossDevice {
            given: D1,
            actual: D0
        })
    );
    begin(&mock, b, CaptureMode::Relaxed).unwrap();
    assert_eq!(
        mock.launch_graph(&graph, b),
        Err(MockError::CaptureUnsupported)
    );
    assert_eq!(status(&mock, b), Invalidated);
    mock.end_capture(b).unwrap_err();

    let elsewhere = MockBackend::new(1);
    let s = stream(&elsewhere, D0);
    assert_eq!(
        elsewhere.launch_graph(&graph, s),
        Err(MockError::ForeignGraph)
    );
    assert_eq!(elsewhere.destroy_graph(graph), Err(MockError::ForeignGraph));
    assert_eq!(elsewhere.misuses().len(), 2);
    assert_eq!(
        elsewhere.misuses()[1].harness,
        Some(HarnessCall::DestroyGraph)
    );
    // The cross-device launch, the launch into a capture, its end.
    assert_eq!(mock.misuses().len(), 3, "{:?}", mock.misuses());
}

// ---- memory ------------------------------------------------------------------

/// A capture on `s` that allocates a device block in stream order, uses it
/// and frees it (memory nodes); returns the graph and the block's address.
fn alloc_use_free(mock: &MockBackend, s: StreamHandle) -> (MockGraph, usize) {
    begin(mock, s, CaptureMode::Global).unwrap();
    // SAFETY: a live stream of this mock's device 0.
    let p = unsafe { mock.allocate_async(MemoryKind::Device, D0, 512, 256, s) }.unwrap();
    mock.use_memory(s, p.as_ptr(), 512).unwrap();
    // SAFETY: the block was allocated with this layout in this capture.
    unsafe { mock.deallocate_async(MemoryKind::Device, D0, p, 512, 256, s) }.unwrap();
    let graph = mock.end_capture(s).unwrap();
    (graph, p.as_ptr().addr())
}

#[test]
fn graph_allocations_stay_reserved_until_the_graph_drops() {
    let (mock, s) = mock_with_stream(1);
    let (graph, addr) = alloc_use_free(&mock, s);
    assert_eq!(graph.node_count(), 3);
    assert_eq!(
        mock.live_bytes(MemoryKind::Device),
        512,
        "reserved for the graph"
    );

    // Nobody else may use it: work outside the graph is refused, and
    // recorded as a hazard...
    let other = stream(&mock, D0);
    assert_eq!(
        mock.use_memory(other, std::ptr::without_provenance(addr), 8),
        Err(MockError::HeldByGraph { addr, len: 8 })
    );
    assert_eq!(mock.hazards()[0].kind, HazardKind::HeldByGraph);
    assert_eq!(mock.pending_work(other), Ok(0), "nothing queued");
    mock.clear_hazards();
    mock.complete_everything();
    // ...nor free it again.
    // SAFETY: a double free on purpose; the mock refuses it.
    let again = unsafe {
        let p = NonNull::new(std::ptr::without_provenance_mut(addr)).unwrap();
        mock.deallocate(MemoryKind::Device, D0, p, 512, 256)
    };
    assert_eq!(again, Err(MockError::DoubleFree(addr)));

    // The graph's launches use it freely.
    let launch = stream(&mock, D0);
    mock.launch_graph(&graph, launch).unwrap();
    mock.launch_graph(&graph, launch).unwrap();
    assert!(mock.hazards().is_empty());
    // Dropped while its launches run: freed once they have.
    drop(graph);
    assert_eq!(mock.live_bytes(MemoryKind::Device), 512);
    assert_eq!(mock.pending_free_bytes(MemoryKind::Device), 512);
    mock.complete_all(launch).unwrap();
    assert_eq!(mock.live_bytes(MemoryKind::Device), 0);
    assert_eq!(mock.misuses().len(), 1, "the double free");
}

#[test]
fn a_graph_allocation_without_a_free_node_is_freed_with_the_graph() {
    let (mock, s) = mock_with_stream(1);
    begin(&mock, s, CaptureMode::Global).unwrap();
    // SAFETY: a live stream of this mock's device 0.
    let p = unsafe { mock.allocate_async(MemoryKind::Device, D0, 64, 64, s) }.unwrap();
    let graph = mock.end_capture(s).unwrap();
    // Not usable outside the graph, though its graph did not free it: it
    // exists for the graph's launches.
    assert_eq!(
        mock.use_memory(s, p.as_ptr(), 64),
        Err(MockError::HeldByGraph {
            addr: p.as_ptr().addr(),
            len: 64
        })
    );
    assert_eq!(mock.hazards()[0].kind, HazardKind::HeldByGraph);
    mock.clear_hazards();
    mock.destroy_graph(graph).unwrap();
    assert_eq!(mock.live_bytes(MemoryKind::Device), 0);

    // One the caller frees itself is not freed twice.
    begin(&mock, s, CaptureMode::Global).unwrap();
    // SAFETY: as above.
    let q = unsafe { mock.allocate_async(MemoryKind::Device, D0, 64, 64, s) }.unwrap();
    let graph = mock.end_capture(s).unwrap();
    // SAFETY: allocated with this layout; the graph was never launched.
    unsafe { mock.deallocate_async(MemoryKind::Device, D0, q, 64, 64, s) }.unwrap();
    assert_eq!(mock.live_bytes(MemoryKind::Device), 0);
    // A launch now uses freed memory.
    mock.launch_graph(&graph, s).unwrap();
    assert!(
        mock.hazards().is_empty(),
        "an allocation node uses no range"
    );
    drop(graph);
    assert!(mock.misuses().is_empty());
}

#[test]
fn a_graph_can_free_only_its_own_device_allocations() {
    let (mock, s) = mock_with_stream(1);
    let outside = device_block(&mock, 64);
    begin(&mock, s, CaptureMode::Relaxed).unwrap();
    // SAFETY: allocated with this layout; the mock refuses the free.
    let got = unsafe { mock.deallocate_async(MemoryKind::Device, D0, outside, 64, 64, s) };
    let addr = outside.as_ptr().addr();
    assert_eq!(got, Err(MockError::NotGraphAllocation(addr)));
    assert_eq!(status(&mock, s), Invalidated);
    assert_misuses(
        &mock,
        &[(
            CallKind::DeallocateAsync,
            MockError::NotGraphAllocation(addr),
        )],
    );
    assert_eq!(
        mock.end_capture(s).unwrap_err(),
        MockError::CaptureInvalidated
    );
    assert_eq!(mock.live_bytes(MemoryKind::Device), 64, "nothing was freed");
    // SAFETY: still allocated, with this layout, unused.
    unsafe { mock.deallocate(MemoryKind::Device, D0, outside, 64, 64) }.unwrap();
}

#[test]
fn host_visible_blocks_freed_in_a_capture_are_held_for_the_graph() {
    for kind in [MemoryKind::Pinned, MemoryKind::Managed, MemoryKind::Host] {
        let (mock, s) = mock_with_stream(1);
        let p = mock.allocate(kind, D0, 128, 64).unwrap();
        begin(&mock, s, CaptureMode::Global).unwrap();
        mock.use_memory(s, p.as_ptr(), 128).unwrap();
        if kind == MemoryKind::Host {
            // SAFETY: allocated with this layout; the free is ordered after
            // the captured use on the same stream.
            unsafe { mock.deallocate_async(kind, D0, p, 128, 64, s) }.unwrap();
        } else {
            // SAFETY: as above; the stream is capturing.
            let capture = unsafe { mock.capture_id(s, D0) }.unwrap().unwrap();
            // SAFETY: as above.
            unsafe { mock.keep_for_graph(kind, D0, p, 128, 64, s, capture) }.unwrap();
        }
        let graph = mock.end_capture(s).unwrap();
        assert_eq!(mock.live_bytes(kind), 128, "{kind:?}: held for the graph");
        // The host may not touch it: a replay may read it.
        assert_eq!(
            mock.host_access(p.as_ptr(), 8),
            Err(MockError::HeldByGraph {
                addr: p.as_ptr().addr(),
                len: 8
            })
        );
        assert_eq!(mock.hazards()[0].kind, HazardKind::HeldByGraph);
        mock.clear_hazards();
        // A fresh block is another block.
        let q = mock.allocate(kind, D0, 128, 64).unwrap();
        assert_ne!(q, p);
        mock.launch_graph(&graph, s).unwrap();
        assert!(mock.hazards().is_empty());
        drop(graph); // freed once the launch has run
        assert_eq!(mock.live_bytes(kind), 256);
        mock.complete_all(s).unwrap();
        assert_eq!(mock.live_bytes(kind), 128);
        // SAFETY: allocated with this layout, unused.
        unsafe { mock.deallocate(kind, D0, q, 128, 64) }.unwrap();
        assert!(mock.misuses().is_empty(), "{kind:?}");
    }
}

#[test]
fn a_failed_capture_frees_what_it_held_at_its_end() {
    let (mock, s) = mock_with_stream(1);
    let b = stream(&mock, D0);
    let pinned = mock.allocate(MemoryKind::Pinned, D0, 64, 64).unwrap();
    begin(&mock, s, CaptureMode::Relaxed).unwrap();
    // SAFETY: a live stream; allocated with this layout.
    unsafe {
        mock.allocate_async(MemoryKind::Device, D0, 64, 64, s)
            .unwrap();
        let capture = mock.capture_id(s, D0).unwrap().unwrap();
        mock.keep_for_graph(MemoryKind::Pinned, D0, pinned, 64, 64, s, capture)
            .unwrap();
    }
    fork(&mock, s, b);
    mock.enqueue_work(b).unwrap(); // never joined back
    assert_eq!(mock.live_blocks(), 2);
    assert_eq!(
        mock.end_capture(s).unwrap_err(),
        MockError::CaptureUnjoined(b)
    );
    assert_eq!(mock.live_blocks(), 0);
}

#[test]
fn captured_uses_are_checked_against_the_capture() {
    let (mock, a, b) = capturing_with_a_second_stream(CaptureMode::Relaxed);
    // SAFETY: a live stream of this mock's device 0.
    let p = unsafe { mock.allocate_async(MemoryKind::Device, D0, 256, 256, a) }.unwrap();
    fork(&mock, a, b);
    mock.use_memory(b, p.as_ptr(), 256).unwrap();
    // a's use is not ordered after b's: a race inside the graph.
    mock.use_memory(a, p.as_ptr(), 16).unwrap();
    // Nor is a's free.
    // SAFETY: allocated in this capture with this layout.
    unsafe { mock.deallocate_async(MemoryKind::Device, D0, p, 256, 256, a) }.unwrap();
    // A use after the free node.
    mock.use_memory(a, p.as_ptr(), 16).unwrap();
    join(&mock, a, b);
    let graph = mock.end_capture(a).unwrap();
    let kinds = hazard_kinds(&mock);
    assert_eq!(
        kinds,
        [
            (HazardKind::ConcurrentUse, Some(b)),
            (HazardKind::FreedWhileInUse, Some(b)),
            (HazardKind::UsedAfterFree, None),
        ]
    );
    assert!(mock.misuses().is_empty());
    drop(graph);
}

#[test]
fn destroying_a_captured_event_is_allowed() {
    let (mock, a, b) = capturing_with_a_second_stream(CaptureMode::Global);
    let e = fork(&mock, a, b);
    // SAFETY: a live event of this mock's device 0, not used again.
    unsafe { mock.destroy_event(e, D0) }.unwrap();
    join(&mock, a, b);
    mock.end_capture(a).unwrap();
    assert!(mock.misuses().is_empty());
}

#[test]
fn a_pinned_or_managed_block_freed_in_stream_order_on_a_capturing_stream_is_refused() {
    for kind in [MemoryKind::Pinned, MemoryKind::Managed] {
        let (mock, s) = mock_with_stream(1);
        let p = mock.allocate(kind, D0, 128, 64).unwrap();
        begin(&mock, s, CaptureMode::Relaxed).unwrap();
        // SAFETY: allocated with this layout, unused.
        let freed = unsafe { mock.deallocate_async(kind, D0, p, 128, 64, s) };
        assert_eq!(freed, Err(MockError::CaptureUnsupported), "{kind:?}");
        assert_eq!(mock.capture_status_of(s), Ok(CaptureStatus::Invalidated));
        assert_eq!(mock.misuses().len(), 1, "{kind:?}");
        assert_eq!(
            mock.end_capture(s).unwrap_err(),
            MockError::CaptureInvalidated
        );
        assert_eq!(mock.live_bytes(kind), 128, "{kind:?}: not freed");
        // SAFETY: still allocated, with this layout, unused.
        unsafe { mock.deallocate(kind, D0, p, 128, 64) }.unwrap();
    }
}
