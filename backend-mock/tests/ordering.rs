//! The mock's simulation of stream order: work queues, events as positions,
//! waits across streams and devices, synchronization through wait chains, the
//! special streams, destroyed streams, and the `Immediate` policy.
//!
//! Nearly every line is a call of the backend traits, whose handle-taking
//! methods are `unsafe fn`s (for real drivers); the mock's are sound for any
//! handle, so each test runs them in one `unsafe` block.
#![cfg(not(loom))]

use gpupool_core::{Completion, DeviceId, EventBackend, EventHandle, StreamBackend, StreamHandle};
use gpupool_mock::{CompletionPolicy, MockBackend, MockError};

use Completion::{Complete, Pending};

mod common;
use common::{event, mock_with_stream, stream, D0, D1};

/// Two streams `a` and `b` and an event `e` of `mock`'s device 0: work is
/// queued on `a`, `e` recorded after it, and `b` waits on `e`.
fn b_waits_on_work_of_a(mock: &MockBackend) -> (StreamHandle, StreamHandle, EventHandle) {
    let (a, b) = (stream(mock, D0), stream(mock, D0));
    let e = event(mock, D0);
    mock.enqueue_work(a).unwrap();
    // SAFETY: all three are live handles of this mock's device 0, made above.
    unsafe {
        mock.record_event(e, a, D0).unwrap();
        mock.stream_wait_event(b, D0, e).unwrap();
    }
    (a, b, e)
}

#[test]
fn work_completes_in_order_one_at_a_time() {
    let (mock, s) = mock_with_stream(1);
    // SAFETY: a handle the mock never made, on purpose: the mock checks every
    // handle it is given (see `MockBackend`'s safety section).
    let bogus = unsafe { StreamHandle::from_raw(0x4242) };
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        assert_eq!(mock.query_stream(s, D0), Ok(Complete));
        assert_eq!(mock.complete_one(s), Ok(false));
        for _ in 0..3 {
            mock.enqueue_work(s).unwrap();
        }
        assert_eq!(mock.pending_work(s), Ok(3));
        assert_eq!(mock.query_stream(s, D0), Ok(Pending));
        assert_eq!(mock.complete_one(s), Ok(true));
        assert_eq!(mock.pending_work(s), Ok(2));
        mock.complete_all(s).unwrap();
        assert_eq!(mock.pending_work(s), Ok(0));
        assert_eq!(mock.query_stream(s, D0), Ok(Complete));
        assert_eq!(
            mock.enqueue_work(bogus),
            Err(MockError::InvalidStream(bogus))
        );
    }
}

#[test]
fn event_completes_when_its_stream_passes_the_record() {
    let (mock, s) = mock_with_stream(1);
    let e = event(&mock, D0);
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        assert_eq!(mock.query_event(e, D0), Ok(Complete), "never recorded");
        mock.enqueue_work(s).unwrap();
        mock.record_event(e, s, D0).unwrap();
        mock.enqueue_work(s).unwrap(); // after the record: not captured
        assert_eq!(mock.query_event(e, D0), Ok(Pending));
        mock.complete_one(s).unwrap();
        assert_eq!(mock.query_event(e, D0), Ok(Complete));
        assert_eq!(mock.query_stream(s, D0), Ok(Pending));
        // Re-recording captures the new position.
        mock.record_event(e, s, D0).unwrap();
        assert_eq!(mock.query_event(e, D0), Ok(Pending));
        mock.synchronize_event(e, D0).unwrap();
        assert_eq!(mock.query_event(e, D0), Ok(Complete));
        assert_eq!(mock.query_stream(s, D0), Ok(Complete));
    }
}

#[test]
fn waits_block_until_the_event_completes_across_streams() {
    let mock = MockBackend::new(1);
    let (a, b) = (stream(&mock, D0), stream(&mock, D0));
    let (ea, eb) = (event(&mock, D0), event(&mock, D0));
    // A wait on an event already complete is nothing at all.
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        mock.stream_wait_event(b, D0, ea).unwrap();
        assert_eq!(mock.query_stream(b, D0), Ok(Complete));

        mock.enqueue_work(a).unwrap();
        mock.enqueue_work(a).unwrap();
        mock.record_event(ea, a, D0).unwrap();
        mock.stream_wait_event(b, D0, ea).unwrap();
        mock.enqueue_work(b).unwrap();
        mock.record_event(eb, b, D0).unwrap();
        assert_eq!(mock.query_stream(b, D0), Ok(Pending));
        assert_eq!(mock.pending_work(b), Ok(1), "waits are not work");
        assert_eq!(mock.complete_one(b), Ok(false), "blocked on the wait");
        mock.complete_one(a).unwrap();
        assert_eq!(mock.complete_one(b), Ok(false), "still blocked");
        mock.complete_one(a).unwrap();
        assert_eq!(mock.query_event(ea, D0), Ok(Complete));
        assert_eq!(mock.query_event(eb, D0), Ok(Pending));
        assert_eq!(mock.complete_one(b), Ok(true), "the wait resolved itself");
        assert_eq!(mock.query_event(eb, D0), Ok(Complete));
        // Re-recording `ea` later does not change what `b` waited for.
        mock.enqueue_work(a).unwrap();
        mock.record_event(ea, a, D0).unwrap();
        assert_eq!(mock.query_stream(b, D0), Ok(Complete));
    }
}

#[test]
fn a_stream_without_work_after_a_satisfied_wait_is_idle() {
    let mock = MockBackend::new(1);
    let (a, b, _e) = b_waits_on_work_of_a(&mock);
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        assert_eq!(mock.query_stream(b, D0), Ok(Pending));
        mock.complete_all(a).unwrap();
        assert_eq!(mock.query_stream(b, D0), Ok(Complete));
    }
}

#[test]
fn synchronize_drains_through_a_wait_chain() {
    let mock = MockBackend::new(2);
    // s0 (device 0) -> s1 (device 1) -> s2 (device 0): each waits on the last.
    let s = [stream(&mock, D0), stream(&mock, D1), stream(&mock, D0)];
    let d = [D0, D1, D0];
    let e = [event(&mock, D0), event(&mock, D1)];
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        for i in 0..3 {
            if i > 0 {
                // Waiting on another device's event is allowed.
                mock.stream_wait_event(s[i], d[i], e[i - 1]).unwrap();
            }
            mock.enqueue_work(s[i]).unwrap();
            if i < 2 {
                mock.record_event(e[i], s[i], d[i]).unwrap();
            }
            mock.enqueue_work(s[i]).unwrap(); // after the record: not needed below
        }
        mock.synchronize_stream(s[2], D0).unwrap();
        assert_eq!(mock.query_stream(s[2], D0), Ok(Complete));
        // Only what s2 depended on was completed: up to the records, not beyond.
        assert_eq!(mock.query_event(e[0], D0), Ok(Complete));
        assert_eq!(mock.query_event(e[1], D1), Ok(Complete));
        assert_eq!(mock.pending_work(s[0]), Ok(1));
        assert_eq!(mock.pending_work(s[1]), Ok(1));
        mock.complete_everything();
        for i in 0..3 {
            assert_eq!(mock.query_stream(s[i], d[i]), Ok(Complete));
        }
        assert!(mock.misuses().is_empty());
    }
}

#[test]
fn synchronize_event_drains_only_what_it_captured() {
    let mock = MockBackend::new(1);
    let (a, b) = (stream(&mock, D0), stream(&mock, D0));
    let (ea, eb) = (event(&mock, D0), event(&mock, D0));
    mock.enqueue_work(a).unwrap();
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        mock.record_event(ea, a, D0).unwrap();
        mock.enqueue_work(a).unwrap();
        mock.stream_wait_event(b, D0, ea).unwrap();
        mock.enqueue_work(b).unwrap();
        mock.record_event(eb, b, D0).unwrap();
        mock.synchronize_event(eb, D0).unwrap();
        assert_eq!(mock.query_event(eb, D0), Ok(Complete));
        assert_eq!(mock.pending_work(a), Ok(1));
        assert_eq!(mock.pending_work(b), Ok(0));
    }
}

#[test]
fn destroyed_stream_work_counts_as_finished() {
    let mock = MockBackend::new(1);
    let (a, b, e) = b_waits_on_work_of_a(&mock);
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        mock.enqueue_work(b).unwrap();
        mock.destroy_stream(a, D0).unwrap();
        assert_eq!(mock.query_event(e, D0), Ok(Complete));
        assert_eq!(mock.complete_one(b), Ok(true));
        assert_eq!(mock.query_stream(b, D0), Ok(Complete));
        // Destroying a stream blocked on a wait is fine too.
        let c = stream(&mock, D0);
        mock.enqueue_work(b).unwrap();
        mock.record_event(e, b, D0).unwrap();
        mock.stream_wait_event(c, D0, e).unwrap();
        mock.destroy_stream(c, D0).unwrap();
        mock.complete_everything();
        assert_eq!(mock.live_streams(), 1);
    }
}

#[test]
fn null_and_legacy_are_one_implicit_stream_per_device_and_per_thread_another() {
    let mock = MockBackend::new(2);
    let e = event(&mock, D1);
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        for h in [
            StreamHandle::NULL,
            StreamHandle::LEGACY,
            StreamHandle::PER_THREAD,
        ] {
            assert_eq!(mock.query_stream(h, D1), Ok(Complete));
            mock.synchronize_stream(h, D0).unwrap();
            mock.record_event(e, h, D1).unwrap();
        }
        assert_eq!(
            mock.query_stream(StreamHandle::NULL, DeviceId(2)),
            Err(MockError::InvalidDevice(DeviceId(2)))
        );
        // Work on the current device's implicit stream, seen through the
        // null and legacy handles, not the per-thread stream's.
        mock.set_current_device(D1);
        mock.enqueue_work(StreamHandle::NULL).unwrap();
        mock.record_event(e, StreamHandle::LEGACY, D1).unwrap();
        assert_eq!(mock.query_stream(StreamHandle::LEGACY, D1), Ok(Pending));
        assert_eq!(
            mock.query_stream(StreamHandle::PER_THREAD, D1),
            Ok(Complete)
        );
        assert_eq!(mock.query_stream(StreamHandle::NULL, D0), Ok(Complete));
        let s = stream(&mock, D0);
        mock.stream_wait_event(s, D0, e).unwrap();
        assert_eq!(mock.query_stream(s, D0), Ok(Pending));
        mock.synchronize_stream(s, D0).unwrap();
        assert_eq!(mock.query_event(e, D1), Ok(Complete));
        assert_eq!(mock.pending_work(StreamHandle::NULL), Ok(0));
        assert_eq!(
            mock.live_streams(),
            1,
            "implicit streams are not live streams"
        );
        assert!(mock.misuses().len() == 1);
    }
}

#[test]
fn immediate_policy_completes_work_at_once() {
    let mock = MockBackend::new(1);
    mock.set_policy(CompletionPolicy::Immediate);
    let (a, b) = (stream(&mock, D0), stream(&mock, D0));
    let e = event(&mock, D0);
    mock.enqueue_work(a).unwrap();
    assert_eq!(mock.pending_work(a), Ok(0));
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        assert_eq!(mock.query_stream(a, D0), Ok(Complete));
        mock.record_event(e, a, D0).unwrap();
        assert_eq!(mock.query_event(e, D0), Ok(Complete));
        mock.stream_wait_event(b, D0, e).unwrap();
        mock.enqueue_work(b).unwrap();
        assert_eq!(mock.query_stream(b, D0), Ok(Complete));
        // Back to Manual: new work stays queued.
        mock.set_policy(CompletionPolicy::Manual);
        mock.enqueue_work(a).unwrap();
        assert_eq!(mock.query_stream(a, D0), Ok(Pending));
    }
}

#[test]
fn switching_to_immediate_completes_queued_work_and_releases_waits() {
    let mock = MockBackend::new(1);
    let (a, b, c) = (stream(&mock, D0), stream(&mock, D0), stream(&mock, D0));
    let (ea, eb) = (event(&mock, D0), event(&mock, D0));
    // a: work, work | b: wait(a), work | c: wait(b), work -- all under Manual.
    mock.enqueue_work(a).unwrap();
    mock.enqueue_work(a).unwrap();
    // SAFETY: every handle is this mock's, with its own device, live where
    // it is used; where not, on purpose, the mock reports it (its trait
    // methods are sound for any handle: see `MockBackend`'s safety section).
    unsafe {
        mock.record_event(ea, a, D0).unwrap();
        mock.stream_wait_event(b, D0, ea).unwrap();
        mock.enqueue_work(b).unwrap();
        mock.record_event(eb, b, D0).unwrap();
        mock.stream_wait_event(c, D0, eb).unwrap();
        mock.enqueue_work(c).unwrap();
        assert_eq!(mock.complete_one(c), Ok(false));
        assert_eq!(mock.query_stream(c, D0), Ok(Pending));
        mock.set_policy(CompletionPolicy::Immediate);
        for s in [a, b, c] {
            assert_eq!(mock.query_stream(s, D0), Ok(Complete));
            assert_eq!(mock.pending_work(s), Ok(0));
        }
        assert_eq!(mock.query_event(eb, D0), Ok(Complete));
        assert!(mock.misuses().is_empty());
    }
}
