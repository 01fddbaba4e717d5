//! The calling thread's current context, and a device's primary context.

use std::ffi::{c_int, c_uint};

use cudarc::driver::sys;

use crate::error::{check, CudaError};

/// `cuCtxGetDevice`: the device of the calling thread's current context. It
/// reads the thread's own current context, so no handle is handed to the
/// driver (nothing is pushed): a context destroyed while current, which the
/// driver leaves current on other threads (and a released primary context
/// even on the releasing one), gives `CUDA_ERROR_CONTEXT_IS_DESTROYED`. Call
/// it only with a context current (`CUDA_ERROR_INVALID_CONTEXT` otherwise).
pub(crate) fn ctx_get_device() -> Result<sys::CUdevice, CudaError> {
    let mut cu_device: sys::CUdevice = 0;
    // SAFETY: `cu_device` is a valid place for the driver to write to; the
    // call takes no handle.
    check(unsafe { sys::cuCtxGetDevice(&mut cu_device) })?;
    Ok(cu_device)
}

/// `cuCtxSynchronize`: waits for all work of the calling thread's current
/// context, work left on destroyed streams included.
pub(crate) fn ctx_synchronize() -> Result<(), CudaError> {
    // SAFETY: no arguments; the call waits for the work of the current
    // context (an error if none is current).
    check(unsafe { sys::cuCtxSynchronize() })
}

/// `cuDevicePrimaryCtxGetState`: the flags of `dev`'s primary context and
/// whether it is active (non-zero: retained by someone).
///
/// # Safety
/// `dev` is a device handle from `cuDeviceGet`.
pub(crate) unsafe fn device_primary_ctx_get_state(
    dev: sys::CUdevice,
) -> Result<(c_uint, c_int), CudaError> {
    let mut flags: c_uint = 0;
    let mut active: c_int = 0;
    // SAFETY: a device handle from `cuDeviceGet` (this function's contract);
    // `flags` and `active` are valid places for the driver to write to.
    check(unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) })?;
    Ok((flags, active))
}
