//! Mock-only: a fifth adversarial review, of the `Completed` futures
//! (`AccessOrder::completed`, `EventLease::completed`, the completion engine
//! of each `EventPool`) and of `DeviceSlice` being `Send`/`Sync`. Safe code
//! only; each test asserts what *should* happen. Its six findings (a pool
//! dropped by a waker on the engine's thread joining itself; the drop
//! waiting for a waker; a panic payload that panics on drop; a waker's drop
//! that panics inside `abandon`; a capture begun and ended around the
//! record; checking mode never resolving) are fixed, and their tests pass
//! with the others, which show an attack that held.
#![cfg(not(feature = "cuda"))]
#![forbid(unsafe_code)]

use super::common::busy_lease;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use super::future_kit::*;
use gpupool_core::{AccessOrder, CaptureMode, DeviceId, Error, EventPool, Scratchpad, StreamPool};
use gpupool_mock::{CallKind, CompletionPolicy, HazardKind, MockBackend};

const ROUNDS: usize = if cfg!(miri) { 3 } else { 200 };

// ---- 1. Polling, moving and dropping futures (held) ----

#[test]
fn polled_on_other_threads_with_other_wakers_before_and_after_ready() {
    let (gpu, streams, events) = machine(1);
    let lease = busy_lease(&gpu, &streams);
    // Never polled: dropped at once, and dropped after a first poll.
    drop(lease.order().completed(&events).unwrap());
    let mut f = lease.order().completed(&events).unwrap();
    let (_, w1) = pending_with_flag(&mut f);
    // Moved to another thread and polled there with another waker; that
    // waker is the one woken.
    let (mut f, c2) = thread::scope(|s| {
        s.spawn(move || {
            let (c2, _w2) = pending_with_flag(&mut f);
            (f, c2)
        })
        .join()
        .unwrap()
    });
    gpu.complete_all(lease.handle()).unwrap();
    until("the latest waker is woken", || c2.wakes() > 0);
    assert_eq!(poll(&mut f, &w1), Poll::Ready(Ok(())));
    assert_eq!(poll(&mut f, &w1), Poll::Ready(Ok(())), "after Ready");
    assert!(format!("{f:?}").contains("taken"));
    drop(f);
    // Made on a thread that exits (leases in place in its cell), dropped or polled here.
    gpu.enqueue_work(lease.handle()).unwrap();
    let (g, mut h) = thread::scope(|s| {
        s.spawn(|| {
            drop(events.get(0).unwrap());
            let g = lease.order().completed(&events).unwrap();
            drop(events.get(0).unwrap());
            (g, lease.order().completed(&events).unwrap())
        })
        .join()
        .unwrap()
    });
    drop(g);
    gpu.complete_all(lease.handle()).unwrap();
    assert_eq!(wait_for(&mut h, LONG), Some(Ok(())));
    drop(h);
    assert_eq!(events.live_leases(), 0);
    drop_pool_then_all_back(events, &gpu);
}

#[test]
fn forgotten_future_then_purge_then_pool_drop() {
    let (gpu, streams, events) = machine(1);
    let (lease, mut f) = busy_lease_and_future(&gpu, &streams, &events);
    let (c, _w) = pending_with_flag(&mut f);
    std::mem::forget(f); // its lease, and the waker kept for it, leak
    drop(lease.order().completed(&events).unwrap()); // abandoned
    events.purge().unwrap();
    // The engine still asks about the forgotten event: it must be alive.
    thread::sleep(Duration::from_millis(10));
    gpu.complete_everything();
    until("its waker is woken", || c.wakes() > 0);
    events.purge().unwrap();
    drop(events);
    assert_eq!(gpu.live_events(), 1, "only the forgotten event is left");
    assert_clean(&gpu);
}

#[test]
fn many_pools_with_engines_dropped_right_after_their_futures() {
    let gpu = MockBackend::new(1);
    let streams = StreamPool::new(gpu.clone());
    let lease = streams.get(0).unwrap();
    for round in 0..ROUNDS / 10 + 2 {
        let pools: Vec<EventPool<MockBackend>> =
            (0..4).map(|_| EventPool::new(gpu.clone())).collect();
        for p in &pools {
            gpu.enqueue_work(lease.handle()).unwrap();
            let a = lease.order().completed(p).unwrap();
            let b = AccessOrder::null_stream(DeviceId(0)).completed(p).unwrap();
            if round % 2 == 0 {
                gpu.complete_everything(); // mid-flight at the drop
            }
            drop((a, b));
        }
        drop(pools); // each engine stopped with entries in any state
    }
    gpu.complete_everything();
    all_back(&gpu);
}

// ---- 2. Orders of every kind, captures (held) ----

#[test]
fn special_orders_foreign_machines_and_missing_devices() {
    let gpu = MockBackend::new(1);
    gpu.set_policy(CompletionPolicy::Immediate);
    let events = EventPool::new(gpu.clone());
    for order in [
        AccessOrder::null_stream(DeviceId(0)),
        AccessOrder::legacy_stream(DeviceId(0)),
    ] {
        let mut f = order.completed(&events).unwrap();
        assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
    }
    // The per-thread stream may capture behind gpupool's back: refused.
    let unseen = AccessOrder::per_thread_stream(DeviceId(0)).completed(&events);
    assert!(matches!(unseen, Err(Error::CapturesUnseen)), "{unseen:?}");
    drop(unseen);
    let missing = AccessOrder::per_thread_stream(DeviceId(7)).completed(&events);
    assert!(
        matches!(missing, Err(Error::DeviceOutOfRange { .. })),
        "{missing:?}"
    );
    drop(missing);
    // A stream of another machine: refused, nothing made on either.
    let (other, before) = (MockBackend::new(1), gpu.calls(CallKind::CreateEvent));
    let theirs = StreamPool::new(other.clone());
    let refused = theirs.get(0).unwrap().order().completed(&events).err();
    assert!(matches!(refused, Some(Error::ForeignHandle)), "{refused:?}");
    assert_eq!(gpu.calls(CallKind::CreateEvent), before);
    // A lease never recorded, and one recorded on the host order. (A `SharedEvent` cannot be
    // consumed: `shared.completed()` does not compile, and nothing hands its lease back.)
    let never = wait_for(&mut events.get(0).unwrap().completed().unwrap(), LONG);
    assert_eq!(never, Some(Ok(())));
    let e = events.get(0).unwrap();
    e.record(&AccessOrder::host()).unwrap();
    assert_eq!(wait_for(&mut e.completed().unwrap(), LONG), Some(Ok(())));
    drop_pool_then_all_back(events, &gpu);
    assert_clean(&other);
}

#[test]
fn a_capture_begun_on_the_watched_stream_by_another_thread() {
    let (gpu, streams, events) = machine(1);
    let (lease, mut before) = busy_lease_and_future(&gpu, &streams, &events);
    let (_, _w) = pending_with_flag(&mut before);
    let mut between = lease.order().completed(&events).unwrap(); // not polled yet
    use CaptureMode::{Global, Relaxed, ThreadLocal};
    for mode in [Global, ThreadLocal, Relaxed] {
        thread::scope(|s| {
            s.spawn(|| {
                lease.begin_capture(mode).unwrap();
                // The engine keeps asking about the events recorded before.
                thread::sleep(Duration::from_millis(5));
                gpu.enqueue_work(lease.handle()).unwrap();
                let graph = lease.end_capture().expect("the capture was not broken");
                assert_eq!(graph.node_count(), 1);
            });
        });
    }
    gpu.complete_all(lease.handle()).unwrap();
    assert_eq!(wait_for(&mut before, LONG), Some(Ok(())));
    assert_eq!(wait_for(&mut between, LONG), Some(Ok(())));
    assert_clean(&gpu);
}

// Should: a captured record is never watched nor pooled, and `Ok` means the work ran. (A capture
// begun after completed()'s check and ended before its after-record question goes unseen.)
#[test]
fn a_capture_begun_and_ended_around_the_record_is_seen() {
    let (gpu, streams, events) = machine(1);
    let lease = streams.get(0).unwrap();
    let stop = AtomicBool::new(false);
    let mut early = 0;
    thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(SeqCst) {
                if lease.begin_capture(CaptureMode::ThreadLocal).is_ok() {
                    let _ = lease.end_capture();
                }
            }
        });
        let (_, w) = flag();
        let start = Instant::now();
        while early == 0 && start.elapsed() < Duration::from_secs(5) {
            // Work that has not run, queued outside any capture.
            while gpu.pending_work(lease.handle()).unwrap() == 0 {
                gpu.enqueue_work(lease.handle()).unwrap();
            }
            let mut batch: Vec<_> = (0..64)
                .filter_map(|_| lease.order().completed(&events).ok())
                .collect();
            thread::sleep(Duration::from_micros(500));
            for f in &mut batch {
                if poll(f, &w) == Poll::Ready(Ok(())) {
                    early += 1; // before the work queued before it ran
                }
            }
            gpu.complete_all(lease.handle()).unwrap();
        }
        stop.store(true, SeqCst);
    });
    assert_eq!(early, 0, "futures resolved Ok before their work had run");
}

// ---- 3. Injected failures: every event back or destroyed exactly once (held) ----

#[test]
fn injected_create_record_query_and_destroy_failures() {
    let (gpu, streams, events) = machine(1);
    let lease = busy_lease(&gpu, &streams);
    gpu.fail_nth(CallKind::CreateEvent, 1);
    assert!(lease.order().completed(&events).is_err());
    gpu.fail_nth(CallKind::RecordEvent, 1);
    assert!(lease.order().completed(&events).is_err());
    assert_eq!(events.live_leases(), 0);
    // A query that fails for a live future and for an abandoned one.
    let mut live = lease.order().completed(&events).unwrap();
    let abandoned = lease.order().completed(&events).unwrap();
    drop(abandoned);
    gpu.fail_nth(CallKind::QueryEvent, 1);
    gpu.fail_nth(CallKind::QueryEvent, 2);
    let r = wait_for(&mut live, LONG).expect("a failed query resolves it");
    assert!(r.is_err(), "{r:?}");
    drop(live);
    gpu.complete_everything();
    // Each try takes an event in (`completed` takes in what the engine saw
    // pass) and resolves its own future, so that future's event is pooled
    // too (its result is not looked at: the second injected failure may
    // reach its query). Dropped unpolled instead, it would leave its event
    // with the engine: one of the two events always out, never both pooled,
    // once the engine is quick enough to return each before the next try.
    until("the abandoned event is back", || {
        let mut f = lease.order().completed(&events).unwrap();
        gpu.complete_everything();
        assert!(wait_for(&mut f, LONG).is_some(), "never resolved");
        drop(f);
        events.live_leases() == 0 && events.total_stats().pooled >= 2
    });
    // A failed destroy at the drop: quarantined, then reported lost, never
    // destroyed twice.
    let created = gpu.calls(CallKind::CreateEvent) - 1; // one create failed
    gpu.fail_nth(CallKind::DestroyEvent, 1);
    drop(events);
    assert_eq!(gpu.calls(CallKind::DestroyEvent), created, "tried once");
    assert_eq!(gpu.live_events(), 1, "the one whose destroy failed");
    assert_clean(&gpu);
}

// ---- 4. Wakers: re-entrant, panicking, owning the pool ----

/// A waker whose `wake` uses the pools again on the engine's thread: makes
/// a future and drops it, purges, leases and returns events.
type Pools = (MockBackend, StreamPool<MockBackend>, EventPool<MockBackend>);
struct Reentrant(Arc<Pools>, AtomicUsize);

impl Wake for Reentrant {
    fn wake(self: Arc<Self>) {
        let (gpu, streams, events) = &*self.0;
        let lease = busy_lease(gpu, streams);
        drop(lease.order().completed(events).unwrap());
        let _ = events.purge();
        drop(events.get(0).unwrap());
        self.1.fetch_add(1, SeqCst);
    }
}

#[test]
fn a_waker_that_reenters_the_pool_on_the_engine_thread() {
    let pools = Arc::new(machine(1));
    let r = Arc::new(Reentrant(Arc::clone(&pools), AtomicUsize::new(0)));
    let w = Waker::from(Arc::clone(&r));
    let (gpu, streams, events) = &*pools;
    let lease = streams.get(0).unwrap();
    for _ in 0..ROUNDS / 20 + 1 {
        gpu.enqueue_work(lease.handle()).unwrap();
        let mut f = lease.order().completed(events).unwrap();
        assert!(poll(&mut f, &w).is_pending());
        let n = r.1.load(SeqCst);
        gpu.complete_everything();
        until("the re-entrant wake ran", || r.1.load(SeqCst) > n);
        assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
    }
    drop((lease, w, r));
    gpu.complete_everything();
    let Ok((gpu, _, _)) = Arc::try_unwrap(pools) else {
        panic!("a waker left")
    };
    all_back(&gpu);
}

/// A panic payload that panics again when dropped, and a waker that throws it.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("the payload of a waker's panic, dropped");
    }
}

struct Booby(AtomicBool);

impl Wake for Booby {
    fn wake(self: Arc<Self>) {
        self.0.store(true, SeqCst);
        std::panic::panic_any(Bomb);
    }
}

// Should: the engine survives any waker's panic (payload included) and loses no event.
#[test]
fn a_panic_payload_that_panics_on_drop_does_not_stop_the_engine() {
    let (gpu, streams, events) = machine(1);
    let (slow, fast) = (streams.get(0).unwrap(), streams.get(0).unwrap());
    // An abandoned entry the engine holds (its work not run yet).
    gpu.enqueue_work(slow.handle()).unwrap();
    drop(slow.order().completed(&events).unwrap());
    thread::sleep(Duration::from_millis(20));
    gpu.enqueue_work(fast.handle()).unwrap();
    let mut booby = fast.order().completed(&events).unwrap();
    let woken = Arc::new(Booby(AtomicBool::new(false)));
    assert!(poll(&mut booby, &Waker::from(Arc::clone(&woken))).is_pending());
    gpu.complete_all(fast.handle()).unwrap();
    until("the engine wakes it", || woken.0.load(SeqCst));
    assert_eq!(wait_for(&mut booby, LONG), Some(Ok(())));
    thread::sleep(Duration::from_millis(20));
    // A later future must still resolve.
    gpu.enqueue_work(fast.handle()).unwrap();
    let mut later = fast.order().completed(&events).unwrap();
    gpu.complete_all(fast.handle()).unwrap();
    let resolved = wait_for(&mut later, LONG);
    drop((later, booby));
    gpu.complete_everything();
    drop(events);
    let outcome = (resolved, gpu.live_events()); // (None: the engine died; 1: an event leaked)
    assert_eq!(
        outcome,
        (Some(Ok(())), 0),
        "the later future resolved, no event left"
    );
}

/// A waker that owns the last handle of the pool by the time it is woken
/// (once told to go on); keeps where the pool dropped and if that panicked.
#[derive(Default)]
struct Owner {
    pool: Mutex<Option<Arc<EventPool<MockBackend>>>>,
    gate: Gate,
    outcome: Mutex<Option<(String, bool)>>,
}

impl Wake for Owner {
    fn wake(self: Arc<Self>) {
        self.gate.hold();
        let pool = self.pool.lock().unwrap().take();
        let name = thread::current().name().unwrap_or("?").to_owned();
        let panicked = catch_unwind(AssertUnwindSafe(|| drop(pool))).is_err();
        *self.outcome.lock().unwrap() = Some((name, panicked));
    }
}

// Should: the pool's last owner may drop anywhere, the engine's thread included, without a panic.
#[test]
fn the_pool_dropped_by_a_waker_on_the_engine_thread() {
    let gpu = MockBackend::new(1);
    let streams = StreamPool::new(gpu.clone());
    let pool = Arc::new(EventPool::new(gpu.clone()));
    let owner = Arc::new(Owner::default());
    *owner.pool.lock().unwrap() = Some(Arc::clone(&pool));
    let lease = busy_lease(&gpu, &streams);
    {
        let mut f = lease.order().completed(&pool).unwrap();
        assert!(poll(&mut f, &Waker::from(Arc::clone(&owner))).is_pending());
        gpu.complete_all(lease.handle()).unwrap();
        until("the engine wakes the task", || owner.gate.reached());
        // The task is polled (by another wake-up) and finishes meanwhile.
        let (_, other) = flag();
        assert_eq!(poll(&mut f, &other), Poll::Ready(Ok(())));
    }
    drop(pool); // the waker holds the last one now
    owner.gate.open();
    until("the pool's drop returned", || {
        owner.outcome.lock().unwrap().is_some()
    });
    let (on, panicked) = owner.outcome.lock().unwrap().take().unwrap();
    eprintln!("the pool dropped on thread {on:?}");
    assert!(!panicked, "EventPool's drop panicked on thread {on:?}");
}

/// A waker whose wake takes a lock (an executor's run queue, say).
struct Queue(Mutex<()>, AtomicBool);

impl Wake for Queue {
    fn wake(self: Arc<Self>) {
        self.1.store(true, SeqCst);
        drop(self.0.lock());
    }
}

// The pool's drop waits for a wake under way (user code on the engine's thread: a waker
// that waits for the dropping thread deadlocks, a documented limit), never for the GPU, and
// finishes once the wake returns.
#[test]
fn the_pool_drop_waits_only_for_a_wake_under_way() {
    let (gpu, streams, events) = machine(1);
    let queue = Arc::new(Queue(Mutex::new(()), AtomicBool::new(false)));
    let held = queue.0.lock().unwrap();
    let (lease, mut f) = busy_lease_and_future(&gpu, &streams, &events);
    assert!(poll(&mut f, &Waker::from(Arc::clone(&queue))).is_pending());
    gpu.complete_all(lease.handle()).unwrap();
    until("the engine is inside wake", || queue.1.load(SeqCst));
    assert_eq!(poll(&mut f, &flag().1), Poll::Ready(Ok(())));
    drop(f);
    let dropped = AtomicBool::new(false);
    let returned = thread::scope(|s| {
        let flag = &dropped;
        s.spawn(move || {
            drop(events);
            flag.store(true, SeqCst);
        });
        thread::sleep(Duration::from_millis(500));
        let returned = dropped.load(SeqCst);
        drop(held); // lets the waker, and so the drop, finish
        returned
    });
    assert!(!returned, "the drop returned while a wake was under way");
    until("the pool's drop returned", || dropped.load(SeqCst));
}

/// A waker whose last drop panics.
struct DropBomb;

impl Wake for DropBomb {
    fn wake(self: Arc<Self>) {}
}

impl Drop for DropBomb {
    fn drop(&mut self) {
        panic!("a waker's drop that panics");
    }
}

// Should: a future dropped early hands its event to the engine, whatever its waker's drop does.
#[test]
fn a_waker_drop_that_panics_in_the_future_drop_loses_no_event() {
    let (gpu, streams, events) = machine(1);
    let (_lease, f) = busy_lease_and_polled_future(&gpu, &streams, &events, DropBomb);
    // Dropped before its event passed: `abandon` drops the kept waker.
    // The panic is the user's; it may reach them or be caught on the way.
    let _ = catch_unwind(AssertUnwindSafe(|| drop(f)));
    gpu.complete_everything();
    thread::sleep(Duration::from_millis(50));
    drop(events);
    assert_eq!(gpu.live_events(), 0, "the abandoned event was lost");
}

// Should: in checking mode a `Completed` future (the async program's host wait) resolves.
#[test]
fn checking_mode_resolves_completed_futures() {
    let (gpu, streams, events) = machine(1);
    gpu.set_policy(CompletionPolicy::Immediate);
    gpu.set_checking(true);
    let (_lease, mut f) = busy_lease_and_future(&gpu, &streams, &events);
    assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
}

// ---- 5. DeviceSlice: Send + Sync (held) ----

#[test]
fn a_device_slice_used_on_another_thread_races_only_on_the_device() {
    // A slice borrows its scratchpad, which is not `Sync`: the other thread
    // holds the slice, not the scratchpad, which cannot be reset or released
    // while the slice's borrow lasts (`scratch.reset()` inside the scope
    // below does not compile).
    let gpu = MockBackend::new(1);
    let streams = StreamPool::new(gpu.clone());
    let (mine, theirs) = (streams.get(0).unwrap(), streams.get(0).unwrap());
    let scratch = Scratchpad::new(&gpu, mine.order()).unwrap();
    let slice = scratch.to_device(&[1u32, 2, 3, 4]).unwrap();
    let read = thread::scope(|s| {
        let (slice, gpu, theirs) = (&slice, &gpu, &theirs);
        let t = s.spawn(move || {
            // A kernel on another stream, with no wait: a device race.
            gpu.launch_map(&theirs.order(), slice, slice, |x: u32| x * 10)
        });
        let read = scratch.to_host(slice);
        t.join().unwrap().unwrap();
        read
    });
    // The host read whole values (before or after the kernel), never torn.
    let v = read.unwrap();
    assert!(v == [1, 2, 3, 4] || v == [10, 20, 30, 40], "{v:?}");
    // The missing wait is a device hazard the mock reports.
    let hazards = gpu.hazards();
    assert!(
        hazards.iter().all(|h| h.kind == HazardKind::ConcurrentUse),
        "{hazards:?}"
    );
    gpu.complete_everything();
    drop(scratch);
}
