//! # gpupool
//!
//! Per-device pools of GPU **streams** and **events**, handed out as exclusive
//! RAII leases, and a monotonic, stream-ordered **scratch allocator** for host,
//! pinned, device and managed memory: NVIDIA DALI's `CUDAStreamPool`,
//! `CUDAEventPool` and `DynamicScratchpad`, as a lock-free core over a
//! pluggable backend.
//!
//! This is the crate to depend on. It re-exports the core
//! ([`gpupool-core`](gpupool_core)) and picks the backend by feature:
//!
//! | feature | backend | [`DefaultBackend`] |
//! |---|---|---|
//! | `mock` (default) | [`gpupool-mock`](https://docs.rs/gpupool-mock): a simulated GPU, no GPU or driver needed | `MockBackend` |
//! | `cuda` | [`gpupool-cuda`](https://docs.rs/gpupool-cuda): the CUDA driver API through cudarc, `libcuda` loaded at run time | `CudaBackend` (also when `mock` is on) |
//!
//! ```toml
//! [dependencies]
//! gpupool = "0.1"                                    # the mock: tests and CI without a GPU
//! # gpupool = { version = "0.1", features = ["cuda", "cuda-12080"] }  # a real GPU, CUDA 12.8 bindings
//! ```
//!
//! Code written against [`DefaultBackend`], [`streams()`], [`events()`] and
//! [`backend()`] (or generic over [`Backend`]) switches from the mock to CUDA
//! with that one feature and no `cfg` of its own.
//!
//! More features:
//! - `cuda-11040` … `cuda-13040`: the CUDA version cudarc's bindings are
//!   built for, with `cuda` (at most one: the oldest driver the application
//!   runs on; `cuda-12080` runs on every driver for CUDA 12.8 or later). With
//!   none, the bindings follow the CUDA toolkit installed at build time
//!   (`cuda-version-from-build-system`), or cudarc's newest without one. No
//!   version is a default feature, so naming one never clashes with another.
//! - `nvrtc`: cudarc's NVRTC bindings, at `gpupool::cuda::cudarc::nvrtc`
//!   (loading PTX with cudarc's `CudaContext::load_module` needs its `Ptx`).
//! - `std`: the core's std conveniences (on with either backend). With
//!   `default-features = false` and no backend this crate is the `no_std`
//!   core.
//!
//! ## Example
//!
//! ```
//! use gpupool::{AccessOrder, Scratchpad};
//!
//! let upload = gpupool::streams().get(0)?;
//! let compute = gpupool::streams().get(0)?;
//! let mut scratch = Scratchpad::new(gpupool::backend(), compute.order())?;
//! let input = scratch.to_device(&[1u32, 2, 3])?; // copied in `compute`'s order
//! // Work issued on `compute` from now on runs after `upload`'s work so far,
//! // through a pooled event.
//! compute.order().wait(&upload.order(), gpupool::events())?;
//! // ... kernels on `compute` reading `input` ...
//! assert_eq!(scratch.to_host(&input)?, [1, 2, 3]); // stream-ordered read-back
//! scratch.reset()?;
//! # Ok::<(), gpupool::DefaultError>(())
//! ```
//!
//! The [README](https://docs.rs/crate/gpupool/latest/source/README.md) has the
//! quick start, the examples and the benchmarks.

#![no_std]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "std")]
extern crate std;

pub use gpupool_core::*;

/// The simulated GPU (`gpupool-mock`): streams with queued work that tests
/// complete, stream-ordered memory with hazard detection, fault injection.
#[cfg(feature = "mock")]
#[doc(inline)]
pub use gpupool_mock as mock;

/// The CUDA backend (`gpupool-cuda`), and through it [`cudarc`](gpupool_cuda::cudarc).
#[cfg(feature = "cuda")]
#[doc(inline)]
pub use gpupool_cuda as cuda;

/// The backend the features select: `CudaBackend` with `cuda`.
#[cfg(feature = "cuda")]
pub type DefaultBackend = gpupool_cuda::CudaBackend;

/// The backend the features select: `MockBackend` with `mock` alone.
#[cfg(all(feature = "mock", not(feature = "cuda")))]
pub type DefaultBackend = gpupool_mock::MockBackend;

/// A pool or scratchpad error of the [`DefaultBackend`].
#[cfg(any(feature = "mock", feature = "cuda"))]
pub type DefaultError = Error<<DefaultBackend as Backend>::Error>;

#[cfg(any(feature = "mock", feature = "cuda"))]
mod process_wide;

#[cfg(any(feature = "mock", feature = "cuda"))]
pub use process_wide::{backend, events, streams, take_errors, ErrorsOutOfSight};
