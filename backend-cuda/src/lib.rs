//! # gpupool-cuda
//!
//! gpupool's CUDA backend: [`CudaBackend`] implements the core's backend traits
//! over the CUDA driver API through [`cudarc`], so a
//! [`StreamPool`] and an [`EventPool`] hand out real CUDA streams and events.
//!
//! - **Built without CUDA, loaded at run time.** cudarc is used with
//!   `dynamic-loading`: this crate builds, and its pools can be constructed,
//!   on a machine with no NVIDIA driver. The first pool call that needs the
//!   driver loads `libcuda`; without it, the call fails with
//!   [`CudaError::NoDriver`] (nothing panics). Zero devices gives the pools'
//!   `Error::NoDevice`.
//! - **Primary contexts.** Streams (non-blocking, priority clamped to the
//!   device's range) and events (the pool's flags; timing disabled by default)
//!   live on each device's primary context, the one the CUDA runtime uses, so
//!   they mix freely with runtime-API code and other libraries.
//! - **Process-wide pools**, like DALI's `instance()`: [`streams()`] and
//!   [`events()`], created on first use and never dropped (so nothing is
//!   destroyed while the driver shuts down at exit).
//! - **gpupool's own device memory pool** per device ([`memory`]): the
//!   backend never changes the device's default memory pool, so other users
//!   of `cudaMallocAsync` in the process see no difference.
//! - **cudarc interop** ([`interop`]): [`with_cudarc_stream`] runs a closure
//!   with a lease's stream lent as a [`LeasedStream`] (cudarc's kernel
//!   launches, events and synchronization on it; no `unsafe` needed for the
//!   stream); [`DeviceSliceExt::kernel_arg`] passes scratch memory to a
//!   kernel; [`CudaBackend::context`] gives the context to load modules on;
//!   [`cudarc_stream`] is the `unsafe`, unscoped form.
//! - [`testing`]: kernels that keep a stream busy, for tests and benchmarks.
//!
//! ## Choosing the CUDA version
//!
//! cudarc generates its driver bindings for one CUDA version, chosen by a
//! cargo feature, and this crate forwards them: `cuda-11040` ...
//! `cuda-13040` (every version cudarc 0.19.10 has). Name at most one, the
//! oldest driver the application runs on: the driver is loaded at run time
//! and must support the version chosen (drivers are backward compatible: a
//! newer driver runs code built for an older CUDA version); two define
//! cudarc's bindings twice (E0428). None is a default feature. With none,
//! the bindings follow the CUDA toolkit installed where the crate is built
//! (`nvcc --version`, cudarc's `cuda-version-from-build-system`), or, without
//! a toolkit, the newest version cudarc knows:
//!
//! ```toml
//! [dependencies]
//! gpupool-cuda = { version = "0.1", features = ["cuda-12080"] }
//! ```
//!
//! gpupool's own driver calls do not depend on the version chosen (the one
//! whose signature changed between versions, `cuStreamGetCaptureInfo`, is
//! looked up in the driver at run time).
//!
//! An application that also depends on cudarc itself should leave cudarc's
//! version features to this crate (or enable the same one). The `nvrtc`
//! feature turns on cudarc's NVRTC bindings (`gpupool_cuda::cudarc::nvrtc`),
//! for compiling CUDA C at run time.
//!
//! ## Example
//!
//! ```
//! use gpupool_core::{AccessOrder, Error};
//! use gpupool_cuda::CudaError;
//!
//! fn run() -> Result<(), Error<CudaError>> {
//!     let upload = gpupool_cuda::streams().get(0)?;
//!     let compute = gpupool_cuda::streams().get(0)?;
//!     // ... copies on `upload` ...
//!     // Work issued on `compute` from now on runs after the copies so far.
//!     compute.order().wait(&upload.order(), gpupool_cuda::events())?;
//!     // ... kernels on `compute` ...
//!     AccessOrder::host().wait(&compute.order(), gpupool_cuda::events())?; // synchronize
//!     Ok(())
//! }
//!
//! match run() {
//!     Ok(()) => println!("done"),
//!     Err(Error::Backend { source: CudaError::NoDriver, .. }) => println!("no CUDA driver here"),
//!     Err(e) => panic!("{e}"),
//! }
//! ```
//!
//! [`StreamPool`]: gpupool_core::StreamPool
//! [`EventPool`]: gpupool_core::EventPool

#![warn(missing_docs)]

mod backend;
#[doc(hidden)]
pub mod block_pool; // public for the loom models only
pub mod device_cache;
mod driver;
mod error;
mod graph;
pub mod interop;
mod kernel_arg;
mod library;
pub mod memory;
mod raw;
#[doc(hidden)]
pub mod shards; // public for the loom models only
mod streams_events;
mod sync;
pub mod testing;

use std::sync::OnceLock;

use gpupool_core::{EventPool, StreamPool};

pub use backend::CudaBackend;
pub use error::CudaError;
pub use graph::{CudaGraph, CudaGraphExec};
pub use interop::{cudarc_stream, with_cudarc_owned_stream, with_cudarc_stream, LeasedStream};
pub use kernel_arg::{DeviceSliceExt, KernelPtr};
pub use memory::MemoryStats;

/// The cudarc this crate is built on, so users name the same version.
pub use cudarc;

/// The process-wide stream pool (DALI's `CUDAStreamPool::instance()`), with the
/// default configuration: non-blocking streams at the default priority.
///
/// Created on the first call; the pool calls the driver only on its own first
/// `get` or `put`. It lives until the process exits and is never dropped, so
/// its streams are never destroyed during driver shutdown; call
/// [`purge`](StreamPool::purge) to give them back earlier.
///
/// ```
/// let pool = gpupool_cuda::streams();
/// assert!(std::ptr::eq(pool, gpupool_cuda::streams()));
/// assert_eq!(pool.device_count(), None); // no driver call yet
/// ```
pub fn streams() -> &'static StreamPool<CudaBackend> {
    static POOL: OnceLock<StreamPool<CudaBackend>> = OnceLock::new();
    POOL.get_or_init(|| StreamPool::new(CudaBackend::new()))
}

/// The process-wide event pool (DALI's `CUDAEventPool::instance()`): events
/// with timing disabled. Lazy and never dropped, like [`streams()`].
///
/// ```
/// use gpupool_core::EventFlags;
/// assert_eq!(gpupool_cuda::events().flags(), EventFlags::DISABLE_TIMING);
/// ```
pub fn events() -> &'static EventPool<CudaBackend> {
    static POOL: OnceLock<EventPool<CudaBackend>> = OnceLock::new();
    POOL.get_or_init(|| EventPool::new(CudaBackend::new()))
}
