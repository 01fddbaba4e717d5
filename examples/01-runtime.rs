//! 01-runtime: a small multi-threaded GPU runtime on gpupool, on the mock
//! machine (no GPU needed).
//!
//! Each worker thread owns an "upload" stream for the life of the run. Every
//! iteration it leases a fresh stream for a kernel, orders that stream after
//! its upload stream with `AccessOrder::wait` (a pooled event, recorded and
//! waited on), queues the kernel, and returns the lease while the kernel may
//! still be running. Every few iterations a worker lets the simulated GPU
//! finish everything queued so far, so returned streams are often still busy
//! and the pool's busy list, scan and promotion all take part.
//!
//! It runs on a mock machine of its own (not the process-wide
//! `gpupool::backend()`), because it completes the simulated work by hand and
//! counts the driver calls the pools made.
//!
//! Run: `cargo run --release --example 01-runtime` (builds gpupool, its core,
//! the mock and crossbeam-epoch, nothing else).

use std::time::{Duration, Instant};

use gpupool::mock::{CallKind, MockBackend};
use gpupool::{DeviceId, EventPool, PoolStats, StreamPool};

const WORKERS: usize = 4;
const DEVICES: u32 = 2;
/// Iterations a worker runs ahead of the simulated GPU.
const GPU_LAG: usize = 8;

fn main() {
    // GPUPOOL_DEMO_ITERATIONS overrides the iterations per worker.
    let iterations: usize = std::env::var("GPUPOOL_DEMO_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let gpu = MockBackend::new(DEVICES);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());

    let start = Instant::now();
    let lease_time: Duration = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (gpu, streams, events) = (&gpu, &streams, &events);
                scope.spawn(move || {
                    let device = DeviceId((w as u32) % DEVICES);
                    let upload = streams.get(device).expect("upload stream");
                    let mut in_pool = Duration::ZERO;
                    for i in 0..iterations {
                        gpu.enqueue_work(upload.handle()).expect("upload");
                        let t = Instant::now();
                        let kernel = streams.get(device).expect("kernel stream");
                        in_pool += t.elapsed();
                        kernel
                            .order()
                            .wait(&upload.order(), events)
                            .expect("order the kernel after the upload");
                        gpu.enqueue_work(kernel.handle()).expect("kernel");
                        let t = Instant::now();
                        drop(kernel); // back to the pool, maybe still busy
                        in_pool += t.elapsed();
                        if i % GPU_LAG == GPU_LAG - 1 {
                            gpu.complete_everything(); // the GPU catches up
                        }
                    }
                    in_pool
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let wall = start.elapsed();

    let leases = WORKERS * iterations;
    let s = streams.total_stats();
    let e = events.total_stats();
    println!("gpupool demo: {WORKERS} workers x {iterations} iterations on a mock machine of {DEVICES} devices");
    println!();
    print_stats("stream pool", &s);
    print_stats("event pool", &e);
    println!("  leases:    leases handed out");
    println!("  reused:    served from the ready list (streams found idle when they came back)");
    println!(
        "  busy hits: served by a stream that came back busy and had finished since (one query)"
    );
    println!(
        "  promoted:  finished streams the same scan moved from the busy list to the ready list"
    );
    println!(
        "  created:   leases that had to create a stream or event (the driver call a pool saves)"
    );
    println!("  live:      leases out now");
    println!();
    println!(
        "driver calls: create stream {}, create event {}, query stream {}, record event {}, stream wait {}",
        gpu.calls(CallKind::CreateStream),
        gpu.calls(CallKind::CreateEvent),
        gpu.calls(CallKind::QueryStream),
        gpu.calls(CallKind::RecordEvent),
        gpu.calls(CallKind::StreamWaitEvent),
    );
    println!(
        "streams created: {} for {} kernel leases (+{WORKERS} upload streams); events created: {} for {} waits",
        s.created, leases, e.created, e.leases
    );
    println!(
        "time per kernel lease (get + return, measured in the workers): {:.0} ns; wall time {:.2?}",
        lease_time.as_nanos() as f64 / leases as f64,
        wall
    );
    println!(
        "  (mock times: the simulated driver takes a lock per call, a real one costs more: \
         see the README's H200 figures)"
    );

    assert_eq!(streams.live_leases(), 0);
    streams.purge().expect("purge streams");
    events.purge().expect("purge events");
    drop((streams, events));
    assert_eq!(
        gpu.live_streams() + gpu.live_events(),
        0,
        "everything was destroyed"
    );
    println!("after purge and drop: 0 streams and 0 events alive on the machine");
}

fn print_stats(name: &str, s: &PoolStats) {
    println!(
        "{name:>12}: {:>7} leases | {:>7} reused | {:>6} busy hits | {:>6} promoted | {:>4} created | {} live",
        s.leases, s.reused, s.busy_hits, s.promoted, s.created, s.live_leases
    );
}
