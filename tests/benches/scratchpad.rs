//! Host scratch rounds: gpupool's `Scratchpad` (host kind, reset between rounds)
//! against `bumpalo::Bump` (reset between rounds) on the same sizes: 16
//! allocations of 1 B to 64 KiB, alignment 8. Both are warm, so neither asks its
//! upstream for memory; this measures the bump paths themselves.
//!
//! Run: `cargo bench -p gpupool-tests --bench scratchpad`

use std::alloc::Layout;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use gpupool_core::{AccessOrder, MemoryKind, Scratchpad};
use gpupool_mock::MockBackend;

/// 16 sizes between 1 B and 64 KiB.
const SIZES: [usize; 16] = [
    1, 24, 100, 512, 4096, 65536, 17, 3000, 8192, 40000, 64, 256, 1024, 12345, 50000, 2,
];

fn scratch_rounds(c: &mut Criterion) {
    let gpu = MockBackend::new(1);
    let mut scratch = Scratchpad::new(&gpu, AccessOrder::host());
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
    g.bench_function("gpupool_scratchpad", |b| {
        b.iter(|| {
            for &s in &SIZES {
                black_box(scratch.alloc(MemoryKind::Host, black_box(s), 8).unwrap());
            }
            scratch.reset().unwrap();
        })
    });
    g.bench_function("bumpalo", |b| {
        b.iter(|| {
            for &s in &SIZES {
                black_box(bump.alloc_layout(Layout::from_size_align(black_box(s), 8).unwrap()));
            }
            bump.reset();
        })
    });
    g.finish();
}

criterion_group!(benches, scratch_rounds);
criterion_main!(benches);
