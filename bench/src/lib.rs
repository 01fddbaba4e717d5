//! gpupool's measurements (not published): the baselines gpupool is measured
//! against, the benchmarks and the probes.
//!
//! - [`baselines`]: DALI-style spinlock pools, `Mutex<Vec>` pools, no pool,
//!   a DALI-style scratchpad, plain calls and bumpalo for host scratch, over
//!   the backend traits. The side-by-side benchmark
//!   (`src/bin/side-by-side/`: every pool and scratch operation against
//!   them, on the mock or with `--features cuda` on a GPU) and the criterion
//!   benches (`benches/`) measure gpupool against them; [`pool_ops`] holds
//!   the pool operations both time.
//! - The probes on a GPU, each a binary that says "skipped" without one:
//!   `soak`, `driver-scaling`, `capture-probe`, `scratch-thread-profile`,
//!   `one-thread-rows` (gpupool's own one-thread rows, from the
//!   `gpupool-rows` crate in `rows/`, which `scripts/same-process-rows.sh`
//!   also compiles against two builds of gpupool into one binary,
//!   `same-process-rows/main.rs`).
//!
//! The async-completion benchmark (`src/bin/async-completion.rs`) compares
//! four ways of making GPU completion awaitable from async Rust, in one
//! process, on the same streams and the same kernel:
//!
//! - (a) [`designs::gpupool`]: gpupool's own futures
//!   (`AccessOrder::completed`, one completion engine thread per event pool);
//! - (b) [`designs::blocking`]: a pooled event and `cuEventSynchronize` in
//!   tokio's `spawn_blocking`;
//! - (c) [`designs::hostfn`]: a `cuLaunchHostFunc` callback per future that
//!   sets a flag and wakes the task;
//! - (d) [`designs::cutile`]: a port of cutile-rs's `cuda-async` completion
//!   path (a bounded `cuStreamQuery` spin, then a reactor thread scanning
//!   pinned flags written by `cuStreamWriteValue32`, with a
//!   `cuLaunchHostFunc` fallback); run twice, with cuda-async's 20 µs spin
//!   budget (`d-cutile`) and with none (`d0-cutile-nospin`), since kernels
//!   shorter than the budget are nearly all settled by the spin.
//!
//! [`gpu`] holds the GPU side (kernels, pinned timestamp slots, clock
//! calibration), [`harness`] one measured run, [`sys_stats`] the CPU-time
//! and percentile helpers, [`report`] the table and the CSV, [`scoped`] the
//! threads of a multi-thread measurement.

pub mod baselines;
pub mod designs;
pub mod gpu;
pub mod harness;
pub mod pool_ops;
pub mod report;
pub mod scoped;
pub mod sys_stats;
