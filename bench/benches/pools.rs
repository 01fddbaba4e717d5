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

use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpupool_bench::pool_ops::{Op, Pools};
use gpupool_bench::scoped::on_threads;
use gpupool_mock::MockBackend;

/// Runs `op` `iters` times on each of `threads` threads started together;
/// returns the wall time from the first thread's start to the last one's end.
fn run_threads(threads: usize, iters: u64, op: &(dyn Fn() + Sync)) -> Duration {
    let barrier = &Barrier::new(threads);
    let thread = |_| {
        // Register this thread with every pool before the clock starts.
        op();
        barrier.wait();
        let start = Instant::now();
        for _ in 0..iters {
            op();
        }
        (start, Instant::now())
    };
    let spans = on_threads(0..threads, "a benchmark thread", thread, || {});
    let start = spans.iter().map(|s| s.0).min();
    let end = spans.iter().map(|s| s.1).max();
    match (start, end) {
        (Some(s), Some(e)) => e - s,
        _ => Duration::ZERO,
    }
}

/// Times each of `ops` (named by `names`, in order) on one and two threads.
fn bench_all(c: &mut Criterion, group: &str, names: &[&str], ops: &[Op<'_>]) {
    let mut g = c.benchmark_group(group);
    for threads in [1usize, 2] {
        for (&name, op) in names.iter().zip(ops) {
            let op = &**op;
            // Warm: enough pooled objects for every thread.
            run_threads(threads, 16, op);
            g.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
                b.iter_custom(|iters| run_threads(t, iters, op))
            });
        }
    }
    g.finish();
}

fn pools(c: &mut Criterion) {
    let gpu = MockBackend::new(1);
    let pools = Pools::new(&gpu, 1);
    let events = ["gpupool", "dali_style", "mutex_vec", "create_destroy"];
    bench_all(c, "event_get_put", &events, &pools.event_ops());
    let streams = [
        "gpupool",
        "gpupool_same_thread",
        "dali_style",
        "mutex_vec",
        "create_destroy",
    ];
    bench_all(c, "stream_lease_return", &streams, &pools.stream_ops());
    pools.purge();
    assert_eq!(gpu.live_events(), 0);
    assert_eq!(gpu.live_streams(), 0);
}

criterion_group!(benches, pools);
criterion_main!(benches);
