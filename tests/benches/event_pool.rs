//! Event pool get+put: gpupool's lock-free `EventPool` against a
//! `spin::Mutex<Vec<_>>` pool over the same mock backend, on one thread and on
//! two threads at once. The mock costs nothing on the reuse path (neither pool
//! calls the backend once warm), so this measures the pools' own overhead.
//!
//! Run: `cargo bench -p gpupool-tests --bench event_pool`

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use gpupool_core::{DeviceId, EventBackend, EventFlags, EventHandle, EventPool};
use gpupool_mock::MockBackend;

/// The baseline: one spinlock over a per-device `Vec` of events.
struct SpinPool {
    backend: MockBackend,
    lists: Vec<spin::Mutex<Vec<EventHandle>>>,
}

impl SpinPool {
    fn new(backend: MockBackend, devices: usize) -> Self {
        SpinPool {
            backend,
            lists: (0..devices).map(|_| spin::Mutex::new(Vec::new())).collect(),
        }
    }

    fn get(&self, device: u32) -> EventHandle {
        if let Some(e) = self.lists[device as usize].lock().pop() {
            return e;
        }
        self.backend
            .create_event(DeviceId(device), EventFlags::DISABLE_TIMING)
            .unwrap()
    }

    fn put(&self, device: u32, e: EventHandle) {
        self.lists[device as usize].lock().push(e);
    }
}

/// Runs `op` `iters` times on each of `threads` threads started together;
/// returns the wall time of the slowest.
fn run_threads(threads: usize, iters: u64, op: &(dyn Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..iters {
                        op();
                    }
                    t.elapsed()
                })
            })
            .collect();
        barrier.wait();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}

fn event_get_put(c: &mut Criterion) {
    let gpu = MockBackend::new(1);
    let pool = EventPool::new(gpu.clone());
    let spin = SpinPool::new(gpu.clone(), 1);
    // Warm both: enough events for every thread, so neither calls the backend.
    let warm: Vec<_> = (0..4).map(|_| pool.get(0).unwrap()).collect();
    drop(warm);
    for _ in 0..4 {
        let e = spin.get(0);
        spin.put(0, e);
    }
    let ours = || {
        let e = pool.get(0).unwrap();
        black_box(e.get());
    };
    let baseline = || {
        let e = spin.get(0);
        black_box(e);
        spin.put(0, e);
    };

    let mut g = c.benchmark_group("event_get_put");
    for threads in [1usize, 2] {
        g.bench_function(format!("gpupool/{threads}t"), |b| {
            b.iter_custom(|iters| run_threads(threads, iters, &ours))
        });
        g.bench_function(format!("spin_mutex_vec/{threads}t"), |b| {
            b.iter_custom(|iters| run_threads(threads, iters, &baseline))
        });
    }
    g.finish();
    assert_eq!(pool.live_leases(), 0);
}

criterion_group!(benches, event_get_put);
criterion_main!(benches);
