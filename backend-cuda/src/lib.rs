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
//! - **cudarc interop**: [`cudarc_stream`] lets a lease be used with cudarc's
//!   safe API (kernels, copies); [`CudaBackend::context`] gives the context to
//!   load modules on.
//! - [`testing`]: kernels that keep a stream busy, for tests and benchmarks.
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
pub mod memory;
mod sync;
pub mod testing;

use std::sync::{Arc, OnceLock};

use cudarc::driver::safe::CudaStream;
use cudarc::driver::sys;
use gpupool_core::{EventPool, StreamLease, StreamPool};

pub use backend::CudaBackend;
pub use error::CudaError;
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

/// The leased stream as cudarc's [`CudaStream`], for cudarc's safe API
/// (`launch_builder`, `clone_htod`, `alloc_zeros`, ...). The lease keeps
/// ownership: dropping the returned stream does not destroy or return
/// anything (it is cudarc's `CudaContext::wrap_borrowed_stream`).
///
/// The stream's context is the device's primary context
/// ([`CudaBackend::context`]); load modules there.
///
/// # Safety
///
/// The cudarc stream borrows the lease's CUDA stream but is an `Arc` with no
/// lifetime, so the compiler cannot hold it to the lease. The caller promises:
///
/// 1. The returned `Arc<CudaStream>`, every clone of it, and everything cudarc
///    made that keeps one (a `CudaSlice` allocated on it keeps it, and frees
///    its memory *on this stream* when dropped) are gone before the lease ends
///    (drop, [`return_to_pool`](StreamLease::return_to_pool)). After that the
///    stream belongs to the pool again: it may be leased to another thread,
///    whose work a late call would interleave with, or destroyed by a purge,
///    after which the handle is dangling. (After
///    [`detach`](StreamLease::detach), the caller owns the stream and the
///    same holds until it destroys or returns it.)
/// 2. Work issued through cudarc is ordered with the lease's other work by
///    stream order only: cudarc's own cross-stream tracking does not know
///    about gpupool's streams.
///
/// ```no_run
/// use gpupool_cuda::cudarc::driver::LaunchConfig;
///
/// let lease = gpupool_cuda::streams().get(0)?;
/// {
///     // SAFETY: `stream` and the slice made on it are dropped at the end of
///     // this block, before the lease.
///     let stream = unsafe { gpupool_cuda::cudarc_stream(&lease) }?;
///     let x = stream.clone_htod(&[1.0f32, 2.0, 3.0])?;
///     let back = stream.clone_dtoh(&x)?;
///     assert_eq!(back, [1.0, 2.0, 3.0]);
/// }
/// drop(lease);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub unsafe fn cudarc_stream(
    lease: &StreamLease<'_, CudaBackend>,
) -> Result<Arc<CudaStream>, CudaError> {
    let ctx = CudaBackend::new().context(lease.device())?;
    // SAFETY: the lease's stream is a live stream created by `CudaBackend` on
    // `lease.device()`'s primary context, which is `ctx` (a `StreamPool` of
    // `CudaBackend` holds only streams of a backend with `CudaBackend`'s id,
    // which every `CudaBackend` shares); the caller keeps the wrapper within
    // the lease (this function's contract), and cudarc does not destroy a
    // borrowed stream.
    Ok(unsafe { ctx.wrap_borrowed_stream(lease.handle().as_raw() as sys::CUstream) })
}
