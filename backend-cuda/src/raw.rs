//! Every call gpupool makes into the CUDA driver's C API directly (cudarc's
//! `sys` bindings, and the entry points looked up in `libcuda` at run time),
//! as cudarc keeps its own raw calls in its `result` layer and builds its safe
//! API on top.
//!
//! Each wrapper is an `unsafe fn` whose `# Safety` section states what the
//! driver needs of its arguments (a live handle, a valid pointer, the right
//! context current), or a safe fn where the call takes no handle and cannot
//! cause undefined behaviour whatever its arguments (as cudarc's own
//! `result::ctx::synchronize` is safe). Each returns `Result<_, CudaError>`
//! through [`check`](crate::error::check): a `CUresult` other than
//! `CUDA_SUCCESS` becomes [`CudaError::Driver`](crate::CudaError::Driver),
//! with the exceptions said where they apply (the queries' `NOT_READY`, an
//! entry point the driver does not export). Nothing else is decided here:
//! which context is current, what an error means to the caller, whether a
//! result is ignored on a destroy path: that is the callers'.
//!
//! The rest of the crate calls these, or cudarc's own `result` layer, never
//! `sys::cu*` itself. This module depends only on [`crate::error`],
//! [`crate::library`] (whether `libcuda` is loaded) and `gpupool_core`'s
//! handle types, so every other module may use it.
//!
//! - [`context`]: the current context, a device's primary context.
//! - [`stream`]: streams and events.
//! - [`memory`]: allocation, free and copy.
//! - [`graph`]: stream capture, graphs and their user objects.
//! - [`module`]: module loading and kernel launch (for [`crate::testing`]).
//! - [`symbols`]: entry points looked up in the driver at run time, whatever
//!   CUDA version cudarc's bindings were generated for.

use cudarc::driver::sys;
use gpupool_core::{EventHandle, StreamHandle};

pub(crate) mod context;
pub(crate) mod graph;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod stream;
pub(crate) mod symbols;

pub(crate) use self::context::*;
pub(crate) use self::graph::*;
pub(crate) use self::memory::*;
pub(crate) use self::module::*;
pub(crate) use self::stream::*;
pub(crate) use self::symbols::*;

/// The driver's handle of a stream.
#[inline]
pub(crate) fn raw_stream(s: StreamHandle) -> sys::CUstream {
    s.as_raw() as sys::CUstream
}

/// The driver's handle of an event.
#[inline]
pub(crate) fn raw_event(e: EventHandle) -> sys::CUevent {
    e.as_raw() as sys::CUevent
}
