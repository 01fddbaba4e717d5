//! Stream capture, graphs and executable graphs, and the user objects a
//! graph holds.

use std::ffi::{c_uint, c_ulonglong, c_void};

use cudarc::driver::sys;
use gpupool_core::StreamHandle;

use super::raw_stream;
use crate::error::{check, CudaError};

/// `cuThreadExchangeStreamCaptureMode`: makes `*mode` the calling thread's
/// capture interaction mode and leaves the previous one in `*mode`.
pub(crate) fn thread_exchange_stream_capture_mode(
    mode: &mut sys::CUstreamCaptureMode,
) -> Result<(), CudaError> {
    // SAFETY: `mode` is a valid place holding a mode; the call swaps the
    // thread's mode.
    check(unsafe { sys::cuThreadExchangeStreamCaptureMode(mode) })
}

/// `cuStreamBeginCapture`: `stream` begins capturing a graph in `mode`.
///
/// # Safety
/// `stream` is a live created stream (it carries its context), not
/// capturing.
pub(crate) unsafe fn stream_begin_capture(
    stream: StreamHandle,
    mode: sys::CUstreamCaptureMode,
) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuStreamBeginCapture_v2(raw_stream(stream), mode) })
}

/// `cuStreamEndCapture`: ends `stream`'s capture, the graph written to
/// `*graph`. The driver may write a graph there also when it fails: the
/// caller owns it either way (destroy it if it is not null).
///
/// # Safety
/// `stream` is a live created stream.
pub(crate) unsafe fn stream_end_capture(
    stream: StreamHandle,
    graph: &mut sys::CUgraph,
) -> Result<(), CudaError> {
    // SAFETY: a live created stream (this function's contract); `graph` is a
    // valid place for the handle.
    check(unsafe { sys::cuStreamEndCapture(raw_stream(stream), graph) })
}

/// `cuGraphDestroy`.
///
/// # Safety
/// `graph` is a live graph the caller owns and uses no more.
pub(crate) unsafe fn graph_destroy(graph: sys::CUgraph) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuGraphDestroy(graph) })
}

/// `cuGraphInstantiateWithFlags`: an executable graph of `graph`, in the
/// current context.
///
/// # Safety
/// `graph` is a live graph that no other thread modifies meanwhile.
pub(crate) unsafe fn graph_instantiate_with_flags(
    graph: sys::CUgraph,
    flags: c_ulonglong,
) -> Result<sys::CUgraphExec, CudaError> {
    let mut exec: sys::CUgraphExec = core::ptr::null_mut();
    // SAFETY: `exec` is a valid place for the handle; the graph is live and
    // not modified meanwhile (this function's contract).
    check(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags) })?;
    Ok(exec)
}

/// `cuGraphLaunch`: launches `exec` in the order of `stream`.
///
/// # Safety
/// `exec` is a live executable graph; `stream` is live, or a special stream
/// of the current context; the memory the graph's work uses is valid, and
/// used by nothing unordered with it, until the launch has run.
pub(crate) unsafe fn graph_launch(
    exec: sys::CUgraphExec,
    stream: StreamHandle,
) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuGraphLaunch(exec, raw_stream(stream)) })
}

/// `cuGraphExecDestroy` (CUDA lets the launches in flight finish).
///
/// # Safety
/// `exec` is a live executable graph the caller owns and uses no more.
pub(crate) unsafe fn graph_exec_destroy(exec: sys::CUgraphExec) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuGraphExecDestroy(exec) })
}

/// `cuUserObjectCreate`: a user object with `initial_refcount` references
/// whose destructor `destroy(ptr)` CUDA calls once the last is released.
///
/// # Safety
/// `destroy(ptr)` is sound to call once, on any thread, at any time after
/// the call (if it succeeds); it makes no CUDA call.
pub(crate) unsafe fn user_object_create(
    ptr: *mut c_void,
    destroy: sys::CUhostFn,
    initial_refcount: c_uint,
    flags: c_uint,
) -> Result<sys::CUuserObject, CudaError> {
    let mut object: sys::CUuserObject = std::ptr::null_mut();
    // SAFETY: `object` is a valid place for the handle; `destroy` and `ptr`
    // as this function's contract says.
    check(unsafe { sys::cuUserObjectCreate(&mut object, ptr, destroy, initial_refcount, flags) })?;
    Ok(object)
}

/// `cuGraphRetainUserObject`: `graph` takes `count` references to `object`
/// (with `CU_GRAPH_USER_OBJECT_MOVE`, the caller's own, moved to it).
///
/// # Safety
/// `graph` is a live graph that no other thread uses meanwhile (CUDA does
/// not synchronize calls on one graph); `object` is a live user object of
/// which the caller owns the references moved.
pub(crate) unsafe fn graph_retain_user_object(
    graph: sys::CUgraph,
    object: sys::CUuserObject,
    count: c_uint,
    flags: c_uint,
) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    check(unsafe { sys::cuGraphRetainUserObject(graph, object, count, flags) })
}
