//! loom models of every shared (`Sync`) type in gpupool: the core's
//! lock-free paths, each over the public API (or the hidden `internals`
//! wrappers for the raw stacks), the pools' per-thread caches as the pools
//! use them (`models.rs`), thread exits and the adoption of their cells
//! (`models/thread_exit.rs`), the event pool's in-place leases of cell slots
//! (`models/in_place.rs`), the mock
//! backend (`models/mock_backend.rs`), the CUDA backend's pinned/managed
//! block pool over a fake upstream (`models/block_pool.rs`) and its
//! per-thread shards and the blocks each thread keeps in them, over the same
//! fake (`models/shards.rs`); 2–3 threads each. The list, and which model covers which type, is in the crate
//! documentation (`src/lib.rs`).
//!
//! Built only with `--cfg loom --cfg crossbeam_loom`; `tests/run_models.rs`
//! does that for a plain `cargo test -p loom-tests`.
#![cfg(loom)]

// Under `tests/models/`: files directly in `tests/` would be test crates of
// their own.
#[path = "models/block_pool.rs"]
mod block_pool;
#[path = "models/capture.rs"]
mod capture;
#[path = "models/completion.rs"]
mod completion;
#[path = "models/in_place.rs"]
mod in_place;
#[path = "models/ledger.rs"]
mod ledger;
#[path = "models/mock_backend.rs"]
mod mock_backend;
#[path = "models/shards.rs"]
mod shards;
#[path = "models/thread_exit.rs"]
mod thread_exit;

use std::collections::HashSet;

use gpupool_core::epoch_crate::Collector;
use gpupool_core::internals::{GuardedStack, PushOnlyBag};
use gpupool_core::{DeviceId, EventFlags, EventPool, StreamPool, StreamPoolConfig};
use gpupool_mock::{CallKind, CompletionPolicy, MockBackend};
use loom::sync::{Arc, Mutex};
use loom::thread;

use ledger::{assert_all_destroyed, detached_streams, Ledger};

/// Spawns a loom thread that borrows from the caller's stack frame (loom has no
/// scoped threads). The returned guard joins the thread when dropped.
///
/// Every model keeps the guard alive in a local declared after the data the
/// thread borrows, so the thread is joined (explicitly, or by the guard's drop
/// during unwinding) before that data is dropped.
fn spawn_scoped<'a, R: Send + 'static>(f: impl FnOnce() -> R + Send + 'a) -> Scoped<R> {
    let f: Box<dyn FnOnce() -> R + Send + 'a> = Box::new(f);
    // SAFETY: the closure only borrows data that outlives the `Scoped` guard
    // (see above), and the guard joins the thread before it is dropped, so the
    // borrows never dangle although the type says 'static.
    let f: Box<dyn FnOnce() -> R + Send + 'static> = unsafe { std::mem::transmute(f) };
    Scoped(Some(thread::spawn(f)))
}

struct Scoped<R>(Option<thread::JoinHandle<R>>);

impl<R> Scoped<R> {
    fn join(mut self) -> R {
        self.0.take().unwrap().join().unwrap()
    }
}

impl<R> Drop for Scoped<R> {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}

/// `loom::model` with a preemption bound of at least
/// [`loom_tests::DEEP_PREEMPTIONS`], for the models cheap enough to explore
/// deeper than the suite's default (an unbounded run stays unbounded).
/// Their longest executions (a capture begun, joined and ended through the
/// pools, each step asking and bumping the streams' capture notes) pass
/// loom's default of 1,000 branches.
fn model_deep(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 4_000;
    builder.preemption_bound = builder
        .preemption_bound
        .map(|p| p.max(loom_tests::DEEP_PREEMPTIONS));
    builder.check(f);
}

/// A stream pool over `mock` whose stacks use a collector of its own.
///
/// Not crossbeam-epoch's global collector: pinning that one gives each model
/// thread crossbeam's thread-local handle, whose destructor (like the pools'
/// own thread-local, which orphans the thread's cells) makes loom atomic
/// accesses when the thread ends, and loom drops a thread's thread-locals in
/// an order that changes from one execution to the next, which it then
/// reports as a model that is not deterministic. With a collector of its own
/// a pool pins by registering for the one call; the pools' code is the same.
fn stream_pool(mock: &MockBackend, config: StreamPoolConfig) -> StreamPool<MockBackend> {
    StreamPool::with_collector(mock.clone(), config, Collector::new())
}

/// An event pool over `mock` with a collector of its own (see
/// [`stream_pool`]).
fn event_pool(mock: &MockBackend) -> EventPool<MockBackend> {
    EventPool::with_collector(mock.clone(), EventFlags::default(), Collector::new())
}

fn idle_mock(devices: u32) -> MockBackend {
    let mock = MockBackend::new(devices);
    mock.set_policy(CompletionPolicy::Immediate);
    mock
}

#[test]
fn stack_push_pop_is_exact() {
    loom::model(|| {
        let s = Arc::new(GuardedStack::new());
        s.push(1);
        let s1 = s.clone();
        let t = thread::spawn(move || {
            s1.push(2);
            s1.pop()
        });
        let mine = s.pop();
        let theirs = t.join().unwrap();
        let mut all: Vec<i32> = mine.into_iter().chain(theirs).chain(s.drain()).collect();
        all.sort();
        assert_eq!(all, [1, 2], "an item was lost or duplicated");
    });
}

#[test]
fn bag_push_races_take_all() {
    loom::model(|| {
        let bag = Arc::new(PushOnlyBag::new());
        let stack = Arc::new(GuardedStack::new());
        bag.push(1);
        let b1 = bag.clone();
        let t = thread::spawn(move || b1.push(2));
        stack.take_from(&bag);
        t.join().unwrap();
        let mut all: Vec<i32> = stack.drain().into_iter().chain(bag.take_all()).collect();
        all.sort();
        assert_eq!(all, [1, 2]);
    });
}

#[test]
fn stream_pool_two_threads_one_device() {
    loom::model(|| {
        let mock = idle_mock(1);
        let pool = stream_pool(&mock, StreamPoolConfig::default());
        drop(pool.get(0).unwrap()); // one idle stream in the ready list
        let in_use = Mutex::new(HashSet::new());
        let work = || {
            let lease = pool.get(0).unwrap();
            assert!(
                in_use.lock().unwrap().insert(lease.handle()),
                "stream leased twice"
            );
            in_use.lock().unwrap().remove(&lease.handle());
        };
        let t = spawn_scoped(work);
        work();
        t.join();
        assert_eq!(pool.live_leases(), 0);
        let stats = pool.total_stats();
        assert_eq!(stats.leases, 3);
        assert!(stats.created <= 2);
        pool.purge().unwrap();
        assert_eq!(mock.live_streams(), 0);
        assert!(mock.misuses().is_empty());
    });
}

#[test]
fn stream_get_races_purge() {
    loom::model(|| {
        let mock = idle_mock(1);
        let pool = stream_pool(&mock, StreamPoolConfig::default());
        drop(pool.get(0).unwrap());
        let t = spawn_scoped(|| drop(pool.get(0).unwrap()));
        pool.purge().unwrap();
        t.join();
        pool.purge().unwrap();
        assert_eq!(pool.live_leases(), 0);
        assert_eq!(mock.live_streams(), 0, "a stream was lost");
        assert!(mock.misuses().is_empty(), "a stream was destroyed twice");
    });
}

#[test]
fn stream_put_to_busy_races_scan() {
    loom::model(|| {
        let mock = MockBackend::new(1);
        let pool = stream_pool(&mock, StreamPoolConfig::default());
        let a = pool.get(0).unwrap();
        let b = pool.get(0).unwrap();
        let (sa, sb) = (a.handle(), b.handle());
        mock.enqueue_work(sa).unwrap();
        drop(a); // pending: busy list
        mock.complete_all(sa).unwrap(); // finished, still in the busy list
        mock.enqueue_work(sb).unwrap();
        let owned_b = b.detach();
        let t = spawn_scoped(|| pool.put(owned_b, None).unwrap()); // busy push
        let got = pool.get(0).unwrap(); // scans the busy list
        assert_eq!(got.handle(), sa, "the finished busy stream was not found");
        drop(got);
        t.join();
        assert_eq!(pool.total_stats().busy_hits, 1);
        assert_eq!(pool.purge().unwrap(), 2, "a stream was lost from the lists");
        assert_eq!(mock.live_streams(), 0);
        let _ = sb;
    });
}

#[test]
fn lazy_device_table_two_threads() {
    loom::model(|| {
        let mock = idle_mock(2);
        let pool = stream_pool(&mock, StreamPoolConfig::default());
        let t = spawn_scoped(|| pool.get(1).unwrap().device());
        let mine = pool.get(0).unwrap().device();
        assert_eq!(t.join(), DeviceId(1));
        assert_eq!(mine, DeviceId(0));
        assert_eq!(pool.device_count(), Some(2));
        let counts = mock.calls(CallKind::DeviceCount);
        assert!((1..=2).contains(&counts));
        pool.purge().unwrap();
        assert_eq!(mock.live_streams(), 0);
    });
}

#[test]
fn shared_event_last_two_clones() {
    loom::model(|| {
        let mock = idle_mock(1);
        let pool = event_pool(&mock);
        let shared = pool.get_shared(0).unwrap();
        let event = shared.handle();
        let other = shared.clone();
        let t = spawn_scoped(move || drop(other));
        drop(shared);
        t.join();
        assert_eq!(pool.live_leases(), 0);
        // Returned exactly once (to the cell of the thread that dropped the
        // last clone): one event pooled, destroyed once.
        assert_eq!(pool.total_stats().pooled, 1);
        assert_eq!(pool.purge().unwrap(), 1);
        assert_all_destroyed(&mock);
        let _ = event;
    });
}

#[test]
fn event_pool_two_threads_get_put() {
    loom::model(|| {
        let mock = idle_mock(1);
        let pool = event_pool(&mock);
        drop(pool.get(0).unwrap());
        let work = || pool.get(0).unwrap().handle();
        let t = spawn_scoped(work);
        let mine = work();
        let theirs = t.join();
        let _ = (mine, theirs);
        assert_eq!(pool.live_leases(), 0);
        let created = pool.total_stats().created;
        assert!((1..=2).contains(&created));
        assert_eq!(
            pool.purge().unwrap(),
            created,
            "an event was lost or duplicated"
        );
        assert_eq!(mock.live_events(), 0);
    });
}

#[test]
fn parked_error_two_drops() {
    loom::model(|| {
        let mock = idle_mock(1);
        let pool = stream_pool(&mock, StreamPoolConfig::default());
        let a = pool.get(0).unwrap();
        let b = pool.get(0).unwrap();
        // Both returns fail their query; both streams must still come back.
        mock.fail_nth(CallKind::QueryStream, 1);
        mock.fail_nth(CallKind::QueryStream, 2);
        let t = spawn_scoped(move || drop(a));
        drop(b);
        t.join();
        assert!(pool.take_error().is_some());
        assert_eq!(pool.dropped_errors(), 1);
        assert!(pool.take_error().is_none());
        assert_eq!(pool.live_leases(), 0);
        assert_eq!(pool.purge().unwrap(), 2);
        assert_eq!(mock.live_streams(), 0);
    });
}

/// The stream pool (default configuration: cells keep streams found idle on
/// return). A thread puts four streams (its cell registered on the way: the
/// registration races the purge; the four fill every slot of the cell),
/// leases two from its cell (`take`, last slot first), returns one (`give`)
/// and keeps the other, while this thread purges. A purge never destroys a
/// stream that is out (the ledger), the tallies are exact and every stream is
/// destroyed once.
#[test]
fn thread_cache_owner_races_a_drain() {
    // Its longest executions (four puts, two gets and returns, a purge that
    // also takes the streams held for graph captures, and the collector's
    // teardown) pass loom's default of 1,000 branches.
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 4_000;
    builder.check(|| {
        let mock = idle_mock(1);
        let pool = stream_pool(&mock, StreamPoolConfig::default());
        let streams: [_; 4] = detached_streams(&pool);
        let ledger = Ledger::new(streams.each_ref().map(|s| s.handle()));
        let (pool, ledger, mock) = (&pool, &ledger, &mock);
        let owner = spawn_scoped(move || {
            for s in streams {
                ledger.put(pool, s);
            }
            let a = pool.get(0).unwrap();
            ledger.out(a.handle());
            let b = pool.get(0).unwrap();
            ledger.out(b.handle());
            ledger.back(a.handle());
            drop(a);
            b.detach()
        });
        ledger.purge(pool, mock);
        let kept = owner.join();
        ledger.put(pool, kept);
        // Four detached here, two leased by the owner.
        ledger.finish(pool, mock, 6);
    });
}

/// The stream pool with `same_thread_reuse` (cells keep returned streams
/// unqueried, for the thread that leased them). A thread's first lease
/// registers its cell, racing a purge's drain of the registry; it returns the
/// stream (kept in its cell) and leases it back. Every stream is destroyed
/// once, never while out; the tallies are exact.
#[test]
fn thread_cache_registration_races_a_drain() {
    model_deep(|| {
        let mock = idle_mock(1);
        let config = StreamPoolConfig {
            same_thread_reuse: true,
            ..StreamPoolConfig::default()
        };
        let pool = stream_pool(&mock, config);
        let [s1] = detached_streams(&pool);
        let ledger = Ledger::new([s1.handle()]);
        ledger.put(&pool, s1); // the ready list
        let (pool, ledger, mock) = (&pool, &ledger, &mock);
        let owner = spawn_scoped(move || {
            let a = pool.get(0).unwrap();
            ledger.out(a.handle());
            ledger.back(a.handle());
            drop(a);
            let again = pool.get(0).unwrap();
            ledger.out(again.handle());
            again.detach()
        });
        ledger.purge(pool, mock);
        let kept = owner.join();
        ledger.put(pool, kept);
        // One detached here, two leased by the owner.
        ledger.finish(pool, mock, 3);
    });
}
