//! Host scratch rounds: gpupool's `Scratchpad` (host kind) against
//! `bumpalo::Bump` on the same sizes: 16 allocations of 1 B to 64 KiB,
//! alignment 8, per round. Two ways of using each:
//!
//! - `*_reset`: one allocator, reset between rounds. Both are warm, so neither
//!   asks its upstream for memory; this measures the bump paths themselves.
//! - `*_new`: a new allocator each round, dropped at its end, as DALI uses its
//!   `DynamicScratchpad` (one per operator run). Every round takes its blocks
//!   from upstream and gives them back: the mock backend's `std::alloc` blocks
//!   (behind its mutex and bookkeeping) for the scratchpad, the global
//!   allocator's chunks for bumpalo.
//!
//! - `mock_upstream_only`: what `scratchpad_new` asks of the mock in a round,
//!   and nothing else (the three host blocks, 64, 128 and 256 KiB, allocated
//!   and freed): the share of `scratchpad_new` that is the mock backend's.
//!
//! Criterion reports time per round of 16 allocations (and the throughput in
//! allocations per second).
//!
//! Run: `cargo bench -p gpupool-bench --bench scratchpad`

use std::alloc::Layout;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpupool_core::{AccessOrder, DeviceId, MemoryBackend, MemoryKind, Scratchpad};
use gpupool_mock::MockBackend;

/// 16 sizes between 1 B and 64 KiB.
const SIZES: [usize; 16] = [
    1, 24, 100, 512, 4096, 65536, 17, 3000, 8192, 40000, 64, 256, 1024, 12345, 50000, 2,
];

fn scratch_rounds(c: &mut Criterion) {
    let gpu = MockBackend::new(1);
    let mut scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
    let mut bump = bumpalo::Bump::new();
    for _ in 0..3 {
        for &s in &SIZES {
            scratch.alloc(MemoryKind::Host, s, 8).unwrap();
            bump.alloc_layout(Layout::from_size_align(s, 8).unwrap());
        }
        scratch.reset().unwrap();
        bump.reset();
    }
    let mut g = c.benchmark_group("host_round_of_16");
    g.throughput(Throughput::Elements(SIZES.len() as u64));
    g.bench_function("scratchpad_reset", |b| {
        b.iter(|| {
            for &s in &SIZES {
                black_box(scratch.alloc(MemoryKind::Host, black_box(s), 8).unwrap());
            }
            scratch.reset().unwrap();
        })
    });
    g.bench_function("bumpalo_reset", |b| {
        b.iter(|| {
            for &s in &SIZES {
                black_box(bump.alloc_layout(Layout::from_size_align(black_box(s), 8).unwrap()));
            }
            bump.reset();
        })
    });
    g.bench_function("scratchpad_new", |b| {
        b.iter(|| {
            let scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
            for &s in &SIZES {
                black_box(scratch.alloc(MemoryKind::Host, black_box(s), 8).unwrap());
            }
            drop(scratch);
        })
    });
    g.bench_function("bumpalo_new", |b| {
        b.iter(|| {
            let bump = bumpalo::Bump::new();
            for &s in &SIZES {
                black_box(bump.alloc_layout(Layout::from_size_align(black_box(s), 8).unwrap()));
            }
            drop(bump);
        })
    });
    g.bench_function("mock_upstream_only", |b| {
        b.iter(|| {
            for size in [64 << 10, 128 << 10, 256 << 10] {
                let p = gpu
                    .allocate(MemoryKind::Host, DeviceId(0), size, 16)
                    .unwrap();
                // SAFETY: `p` was just allocated with this kind, device, size
                // and alignment, and nothing uses it.
                unsafe {
                    gpu.deallocate(MemoryKind::Host, DeviceId(0), black_box(p), size, 16)
                        .unwrap()
                };
            }
        })
    });
    g.finish();
    drop(scratch);
    assert_eq!(gpu.live_bytes(MemoryKind::Host), 0, "the bench leaked");
}

criterion_group!(benches, scratch_rounds);
criterion_main!(benches);
