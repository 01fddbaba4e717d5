//! Memory: device memory from a memory pool in stream order, pinned and
//! managed allocations, stream-ordered copies.

use std::ffi::{c_uint, c_void};

use cudarc::driver::sys;
use gpupool_core::StreamHandle;

use super::raw_stream;
use crate::error::{check, CudaError};

/// `cuMemAllocFromPoolAsync`: `size` bytes of `pool`, in the order of
/// `stream`.
///
/// # Safety
/// `pool` is a live memory pool of the device of the current context;
/// `stream` is a live stream of that device, or a special stream, which
/// means the current context's.
#[inline]
pub(crate) unsafe fn mem_alloc_from_pool_async(
    size: usize,
    pool: sys::CUmemoryPool,
    stream: StreamHandle,
) -> Result<sys::CUdeviceptr, CudaError> {
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: `dptr` is a valid place for the address; `pool` and `stream`
    // as this function's contract says.
    check(unsafe { sys::cuMemAllocFromPoolAsync(&mut dptr, size, pool, raw_stream(stream)) })?;
    Ok(dptr)
}

/// `cuMemFreeAsync`: frees `dptr` in the order of `stream`.
///
/// # Safety
/// `dptr` is a block of a memory pool (stream-ordered allocation), freed
/// once, that nothing uses after the work queued on `stream` so far;
/// `stream` is live, or a special stream of the current context.
#[inline]
pub(crate) unsafe fn mem_free_async(
    dptr: sys::CUdeviceptr,
    stream: StreamHandle,
) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuMemFreeAsync(dptr, raw_stream(stream)) })
}

/// `cuMemPoolTrimTo`: gives `pool`'s unused memory back to the OS, keeping
/// at least `min_bytes_to_keep`.
///
/// # Safety
/// `pool` is a live memory pool.
pub(crate) unsafe fn mem_pool_trim_to(
    pool: sys::CUmemoryPool,
    min_bytes_to_keep: usize,
) -> Result<(), CudaError> {
    // SAFETY: a live pool (this function's contract); trimming frees only
    // memory no allocation holds.
    check(unsafe { sys::cuMemPoolTrimTo(pool, min_bytes_to_keep) })
}

/// `cuMemHostAlloc`: `bytes` bytes of page-locked host memory with the
/// `CU_MEMHOSTALLOC_*` bits `flags`, in the current context.
pub(crate) fn mem_host_alloc(bytes: usize, flags: c_uint) -> Result<*mut c_void, CudaError> {
    let mut host: *mut c_void = core::ptr::null_mut();
    // SAFETY: `host` is a valid place for the pointer; the driver rejects
    // flag bits it does not know.
    check(unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) })?;
    Ok(host)
}

/// `cuMemAllocManaged`: `bytes` bytes of managed memory with the
/// `CU_MEM_ATTACH_*` value `flags`, in the current context.
pub(crate) fn mem_alloc_managed(
    bytes: usize,
    flags: c_uint,
) -> Result<sys::CUdeviceptr, CudaError> {
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: `dptr` is a valid place for the address; the driver rejects
    // flags it does not know.
    check(unsafe { sys::cuMemAllocManaged(&mut dptr, bytes, flags) })?;
    Ok(dptr)
}

/// `cuMemFreeHost`: frees memory from [`mem_host_alloc`].
///
/// # Safety
/// `host` came from `cuMemHostAlloc`, is freed once, and nothing (host or
/// device) uses it any more.
pub(crate) unsafe fn mem_free_host(host: *mut c_void) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuMemFreeHost(host) })
}

/// `cuMemFree`: frees memory from [`mem_alloc_managed`] (or `cuMemAlloc`).
///
/// # Safety
/// `dptr` came from `cuMemAllocManaged` (or `cuMemAlloc`), is freed once,
/// and nothing (host or device) uses it any more.
pub(crate) unsafe fn mem_free(dptr: sys::CUdeviceptr) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuMemFree_v2(dptr) })
}

/// `cuMemHostGetDevicePointer`: the device address of mapped host memory
/// (`flags` must be 0).
///
/// # Safety
/// `host` lies in memory allocated with `CU_MEMHOSTALLOC_DEVICEMAP`.
pub(crate) unsafe fn mem_host_get_device_pointer(
    host: *mut c_void,
    flags: c_uint,
) -> Result<sys::CUdeviceptr, CudaError> {
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: `host` lies in device-mapped memory (this function's
    // contract); `dptr` is a valid place for the address.
    check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, flags) })?;
    Ok(dptr)
}

/// `cuMemcpyAsync`: copies `size` bytes from `src` to `dst` in the order of
/// `stream` (unified addressing: any kind of memory on either side).
///
/// # Safety
/// Both ranges are valid for `size` bytes until the copy has run on
/// `stream`, and do not overlap; `stream` is live, or a special stream of
/// the current context.
pub(crate) unsafe fn memcpy_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    size: usize,
    stream: StreamHandle,
) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuMemcpyAsync(dst, src, size, raw_stream(stream)) })
}
