//! gpupool's one-thread rows (`bench/rows/src/rows.rs`, the current rows
//! crate's) compiled against the API gpupool had before the soundness change
//! (`786791a`): plain `AccessOrder` values, safe stream calls, infallible
//! `Scratchpad::new`, `get()` on leases. `scripts/same-process-rows.sh` builds
//! this file, with `rows.rs` beside it, as the rows crate of a revision whose
//! core has no `BackendId` (such as `1ad68b3`), so that the same loops can be
//! timed against it in one process. Same rows, same order, same sizes as the
//! current rows crate; the bare backend is the mock here (that API has no room
//! for the current one).

pub use gpupool_core;
pub use gpupool_cuda::CudaBackend as Gpu;
pub use gpupool_mock::MockBackend as Mock;

/// Stands in for the current rows crate's bare backend: the mock.
pub struct Bare;

impl Bare {
    /// A mock with one device.
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> Mock {
        Mock::new(1)
    }
}

// That API's side of the calls where builds differ (`rows.rs` says which;
// the current rows crate's `lib.rs` has the same macros for its API).

/// The access order of `$stream`, on device 0.
macro_rules! stream_order {
    ($gpu:expr, $stream:expr) => {
        AccessOrder::stream($stream, D)
    };
}

/// A new scratchpad on `$order`.
macro_rules! new_scratchpad {
    ($gpu:expr, $order:expr) => {
        Scratchpad::new($gpu, $order)
    };
}

/// A lease's handle.
macro_rules! lease_handle {
    ($lease:expr) => {
        $lease.get()
    };
}

/// Destroys the rows' stream (a `Result`).
macro_rules! destroy_stream {
    ($gpu:expr, $stream:expr) => {
        $gpu.destroy_stream($stream, D)
    };
}

// `bench/rows/src/rows.rs` here; beside this file in the copy the script
// builds.
#[path = "../src/rows.rs"]
mod rows;

pub use rows::{calibrate, time, with_rows, Row};
