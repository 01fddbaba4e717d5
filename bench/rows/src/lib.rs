//! gpupool's own one-thread rows: the stream and event pools and the scratch
//! rounds of each kind, each a closure that runs one operation (a lease and
//! its return, a round of 16 allocations), and the helpers that time them.
//!
//! Used by gpupool-bench's `one-thread-rows` binary, and by
//! `scripts/same-process-rows.sh`, which compiles two copies of this crate
//! (its source from the working tree), one against a build of gpupool from
//! before a change and one against the working tree (or a later revision),
//! to time both builds in one process (`bench/same-process-rows/main.rs`),
//! on CUDA, on the mock or on the [`Bare`] backend. So: only API that every
//! build since the soundness issue has, and the backends each build's rows
//! run on are re-exported here ([`Gpu`], [`Mock`], [`Bare`], and the build's
//! [`gpupool_core`]).

mod bare;

pub use bare::{Bare, BareError};
pub use gpupool_core;
pub use gpupool_cuda::CudaBackend as Gpu;
pub use gpupool_mock::MockBackend as Mock;

// This API's side of the calls where builds differ (`rows.rs` says which;
// `legacy/lib.rs` has the same macros for the API before the soundness
// change).

/// The access order of `$stream`, on device 0 of `$gpu`.
macro_rules! stream_order {
    ($gpu:expr, $stream:expr) => {
        // SAFETY: the rows' stream was created on device 0 by `gpu` and is
        // destroyed at the end, after every scratchpad on it is gone;
        // nothing captures it.
        unsafe { AccessOrder::from_raw($gpu, $stream, D) }
    };
}

/// A new scratchpad on `$order`.
macro_rules! new_scratchpad {
    ($gpu:expr, $order:expr) => {
        Scratchpad::new($gpu, $order).expect("a scratchpad")
    };
}

/// A lease's handle.
macro_rules! lease_handle {
    ($lease:expr) => {
        $lease.handle()
    };
}

/// Destroys the rows' stream (a `Result`).
macro_rules! destroy_stream {
    ($gpu:expr, $stream:expr) => {
        // SAFETY: every scratchpad on the stream is gone; nothing else holds
        // it.
        unsafe { $gpu.destroy_stream($stream, D) }
    };
}

mod rows;

pub use rows::{calibrate, time, with_rows, Row};
