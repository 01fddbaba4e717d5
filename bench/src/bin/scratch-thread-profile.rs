//! Where a learned-size device scratch round spends its time when 1 to 16
//! threads run it at once, each on its own stream, next to controls that
//! touch no gpupool code: the figures behind the thread-scaling discussion in
//! `docs/scratch-scaling.md`.
//!
//! Workloads, each run by every thread in a loop after a barrier:
//! - `alu chain`: one dependent multiply-xor chain (latency bound, no memory);
//! - `alu wide`: eight independent chains (throughput bound, no memory);
//! - `malloc`: a 256-byte heap allocation and free (the system allocator);
//! - `ctx get`: `cuCtxGetCurrent` (a driver call that scales);
//! - `pad new+drop`: `Scratchpad::new` and drop, no allocation;
//! - `backend pair`: the CUDA backend's stream-ordered device allocation and
//!   free of the learned round's size (the per-thread block cache);
//! - `learned round`: the side-by-side benchmark's learned device round (a new
//!   scratchpad with learned sizes, 16 allocations, drop);
//! - `learned pinned round`: the same round in pinned memory, released in the
//!   order of the thread's stream.
//!
//! A machine whose threads share cores (hyperthreads) slows the controls as
//! much as gpupool's code: the controls' ratios are the floor for code that
//! shares nothing. For each workload and thread count: ns per iteration of
//! the median thread (and of the slowest), median of `REPEATS` runs; the
//! thread counts alternate within each repeat. Without a driver or a GPU it
//! says "skipped" and exits 0.
//!
//! `cargo run --release -p gpupool-bench --bin scratch-thread-profile`

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use gpupool_bench::gpu::cuda_or_skip;
use gpupool_bench::scoped::on_threads;
use gpupool_bench::sys_stats::upper_median as median;
use gpupool_core::{
    AccessOrder, DeviceId, MemoryBackend, MemoryKind, ScratchSizes, Scratchpad, StreamBackend,
    StreamOptions,
};
use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::CudaBackend;

const THREADS: [usize; 5] = [1, 2, 4, 8, 16];
const REPEATS: usize = 7;
/// Time one thread spends on one workload in one run (at one thread).
const TARGET: Duration = Duration::from_millis(40);
/// The side-by-side benchmark's round: 16 allocations of these sizes.
const SIZES: [usize; 16] = [
    1, 24, 100, 512, 4096, 65536, 17, 3000, 8192, 40000, 64, 256, 1024, 12345, 50000, 2,
];
const ALIGN: usize = 8;
const D: DeviceId = DeviceId(0);

#[derive(Copy, Clone, Debug, PartialEq)]
enum Work {
    AluChain,
    AluWide,
    Malloc,
    CtxGet,
    PadNewDrop,
    BackendPair,
    LearnedRound,
    LearnedPinnedRound,
}

const WORK: [Work; 8] = [
    Work::AluChain,
    Work::AluWide,
    Work::Malloc,
    Work::CtxGet,
    Work::PadNewDrop,
    Work::BackendPair,
    Work::LearnedRound,
    Work::LearnedPinnedRound,
];

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::AluChain => "alu chain (control)",
            Work::AluWide => "alu wide (control)",
            Work::Malloc => "malloc 256 B (control)",
            Work::CtxGet => "cuCtxGetCurrent (control)",
            Work::PadNewDrop => "pad new+drop",
            Work::BackendPair => "backend device alloc+free",
            Work::LearnedRound => "learned device round",
            Work::LearnedPinnedRound => "learned pinned round",
        }
    }
}

/// The size of one learned round's device block: the sizes at `ALIGN`.
fn learned_size() -> usize {
    SIZES.iter().map(|s| s.next_multiple_of(ALIGN)).sum()
}

/// What one thread keeps between iterations.
struct Thread<'b> {
    gpu: &'b CudaBackend,
    order: AccessOrder<'b>,
    stream: gpupool_core::StreamHandle,
    sizes: ScratchSizes,
    x: u64,
}

impl Thread<'_> {
    fn iterate(&mut self, work: Work, n: usize) {
        for _ in 0..n {
            match work {
                Work::AluChain => {
                    let mut x = self.x;
                    for _ in 0..64 {
                        x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (x >> 29);
                    }
                    self.x = black_box(x);
                }
                Work::AluWide => {
                    let mut v = [self.x; 8];
                    for (i, x) in v.iter_mut().enumerate() {
                        *x ^= i as u64;
                    }
                    for _ in 0..64 {
                        for x in &mut v {
                            *x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (*x >> 29);
                        }
                    }
                    self.x = black_box(v.iter().fold(0, |a, x| a ^ x));
                }
                Work::Malloc => {
                    black_box(Vec::<u8>::with_capacity(black_box(256)));
                }
                Work::CtxGet => {
                    let mut c = std::ptr::null_mut();
                    // SAFETY: writes the current context into `c`, nothing else.
                    let r = unsafe { sys::cuCtxGetCurrent(&mut c) };
                    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuCtxGetCurrent");
                    black_box(c);
                }
                Work::PadNewDrop => {
                    black_box(Scratchpad::new(self.gpu, self.order).expect("a scratchpad"));
                }
                Work::BackendPair => {
                    let size = learned_size();
                    // SAFETY: `stream` is this thread's live stream of device
                    // 0, created by `gpu`; the block is freed in its order
                    // right after, nothing used it.
                    unsafe {
                        let p: NonNull<u8> = self
                            .gpu
                            .allocate_async(MemoryKind::Device, D, size, 256, self.stream)
                            .expect("a device block");
                        self.gpu
                            .deallocate_async(MemoryKind::Device, D, p, size, 256, self.stream)
                            .expect("a stream-ordered free");
                    }
                }
                Work::LearnedRound | Work::LearnedPinnedRound => {
                    let kind = if work == Work::LearnedRound {
                        MemoryKind::Device
                    } else {
                        MemoryKind::Pinned
                    };
                    let pad = Scratchpad::new(self.gpu, self.order)
                        .expect("a scratchpad")
                        .learn_sizes(&self.sizes);
                    for &size in &SIZES {
                        black_box(pad.alloc(kind, size, ALIGN).expect("scratch"));
                    }
                }
            }
        }
    }
}

/// Every thread runs `warm` then (timed, after a barrier) `n` iterations;
/// returns each thread's ns per iteration.
fn run(
    gpu: &CudaBackend,
    streams: &[gpupool_core::StreamHandle],
    work: Work,
    n: usize,
) -> Vec<f64> {
    let barrier = &Barrier::new(streams.len());
    let thread = move |stream| {
        // SAFETY: `stream` was created on device 0 by `gpu` and is destroyed
        // only after every thread of this scope ended; nothing captures it.
        let order = unsafe { AccessOrder::from_raw(gpu, stream, D) };
        let mut t = Thread {
            gpu,
            order,
            stream,
            sizes: ScratchSizes::new(),
            x: 0x2545_F491_4F6C_DD1D,
        };
        t.iterate(work, 256);
        barrier.wait();
        let start = Instant::now();
        t.iterate(work, n);
        start.elapsed().as_nanos() as f64 / n as f64
    };
    on_threads(streams.iter().copied(), "a profile thread", thread, || {})
}

fn main() {
    let Some(gpu) = cuda_or_skip() else {
        return;
    };
    let streams: Vec<_> = (0..THREADS[THREADS.len() - 1])
        .map(|_| {
            gpu.create_stream(D, StreamOptions::default())
                .expect("a stream")
        })
        .collect();
    println!(
        "| workload | {} |",
        THREADS
            .map(|t| format!("{t} thr ns (× 1 thr) [slowest]"))
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(THREADS.len()));
    let blocked = [(Work::LearnedRound, true), (Work::LearnedPinnedRound, true)];
    for (work, in_blocks) in WORK.iter().map(|&w| (w, false)).chain(blocked) {
        // Calibrate at one thread.
        let mut n = 1024usize;
        loop {
            let per = run(&gpu, &streams[..1], work, n)[0];
            if per * n as f64 >= TARGET.as_nanos() as f64 / 8.0 || n >= 1 << 26 {
                n = ((TARGET.as_nanos() as f64 / per.max(0.1)) as usize).clamp(1024, 1 << 26);
                break;
            }
            n *= 4;
        }
        let mut med = vec![Vec::new(); THREADS.len()];
        let mut slow = vec![Vec::new(); THREADS.len()];
        let mut measure = |i: usize| {
            let per = run(&gpu, &streams[..THREADS[i]], work, n);
            slow[i].push(per.iter().copied().fold(0.0, f64::max));
            med[i].push(median(per));
        };
        if in_blocks {
            for i in 0..THREADS.len() {
                for _ in 0..REPEATS {
                    measure(i);
                }
            }
        } else {
            for _ in 0..REPEATS {
                for i in 0..THREADS.len() {
                    measure(i);
                }
            }
        }
        let one = median(med[0].clone());
        let cells: Vec<String> = (0..THREADS.len())
            .map(|i| {
                let m = median(med[i].clone());
                format!("{m:.0} ({:.2}×) [{:.0}]", m / one, median(slow[i].clone()))
            })
            .collect();
        let order = if in_blocks { ", counts in blocks" } else { "" };
        println!("| {}{order} | {} |", work.name(), cells.join(" | "));
    }
    for s in streams {
        // SAFETY: every thread that used the stream has ended; every block
        // freed on it was freed in its order; nothing else holds it.
        unsafe { gpu.destroy_stream(s, D) }.expect("destroying a stream");
    }
    println!("OK");
}
