//! Mock-only: a seventh adversarial review, of the capture interaction mode
//! the first poll's spin relaxes (`EventBackend::relaxed_queries`) and the
//! engine thread's mode. Finding, fixed: the engine's thread was relaxed for
//! good (`prepare_query_thread`), so a waker's calls on it skipped the
//! checks every other thread gets
//! (`a_waker_on_the_engine_thread_is_checked_like_any_thread`); the engine
//! now relaxes only around each pass's queries and wakes tasks after.
//!
//! The probe of a thread's mode: a host-order `wait_event` on an event never
//! recorded is one `synchronize_event`, a potentially unsafe call. With a
//! foreign capture the thread must respect open (thread-local on the thread,
//! or global anywhere), the mock refuses it (`CaptureProhibited`, and
//! invalidates that capture) unless the thread's mode is relaxed.
//!
//! Safe code only, but for one helper (`raw_begin_capture`, as in attacks6):
//! the mock's harness `begin_capture` on a stream made straight from the mock
//! that no gpupool pool, lease or order ever holds (another library's
//! `cuStreamBeginCapture`).
#![cfg(not(feature = "cuda"))]
#![deny(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Wake, Waker};
use std::thread;
use std::time::Duration;

use super::common::{busy_lease, leases};
use super::future_kit::*;
use gpupool_core::{
    AccessOrder, BackendOp, CaptureMode, DeviceId, Error, EventBackend, EventPool, StreamBackend,
    StreamHandle, StreamPool, DEFAULT_COMPLETION_SPIN,
};
use gpupool_mock::{MockBackend, MockError};

/// As attacks6: a capture another library begins with the raw call.
#[allow(unsafe_code)]
fn raw_begin_capture(gpu: &MockBackend, stream: StreamHandle, mode: CaptureMode) {
    // SAFETY: `stream` was made by `gpu.create_stream` in the test and is
    // never handed to a gpupool pool, lease or order.
    unsafe { gpu.begin_capture(stream, mode) }.unwrap();
}

fn raw_stream(gpu: &MockBackend) -> StreamHandle {
    gpu.create_stream(DeviceId(0), Default::default()).unwrap()
}

/// What the probe found: `true` if the calling thread's potentially unsafe
/// call went through (relaxed, or nothing prohibits it), `false` if it was
/// refused as prohibited.
fn probe(events: &EventPool<MockBackend>) -> bool {
    let e = events.get(0).unwrap();
    match AccessOrder::host().wait_event(&e) {
        Ok(()) => true,
        Err(Error::Backend {
            op: BackendOp::SynchronizeEvent,
            source: MockError::CaptureProhibited(_),
        }) => false,
        Err(other) => panic!("probe: {other:?}"),
    }
}

/// A foreign thread-local capture on this thread, `probe` run by `inside`,
/// then: whether each probe went through, and whether the capture ended
/// unbroken.
fn with_thread_local_capture(
    gpu: &MockBackend,
    inside: impl FnOnce() -> Vec<bool>,
) -> (Vec<bool>, bool) {
    let raw = raw_stream(gpu);
    raw_begin_capture(gpu, raw, CaptureMode::ThreadLocal);
    let got = inside();
    let ended = gpu.end_capture(raw).is_ok();
    (got, ended)
}

// Control: the probe is refused on a thread with its own thread-local
// capture open, and the refusal breaks that capture.
#[test]
fn control_probe_refused_under_own_thread_local_capture() {
    let (gpu, _streams, events) = machine(1);
    let (got, ended) = with_thread_local_capture(&gpu, || vec![probe(&events)]);
    assert_eq!((got, ended), (vec![false], false));
}

#[test]
fn nested_relaxed_queries_restore_in_order() {
    let (gpu, _streams, events) = machine(1);
    // Inside outer, inside inner, back in outer: relaxed all along; after:
    // not relaxed (probed under a fresh capture).
    let (got, ended) = with_thread_local_capture(&gpu, || {
        let mut seen = Vec::new();
        gpu.relaxed_queries(&mut || {
            seen.push(probe(&events));
            gpu.relaxed_queries(&mut || seen.push(probe(&events)));
            seen.push(probe(&events));
        });
        seen
    });
    assert_eq!((got, ended), (vec![true, true, true], true));
    let (after, ended) = with_thread_local_capture(&gpu, || vec![probe(&events)]);
    assert_eq!((after, ended), (vec![false], false), "left relaxed");
}

#[test]
fn a_panic_inside_relaxed_queries_restores_the_mode() {
    let (gpu, _streams, events) = machine(1);
    for nested in [false, true] {
        let r = catch_unwind(AssertUnwindSafe(|| {
            gpu.relaxed_queries(&mut || {
                if nested {
                    gpu.relaxed_queries(&mut || panic!("inner queries panic"));
                }
                panic!("queries panic");
            })
        }));
        assert!(r.is_err());
        let (after, ended) = with_thread_local_capture(&gpu, || vec![probe(&events)]);
        assert_eq!(
            (after, ended),
            (vec![false], false),
            "nested {nested}: left relaxed"
        );
    }
}

#[test]
fn relaxed_queries_is_forwarded_through_ref_arc_and_box() {
    let (gpu, _streams, events) = machine(1);
    let arc = Arc::new(gpu.clone());
    let boxed = Box::new(gpu.clone());
    let by_ref = &gpu;
    let (got, ended) = with_thread_local_capture(&gpu, || {
        let mut seen = Vec::new();
        EventBackend::relaxed_queries(&by_ref, &mut || seen.push(probe(&events)));
        EventBackend::relaxed_queries(&arc, &mut || seen.push(probe(&events)));
        EventBackend::relaxed_queries(&boxed, &mut || seen.push(probe(&events)));
        seen
    });
    assert_eq!((got, ended), (vec![true, true, true], true));
}

// The spin relaxes only its own queries: the polling thread's later calls
// are checked as before (whether the spin resolved the future or not).
#[test]
fn the_polling_thread_is_not_left_relaxed_after_a_first_poll() {
    let (gpu, streams, events) = machine(1);
    let lease = streams.get(0).unwrap();
    let (_, w) = flag();
    for done_before in [false, true] {
        gpu.enqueue_work(lease.handle()).unwrap();
        let mut f = lease.order().completed(&events).unwrap();
        if done_before {
            gpu.complete_all(lease.handle()).unwrap();
        }
        let (got, ended) = with_thread_local_capture(&gpu, || {
            let first = poll(&mut f, &w);
            assert_eq!(first.is_ready(), done_before);
            vec![probe(&events)]
        });
        assert_eq!(
            (got, ended),
            (vec![false], false),
            "done before: {done_before}"
        );
        gpu.complete_all(lease.handle()).unwrap();
        assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
    }
}

// A long spin on one thread relaxes that thread only: another thread with
// its own thread-local capture is checked meanwhile.
#[test]
fn a_long_spin_relaxes_no_other_thread() {
    let (gpu, streams, events) = machine(1);
    events.set_completion_spin(Duration::from_millis(if cfg!(miri) { 2000 } else { 300 }));
    let (lease, mut f) = busy_lease_and_future(&gpu, &streams, &events);
    let (_, w) = flag();
    let got = thread::scope(|s| {
        let h = s.spawn(|| {
            thread::sleep(Duration::from_millis(20));
            with_thread_local_capture(&gpu, || vec![probe(&events)])
        });
        let first = poll(&mut f, &w);
        assert!(first.is_pending());
        h.join().unwrap()
    });
    assert_eq!(got, (vec![false], false));
    gpu.complete_all(lease.handle()).unwrap();
    assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
}

// The spin under a thread-local capture gpupool itself began on the same
// thread, on another stream, and on the future's own stream (begun after
// the record): neither capture is broken, the future resolves once the
// work ran, and the thread is checked as before afterwards.
#[test]
fn the_spin_inside_gpupool_thread_local_captures_on_the_same_thread() {
    let (gpu, streams, events) = machine(1);
    let [a, b] = leases(&streams);
    let (_, w) = flag();
    for spin in [DEFAULT_COMPLETION_SPIN, Duration::from_millis(5)] {
        events.set_completion_spin(spin);
        for on_own_stream in [false, true] {
            gpu.enqueue_work(a.handle()).unwrap();
            let mut f = a.order().completed(&events).unwrap();
            let cap = if on_own_stream { &a } else { &b };
            cap.begin_capture(CaptureMode::ThreadLocal).unwrap();
            gpu.enqueue_work(cap.handle()).unwrap();
            assert!(poll(&mut f, &w).is_pending());
            gpu.enqueue_work(cap.handle()).unwrap();
            let graph = cap.end_capture().expect("the capture was not broken");
            assert_eq!(graph.node_count(), 2);
            drop(graph);
            gpu.complete_all(a.handle()).unwrap();
            assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
        }
    }
    drop((a, b));
    drop(events);
    assert_clean(&gpu);
}

/// A waker that runs `job` on whichever thread wakes it (the engine's), once.
struct OnWake {
    job: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    done: mpsc::Sender<()>,
}

impl Wake for OnWake {
    fn wake(self: Arc<Self>) {
        if let Some(job) = self.job.lock().unwrap().take() {
            job();
            let _ = self.done.send(());
        }
    }
}

/// Runs `job` in the wake of a future resolved by the engine (spin off);
/// returns once it ran.
fn in_a_wake(
    gpu: &MockBackend,
    streams: &StreamPool<MockBackend>,
    events: &EventPool<MockBackend>,
    job: Box<dyn FnOnce() + Send>,
) {
    events.set_completion_spin(Duration::ZERO);
    let lease = busy_lease(gpu, streams);
    let mut f = lease.order().completed(events).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = Waker::from(Arc::new(OnWake {
        job: Mutex::new(Some(job)),
        done: tx,
    }));
    assert!(poll(&mut f, &w).is_pending());
    gpu.complete_all(lease.handle()).unwrap();
    rx.recv_timeout(LONG).expect("the wake ran");
    assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
}

// Should: code a waker runs (an executor that polls a task inside `wake`)
// sees the thread's capture interaction mode as on any thread: a task that
// begins its own thread-local capture there and then makes a potentially
// unsafe call is refused, as it would be on the runtime's threads. Fails:
// the engine's thread is relaxed for good (`prepare_query_thread`, on the
// mock as on CUDA), and wakers run on it, so the call goes through unchecked
// (on CUDA: e.g. a `cuMemAlloc` or a sync call in the middle of the task's
// capture is neither refused nor captured).
#[test]
fn a_waker_on_the_engine_thread_is_checked_like_any_thread() {
    let (gpu, streams, events) = machine(1);
    let events = Arc::new(events);
    let out = Arc::new(Mutex::new(None));
    let (g2, e2, o2) = (gpu.clone(), Arc::clone(&events), Arc::clone(&out));
    in_a_wake(
        &gpu,
        &streams,
        &events,
        Box::new(move || {
            let on_engine = thread::current().name() == Some("gpupool-completion");
            let got = with_thread_local_capture(&g2, || vec![probe(&e2)]);
            *o2.lock().unwrap() = Some((on_engine, got));
        }),
    );
    let (on_engine, got) = out.lock().unwrap().take().unwrap();
    assert!(on_engine, "the wake ran on the engine's thread");
    assert_eq!(
        got,
        (vec![false], false),
        "the waker's call went through unchecked"
    );
}

// Likewise under a foreign global capture on another thread: a waker's
// potentially unsafe call is refused on the engine's thread as on any
// thread of the default (global) mode (and that capture is invalidated, as
// CUDA does).
#[test]
fn a_waker_under_a_foreign_global_capture_elsewhere() {
    let (gpu, streams, events) = machine(1);
    let events = Arc::new(events);
    let raw = raw_stream(&gpu);
    let (begun_tx, begun_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel::<()>();
    let gpu2 = gpu.clone();
    let capturer = thread::spawn(move || {
        raw_begin_capture(&gpu2, raw, CaptureMode::Global);
        begun_tx.send(()).unwrap();
        end_rx.recv().unwrap();
        gpu2.end_capture(raw).is_ok()
    });
    begun_rx.recv().unwrap();
    let out = Arc::new(Mutex::new(None));
    let (e2, o2) = (Arc::clone(&events), Arc::clone(&out));
    in_a_wake(
        &gpu,
        &streams,
        &events,
        Box::new(move || *o2.lock().unwrap() = Some(probe(&e2))),
    );
    // The same call from this (non-engine) thread is refused.
    let here = probe(&events);
    end_tx.send(()).unwrap();
    let ended = capturer.join().unwrap();
    let in_wake = out.lock().unwrap().take().unwrap();
    assert_eq!((in_wake, here, ended), (false, false, false));
}
