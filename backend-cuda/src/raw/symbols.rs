//! Entry points looked up in the loaded driver library at run time, once
//! each, rather than called through cudarc's bindings: their binding exists
//! only for some CUDA versions, or its signature changed between versions.
//! Whatever CUDA version cudarc's bindings were generated for, a driver that
//! exports the entry point is used through it, and one that does not gives
//! `None` instead of a panic.

use std::ffi::{c_ulonglong, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys;
use gpupool_core::StreamHandle;

use super::raw_stream;
use crate::error::{check, CudaError};
use crate::library;

/// `cuStreamGetId`'s signature.
type GetId = unsafe extern "C" fn(sys::CUstream, *mut c_ulonglong) -> sys::CUresult;

/// The loaded driver's `cuStreamGetId`, looked up once; `None` before the
/// driver has loaded (cudarc panics on a missing library), or when the driver
/// predates CUDA 12.0. Called through this pointer rather than through
/// cudarc's binding, which exists only when cudarc is built for CUDA 12.0 or
/// later: so the device cache and `stream_id` work with every CUDA version
/// feature, and a missing symbol switches them off instead of panicking.
fn get_id_fn() -> Option<GetId> {
    static GET_ID: OnceLock<Option<GetId>> = OnceLock::new();
    if !library::is_loaded() {
        return None;
    }
    *GET_ID.get_or_init(|| {
        // SAFETY: the library is loaded (checked above), so `culib` does not
        // panic; looking a symbol up calls nothing in it. `GetId` is the
        // signature the CUDA headers declare for `cuStreamGetId`, and the
        // pointer stays valid while the library is loaded, which cudarc keeps
        // it for the life of the process (`culib` is a process-wide static).
        unsafe {
            sys::culib()
                .get::<GetId>(b"cuStreamGetId\0")
                .ok()
                .map(|f| *f)
        }
    })
}

/// Whether the loaded driver has `cuStreamGetId`. False until the driver
/// has loaded.
pub(crate) fn has_stream_get_id() -> bool {
    get_id_fn().is_some()
}

/// `cuStreamGetId`: the driver's id of `stream` itself, unique in the
/// process and never reused (drivers for CUDA 12.0 and later); `None` where
/// the driver has no such entry point, or has not loaded. The stream names
/// its context: no current context is needed.
///
/// # Safety
/// `stream` is a live created stream (not a special one).
#[inline]
pub(crate) unsafe fn stream_get_id(stream: StreamHandle) -> Option<Result<u64, CudaError>> {
    let get_id = get_id_fn()?;
    let mut id: c_ulonglong = 0;
    // SAFETY: `get_id` is the driver's `cuStreamGetId`, and `stream` is a
    // live created stream (this function's contract); `id` is a valid place
    // for the answer.
    let r = unsafe { get_id(raw_stream(stream), &mut id) };
    Some(check(r).map(|()| id))
}

/// `cuStreamGetCaptureInfo` as the driver exports it: the `_v3` entry
/// point (drivers for CUDA 12.3 and later), else `_v2` (11.3 and later),
/// looked up once in the driver library cudarc loaded, whatever CUDA version
/// cudarc's bindings were generated for (the two signatures differ; the
/// outputs asked for here come first in both). The dependency and edge
/// outputs are not asked for (null).
#[derive(Copy, Clone)]
enum CaptureInfoFn {
    V3(
        unsafe extern "C" fn(
            sys::CUstream,
            *mut sys::CUstreamCaptureStatus,
            *mut u64,
            *mut sys::CUgraph,
            *mut c_void,
            *mut c_void,
            *mut usize,
        ) -> sys::CUresult,
    ),
    V2(
        unsafe extern "C" fn(
            sys::CUstream,
            *mut sys::CUstreamCaptureStatus,
            *mut u64,
            *mut sys::CUgraph,
            *mut c_void,
            *mut usize,
        ) -> sys::CUresult,
    ),
}

/// The driver's `cuStreamGetCaptureInfo` entry point, or `None` if it
/// exports neither (a driver older than CUDA 11.3, or none loaded).
fn capture_info_fn() -> Option<CaptureInfoFn> {
    static FN: OnceLock<Option<CaptureInfoFn>> = OnceLock::new();
    *FN.get_or_init(|| {
        // SAFETY: `culib` loads the driver library (or panics, as every
        // cudarc driver call does without one; gpupool reaches this only
        // after the driver answered). Each symbol is read with the signature
        // the CUDA headers give that versioned name.
        unsafe {
            let lib = sys::culib();
            if let Ok(f) = lib.get(b"cuStreamGetCaptureInfo_v3\0") {
                return Some(CaptureInfoFn::V3(*f));
            }
            lib.get(b"cuStreamGetCaptureInfo_v2\0")
                .ok()
                .map(|f| CaptureInfoFn::V2(*f))
        }
    })
}

/// `cuStreamGetCaptureInfo`: the capture status of `stream`, the capture's
/// id (unique in the process) and the graph being captured (null where the
/// driver gives none); `None` where the driver exports no entry point for it
/// (before CUDA 11.3). Like `cuStreamIsCapturing`, allowed in every capture
/// mode and breaking no capture.
///
/// # Safety
/// `stream` is a usable stream (live, or special), with its context current
/// if it is a special stream.
pub(crate) unsafe fn stream_get_capture_info(
    stream: StreamHandle,
) -> Option<Result<(sys::CUstreamCaptureStatus, u64, sys::CUgraph), CudaError>> {
    let f = capture_info_fn()?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: u64 = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let raw = raw_stream(stream);
    let null = std::ptr::null_mut();
    let r = match f {
        // SAFETY: this function's contract; `status`, `id` and `graph` are
        // valid places for the answers, and the outputs not asked for are
        // null, which the driver allows.
        CaptureInfoFn::V3(f) => unsafe {
            f(
                raw,
                &mut status,
                &mut id,
                &mut graph,
                null,
                null,
                null.cast(),
            )
        },
        // SAFETY: as above.
        CaptureInfoFn::V2(f) => unsafe {
            f(raw, &mut status, &mut id, &mut graph, null, null.cast())
        },
    };
    Some(check(r).map(|()| (status, id, graph)))
}
