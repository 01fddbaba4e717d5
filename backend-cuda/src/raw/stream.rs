//! Streams and events: queries, synchronization, the stream's context and
//! capture status, event creation. (Creating, destroying and waiting on
//! streams, and recording, destroying and synchronizing events, go through
//! cudarc's `result` layer.)

use std::ffi::c_uint;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;
use gpupool_core::{Completion, EventHandle, StreamHandle};

use super::{raw_event, raw_stream};
use crate::error::{check, CudaError};

/// `CUDA_SUCCESS` is complete, `CUDA_ERROR_NOT_READY` pending, anything else
/// an error.
#[inline]
fn completion(r: sys::CUresult) -> Result<Completion, CudaError> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(Completion::Complete),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(Completion::Pending),
        other => Err(CudaError::Driver(DriverError(other))),
    }
}

/// `cuStreamQuery`: whether `stream` has finished its work so far
/// (`CUDA_ERROR_NOT_READY` is [`Completion::Pending`], not an error).
///
/// # Safety
/// `stream` is a live stream, or a special stream (0, 1, 2) of the context
/// current on the calling thread.
#[inline]
pub(crate) unsafe fn stream_query(stream: StreamHandle) -> Result<Completion, CudaError> {
    // SAFETY: a live stream, or a special stream of the current context
    // (this function's contract).
    completion(unsafe { sys::cuStreamQuery(raw_stream(stream)) })
}

/// `cuStreamSynchronize`: waits until `stream` has finished its work so far.
///
/// # Safety
/// `stream` is a live stream, or a special stream of the context current on
/// the calling thread.
pub(crate) unsafe fn stream_synchronize(stream: StreamHandle) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuStreamSynchronize(raw_stream(stream)) })
}

/// `cuStreamGetCtx`: the context `stream` belongs to.
///
/// # Safety
/// `stream` is a live created stream (not a special one).
pub(crate) unsafe fn stream_get_ctx(stream: StreamHandle) -> Result<sys::CUcontext, CudaError> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: a live created stream (this function's contract); `ctx` is a
    // valid place for the driver to write the context to.
    check(unsafe { sys::cuStreamGetCtx(raw_stream(stream), &mut ctx) })?;
    Ok(ctx)
}

/// `cuStreamIsCapturing`: the capture status of `stream`.
///
/// # Safety
/// `stream` is a usable stream of the current context: live, or special.
#[inline]
pub(crate) unsafe fn stream_is_capturing(
    stream: StreamHandle,
) -> Result<sys::CUstreamCaptureStatus, CudaError> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: this function's contract; `status` is a valid place for the
    // answer.
    check(unsafe { sys::cuStreamIsCapturing(raw_stream(stream), &mut status) })?;
    Ok(status)
}

/// `cuEventCreate` in the calling thread's current context, with the
/// `CU_EVENT_*` bits `flags`.
pub(crate) fn event_create(flags: c_uint) -> Result<sys::CUevent, CudaError> {
    let mut event: sys::CUevent = std::ptr::null_mut();
    // SAFETY: `event` is a valid place for the new handle; the driver
    // rejects flag bits it does not know.
    check(unsafe { sys::cuEventCreate(&mut event, flags) })?;
    Ok(event)
}

/// `cuEventQuery`: whether `event`'s last recording has been passed
/// (`CUDA_ERROR_NOT_READY` is [`Completion::Pending`], not an error).
///
/// # Safety
/// `event` is a live event.
#[inline]
pub(crate) unsafe fn event_query(event: EventHandle) -> Result<Completion, CudaError> {
    // SAFETY: a live event (this function's contract).
    completion(unsafe { sys::cuEventQuery(raw_event(event)) })
}
