//! The [`CudaBackend`] type: a handle to the process's CUDA driver. The
//! core's traits are implemented for it in [`crate::streams_events`] (streams
//! and events) and [`crate::memory`] (memory); the modules of the block pools,
//! the device cache and memory add their inherent methods (switches,
//! statistics) next to what those methods act on. This module sits below all
//! of them, so each can name the type without importing the others.

use std::sync::Arc;

use cudarc::driver::safe::CudaContext;
use gpupool_core::DeviceId;
#[cfg(doc)]
use gpupool_core::{Backend, BackendId, EventBackend, StreamBackend, StreamHandle};

use crate::driver::driver;
use crate::error::CudaError;

/// The CUDA backend: streams and events of the driver API, on each device's
/// primary context.
///
/// It is a zero-sized handle to state shared by the whole process (the loaded
/// driver, one retained primary context per device), so it is free to create,
/// copy and compare. Creating one calls nothing; the first call loads the
/// driver, and fails with [`CudaError::NoDriver`] on a machine without one.
///
/// Streams are created non-blocking (`CU_STREAM_NON_BLOCKING`), with the
/// requested priority clamped to the device's range; events with the flags
/// given (the pools default to `CU_EVENT_DISABLE_TIMING`).
///
/// # Raw handles
///
/// The trait methods that take a raw `CUstream`, `CUevent` or address are
/// `unsafe fn`s: the caller keeps the contract of the core traits (see
/// [`Backend`]'s "Handle contracts" and each method's `# Safety` list). The
/// driver checks some misuse (a destroyed handle often gives
/// `CUDA_ERROR_INVALID_HANDLE`), but not all: anything else is undefined
/// behaviour inside the driver, which no Rust type can rule out. What the
/// traits' "usable stream of `device`" and "usable event of `device`" mean
/// for this backend, precisely:
///
/// - a **stream** is one created by a `CudaBackend`
///   ([`create_stream`](StreamBackend::create_stream): non-blocking, on the
///   device's primary context) and not destroyed yet, or one of the special
///   streams 0, 1, 2 ([`StreamHandle::NULL`], [`LEGACY`](StreamHandle::LEGACY),
///   [`PER_THREAD`](StreamHandle::PER_THREAD)), which mean the default
///   streams of `device`'s primary context;
/// - the **device** named with a stream is that stream's device (the one it
///   was created on); with an event, the event's (CUDA records an event only
///   on a stream of its own context);
/// - an **event** is one created by a `CudaBackend`
///   ([`create_event`](EventBackend::create_event)) on that device and not
///   destroyed yet;
/// - an **address** given to a free or a copy came from this backend's
///   allocate calls for that kind and device (see the
///   [`MemoryBackend`](gpupool_core::MemoryBackend) impl), or, for a copy,
///   is host memory the caller owns.
///
/// # The thread's current context
///
/// A call on a created stream or event uses the context its handle carries; if
/// the thread has no current context, the device's primary one is made
/// current and left there. A call that needs a particular context (creating a
/// stream or an event, anything on a special stream, memory allocation, the
/// closures of [`with_cudarc_stream`](crate::with_cudarc_stream)) makes the
/// device's primary context current for the call and then puts the previous
/// one back, also after a panic, **if it is a primary context**: to hand a
/// context back to the driver gpupool must know it is alive, and it knows
/// that only of primary contexts, which its process-wide table retains for
/// the life of the process (the previously current one is retained into the
/// table then, if it was not yet; a device whose primary context nobody
/// retains is never initialised that way). A context that safe code destroyed
/// (cudarc's `CudaContext` releases or destroys its context when its last
/// `Arc` is dropped, even inside a [`with_cudarc_stream`](crate::with_cudarc_stream)
/// closure) is therefore never made current again, nor is any other context
/// handed to the driver on the caller's behalf:
///
/// - a **non-primary context** (`cuCtxCreate`, cudarc's safe
///   `CudaContext::new_non_primary` and `new_cig`, a green context's) is not
///   put back: nobody but its creator can keep one alive. After such a call
///   the device's primary context is current; cudarc's safe API makes its own
///   context current before each call and does not notice, and code that uses
///   the driver or the runtime API directly on a non-primary context makes it
///   current again after a gpupool call;
/// - [`current_device`](Backend::current_device) recognises a retained
///   primary context by its handle and asks the driver about any other with
///   `cuCtxGetDevice`, which reads the thread's current context without being
///   handed it: a context destroyed while current (the driver leaves it
///   current on other threads, and a released primary context even on the
///   releasing thread) gives `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
///
/// Every `CudaBackend` value shares one [`BackendId`] ([`Backend::id`]): they
/// all speak to the same driver, so a handle made through one is usable with
/// any other. The pools, leases and scratchpads only pass handles they
/// created and still own, and [`AccessOrder`](gpupool_core::AccessOrder)s
/// borrow their streams: through them no `unsafe` is needed.
///
/// ```
/// use gpupool_core::{EventPool, StreamPool};
/// use gpupool_cuda::CudaBackend;
///
/// let streams = StreamPool::new(CudaBackend::new()); // no driver call yet
/// let events = EventPool::new(CudaBackend::new());
/// if let Ok(lease) = streams.get(0) {
///     // ... launch work on lease.handle() ...
///     drop(lease); // back to the pool
/// }
/// # drop(events);
/// ```
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CudaBackend {
    _private: (),
}

impl CudaBackend {
    /// A handle to the process's CUDA driver. Calls nothing.
    pub const fn new() -> Self {
        CudaBackend { _private: () }
    }

    /// cudarc's handle to `device`'s primary context, the one the pooled
    /// streams and events live on: for loading modules and launching kernels
    /// through cudarc's safe API (see [`with_cudarc_stream`](crate::with_cudarc_stream)).
    ///
    /// Retains the context on first use; the context stays retained for the
    /// life of the process. The thread's current context afterwards is as
    /// after any call that switches contexts (the type documentation, "The
    /// thread's current context"). cudarc makes the context current on the
    /// calling thread whenever its safe API uses it.
    pub fn context(&self, device: DeviceId) -> Result<Arc<CudaContext>, CudaError> {
        let primary = driver()?.primary(device)?;
        Ok(primary.context().clone())
    }
}
