//! Graph capture through gpupool: [`CaptureBackend`] for [`CudaBackend`]
//! (`cuStreamBeginCapture`, `cuStreamEndCapture`), and the graph a capture
//! ends in, [`CudaGraph`], with its executable form, [`CudaGraphExec`].
//!
//! Capturing through [`StreamLease::begin_capture`] rather than the raw
//! handle is what lets gpupool keep its promises across the capture (see
//! `docs/graph-capture.md`): the lease's capture note is bumped, so the
//! pools and scratchpads know to ask before they query the stream or reuse
//! memory that the graph's replays use.
//!
//! ```no_run
//! use gpupool_core::{CaptureMode, Scratchpad};
//! use gpupool_cuda::CudaBackend;
//!
//! let gpu = CudaBackend::new();
//! let lease = gpupool_cuda::streams().get(0)?;
//! lease.begin_capture(CaptureMode::ThreadLocal)?;
//! {
//!     let scratch = Scratchpad::new(&gpu, lease.order())?;
//!     let x = scratch.to_device(&[1.0f32; 1024])?; // the graph's allocation and copy
//!     // ... kernels on `x` through `with_cudarc_stream(&lease, ..)` ...
//! } // freed in the capture: the graph's free node
//! let graph = lease.end_capture()?;
//! let exec = graph.instantiate()?;
//! // SAFETY: the graph's kernels use only scratch memory made in the
//! // capture (the graph's own).
//! unsafe { exec.launch(&lease.order()) }?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`StreamLease::begin_capture`]: gpupool_core::StreamLease::begin_capture

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use cudarc::driver::sys;
use gpupool_core::{AccessOrder, CaptureBackend, CaptureMode, DeviceId, StreamHandle};

use crate::backend::CudaBackend;
use crate::driver::driver;
use crate::error::CudaError;
use crate::raw;

/// A graph a capture ended in (`CUgraph`), owned: destroyed when dropped.
/// Every executable graph made from it ([`instantiate`](Self::instantiate))
/// lives on independently.
#[derive(Debug)]
pub struct CudaGraph {
    graph: sys::CUgraph,
    device: DeviceId,
}

// SAFETY: a `CUgraph` is a driver object that may be used from any thread;
// `CudaGraph` owns it alone (no aliasing handle is kept elsewhere by gpupool),
// and every call on it takes `&self` or `self` with no interior state.
unsafe impl Send for CudaGraph {}
// SAFETY: the calls made through `&CudaGraph` (`cuGraphInstantiateWithFlags`)
// only read the graph; CUDA allows several threads to instantiate one graph
// as long as none modifies it, and `CudaGraph` offers no modifying call.
unsafe impl Sync for CudaGraph {}

impl CudaGraph {
    /// The driver's handle, for cudarc's or the driver's own graph calls.
    /// It stays owned by this value: do not destroy it.
    pub fn as_raw(&self) -> sys::CUgraph {
        self.graph
    }

    /// The device of the stream that began the capture.
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// Makes an executable graph of it (`cuGraphInstantiateWithFlags`, no
    /// flags).
    pub fn instantiate(&self) -> Result<CudaGraphExec, CudaError> {
        let drv = driver()?;
        drv.with_context(self.device, |_| {
            // SAFETY: the graph is live (owned by `self`) and not modified
            // (`CudaGraph` offers no modifying call); the device's primary
            // context is current.
            let exec = unsafe { raw::graph_instantiate_with_flags(self.graph, 0) }?;
            Ok(CudaGraphExec {
                exec,
                device: self.device,
            })
        })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: the graph is owned by `self` alone and used no more; its
        // executable graphs keep what they need. An error (the driver shut
        // down at exit) leaves nothing to do.
        let _ = unsafe { raw::graph_destroy(self.graph) };
    }
}

/// An executable graph (`CUgraphExec`), owned: destroyed when dropped (CUDA
/// lets its launches in flight finish).
#[derive(Debug)]
pub struct CudaGraphExec {
    exec: sys::CUgraphExec,
    device: DeviceId,
}

// SAFETY: as for `CudaGraph`: a driver object usable from any thread, owned
// by this value alone.
unsafe impl Send for CudaGraphExec {}
// SAFETY: `launch` is the only call through `&self`; CUDA allows launches of
// one executable graph from several threads (they are ordered by the
// driver).
unsafe impl Sync for CudaGraphExec {}

impl CudaGraphExec {
    /// The driver's handle. It stays owned by this value.
    pub fn as_raw(&self) -> sys::CUgraphExec {
        self.exec
    }

    /// Launches the graph in `order`'s stream (`cuGraphLaunch`): its work
    /// runs after the work issued there so far. Host order launches it on
    /// the device's null stream.
    ///
    /// Scratch memory the graph uses is the graph's (made in the capture)
    /// or kept for it by gpupool until the graph is gone, whenever it runs.
    ///
    /// # Safety
    /// 1. Every other memory the graph's work uses (buffers of the caller's,
    ///    cudarc's `CudaSlice`s captured as kernel arguments) is valid, and
    ///    used by nothing else that is not ordered with this launch, until
    ///    the launch has run: the graph replays the captured kernels, whose
    ///    own `unsafe` launch vouched for their arguments only when they were
    ///    captured.
    /// 2. The launch is ordered after the work the capture's streams had
    ///    issued before the capture began (launch in the origin's order, or
    ///    in an order that waited on the streams first): a scratchpad
    ///    reuses its memory in its stream's order, so scratch memory the
    ///    graph uses may be what that earlier work used.
    pub unsafe fn launch(&self, order: &AccessOrder<'_>) -> Result<(), CudaError> {
        if !order.is_usable_with(&CudaBackend::new()) {
            return Err(CudaError::ForeignStream(
                order.stream_handle().unwrap_or(StreamHandle::NULL),
            ));
        }
        // (A stream of another device than the graph's: the driver refuses
        // the launch.)
        let (stream, device) = match (order.stream_handle(), order.device()) {
            (Some(s), Some(d)) => (s, d),
            _ => (StreamHandle::NULL, self.device),
        };
        driver()?.on_stream(stream, device, || {
            // SAFETY: the graph is live (owned by `self`); `stream` is the
            // order's (borrowed by it, of this backend: checked above) or the
            // null stream, of the graph's device; the memory its work uses is
            // valid (this function's contract, and gpupool's scratchpads for
            // their memory).
            unsafe { raw::graph_launch(self.exec, stream) }
        })
    }
}

impl Drop for CudaGraphExec {
    fn drop(&mut self) {
        // SAFETY: owned by `self` alone and used no more; CUDA finishes the
        // launches in flight. An error (the driver shut down) leaves nothing
        // to do.
        let _ = unsafe { raw::graph_exec_destroy(self.exec) };
    }
}

/// How many captures gpupool began in a mode that restricts other calls
/// (global or thread-local) and has not ended: while there is one, the
/// backend's own calls run in relaxed interaction mode ([`unrestricted`]).
static RESTRICTING_CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// The origin streams (raw handles) of the captures gpupool began and has
/// not seen end, each with whether it restricts (counted above).
static OPEN_ORIGINS: Mutex<Vec<(usize, bool)>> = Mutex::new(Vec::new());

/// Whether a capture gpupool began (in any mode) may still be open: then a
/// context synchronization would break it (`trim_memory` waits instead).
pub(crate) fn captures_open() -> bool {
    !origins().is_empty()
}

/// Runs `op`, a backend call of the kind a capture in global or
/// thread-local mode refuses ("potentially unsafe": queries,
/// synchronizations, synchronous allocations, stream-ordered allocations
/// outside the capture), with the calling thread's capture interaction mode
/// relaxed while a capture gpupool began in such a mode is open
/// (`cuThreadExchangeStreamCaptureMode`). The driver then neither refuses
/// the call nor invalidates the capture. gpupool never makes these calls on
/// a capturing stream (it asks first), so they cannot touch the capture; the
/// user's own calls keep the mode they chose. With no such capture open
/// (every program that does not capture), one atomic load.
#[inline(always)]
pub(crate) fn unrestricted<T>(op: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    // Relaxed: a hint. A call that races the beginning of a capture on
    // another thread is as unordered with it as it would be without
    // gpupool; `begin_capture` counts the capture before beginning it.
    let _restore = if RESTRICTING_CAPTURES.load(Ordering::Relaxed) == 0 {
        None
    } else {
        Some(relax_mode()?)
    };
    // Called here, once, rather than handed to a function: a closure passed
    // on would be built in memory before the test above, and one called on
    // two paths would not be inlined.
    op()
}

/// `op` with the calling thread's capture interaction mode relaxed, then
/// put back (also if `op` panics): whatever capture is open, begun by
/// gpupool or not, `op`'s queries are neither refused nor break it. If the
/// mode cannot be exchanged (no driver), `op` runs as it is (its calls fail
/// the same way).
pub(crate) fn with_relaxed_mode<R>(op: impl FnOnce() -> R) -> R {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    if raw::thread_exchange_stream_capture_mode(&mut mode).is_err() {
        return op();
    }
    let _restore = Restore(mode);
    op()
}

/// Puts the calling thread's capture interaction mode back, also if the
/// code between panics.
struct Restore(sys::CUstreamCaptureMode);

impl Drop for Restore {
    fn drop(&mut self) {
        // `self.0` holds the mode the thread had.
        let _ = raw::thread_exchange_stream_capture_mode(&mut self.0);
    }
}

/// [`unrestricted`] while a restricting capture is open: relaxes the
/// thread's capture interaction mode and returns the guard that puts it
/// back. Kept out of line, so that the calls of programs that never capture
/// stay as small as they were.
#[cold]
#[inline(never)]
fn relax_mode() -> Result<Restore, CudaError> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    raw::thread_exchange_stream_capture_mode(&mut mode)?;
    Ok(Restore(mode))
}

/// Taken for reading while a capture seen on a stream is acted on (a graph
/// being captured given a reference, `hold_in_graph`; a graph's allocation
/// freed inside its own capture), and for writing while gpupool ends a
/// capture (`CaptureBackend::end_capture`): the capture a capture info call
/// returned is still the stream's, and its graph alive, until the action is
/// done.
pub(crate) static CAPTURES_ENDING: std::sync::RwLock<()> = std::sync::RwLock::new(());

std::thread_local! {
    /// Whether this thread holds `CAPTURES_ENDING` for reading (through
    /// [`no_capture_ends`]): a nested call goes on under the outer hold
    /// instead of reading again, which could wait forever behind a writer
    /// that waits for the outer hold.
    static HOLDING_CAPTURES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with `CAPTURES_ENDING` held for reading: no capture that
/// gpupool ends ends meanwhile. Re-entrant on one thread.
pub(crate) fn no_capture_ends<R>(f: impl FnOnce() -> R) -> R {
    if HOLDING_CAPTURES.get() {
        return f();
    }
    /// Clears the flag when the hold ends, a panic included.
    struct Hold<'a>(#[allow(dead_code)] std::sync::RwLockReadGuard<'a, ()>);
    impl Drop for Hold<'_> {
        fn drop(&mut self) {
            HOLDING_CAPTURES.set(false);
        }
    }
    let _hold = Hold(CAPTURES_ENDING.read().unwrap_or_else(|e| e.into_inner()));
    HOLDING_CAPTURES.set(true);
    f()
}

/// The driver's capture mode.
fn raw_mode(mode: CaptureMode) -> sys::CUstreamCaptureMode {
    match mode {
        CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        CaptureMode::ThreadLocal => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    }
}

/// `cuStreamBeginCapture` and `cuStreamEndCapture` on a created stream of
/// this backend.
impl CaptureBackend for CudaBackend {
    type Graph = CudaGraph;

    /// # Safety
    /// The trait's contract: `stream` is a live stream created by a
    /// `CudaBackend` on `device`, not capturing.
    unsafe fn begin_capture(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        mode: CaptureMode,
    ) -> Result<(), CudaError> {
        let restricting = mode != CaptureMode::Relaxed;
        if restricting {
            // Counted first: the backend's calls on other threads relax
            // from now on (see `unrestricted`).
            RESTRICTING_CAPTURES.fetch_add(1, Ordering::Relaxed);
        }
        let begun = driver().and_then(|drv| {
            drv.on_stream(stream, device, || {
                // SAFETY: the caller's contract: a live created stream of
                // `device` (it carries its context), not capturing.
                unsafe { raw::stream_begin_capture(stream, raw_mode(mode)) }
            })
        });
        match begun {
            Ok(()) => origins().push((stream.as_raw(), restricting)),
            Err(_) if restricting => {
                RESTRICTING_CAPTURES.fetch_sub(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
        begun
    }

    /// # Safety
    /// The trait's contract: `stream` is a live stream created by a
    /// `CudaBackend` on `device`.
    unsafe fn end_capture(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<CudaGraph, CudaError> {
        // No block is being handed to this capture's graph meanwhile (see
        // `CAPTURES_ENDING`).
        let _ending = CAPTURES_ENDING.write().unwrap_or_else(|e| e.into_inner());
        let ended = driver()?.on_stream(stream, device, || {
            let mut graph: sys::CUgraph = core::ptr::null_mut();
            // SAFETY: the caller's contract: a live created stream.
            let r = unsafe { raw::stream_end_capture(stream, &mut graph) };
            if r.is_err() && !graph.is_null() {
                // SAFETY: the driver handed the graph over; nothing uses it.
                let _ = unsafe { raw::graph_destroy(graph) };
            }
            r.map(|()| CudaGraph { graph, device })
        });
        // Failed or not, the capture has ended if the stream is no longer
        // in one (a joined stream's end fails and leaves it open).
        // SAFETY: as above.
        let over =
            unsafe { CudaBackend::raw_capture_status(stream) }.map_or(true, |s| !s.is_capturing());
        if over {
            let mut origins = origins();
            if let Some(i) = origins.iter().position(|&(o, _)| o == stream.as_raw()) {
                let (_, restricting) = origins.swap_remove(i);
                if restricting {
                    RESTRICTING_CAPTURES.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        ended
    }
}

/// The origins of the captures gpupool began and has not seen end.
fn origins() -> std::sync::MutexGuard<'static, Vec<(usize, bool)>> {
    // A panic while the lock was held left the list whole (each change is
    // one push or one removal): go on with it.
    OPEN_ORIGINS.lock().unwrap_or_else(|e| e.into_inner())
}
