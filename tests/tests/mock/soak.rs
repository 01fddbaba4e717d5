//! Mock-only soak: 10 million mixed pool operations across 8 threads (stream
//! and event leases ended in every way, waits, scratch allocations of all four
//! kinds with resets, purges), with the machine's live streams, events and
//! bytes sampled while it runs (they must stay bounded, not grow with the
//! operation count) and exact at the end: zero after purge and drop, no
//! hazard, no misuse.
//!
//! Ignored by default (about 20 s in release): run with
//! `cargo test --release -p gpupool-tests --test mock -- soak:: --ignored --nocapture`.
#![cfg(not(feature = "cuda"))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use gpupool_core::{MemoryKind, Scratchpad};
use gpupool_tests::{mock_pools, Rng};

const THREADS: usize = 8;
const DEVICES: u32 = 2;

#[test]
#[ignore = "soak: 10 million operations, about 20 s in release; run with --ignored"]
fn ten_million_mixed_operations_leave_nothing_behind() {
    // GPUPOOL_SOAK_OPERATIONS overrides the count (10 million).
    let operations: u64 = std::env::var("GPUPOOL_SOAK_OPERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let (gpu, streams, events) = mock_pools(DEVICES);
    let ops = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let mut peaks = (0usize, 0usize, 0usize);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (gpu, streams, events, ops, operations) =
                (&gpu, &streams, &events, &ops, operations);
            s.spawn(move || {
                let mut rng = Rng::new(t as u64 + 7);
                while ops.load(Ordering::Relaxed) < operations {
                    let d = rng.below(DEVICES as u64) as u32;
                    let a = streams.get(d).unwrap();
                    let b = streams.get(d).unwrap();
                    let mut scratch = Scratchpad::new(gpu, a.order()).unwrap();
                    let mut n = 2;
                    for _ in 0..rng.below(4) {
                        let kind = MemoryKind::ALL[rng.below(4) as usize];
                        let p = scratch
                            .alloc(kind, (rng.below(50_000) + 1) as usize, 64)
                            .unwrap()
                            .unwrap();
                        if kind != MemoryKind::Host {
                            gpu.use_memory(a.handle(), p.as_ptr(), 1).unwrap();
                        }
                        n += 1;
                    }
                    gpu.enqueue_work(a.handle()).unwrap();
                    b.order().wait(&a.order(), events).unwrap();
                    let e = events.get(d).unwrap();
                    n += 2;
                    match rng.below(3) {
                        0 => drop(e),
                        1 => events.put(e.detach(), None).unwrap(),
                        _ => e.destroy().unwrap(),
                    }
                    // The GPU keeps up most of the time, and lags now and then.
                    if rng.below(4) != 0 {
                        gpu.complete_all(b.handle()).unwrap();
                        gpu.complete_all(a.handle()).unwrap();
                    }
                    if rng.below(2) == 0 {
                        scratch.reset().unwrap();
                        n += 1;
                    }
                    drop(scratch);
                    match rng.below(4) {
                        0 => drop((a, b)),
                        1 => {
                            a.return_to_pool().unwrap();
                            b.return_to_pool().unwrap();
                        }
                        2 => {
                            streams.put(a.detach(), None).unwrap();
                            streams.put(b.detach(), None).unwrap();
                        }
                        _ => {
                            gpu.complete_all(a.handle()).unwrap();
                            a.detach().destroy(gpu).unwrap();
                            drop(b);
                        }
                    }
                    n += 2;
                    if rng.below(16) == 0 {
                        gpu.complete_everything();
                    }
                    if rng.below(4096) == 0 {
                        streams.purge().unwrap();
                        events.purge().unwrap();
                        n += 2;
                    }
                    ops.fetch_add(n, Ordering::Relaxed);
                }
            });
        }
        // Sample the machine's live counts while the soak runs.
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) && ops.load(Ordering::Relaxed) < operations {
                let bytes: usize = MemoryKind::ALL.iter().map(|&k| gpu.live_bytes(k)).sum();
                peaks.0 = peaks.0.max(gpu.live_streams());
                peaks.1 = peaks.1.max(gpu.live_events());
                peaks.2 = peaks.2.max(bytes);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
    });
    done.store(true, Ordering::Relaxed);
    let total = ops.load(Ordering::Relaxed);
    println!(
        "soak: {total} operations; peak live streams {}, events {}, bytes {}",
        peaks.0, peaks.1, peaks.2
    );
    assert!(total >= operations);
    // Bounded: a few per thread and device, never growing with the count.
    assert!(peaks.0 <= 64 * THREADS, "live streams grew to {}", peaks.0);
    assert!(peaks.1 <= 64 * THREADS, "live events grew to {}", peaks.1);
    assert!(peaks.2 <= THREADS << 22, "live bytes grew to {}", peaks.2);
    assert_eq!(streams.live_leases(), 0);
    assert_eq!(events.live_leases(), 0);
    assert!(streams.take_error().is_none() && events.take_error().is_none());
    streams.purge().unwrap();
    events.purge().unwrap();
    drop((streams, events));
    gpu.complete_everything();
    assert_eq!((gpu.live_streams(), gpu.live_events()), (0, 0));
    for kind in MemoryKind::ALL {
        assert_eq!(gpu.live_bytes(kind), 0, "{kind:?}");
    }
    assert!(gpu.hazards().is_empty(), "{:?}", &gpu.hazards()[..1]);
    assert!(gpu.misuses().is_empty(), "{:?}", &gpu.misuses()[..1]);
}
