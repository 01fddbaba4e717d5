//! The mock's bookkeeping: call counts, fault injection, live handles, the
//! misuse log, recorded flags and priorities, and a many-thread smoke test.
#![cfg(not(loom))]

use gpupool_core::{
    Backend, DeviceId, EventBackend, EventFlags, EventHandle, StreamBackend, StreamHandle,
    StreamOptions,
};
use gpupool_mock::{CallKind, Misuse, MockBackend, MockError};

mod common;
use common::{on_threads, D0, D1};

fn opts() -> StreamOptions {
    StreamOptions::default()
}

#[test]
fn fault_fires_exactly_on_the_nth_call_and_has_no_effect() {
    let mock = MockBackend::new(1);
    mock.fail_nth(CallKind::CreateStream, 3);
    assert_eq!(mock.armed_faults(), 1);
    let a = mock.create_stream(D0, opts()).unwrap();
    let b = mock.create_stream(D0, opts()).unwrap();
    assert_eq!(
        mock.create_stream(D0, opts()),
        Err(MockError::Injected(CallKind::CreateStream))
    );
    assert_eq!(mock.armed_faults(), 0);
    assert_eq!(mock.live_streams(), 2);
    assert_eq!(mock.calls(CallKind::CreateStream), 3);
    let c = mock.create_stream(D0, opts()).unwrap();
    assert!(a < b && b < c);
    assert_eq!(mock.live_streams(), 3);
    // Injected failures are not misuses.
    assert!(mock.misuses().is_empty());
}

#[test]
fn fault_counts_from_the_moment_it_is_armed() {
    let mock = MockBackend::new(1);
    let e = mock.create_event(D0, EventFlags::default()).unwrap();
    mock.fail_nth(CallKind::CreateEvent, 1);
    mock.fail_nth(CallKind::DestroyEvent, 1);
    assert_eq!(mock.armed_faults(), 2);
    assert!(mock.create_event(D0, EventFlags::default()).is_err());
    // SAFETY: `e` is a live event of device 0 of this mock, and the first
    // destroy fails with no effect (injected), so the second one ends it.
    let r = unsafe { mock.destroy_event(e, D0) };
    assert_eq!(r, Err(MockError::Injected(CallKind::DestroyEvent)));
    // The failed destroy had no effect: the event is still there.
    assert!(mock.is_live_event(e));
    // SAFETY: as above.
    unsafe { mock.destroy_event(e, D0) }.unwrap();
    assert_eq!(mock.live_events(), 0);
    assert_eq!(mock.calls(CallKind::CreateEvent), 2);
    assert_eq!(mock.calls(CallKind::DestroyEvent), 2);
}

#[test]
fn fault_fires_before_validation_and_can_be_cleared() {
    let mock = MockBackend::new(1);
    mock.fail_nth(CallKind::DestroyStream, 1);
    // Even a bad call fails with the injected error first, and is no misuse.
    // SAFETY: a handle the mock never made, on purpose: the mock's trait
    // methods are sound for any handle (it checks each one and reports a
    // misuse; see `MockBackend`'s safety section).
    let bogus = unsafe { StreamHandle::from_raw(0x7777) };
    // SAFETY: as above.
    let r = unsafe { mock.destroy_stream(bogus, D0) };
    assert_eq!(r, Err(MockError::Injected(CallKind::DestroyStream)));
    assert!(mock.misuses().is_empty());
    mock.fail_nth(CallKind::QueryStream, 2);
    mock.fail_nth(CallKind::DeviceCount, 1);
    mock.fail_nth(CallKind::DeviceCount, 0); // arms nothing
    assert_eq!(mock.armed_faults(), 2);
    mock.clear_faults();
    assert_eq!(mock.armed_faults(), 0);
    assert_eq!(mock.device_count(), Ok(1));
}

#[test]
fn calls_are_counted_by_kind() {
    let mock = MockBackend::new(2);
    assert_eq!(mock.total_calls(), 0);
    mock.device_count().unwrap();
    mock.current_device().unwrap();
    let s = mock.create_stream(D1, opts()).unwrap();
    // SAFETY: `s` is a live stream of this mock.
    assert_eq!(unsafe { mock.stream_device(s) }, Ok(D1));
    // SAFETY: the wrong device, on purpose: the mock's trait methods are sound
    // for any handle (it checks each one and reports a misuse).
    let _ = unsafe { mock.query_stream(s, D0) }; // counted all the same
    assert_eq!(mock.calls(CallKind::DeviceCount), 1);
    assert_eq!(mock.calls(CallKind::CurrentDevice), 1);
    assert_eq!(mock.calls(CallKind::QueryStream), 1);
    assert_eq!(mock.calls(CallKind::SynchronizeEvent), 0);
    assert_eq!(mock.total_calls(), 5);
}

#[test]
fn live_counts_follow_create_and_destroy() {
    let mock = MockBackend::new(2);
    let a = mock.create_stream(D0, opts()).unwrap();
    let b = mock.create_stream(D1, opts()).unwrap();
    let c = mock.create_stream(D1, opts()).unwrap();
    let e = mock.create_event(D1, EventFlags::default()).unwrap();
    assert_eq!(mock.live_streams(), 3);
    assert_eq!(mock.live_streams_on(D0), 1);
    assert_eq!(mock.live_streams_on(D1), 2);
    assert_eq!(mock.live_events(), 1);
    assert!(mock.is_live_stream(b) && mock.is_live_event(e));
    assert!(!mock.is_live_stream(StreamHandle::NULL));
    // SAFETY: live streams and an event of this mock, each with its own
    // device; each is destroyed once and not used after.
    unsafe { mock.destroy_stream(b, D1) }.unwrap();
    assert!(!mock.is_live_stream(b));
    assert_eq!(mock.live_streams_on(D1), 1);
    // SAFETY: as above.
    unsafe {
        mock.destroy_stream(a, D0).unwrap();
        mock.destroy_stream(c, D1).unwrap();
        mock.destroy_event(e, D1).unwrap();
    }
    assert_eq!((mock.live_streams(), mock.live_events()), (0, 0));
    assert!(mock.misuses().is_empty());
}

#[test]
fn handles_are_never_reused_and_never_special() {
    let mock = MockBackend::new(1);
    let s1 = mock.create_stream(D0, opts()).unwrap();
    // SAFETY: a live stream of this mock, destroyed once and not used after.
    unsafe { mock.destroy_stream(s1, D0) }.unwrap();
    let s2 = mock.create_stream(D0, opts()).unwrap();
    let e1 = mock.create_event(D0, EventFlags::default()).unwrap();
    // SAFETY: a live event of this mock, destroyed once and not used after.
    unsafe { mock.destroy_event(e1, D0) }.unwrap();
    let e2 = mock.create_event(D0, EventFlags::default()).unwrap();
    assert!(s1 != s2 && e1 != e2);
    assert!(!s1.is_special() && !e1.is_null());
    assert!(
        s2.as_raw() < e1.as_raw(),
        "stream and event handles are in distinct ranges"
    );
}

#[test]
fn misuse_is_detected_and_logged_in_order() {
    let mock = MockBackend::new(2);
    let s = mock.create_stream(D0, opts()).unwrap();
    let e = mock.create_event(D0, EventFlags::default()).unwrap();
    let t = mock.create_stream(D1, opts()).unwrap();
    // SAFETY: a handle the mock never made, on purpose: the mock's trait
    // methods are sound for any handle (it checks each one and reports a
    // misuse; see `MockBackend`'s safety section).
    let bogus = unsafe { EventHandle::from_raw(12345) };
    let cross = MockError::CrossDevice {
        given: D1,
        actual: D0,
    };
    // SAFETY: every call below but the first misuses a handle on purpose; the
    // mock's trait methods are sound for any handle (see above).
    unsafe {
        mock.destroy_stream(s, D0).unwrap();
        // Double destroy.
        assert_eq!(mock.destroy_stream(s, D0), Err(MockError::InvalidStream(s)));
        // Unknown event; device out of range; wrong device.
        assert_eq!(
            mock.query_event(bogus, D0),
            Err(MockError::InvalidEvent(bogus))
        );
        assert_eq!(
            mock.create_stream(DeviceId(2), opts()),
            Err(MockError::InvalidDevice(DeviceId(2)))
        );
        assert_eq!(mock.destroy_event(e, D1), Err(cross.clone()));
        // Recording an event of device 0 on a stream of device 1.
        assert_eq!(mock.record_event(e, t, D1), Err(cross.clone()));
        // The special streams cannot be destroyed.
        assert_eq!(
            mock.destroy_stream(StreamHandle::NULL, D0),
            Err(MockError::InvalidStream(StreamHandle::NULL))
        );
    }
    let expected = [
        (CallKind::DestroyStream, MockError::InvalidStream(s)),
        (CallKind::QueryEvent, MockError::InvalidEvent(bogus)),
        (
            CallKind::CreateStream,
            MockError::InvalidDevice(DeviceId(2)),
        ),
        (CallKind::DestroyEvent, cross.clone()),
        (CallKind::RecordEvent, cross),
        (
            CallKind::DestroyStream,
            MockError::InvalidStream(StreamHandle::NULL),
        ),
    ];
    let expected: Vec<Misuse> = expected
        .into_iter()
        .map(|(call, error)| Misuse {
            call,
            error,
            harness: None,
        })
        .collect();
    assert_eq!(mock.misuses(), expected);
    // Nothing was changed by the failed calls.
    assert!(mock.is_live_event(e) && mock.is_live_stream(t));
    assert_eq!(mock.live_streams(), 1);
}

#[test]
fn flags_priorities_and_current_device_are_recorded() {
    let mock = MockBackend::new(3);
    let flags = EventFlags::DISABLE_TIMING | EventFlags::BLOCKING_SYNC;
    let e = mock.create_event(D0, flags).unwrap();
    assert_eq!(mock.event_flags(e), Some(flags));
    let hi = mock
        .create_stream(D0, StreamOptions { priority: Some(-2) })
        .unwrap();
    let default = mock.create_stream(D0, opts()).unwrap();
    assert_eq!(mock.stream_priority(hi), Some(Some(-2)));
    assert_eq!(mock.stream_priority(default), Some(None));
    // SAFETY: a live stream of this mock, destroyed once and not used after.
    unsafe { mock.destroy_stream(hi, D0) }.unwrap();
    assert_eq!(mock.stream_priority(hi), None);
    assert_eq!(mock.current_device(), Ok(D0));
    mock.set_current_device(DeviceId(2));
    assert_eq!(mock.clone().current_device(), Ok(DeviceId(2)));
    // SAFETY: a special stream, which names the current device's.
    let current = unsafe { mock.stream_device(StreamHandle::PER_THREAD) };
    assert_eq!(current, Ok(DeviceId(2)));
    assert!(!format!("{mock:?}").is_empty());
    assert!(MockError::Injected(CallKind::QueryEvent)
        .to_string()
        .contains("QueryEvent"));
}

#[test]
fn many_threads_create_and_destroy() {
    const THREADS: usize = 4;
    const ROUNDS: usize = if cfg!(miri) { 5 } else { 200 };
    let mock = MockBackend::new(2);
    on_threads(&mock, THREADS, |mock, t| {
        let d = DeviceId(t as u32 % 2);
        for _ in 0..ROUNDS {
            let s = mock.create_stream(d, opts()).unwrap();
            let e = mock.create_event(d, EventFlags::default()).unwrap();
            mock.enqueue_work(s).unwrap();
            // SAFETY: `s` and `e` are live handles of this mock on `d`, made
            // just above; each is destroyed once, last.
            unsafe {
                mock.record_event(e, s, d).unwrap();
                mock.synchronize_event(e, d).unwrap();
                mock.destroy_event(e, d).unwrap();
                mock.destroy_stream(s, d).unwrap();
            }
        }
    });
    let n = (THREADS * ROUNDS) as u64;
    assert_eq!(mock.calls(CallKind::CreateStream), n);
    assert_eq!(mock.calls(CallKind::DestroyEvent), n);
    assert_eq!((mock.live_streams(), mock.live_events()), (0, 0));
    assert!(mock.misuses().is_empty());
}

#[test]
fn each_machine_has_its_own_id_and_clones_share_it() {
    let a = MockBackend::new(1);
    let b = MockBackend::new(1);
    assert_ne!(a.id(), b.id(), "two machines are two drivers");
    assert_eq!(a.clone().id(), a.id(), "a clone is the same machine");
    assert_eq!(a.id(), a.id(), "the id never changes");
    // Asking is no backend call.
    assert_eq!(a.total_calls(), 0);
}
