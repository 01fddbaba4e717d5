//! Where a [`Pool`](super::Pool)'s blocks and fences come from: the
//! [`Upstream`] trait, and [`PoolKind`], the CUDA driver's implementation.

use cudarc::driver::sys;
use gpupool_core::{
    Completion, DeviceId, EventBackend, EventFlags, EventHandle, StreamBackend, StreamHandle,
};

use crate::backend::CudaBackend;
use crate::driver::driver;
use crate::error::{invalid_value, teardown_ok, CudaError};
use crate::raw;

/// What a [`Pool`](super::Pool) asks of the layer below it: blocks, and fences recorded in
/// a stream's order. Every call is made without the pool's lock held, except
/// [`query_fence`](Self::query_fence) (at most `SCAN_LIMIT` per visit).
pub trait Upstream {
    /// What a failed call returns.
    type Error;
    /// A fence: recorded on a stream, complete once the stream has passed it.
    type Fence: Copy + core::fmt::Debug;

    /// The error for a size no class holds.
    fn invalid_size(&self) -> Self::Error;

    /// A new block of exactly `bytes` bytes (a class size) on `device`.
    fn allocate(&self, device: DeviceId, bytes: usize) -> Result<usize, Self::Error>;

    /// Gives a block back.
    ///
    /// # Safety
    /// `addr` came from [`allocate`](Self::allocate) of this upstream, is
    /// freed once, and nothing (host or device) uses it any more.
    unsafe fn free(&self, device: DeviceId, addr: usize) -> Result<(), Self::Error>;

    /// A new fence on `device`.
    fn create_fence(&self, device: DeviceId) -> Result<Self::Fence, Self::Error>;

    /// Records `fence` at the current end of `stream`'s work.
    fn record_fence(
        &self,
        fence: Self::Fence,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), Self::Error>;

    /// Whether `fence`'s last recording has been passed (a fence never
    /// recorded is complete). The pool treats an error as pending.
    fn query_fence(&self, fence: Self::Fence, device: DeviceId) -> Result<Completion, Self::Error>;

    /// Destroys a fence (a pending one too).
    fn destroy_fence(&self, fence: Self::Fence, device: DeviceId) -> Result<(), Self::Error>;

    /// Waits until `stream` has finished all of its work so far.
    fn synchronize(&self, stream: StreamHandle, device: DeviceId) -> Result<(), Self::Error>;

    /// Whether `stream` has finished all of its work so far. The pool treats
    /// an error as pending.
    fn query_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Completion, Self::Error>;

    /// `stream`'s id, unique in the process and never reused (unlike a
    /// handle); `None` for a special stream, or when there is no such id.
    /// The per-thread blocks group stream-ordered frees by it.
    fn stream_id(&self, stream: StreamHandle, device: DeviceId) -> Option<u64>;
}

/// What a pool's blocks are.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum PoolKind {
    /// `cuMemHostAlloc(PORTABLE | DEVICEMAP)`, freed with `cuMemFreeHost`.
    Pinned,
    /// `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`, freed with `cuMemFree`.
    Managed,
}

/// The CUDA pools' upstream: blocks from the driver, allocated in `device`'s
/// primary context; fences are events with timing disabled.
///
/// The [`Upstream`] methods are safe, but these reach the driver with the
/// handles they are given. That is sound because `PoolKind` is private to
/// this crate and its only user is `Pool<PoolKind>` (the pinned and managed
/// pools of [`crate::memory`]), which passes only (1) fences this upstream
/// created on `device` and has not destroyed (its idle and parked lists own
/// them), and (2) the stream of [`give_after`](super::Pool::give_after), an
/// `unsafe fn` whose caller vouches that it is a usable stream of `device`.
/// Those are the two facts the `SAFETY` comments below rely on.
impl Upstream for PoolKind {
    type Error = CudaError;
    type Fence = EventHandle;

    fn invalid_size(&self) -> CudaError {
        invalid_value()
    }

    fn allocate(&self, device: DeviceId, bytes: usize) -> Result<usize, CudaError> {
        driver()?.with_context(device, |_| match self {
            PoolKind::Pinned => {
                // Portable: page-locked for every context; device-mapped:
                // kernels may use it (under unified addressing, at the same
                // address).
                let host = raw::mem_host_alloc(
                    bytes,
                    sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
                )?;
                Ok(host as usize)
            }
            PoolKind::Managed => {
                // Global attachment makes it usable from every stream.
                let dptr = raw::mem_alloc_managed(
                    bytes,
                    sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32,
                )?;
                Ok(dptr as usize)
            }
        })
    }

    unsafe fn free(&self, device: DeviceId, addr: usize) -> Result<(), CudaError> {
        // At process exit the driver has already freed everything.
        teardown_ok(driver()?.with_context(device, |_| match self {
            // SAFETY: the caller's contract.
            PoolKind::Pinned => unsafe { raw::mem_free_host(addr as *mut _) },
            // SAFETY: the caller's contract.
            PoolKind::Managed => unsafe { raw::mem_free(addr as sys::CUdeviceptr) },
        }))
    }

    fn create_fence(&self, device: DeviceId) -> Result<EventHandle, CudaError> {
        CudaBackend::new().create_event(device, EventFlags::DISABLE_TIMING)
    }

    fn record_fence(
        &self,
        fence: EventHandle,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), CudaError> {
        // SAFETY: (1) and (2) of the impl's documentation: a live fence of
        // `device` made by `create_fence`, and a usable stream of `device`.
        unsafe { CudaBackend::new().record_event(fence, stream, device) }
    }

    fn query_fence(&self, fence: EventHandle, device: DeviceId) -> Result<Completion, CudaError> {
        // SAFETY: (1) of the impl's documentation: a live fence of `device`.
        unsafe { CudaBackend::new().query_event(fence, device) }
    }

    fn destroy_fence(&self, fence: EventHandle, device: DeviceId) -> Result<(), CudaError> {
        // SAFETY: (1) of the impl's documentation: a live fence of `device`,
        // which the pool took out of its lists and never uses again.
        unsafe { CudaBackend::new().destroy_event(fence, device) }
    }

    fn synchronize(&self, stream: StreamHandle, device: DeviceId) -> Result<(), CudaError> {
        // SAFETY: (2) of the impl's documentation: a usable stream of `device`.
        unsafe { CudaBackend::new().synchronize_stream(stream, device) }
    }

    fn query_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Completion, CudaError> {
        // SAFETY: (2) of the impl's documentation: a usable stream of `device`.
        unsafe { CudaBackend::new().query_stream(stream, device) }
    }

    fn stream_id(&self, stream: StreamHandle, _: DeviceId) -> Option<u64> {
        // SAFETY: (2) of the impl's documentation: a usable stream (a special
        // one is refused before the driver is asked).
        unsafe { crate::device_cache::id_of(stream) }
    }
}
