//! Pooled streams and events against creating and destroying one each time,
//! and against a DALI-style spinlock pool over the same backend, on a real GPU,
//! at 1 to 16 threads and oversubscribed at 64, side by side in one process.
//!
//! ```sh
//! cargo run --release -p gpupool-cuda --example 03-pool-vs-driver
//! ```
//!
//! For each operation and thread count it runs every thread through a fixed
//! number of operations after a barrier, five times, and reports the medians:
//! the time per operation seen by one thread, and the total throughput of all
//! threads. Prints a table, writes it as JSON to `$OUT/pool-vs-driver.json`
//! when `OUT` is set, and ends with `OK` once every measurement ran. Without a
//! driver or a GPU it says so and exits 0.

use std::process::ExitCode;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use gpupool_core::{
    Completion, DeviceId, EventBackend, EventFlags, EventHandle, EventPool, StreamBackend,
    StreamHandle, StreamOptions, StreamPool, StreamPoolConfig,
};
use gpupool_cuda::CudaBackend;

const REPEATS: usize = 5;

/// A faithful DALI-style baseline over the same backend: one spinlock over
/// per-device lists (vectors keep their capacity, as DALI recycles its list
/// nodes); streams are queried on return and sorted into ready or busy; `get`
/// pops the ready list, else scans the busy list newest first, else creates.
struct DaliStreams {
    gpu: CudaBackend,
    lists: spin::Mutex<(Vec<StreamHandle>, Vec<StreamHandle>)>,
}

impl DaliStreams {
    fn get(&self, d: DeviceId) -> StreamHandle {
        {
            let mut l = self.lists.lock();
            if let Some(s) = l.0.pop() {
                return s;
            }
            let mut found = None;
            for i in (0..l.1.len()).rev() {
                if self.gpu.query_stream(l.1[i], d).unwrap() == Completion::Complete {
                    found = Some(l.1.remove(i));
                    break;
                }
            }
            if let Some(s) = found {
                return s;
            }
        }
        self.gpu.create_stream(d, StreamOptions::default()).unwrap()
    }

    fn put(&self, s: StreamHandle, d: DeviceId) {
        let idle = self.gpu.query_stream(s, d).unwrap() == Completion::Complete;
        let mut l = self.lists.lock();
        if idle {
            l.0.push(s)
        } else {
            l.1.push(s)
        }
    }
}

/// DALI's event pool: one spinlock over a per-device list, no query.
struct DaliEvents {
    gpu: CudaBackend,
    list: spin::Mutex<Vec<EventHandle>>,
}

impl DaliEvents {
    fn get(&self, d: DeviceId) -> EventHandle {
        if let Some(e) = self.list.lock().pop() {
            return e;
        }
        self.gpu
            .create_event(d, EventFlags::DISABLE_TIMING)
            .unwrap()
    }

    fn put(&self, e: EventHandle) {
        self.list.lock().push(e);
    }
}

/// Per-op latencies of `threads` threads doing `n` ops each: p50, p99, p99.9 in ns.
fn latencies(threads: usize, n: usize, op: &(dyn Fn() + Sync)) -> [f64; 3] {
    let barrier = Barrier::new(threads);
    let mut all: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut v = Vec::with_capacity(n);
                    barrier.wait();
                    for _ in 0..n {
                        let t = Instant::now();
                        op();
                        v.push(t.elapsed().as_nanos() as u64);
                    }
                    v
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    all.sort_unstable();
    let q = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)] as f64;
    [q(0.5), q(0.99), q(0.999)]
}

/// One measurement: per-op time seen by a thread, and total ops per second.
#[derive(Clone, Copy)]
struct Figure {
    ns_per_op: f64,
    mops: f64,
}

/// Runs `op` `n` times on each of `threads` threads started together, `REPEATS`
/// times; returns the medians.
fn measure(threads: usize, n: usize, op: &(dyn Fn() + Sync)) -> Figure {
    let mut per_op = Vec::new();
    let mut mops = Vec::new();
    for _ in 0..REPEATS {
        let barrier = Barrier::new(threads);
        let times: Vec<Duration> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let t = Instant::now();
                        for _ in 0..n {
                            op();
                        }
                        t.elapsed()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut sorted = times.clone();
        sorted.sort();
        let median_thread = sorted[sorted.len() / 2];
        let slowest = *sorted.last().unwrap();
        per_op.push(median_thread.as_nanos() as f64 / n as f64);
        mops.push((threads * n) as f64 / slowest.as_secs_f64() / 1e6);
    }
    Figure {
        ns_per_op: median(per_op),
        mops: median(mops),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() -> ExitCode {
    let gpu = CudaBackend::new();
    match gpupool_core::Backend::device_count(&gpu) {
        Ok(0) => {
            println!("skipped: no GPU");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!("skipped: {e}");
            return ExitCode::SUCCESS;
        }
        Ok(_) => {}
    }
    let d = DeviceId(0);
    let streams = StreamPool::new(gpu);
    let events = EventPool::new(gpu);
    // Warm: enough pooled streams and events for every thread.
    let warm: Vec<_> = (0..16).map(|_| streams.get(d).unwrap()).collect();
    drop(warm);
    let warm: Vec<_> = (0..16).map(|_| events.get(d).unwrap()).collect();
    drop(warm);

    let pooled_stream = || drop(streams.get(d).unwrap());
    // Same-thread reuse (chosen in the config): no query on return.
    let sticky = StreamPool::with_config(
        gpu,
        StreamPoolConfig {
            same_thread_reuse: true,
            ..StreamPoolConfig::default()
        },
    );
    let sticky_stream = || drop(sticky.get(d).unwrap());
    let raw_stream = || {
        let s = gpu.create_stream(d, StreamOptions::default()).unwrap();
        gpu.destroy_stream(s, d).unwrap();
    };
    let pooled_event = || drop(events.get(d).unwrap());
    let raw_event = || {
        let e = gpu.create_event(d, EventFlags::DISABLE_TIMING).unwrap();
        gpu.destroy_event(e, d).unwrap();
    };

    let dali_streams = DaliStreams {
        gpu,
        lists: spin::Mutex::new((Vec::new(), Vec::new())),
    };
    let dali_events = DaliEvents {
        gpu,
        list: spin::Mutex::new(Vec::new()),
    };
    for _ in 0..16 {
        let s = gpu.create_stream(d, StreamOptions::default()).unwrap();
        dali_streams.put(s, d);
        dali_events.put(gpu.create_event(d, EventFlags::DISABLE_TIMING).unwrap());
    }
    let dali_stream = || {
        let s = dali_streams.get(d);
        dali_streams.put(s, d);
    };
    let dali_event = || {
        let e = dali_events.get(d);
        dali_events.put(e);
    };

    type Op<'a> = &'a (dyn Fn() + Sync);
    // (name, gpupool, baseline, baseline name, ops per thread: gpupool, baseline)
    let cases: [(&str, Op<'_>, Op<'_>, &str, [usize; 2]); 6] = [
        (
            "stream lease+return",
            &pooled_stream,
            &raw_stream,
            "create+destroy",
            [20_000, 500],
        ),
        (
            "event get+put",
            &pooled_event,
            &raw_event,
            "create+destroy",
            [200_000, 5_000],
        ),
        (
            "stream lease+return",
            &pooled_stream,
            &dali_stream,
            "DALI-style pool",
            [20_000, 20_000],
        ),
        (
            "event get+put",
            &pooled_event,
            &dali_event,
            "DALI-style pool",
            [200_000, 200_000],
        ),
        (
            "stream lease+return, same-thread reuse",
            &sticky_stream,
            &raw_stream,
            "create+destroy",
            [200_000, 500],
        ),
        (
            "stream lease+return, same-thread reuse",
            &sticky_stream,
            &dali_stream,
            "DALI-style pool",
            [200_000, 20_000],
        ),
    ];
    let mut rows = Vec::new();
    println!("| operation | baseline | threads | gpupool ns/op/thread | baseline ns/op/thread | gpupool Mops/s | baseline Mops/s | throughput ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, pooled, base, base_name, [n_pooled, n_base]) in cases {
        for threads in [1usize, 2, 4, 8, 16] {
            let p = measure(threads, n_pooled / threads.min(4), pooled);
            let r = measure(threads, n_base / threads.min(4), base);
            let ratio = p.mops / r.mops;
            println!(
                "| {name} | {base_name} | {threads} | {:.0} | {:.0} | {:.3} | {:.3} | {:.2}× |",
                p.ns_per_op, r.ns_per_op, p.mops, r.mops, ratio
            );
            rows.push(format!(
                "{{\"operation\":\"{name}\",\"baseline\":\"{base_name}\",\"threads\":{threads},\"gpupool_ns_per_op\":{:.1},\"baseline_ns_per_op\":{:.1},\"gpupool_mops\":{:.4},\"baseline_mops\":{:.5},\"ratio\":{:.3}}}",
                p.ns_per_op, r.ns_per_op, p.mops, r.mops, ratio
            ));
        }
    }
    println!();
    println!("| oversubscribed: 64 threads | p50 ns | p99 ns | p99.9 ns |");
    println!("|---|---|---|---|");
    for (name, op) in [
        ("gpupool event get+put", &pooled_event as Op<'_>),
        ("DALI-style event get+put", &dali_event as Op<'_>),
        ("gpupool stream lease+return", &pooled_stream as Op<'_>),
        ("DALI-style stream lease+return", &dali_stream as Op<'_>),
        (
            "gpupool stream lease+return, same-thread reuse",
            &sticky_stream as Op<'_>,
        ),
    ] {
        let [p50, p99, p999] = latencies(64, 2_000, op);
        println!("| {name} | {p50:.0} | {p99:.0} | {p999:.0} |");
        rows.push(format!(
            "{{\"operation\":\"{name}\",\"threads\":64,\"p50_ns\":{p50:.0},\"p99_ns\":{p99:.0},\"p999_ns\":{p999:.0}}}"
        ));
    }
    for s in dali_streams.lists.lock().0.drain(..) {
        gpu.destroy_stream(s, d).unwrap();
    }
    for e in dali_events.list.lock().drain(..) {
        gpu.destroy_event(e, d).unwrap();
    }
    let s = streams.total_stats();
    println!(
        "stream pool: {} leases, {} streams created; event pool: {} leases, {} events created",
        s.leases,
        s.created,
        events.total_stats().leases,
        events.total_stats().created
    );
    if let Ok(out) = std::env::var("OUT") {
        let json = format!("[{}]\n", rows.join(",\n"));
        if let Err(e) = std::fs::write(format!("{out}/pool-vs-driver.json"), json) {
            eprintln!("could not write JSON: {e}");
        }
    }
    streams.purge().unwrap();
    sticky.purge().unwrap();
    events.purge().unwrap();
    println!("OK");
    ExitCode::SUCCESS
}
