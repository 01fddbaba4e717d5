//! Models of the mock backend itself (`MockBackend`: one reader-writer lock
//! over the whole simulated machine; the read-only calls count themselves in
//! atomics and answer under the read lock when nothing needs changing), which
//! every other model runs on: two threads make every kind of call at once, or
//! query while a third records and destroys, and the live counts, the call
//! and fault counters, the misuse and hazard logs must come out exact in
//! every interleaving.

use std::ptr::NonNull;

use gpupool_core::{
    Backend, Completion, DeviceId, EventBackend, EventFlags, EventHandle, MemoryBackend,
    MemoryKind, StreamBackend, StreamHandle,
};
use gpupool_mock::{CallKind, HazardKind, MockBackend, MockError};

use super::{model_deep, spawn_scoped};

const D: DeviceId = DeviceId(0);
const SIZE: usize = 256;

/// An address no block of the mock covers (the mock only compares it).
fn foreign(i: usize) -> *const u8 {
    std::ptr::without_provenance(0x100 + 0x10 * i)
}

/// A block that the threads of a model share.
#[derive(Copy, Clone)]
struct Block(NonNull<u8>);

// SAFETY: the models never dereference the pointer: the mock only compares
// its address with its records (and frees the block through them).
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    fn get(self) -> NonNull<u8> {
        self.0
    }
}

/// What one thread did.
struct Done {
    stream: StreamHandle,
    injected: bool,
}

/// One thread's calls: a stream, a device block used by a kernel on it, a
/// deliberate use of memory that is no block (one hazard), then an event
/// recorded after the kernel that a stream shared by both threads waits for,
/// and the block freed in that shared stream's order; or, when its event
/// creation is the one that fails (the fault is armed for the first
/// creation, whichever thread makes it), the block freed in its own stream's
/// order and the stream synchronized. Everything it made is destroyed.
/// A one-device mock, a stream and an event (timing disabled) it made on
/// `D`.
fn mock_stream_and_event() -> (MockBackend, StreamHandle, EventHandle) {
    let mock = MockBackend::new(1);
    let s = mock.create_stream(D, Default::default()).unwrap();
    let e = mock.create_event(D, EventFlags::DISABLE_TIMING).unwrap();
    (mock, s, e)
}

/// Checks the mock's count of each of `kinds` of call against `calls`, in
/// order.
fn assert_calls(mock: &MockBackend, kinds: &[CallKind], calls: &[u64]) {
    assert_eq!(kinds.len(), calls.len());
    for (&kind, &n) in kinds.iter().zip(calls) {
        assert_eq!(mock.calls(kind), n, "{kind:?}");
    }
}

fn one_thread(mock: &MockBackend, shared: StreamHandle, i: usize) -> Done {
    let s = mock.create_stream(D, Default::default()).unwrap();
    let p: NonNull<u8> = mock.allocate(MemoryKind::Device, D, SIZE, SIZE).unwrap();
    mock.use_memory(s, p.as_ptr(), SIZE).unwrap();
    mock.use_memory(s, foreign(i), 8).unwrap(); // a hazard, on purpose

    // SAFETY: `s` was made above on `D` by this mock and is destroyed only at
    // the end of this function (every call below on it likewise); `shared` is
    // the model's stream of `D`, destroyed after both threads are joined.
    let state = unsafe { mock.query_stream(s, D) };
    assert_eq!(state.unwrap(), Completion::Pending);
    let injected = match mock.create_event(D, EventFlags::DISABLE_TIMING) {
        Ok(e) => {
            // SAFETY: `e` was just made on `D` by this mock and is destroyed
            // below; `s` and `shared` as above.
            unsafe { mock.record_event(e, s, D) }.unwrap();
            // SAFETY: as above.
            unsafe { mock.stream_wait_event(shared, D, e) }.unwrap();
            // SAFETY: `shared` waits for the event recorded after the only
            // use of `p`; the mock checks exactly that ordering.
            unsafe { mock.deallocate_async(MemoryKind::Device, D, p, SIZE, SIZE, shared) }.unwrap();
            mock.complete_all(s).unwrap();
            // SAFETY: as above.
            let state = unsafe { mock.query_event(e, D) };
            assert_eq!(state.unwrap(), Completion::Complete);
            // SAFETY: as above; nothing uses `e` after this.
            unsafe { mock.destroy_event(e, D) }.unwrap();
            false
        }
        Err(e) => {
            assert!(e.is_injected(), "{e}");
            // SAFETY: `p` is used only by work on `s`.
            unsafe { mock.deallocate_async(MemoryKind::Device, D, p, SIZE, SIZE, s) }.unwrap();
            // SAFETY: `s` as above.
            unsafe { mock.synchronize_stream(s, D) }.unwrap();
            true
        }
    };
    // SAFETY: `s` as above.
    let state = unsafe { mock.query_stream(s, D) };
    assert_eq!(state.unwrap(), Completion::Complete);
    // SAFETY: `s` as above; nothing uses it after this.
    unsafe { mock.destroy_stream(s, D) }.unwrap();
    Done {
        stream: s,
        injected,
    }
}

#[test]
fn two_threads_every_call() {
    model_deep(|| {
        let mock = MockBackend::new(1);
        let shared = mock.create_stream(D, Default::default()).unwrap();
        mock.fail_nth(CallKind::CreateEvent, 1);
        let t = spawn_scoped(|| one_thread(&mock, shared, 1));
        let mine = one_thread(&mock, shared, 0);
        let theirs = t.join();

        assert_ne!(mine.stream, theirs.stream, "one handle for two streams");
        assert!(
            mine.injected ^ theirs.injected,
            "the armed fault fired once"
        );
        assert_eq!(mock.armed_faults(), 0);
        assert_calls(
            &mock,
            &[
                CallKind::CreateStream,
                CallKind::CreateEvent,
                CallKind::RecordEvent,
                CallKind::DeallocateAsync,
                CallKind::DestroyStream,
            ],
            &[3, 2, 1, 2, 2],
        );
        assert!(mock.misuses().is_empty(), "{:?}", mock.misuses());

        let mut hazards = mock.hazards();
        hazards.sort_by_key(|h| h.addr);
        let expected = [(foreign(0), mine.stream), (foreign(1), theirs.stream)];
        assert_eq!(hazards.len(), 2, "{hazards:?}");
        for (h, (addr, s)) in hazards.iter().zip(expected) {
            assert_eq!(h.kind, HazardKind::UsedAfterFree);
            assert_eq!((h.addr, h.len, h.stream), (addr.addr(), 8, Some(s)));
        }

        // Both kernels are done, so the shared stream's waits have resolved
        // and both blocks are back.
        assert_eq!(mock.live_streams(), 1);
        assert_eq!(mock.live_events(), 0);
        assert_eq!(mock.live_blocks(), 0);
        assert_eq!(mock.live_bytes(MemoryKind::Device), 0);
        assert_eq!(mock.pending_free_bytes(MemoryKind::Device), 0);
        let peak = mock.peak_live_bytes(MemoryKind::Device);
        assert!(peak == SIZE || peak == 2 * SIZE, "peak {peak}");
        // SAFETY: `shared` was made on `D` by this mock at the start of the
        // model; the threads that used it are joined.
        let state = unsafe { mock.query_stream(shared, D) };
        assert_eq!(state.unwrap(), Completion::Complete);
        // SAFETY: as above; nothing uses `shared` after this.
        unsafe { mock.destroy_stream(shared, D) }.unwrap();
        assert_eq!(mock.live_streams(), 0);
    });
}

/// A "GPU" thread completes work (one item, then everything) while a user
/// thread runs a kernel on a pinned block, records an event after it, frees
/// the block in the stream's order and waits for the event: whichever thread
/// completes the kernel, the free-pending block goes back exactly once, and
/// the counts end at zero with no hazard.
#[test]
fn completion_races_a_stream_ordered_free() {
    model_deep(|| {
        let (mock, s, e) = mock_stream_and_event();
        let p = Block(mock.allocate(MemoryKind::Pinned, D, SIZE, SIZE).unwrap());
        let user = spawn_scoped(|| {
            let p = p.get();
            mock.use_memory(s, p.as_ptr(), SIZE).unwrap();
            // SAFETY: `s` and `e` were made on `D` by this mock at the start
            // of the model and are destroyed only after this thread is joined.
            unsafe { mock.record_event(e, s, D) }.unwrap();
            // SAFETY: only the kernel on `s` uses `p`; the free is after it.
            unsafe { mock.deallocate_async(MemoryKind::Pinned, D, p, SIZE, SIZE, s) }.unwrap();
            // SAFETY: `e` as above.
            unsafe { mock.synchronize_event(e, D) }.unwrap();
            // SAFETY: as above.
            let state = unsafe { mock.query_event(e, D) };
            assert_eq!(state.unwrap(), Completion::Complete);
        });
        let gpu = spawn_scoped(|| {
            let one = mock.complete_one(s).unwrap();
            mock.complete_everything();
            one
        });
        let pending_then = mock.pending_free_bytes(MemoryKind::Pinned);
        assert!(pending_then == 0 || pending_then == SIZE);
        user.join();
        gpu.join();
        assert_eq!(mock.live_blocks(), 0);
        assert_eq!(mock.live_bytes(MemoryKind::Pinned), 0);
        assert_eq!(mock.pending_free_bytes(MemoryKind::Pinned), 0);
        assert_eq!(mock.pending_work(s).unwrap(), 0);
        assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
        assert!(mock.misuses().is_empty(), "{:?}", mock.misuses());
        // SAFETY: `e` and `s` were made on `D` by this mock; the threads that
        // used them are joined, and nothing uses them after this.
        unsafe { mock.destroy_event(e, D) }.unwrap();
        // SAFETY: as above.
        unsafe { mock.destroy_stream(s, D) }.unwrap();
        assert_eq!((mock.live_streams(), mock.live_events()), (0, 0));
    });
}

/// Two threads make the read-only calls (`query_stream` twice each,
/// `query_event`, `stream_device`, `current_device`: the read-locked fast path
/// when nothing is armed or pending) on a stream with queued work while a
/// third records an event on it and destroys it; a per-stream fault armed on
/// `query_stream` sends the first such query (whichever thread makes it)
/// through the write lock. Every call is counted exactly once, the fault fires exactly once,
/// each query sees the stream either live (pending work) or destroyed (an
/// error, logged once as a misuse), never anything between.
#[test]
fn queries_race_destroy_and_record() {
    model_deep(|| {
        let (mock, s, e) = mock_stream_and_event();
        mock.enqueue_work(s).unwrap();
        mock.fail_stream(CallKind::QueryStream, s);
        // SAFETY: (every call on `s` and `e` in this model) both were made on
        // `D` by this mock. The queries race the destroy of `s` on purpose, so
        // `s` may be gone when they run: the mock's trait methods are sound
        // for any handle, and a destroyed stream is an error and a logged
        // misuse (what this model checks), never undefined behaviour.
        let a = spawn_scoped(|| unsafe {
            let stream = [mock.query_stream(s, D), mock.query_stream(s, D)];
            let event = mock.query_event(e, D);
            (stream, event)
        });
        // SAFETY: as above.
        let b = spawn_scoped(|| unsafe {
            let stream = [mock.query_stream(s, D), mock.query_stream(s, D)];
            let device = mock.stream_device(s);
            assert_eq!(mock.current_device(), Ok(D));
            (stream, device)
        });
        // SAFETY: as above.
        unsafe { mock.record_event(e, s, D) }.unwrap();
        // SAFETY: as above; only the racing queries use `s` after this.
        unsafe { mock.destroy_stream(s, D) }.unwrap();
        let (queries_a, event) = a.join();
        let (queries_b, device) = b.join();

        let gone = Err(MockError::InvalidStream(s));
        let injected = Err(MockError::Injected(CallKind::QueryStream));
        let queries = [queries_a, queries_b].concat();
        let fired = queries.iter().filter(|&q| *q == injected).count();
        assert_eq!(fired, 1, "the armed fault fired once: {queries:?}");
        let mut expected_misuses = 0;
        for query in queries {
            assert!(
                query == Ok(Completion::Pending) || query == gone || query == injected,
                "{query:?}"
            );
            expected_misuses += usize::from(query == gone);
        }
        assert!(device == Ok(D) || device == Err(MockError::InvalidStream(s)));
        expected_misuses += usize::from(device.is_err());
        // Recorded behind the pending work: pending until the stream is
        // destroyed (its work then counts as finished); never recorded:
        // complete.
        assert!(event.is_ok(), "{event:?}");

        let misuses = mock.misuses();
        assert_eq!(misuses.len(), expected_misuses, "{misuses:?}");
        for m in &misuses {
            assert!(
                matches!(m.call, CallKind::QueryStream | CallKind::StreamDevice),
                "{m:?}"
            );
            assert_eq!(m.error, MockError::InvalidStream(s));
        }
        assert_eq!(mock.armed_faults(), 0);
        assert_calls(
            &mock,
            &[
                CallKind::QueryStream,
                CallKind::QueryEvent,
                CallKind::StreamDevice,
                CallKind::CurrentDevice,
                CallKind::RecordEvent,
                CallKind::DestroyStream,
            ],
            &[4, 1, 1, 1, 1, 1],
        );
        assert_eq!(mock.total_calls(), 2 + 9);
        // SAFETY: as above; the threads are joined.
        let state = unsafe { mock.query_event(e, D) };
        assert_eq!(state, Ok(Completion::Complete));
        // SAFETY: as above; nothing uses `e` after this.
        unsafe { mock.destroy_event(e, D) }.unwrap();
        assert_eq!((mock.live_streams(), mock.live_events()), (0, 0));
        assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    });
}
