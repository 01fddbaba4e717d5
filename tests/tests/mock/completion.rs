//! `Completed` futures over the mock: they resolve when (and only when) the
//! mock's GPU has run the work, wake their task, return their events exactly
//! once (also when dropped early or forgotten), refuse captures, and report
//! a failed query as the future's error.
#![cfg(not(feature = "cuda"))]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Poll, Wake, Waker};
use std::time::{Duration, Instant};

use super::common::{busy_lease, capturing};
use super::future_kit::{
    busy_lease_and_future, busy_lease_and_polled_future, machine, machine_with_policy, Gate,
};
use gpupool_core::{AccessOrder, BackendOp, CaptureMode, Completed, Error, EventPool, StreamPool};
use gpupool_mock::{CallKind, CompletionPolicy, MockBackend, MockError};
use gpupool_tests::wake::{block_on, counting_waker as counter, poll, until, wait_for_wake, LONG};

type R = Result<(), Error<MockError>>;

#[test]
fn resolves_only_after_the_work_ran_and_wakes_its_task() {
    let (gpu, streams, events) = machine(1);
    let (lease, mut done) = busy_lease_and_future(&gpu, &streams, &events);
    let (c, waker) = counter();
    assert!(poll(&mut done, &waker).is_pending());
    // The engine keeps asking; nothing has run, so nothing resolves.
    std::thread::sleep(Duration::from_millis(20));
    assert!(poll(&mut done, &waker).is_pending());
    assert_eq!(c.wakes(), 0);
    assert_eq!(events.live_leases(), 1);
    gpu.complete_all(lease.handle()).unwrap();
    wait_for_wake(&c);
    assert_eq!(poll(&mut done, &waker), Poll::Ready(Ok(())));
    // The lease ended with the future: the event is back.
    assert_eq!(events.live_leases(), 0);
    // Polled again after it resolved: still Ok, nothing else happens.
    assert_eq!(poll(&mut done, &waker), Poll::Ready(Ok(())));
}

#[test]
fn host_order_is_ready_at_once_without_an_event() {
    let gpu = MockBackend::new(1);
    let events = EventPool::new(gpu.clone());
    let done = AccessOrder::host().completed(&events).unwrap();
    assert_eq!(block_on(done), Ok(()));
    assert_eq!(gpu.calls(CallKind::CreateEvent), 0);
    assert_eq!(gpu.calls(CallKind::RecordEvent), 0);
}

#[test]
fn work_done_before_the_first_poll_resolves_on_it() {
    let (gpu, streams, events) = machine_with_policy(CompletionPolicy::Immediate);
    let lease = streams.get(0).unwrap();
    for _ in 0..100 {
        gpu.enqueue_work(lease.handle()).unwrap();
        assert_eq!(block_on(lease.order().completed(&events).unwrap()), Ok(()));
    }
    assert_eq!(events.live_leases(), 0);
    // One event, reused each time.
    assert_eq!(gpu.calls(CallKind::CreateEvent), 1);
}

#[test]
fn a_capturing_stream_is_refused_and_its_capture_left_intact() {
    let (gpu, streams, events) = machine(1);
    let [lease] = capturing(&streams, CaptureMode::ThreadLocal);
    let records = gpu.calls(CallKind::RecordEvent);
    assert!(matches!(
        lease.order().completed(&events),
        Err(Error::StreamCapturing)
    ));
    assert_eq!(
        gpu.calls(CallKind::RecordEvent),
        records,
        "nothing recorded"
    );
    let graph = lease.end_capture().unwrap();
    drop(graph);
    assert!(gpu.misuses().is_empty(), "{:?}", gpu.misuses());
    // After the capture, the same stream works.
    gpu.set_policy(CompletionPolicy::Immediate);
    assert_eq!(block_on(lease.order().completed(&events).unwrap()), Ok(()));
}

#[test]
fn an_event_recorded_in_a_capture_is_refused() {
    let (gpu, streams, events) = machine(1);
    let [lease] = capturing(&streams, CaptureMode::ThreadLocal);
    let fork = events.get(0).unwrap();
    fork.record(&lease.order()).unwrap();
    assert!(matches!(fork.completed(), Err(Error::CapturedEvent)));
    drop(lease.end_capture().unwrap());
    assert!(gpu.misuses().is_empty(), "{:?}", gpu.misuses());
}

#[test]
fn an_order_of_another_machine_is_refused() {
    let (a, b) = (MockBackend::new(1), MockBackend::new(1));
    let streams = StreamPool::new(a.clone());
    let events = EventPool::new(b.clone());
    let lease = streams.get(0).unwrap();
    assert!(matches!(
        lease.order().completed(&events),
        Err(Error::ForeignHandle)
    ));
    assert_eq!(b.calls(CallKind::CreateEvent), 0);
}

#[test]
fn a_failed_query_resolves_the_future_with_the_error() {
    let (gpu, streams, events) = machine(1);
    let lease = busy_lease(&gpu, &streams);
    let event = events.get(0).unwrap();
    event.record(&lease.order()).unwrap();
    gpu.fail_event(CallKind::QueryEvent, event.handle());
    let done = event.completed().unwrap();
    let r: R = block_on(done);
    assert!(
        matches!(
            r,
            Err(Error::Backend {
                op: BackendOp::QueryEvent,
                ..
            })
        ),
        "{r:?}"
    );
    gpu.clear_faults();
    assert_eq!(events.live_leases(), 0);
}

#[test]
fn a_later_event_of_a_stream_resolves_after_the_earlier_one() {
    let (gpu, streams, events) = machine(1);
    let (lease, mut first) = busy_lease_and_future(&gpu, &streams, &events);
    gpu.enqueue_work(lease.handle()).unwrap();
    let mut second = lease.order().completed(&events).unwrap();
    let (c1, w1) = counter();
    let (c2, w2) = counter();
    assert!(poll(&mut first, &w1).is_pending());
    assert!(poll(&mut second, &w2).is_pending());
    assert!(gpu.complete_one(lease.handle()).unwrap());
    wait_for_wake(&c1);
    assert_eq!(poll(&mut first, &w1), Poll::Ready(Ok(())));
    std::thread::sleep(Duration::from_millis(20));
    assert!(poll(&mut second, &w2).is_pending());
    assert_eq!(c2.wakes(), 0);
    gpu.complete_all(lease.handle()).unwrap();
    wait_for_wake(&c2);
    assert_eq!(poll(&mut second, &w2), Poll::Ready(Ok(())));
}

#[test]
fn a_future_dropped_early_returns_its_event_once_it_passed() {
    let (gpu, streams, events) = machine(1);
    let lease = busy_lease(&gpu, &streams);
    let done = lease.order().completed(&events).unwrap();
    let abandoned = format!("{done:?}");
    assert!(abandoned.contains("pending"), "{abandoned}");
    let t = Instant::now();
    drop(done); // never blocks
    assert!(t.elapsed() < LONG);
    assert_eq!(events.total_stats().pooled, 0, "not back while pending");
    gpu.complete_all(lease.handle()).unwrap();
    // The engine sees it pass; the next future takes it back in.
    let start = Instant::now();
    loop {
        gpu.enqueue_work(lease.handle()).unwrap();
        let f = lease.order().completed(&events).unwrap();
        gpu.complete_all(lease.handle()).unwrap();
        assert_eq!(block_on(f), Ok(()));
        if events.total_stats().pooled >= 2 {
            break;
        }
        assert!(start.elapsed() < LONG, "never returned");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(events.live_leases(), 0);
    drop(events);
    assert_eq!(gpu.live_events(), 0);
}

#[test]
fn the_pool_drop_takes_the_events_of_pending_and_forgotten_futures() {
    let gpu = MockBackend::new(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let lease = busy_lease(&gpu, &streams);
    for _ in 0..8 {
        drop(lease.order().completed(&events).unwrap());
    }
    let forgotten = lease.order().completed(&events).unwrap();
    std::mem::forget(forgotten); // its lease (and event) leak, safely
    drop(events); // stops and joins the engine; never waits for the GPU
    assert_eq!(
        gpu.live_events(),
        1,
        "only the forgotten future's event is left"
    );
    assert!(gpu.misuses().is_empty(), "{:?}", gpu.misuses());
    gpu.complete_everything();
}

#[test]
fn many_threads_many_futures_each_event_back_exactly_once() {
    const THREADS: usize = 4;
    const EACH: usize = if cfg!(miri) { 10 } else { 200 };
    let gpu = MockBackend::new(2);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // The mock's GPU: runs whatever is queued, now and then.
        let gpu2 = gpu.clone();
        let stop = &stop;
        s.spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                gpu2.complete_everything();
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (streams, events, gpu) = (&streams, &events, gpu.clone());
                s.spawn(move || {
                    let device = (t % 2) as u32;
                    let mut pending: Vec<Completed<'_, MockBackend>> = Vec::new();
                    for i in 0..EACH {
                        let lease = streams.get(device).unwrap();
                        gpu.enqueue_work(lease.handle()).unwrap();
                        let f = lease.order().completed(events).unwrap();
                        if i % 5 == 0 {
                            drop(f); // dropped early, some of them
                        } else {
                            pending.push(f);
                        }
                    }
                    for f in pending {
                        assert_eq!(block_on(f), Ok(()));
                    }
                })
            })
            .collect();
        join_all(workers);
        stop.store(true, Ordering::SeqCst);
    });
    gpu.complete_everything();
    assert_eq!(events.live_leases(), 0);
    let created = gpu.calls(CallKind::CreateEvent);
    drop(events);
    assert_eq!(
        gpu.calls(CallKind::DestroyEvent),
        created,
        "each destroyed once"
    );
    assert_eq!(gpu.live_events(), 0);
    assert!(gpu.misuses().is_empty(), "{:?}", gpu.misuses());
    assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
}

/// Panics when woken.
struct Panicky;

impl Wake for Panicky {
    fn wake(self: Arc<Self>) {
        panic!("a waker that panics");
    }
}

#[test]
fn a_waker_that_panics_does_not_stop_the_engine() {
    let (gpu, streams, events) = machine(1);
    let (lease, first) = busy_lease_and_polled_future(&gpu, &streams, &events, Panicky);
    gpu.complete_all(lease.handle()).unwrap();
    // The engine caught the panic; later futures still resolve.
    gpu.enqueue_work(lease.handle()).unwrap();
    let second = lease.order().completed(&events).unwrap();
    gpu.complete_all(lease.handle()).unwrap();
    assert_eq!(block_on(second), Ok(()));
    assert_eq!(block_on(first), Ok(()));
    assert_eq!(events.live_leases(), 0);
}

#[test]
fn a_burst_on_one_stream_resolves_exactly_what_ran_with_few_queries() {
    const N: usize = 64;
    let (gpu, streams, events) = machine(1);
    let lease = streams.get(0).unwrap();
    let mut futures: Vec<_> = (0..N)
        .map(|_| {
            gpu.enqueue_work(lease.handle()).unwrap();
            lease.order().completed(&events).unwrap()
        })
        .collect();
    let wakers: Vec<_> = (0..N).map(|_| counter()).collect();
    for (f, (_, w)) in futures.iter_mut().zip(&wakers) {
        assert!(poll(f, w).is_pending());
    }
    // Half the work runs: exactly the first half resolves, never one more.
    for _ in 0..N / 2 {
        assert!(gpu.complete_one(lease.handle()).unwrap());
    }
    for (c, _) in &wakers[..N / 2] {
        wait_for_wake(c);
    }
    std::thread::sleep(Duration::from_millis(20));
    for (i, (f, (c, w))) in futures.iter_mut().zip(&wakers).enumerate() {
        if i < N / 2 {
            assert_eq!(poll(f, w), Poll::Ready(Ok(())), "future {i}");
        } else {
            assert!(
                poll(f, w).is_pending(),
                "future {i} resolved before its work ran"
            );
            assert_eq!(c.wakes(), 0);
        }
    }
    // The rest at once: found with a few queries (oldest, newest), not one
    // per event. Counted with the engine held inside a wake (of a future on
    // another stream; this thread submits nothing meanwhile, so the engine
    // runs it) from before the count until the work has run: left running,
    // it asks about the oldest pending event once a pass (a pass at least
    // every 200 µs) for as long as this thread is kept from running between
    // the count and the completion, also under Miri.
    let other = busy_lease(&gpu, &streams);
    let mut held = other.order().completed(&events).unwrap();
    let hold = Arc::new(Gate::default());
    assert!(poll(&mut held, &Waker::from(Arc::clone(&hold))).is_pending());
    gpu.complete_all(other.handle()).unwrap();
    until("the engine is held", || hold.reached());
    let before = gpu.calls(CallKind::QueryEvent);
    gpu.complete_all(lease.handle()).unwrap();
    hold.open();
    for (c, _) in &wakers[N / 2..] {
        wait_for_wake(c);
    }
    let queries = gpu.calls(CallKind::QueryEvent) - before;
    assert!(
        queries < (N / 2) as u64,
        "{queries} queries for {} events",
        N / 2
    );
    for (f, (_, w)) in futures.iter_mut().zip(&wakers).skip(N / 2) {
        assert_eq!(poll(f, w), Poll::Ready(Ok(())));
    }
    drop((futures, held));
    assert_eq!(events.live_leases(), 0);
}

#[test]
fn the_first_poll_resolves_finished_work_itself_unless_the_spin_is_off() {
    let (gpu, streams, events) = machine_with_policy(CompletionPolicy::Immediate);
    let lease = streams.get(0).unwrap();
    let (_, waker) = counter();
    gpu.enqueue_work(lease.handle()).unwrap();
    let mut done = lease.order().completed(&events).unwrap();
    let before = gpu.calls(CallKind::QueryEvent);
    // The work ran: the first poll's own query sees it.
    assert_eq!(poll(&mut done, &waker), Poll::Ready(Ok(())));
    assert_eq!(gpu.calls(CallKind::QueryEvent) - before, 1);
    // Spin off: the first poll asks nothing and hands the event to the
    // engine, which resolves it.
    events.set_completion_spin(Duration::ZERO);
    gpu.enqueue_work(lease.handle()).unwrap();
    let mut done = lease.order().completed(&events).unwrap();
    let before = gpu.calls(CallKind::QueryEvent);
    assert!(poll(&mut done, &waker).is_pending());
    assert_eq!(block_on(done), Ok(()));
    assert!(gpu.calls(CallKind::QueryEvent) > before, "the engine asked");
    assert_eq!(events.live_leases(), 0);
}

#[test]
fn futures_polled_out_of_record_order_never_resolve_early() {
    // Three futures of one stream and thread, recorded a, b, c and first
    // polled (so handed to the engine) a, c, b: the engine orders them by
    // record, so when the work of a and b has run, c (recorded last) is not
    // resolved on the proof of b.
    let (gpu, streams, events) = machine(1);
    events.set_completion_spin(Duration::ZERO);
    let lease = streams.get(0).unwrap();
    let mut recorded: Vec<_> = (0..3)
        .map(|_| {
            gpu.enqueue_work(lease.handle()).unwrap();
            lease.order().completed(&events).unwrap()
        })
        .collect();
    let wakers: Vec<_> = (0..3).map(|_| counter()).collect();
    for i in [0, 2, 1] {
        assert!(poll(&mut recorded[i], &wakers[i].1).is_pending());
    }
    assert!(gpu.complete_one(lease.handle()).unwrap());
    assert!(gpu.complete_one(lease.handle()).unwrap());
    wait_for_wake(&wakers[0].0);
    wait_for_wake(&wakers[1].0);
    assert_eq!(poll(&mut recorded[0], &wakers[0].1), Poll::Ready(Ok(())));
    assert_eq!(poll(&mut recorded[1], &wakers[1].1), Poll::Ready(Ok(())));
    assert!(
        poll(&mut recorded[2], &wakers[2].1).is_pending(),
        "resolved before its work ran"
    );
    gpu.complete_all(lease.handle()).unwrap();
    wait_for_wake(&wakers[2].0);
    assert_eq!(poll(&mut recorded[2], &wakers[2].1), Poll::Ready(Ok(())));
    drop(recorded);
    assert_eq!(events.live_leases(), 0);
}

/// Joins every worker thread of a scope, in order, re-raising a worker's panic.
fn join_all<T>(workers: Vec<std::thread::ScopedJoinHandle<'_, T>>) {
    for w in workers {
        w.join().unwrap();
    }
}
