//! Event get+put and stream lease+return on the mock backend, gpupool's pools
//! against the baselines of `gpupool_bench::baselines`: the DALI-style pools
//! (a spinlock over linked lists with node recycling; the stream pool queries
//! on return), a `std::sync::Mutex<Vec<_>>` pool, and no pool (create and
//! destroy each time), on one thread and on two threads at once. The mock's
//! calls cost little, so this shows the pools' own overhead.
//!
//! Run: `cargo bench -p gpupool-bench --bench pools` (criterion's HTML report,
//! with plots, lands in `target/criterion/report/index.html`). For every
//! thread count, 4 threads per core and the tail latencies, in one table, run
//! the `side-by-side` benchmark (`--bin side-by-side`) instead.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpupool_bench::baselines::{
    event_create_destroy, stream_create_destroy, DaliEventPool, DaliStreamPool, MutexVecEventPool,
    MutexVecStreamPool,
};
use gpupool_core::{DeviceId, EventFlags, EventPool, StreamPool, StreamPoolConfig};
use gpupool_mock::MockBackend;

const D: DeviceId = DeviceId(0);

/// Runs `op` `iters` times on each of `threads` threads started together;
/// returns the wall time from the first thread's start to the last one's end.
fn run_threads(threads: usize, iters: u64, op: &(dyn Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    // Register this thread with every pool before the clock starts.
                    op();
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        op();
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a benchmark thread panicked"))
            .collect()
    });
    let start = spans.iter().map(|s| s.0).min();
    let end = spans.iter().map(|s| s.1).max();
    match (start, end) {
        (Some(s), Some(e)) => e - s,
        _ => Duration::ZERO,
    }
}

fn bench_all(c: &mut Criterion, group: &str, variants: &[(&str, &(dyn Fn() + Sync))]) {
    let mut g = c.benchmark_group(group);
    for threads in [1usize, 2] {
        for &(name, op) in variants {
            // Warm: enough pooled objects for every thread.
            run_threads(threads, 16, op);
            g.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
                b.iter_custom(|iters| run_threads(t, iters, op))
            });
        }
    }
    g.finish();
}

fn event_get_put(c: &mut Criterion) {
    let gpu = MockBackend::new(1);
    let flags = EventFlags::DISABLE_TIMING;
    let pool = EventPool::new(gpu.clone());
    let dali = DaliEventPool::new(gpu.clone(), flags).expect("a DALI-style event pool");
    let mutex_vec = MutexVecEventPool::new(gpu.clone(), flags, 1);
    let ours = || {
        black_box(pool.get(D).expect("get").handle());
    };
    let dali_op = || {
        let e = dali.get(D).expect("get");
        // SAFETY: an event this pool just gave out on `D`, handed back.
        unsafe { dali.put(black_box(e), D) };
    };
    let mutex_vec_op = || {
        let e = mutex_vec.get(D).expect("get");
        // SAFETY: an event this pool just gave out on `D`, handed back.
        unsafe { mutex_vec.put(black_box(e), D) };
    };
    let create = || event_create_destroy(&gpu, D, flags).expect("create+destroy");
    bench_all(
        c,
        "event_get_put",
        &[
            ("gpupool", &ours),
            ("dali_style", &dali_op),
            ("mutex_vec", &mutex_vec_op),
            ("create_destroy", &create),
        ],
    );
    assert_eq!(pool.live_leases(), 0);
    pool.purge().expect("purge");
    dali.purge().expect("purge");
    mutex_vec.purge().expect("purge");
    assert_eq!(gpu.live_events(), 0);
}

fn stream_lease_return(c: &mut Criterion) {
    let gpu = MockBackend::new(1);
    let pool = StreamPool::new(gpu.clone());
    let sticky = StreamPool::with_config(
        gpu.clone(),
        StreamPoolConfig {
            same_thread_reuse: true,
            ..StreamPoolConfig::default()
        },
    );
    let dali = DaliStreamPool::new(gpu.clone());
    let mutex_vec = MutexVecStreamPool::new(gpu.clone(), 1);
    let ours = || {
        black_box(pool.get(D).expect("get").handle());
    };
    let sticky_op = || {
        black_box(sticky.get(D).expect("get").handle());
    };
    let dali_op = || {
        black_box(dali.get(D).expect("get").handle());
    };
    let mutex_vec_op = || {
        let s = mutex_vec.get(D).expect("get");
        // SAFETY: a stream this pool just gave out on `D`, handed back.
        unsafe { mutex_vec.put(black_box(s), D) };
    };
    let create = || stream_create_destroy(&gpu, D).expect("create+destroy");
    bench_all(
        c,
        "stream_lease_return",
        &[
            ("gpupool", &ours),
            ("gpupool_same_thread", &sticky_op),
            ("dali_style", &dali_op),
            ("mutex_vec", &mutex_vec_op),
            ("create_destroy", &create),
        ],
    );
    assert_eq!(pool.live_leases() + sticky.live_leases(), 0);
    pool.purge().expect("purge");
    sticky.purge().expect("purge");
    dali.purge().expect("purge");
    mutex_vec.purge().expect("purge");
    assert_eq!(gpu.live_streams(), 0);
}

criterion_group!(benches, event_get_put, stream_lease_return);
criterion_main!(benches);
