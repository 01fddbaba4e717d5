//! loom models of every shared (`Sync`) type in gpupool: the core's
//! lock-free paths, each over the public API (or the hidden `internals`
//! wrappers for the raw stacks and the per-thread cache), thread exits and
//! the adoption of their per-thread cells (`models/thread_exit.rs`), the
//! event pool's in-place leases of cell slots (`models/in_place.rs`), the mock
//! backend (`models/mock_backend.rs`) and the CUDA backend's pinned/managed
//! block pool over a fake upstream (`models/block_pool.rs`); 2–3 threads
//! each. The list, and which model covers which type, is in the crate
//! documentation (`src/lib.rs`).
//!
//! Built only with `--cfg loom --cfg crossbeam_loom`; `tests/run_models.rs`
//! does that for a plain `cargo test -p loom-tests`.
#![cfg(loom)]

// Under `tests/models/`: files directly in `tests/` would be test crates of
// their own.
#[path = "models/block_pool.rs"]
mod block_pool;
#[path = "models/in_place.rs"]
mod in_place;
#[path = "models/mock_backend.rs"]
mod mock_backend;
#[path = "models/thread_exit.rs"]
mod thread_exit;

use std::collections::HashSet;

use gpupool_core::internals::{GuardedStack, PushOnlyBag};
use gpupool_core::{DeviceId, EventPool, StreamPool};
use gpupool_mock::{CallKind, CompletionPolicy, MockBackend};
use loom::sync::{Arc, Mutex};
use loom::thread;

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
fn model_deep(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder
        .preemption_bound
        .map(|p| p.max(loom_tests::DEEP_PREEMPTIONS));
    builder.check(f);
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
        let pool = StreamPool::new(mock.clone());
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
        let pool = StreamPool::new(mock.clone());
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
        let pool = StreamPool::new(mock.clone());
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
        let pool = StreamPool::new(mock.clone());
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
        let pool = EventPool::new(mock.clone());
        let shared = pool.get_shared(0).unwrap();
        let event = shared.handle();
        let other = shared.clone();
        let t = spawn_scoped(move || drop(other));
        drop(shared);
        t.join();
        assert_eq!(pool.live_leases(), 0);
        // Returned exactly once: the next lease reuses it, the one after is new.
        let first = pool.get(0).unwrap();
        let second = pool.get(0).unwrap();
        assert_eq!(first.handle(), event);
        assert_ne!(second.handle(), event);
        drop((first, second));
        assert_eq!(pool.purge().unwrap(), 2);
        assert_eq!(mock.live_events(), 0);
    });
}

#[test]
fn event_pool_two_threads_get_put() {
    loom::model(|| {
        let mock = idle_mock(1);
        let pool = EventPool::new(mock.clone());
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
        let pool = StreamPool::new(mock.clone());
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

#[test]
fn thread_cache_owner_races_a_drain() {
    use gpupool_core::internals::CacheModel;
    loom::model(|| {
        let cache = Arc::new(CacheModel::new());
        let cell = cache.cell(0);
        assert!(cell.give(1));
        assert!(cell.give(2));
        let c2 = cache.clone();
        // The owner thread takes both, gives one back and keeps the other.
        let owner = thread::spawn(move || {
            let a = cell.take();
            let b = cell.take();
            if let Some(a) = a {
                assert!(cell.give(a));
            }
            (a, b)
        });
        let drained = c2.drain();
        let (_, kept) = owner.join().unwrap();
        let last = cache.drain();
        let mut all: Vec<usize> = drained
            .iter()
            .copied()
            .chain(kept)
            .chain(last.iter().copied())
            .collect();
        all.sort();
        assert_eq!(all, [1, 2], "a cached handle was lost or duplicated");
    });
}

/// A thread registers its cell (the non-adopting kind: the stream pool with
/// `same_thread_reuse`) and keeps and takes handles in it while another
/// thread drains the cache (a purge) and collects orphans: the registration
/// and the drain are ordered by the registry's lock, every handle ends up
/// exactly once in the drains or with the owner, and the owner's tallies are
/// exact.
#[test]
fn thread_cache_registration_races_a_drain() {
    use gpupool_core::internals::CacheModel;
    model_deep(|| {
        let cache = CacheModel::without_adoption();
        let owner = spawn_scoped(|| {
            let cell = cache.cell(0);
            assert!(cell.give(1));
            assert!(cell.give(2));
            let took = cell.take();
            (cell, took)
        });
        let mut drained = cache.drain();
        assert!(cache.take_orphans().is_empty(), "no owner exited");
        let (cell, took) = owner.join();
        let served = usize::from(took.is_some());
        assert_eq!(cache.served_and_kept(0), (served, 2));
        drained.extend(took);
        drained.extend(cache.drain());
        drained.sort();
        assert_eq!(drained, [1, 2], "a cached handle was lost or duplicated");
        assert_eq!(cell.take(), None);
    });
}
