//! cudarc interop for pooled streams: [`with_cudarc_stream`] and
//! [`with_cudarc_owned_stream`] (safe, scoped), and [`cudarc_stream`]
//! (`unsafe`, unscoped).
//!
//! ## Why the scoped form is safe
//!
//! cudarc's `CudaContext::wrap_borrowed_stream` makes an `Arc<CudaStream>`
//! that does not destroy the stream when dropped but has no lifetime: the
//! compiler cannot hold it, or anything that keeps a clone of it, to the
//! lease. The scoped functions keep that `Arc` to themselves and hand the
//! closure only a `&CudaStream`, then drop the `Arc` when the closure returns
//! or unwinds. In cudarc 0.19.10 (checked against its source):
//!
//! - every method that stores a clone of the stream in what it returns takes
//!   `self: &Arc<CudaStream>`: the allocations and copies that make or use a
//!   `CudaSlice` (`alloc`, `alloc_zeros`, `null`, `clone_htod`, `clone_dtoh`,
//!   `clone_dtod`, `memcpy_htod`, `memcpy_dtoh`, `memcpy_dtod`,
//!   `memset_zeros`, `upgrade_device_ptr`), `end_capture` (a `CudaGraph`
//!   keeps the stream), `alloc_unified`'s attach. None of them can be called
//!   with a `&CudaStream`, and no method turns a `&CudaStream` into an
//!   `Arc` (nor can safe code: `Arc`'s constructors take the value);
//! - what is callable with `&self` keeps nothing: `launch_builder` returns a
//!   `LaunchArgs` that borrows the stream, `synchronize`, `wait`, `join`,
//!   `record_event` (the `CudaEvent` keeps the context only), `fork` (a new
//!   stream of cudarc's own, which waits for ours once and keeps nothing of
//!   it), `begin_capture` (a capture left open is ended when the closure
//!   returns or unwinds: it cannot be ended with a `&CudaStream`),
//!   `capture_status`, `context`, `cu_stream`;
//! - the closure's type, `FnOnce(&CudaStream) -> R` for every lifetime of
//!   the reference, keeps any borrow of the stream out of `R`, and a thread
//!   the closure starts can hold the reference only within a
//!   `std::thread::scope`, which ends before the closure does.
//!
//! So nothing cudarc makes inside the closure uses the stream after the call,
//! and the lease (or owned stream), borrowed for the whole call, cannot be
//! returned, detached, put back or destroyed during it. Work queued through
//! cudarc stays queued on the stream in its order, as if issued through the
//! raw handle; an event a kernel launch records into a `CudaSlice` made
//! elsewhere marks a point of this stream's work and stays valid after the
//! stream is reused.
//!
//! What the closure cannot do for this reason: copies between the host and
//! cudarc's `CudaSlice`s (they need the `Arc`). Use gpupool's scratch memory
//! and its copies ([`Scratchpad`](gpupool_core::Scratchpad)) for the data and
//! the closure for kernels ([`DeviceSliceExt::kernel_arg`](crate::DeviceSliceExt)),
//! or [`cudarc_stream`] with its contract.

use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::safe::CudaStream;
use cudarc::driver::sys;
use gpupool_core::{Backend, DeviceId, OwnedStream, StreamHandle, StreamLease};

use crate::backend::CudaBackend;
use crate::driver::{driver, raw_stream};
use crate::error::CudaError;

/// Runs `f` with the leased stream as cudarc's [`CudaStream`], for cudarc's
/// kernel launches (`launch_builder`), `synchronize`, `wait`, `join`,
/// `record_event` and `fork`. Safe: the closure gets a `&CudaStream`, so
/// nothing it makes through cudarc can keep the stream past the call (the
/// argument is in the [module documentation](crate::interop)); the wrapper
/// is dropped when `f` returns, or while a panic in `f` unwinds.
///
/// The stream belongs to the device's primary context
/// ([`CudaBackend::context`]): load modules there. Work issued through cudarc
/// is ordered with the lease's other work by the stream alone (cudarc's
/// cross-stream event tracking does not know gpupool's streams): scratch
/// memory made in the lease's order ([`Scratchpad`](gpupool_core::Scratchpad)
/// on [`lease.order()`](StreamLease::order)) is right for kernels launched
/// here. cudarc's copies to and from its own `CudaSlice`s need the
/// `Arc<CudaStream>` and so are not available in `f` (see
/// [`cudarc_stream`]). A graph capture begun in `f` cannot be ended through
/// cudarc with a `&CudaStream` (`end_capture` needs the `Arc`), so do not
/// begin one here: one that `f` leaves open is ended and its graph discarded
/// when `f` returns (or unwinds), so that the stream never goes back to the
/// pool capturing, and the call fails with
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (`f`'s result is dropped).
///
/// `f` runs with the device's primary context current (cudarc's calls make
/// it current anyway). Afterwards, also when `f` panics, the thread's
/// previous context is current again if it was a primary context (gpupool's
/// table retains it, so even a closure that drops the application's last
/// `Arc<CudaContext>` of it cannot destroy it meanwhile), and the device's
/// primary context otherwise: after no context, and after a non-primary
/// context, which safe cudarc code can destroy in the closure (see
/// [`CudaBackend`]'s "The thread's current context").
///
/// Errors, before `f` runs: [`CudaError::NoDriver`] and the driver's, from
/// retaining the device's primary context on first use. After it: a capture
/// left open (above), or a failure to restore the thread's context.
///
/// ```no_run
/// use gpupool_core::Scratchpad;
/// use gpupool_cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
/// use gpupool_cuda::cudarc::nvrtc::Ptx;
/// use gpupool_cuda::{with_cudarc_stream, CudaBackend, DeviceSliceExt};
///
/// // `fill(float *y, float v, unsigned n)`: y[i] = v for i < n.
/// # const FILL_PTX: &str = "";
/// let gpu = CudaBackend::new();
/// let lease = gpupool_cuda::streams().get(0)?;
/// let module = gpu.context(lease.device())?.load_module(Ptx::from_src(FILL_PTX))?;
/// let fill = module.load_function("fill")?;
///
/// let scratch = Scratchpad::new(&gpu, lease.order())?;
/// let y = scratch.device::<f32>(1024)?;
/// let (v, n) = (1.5f32, 1024u32);
/// with_cudarc_stream(&lease, |stream| {
///     let mut launch = stream.launch_builder(&fill);
///     let y_arg = y.kernel_arg();
///     launch.arg(&y_arg).arg(&v).arg(&n);
///     // SAFETY: `fill` takes (float *, float, unsigned); `y` holds `n`
///     // floats of scratch memory in this stream's order.
///     unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
///     stream.synchronize()
/// })??;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn with_cudarc_stream<R>(
    lease: &StreamLease<'_, CudaBackend>,
    f: impl FnOnce(&CudaStream) -> R,
) -> Result<R, CudaError> {
    // SAFETY: a lease of a `StreamPool<CudaBackend>` holds a live created
    // stream of a backend with `CudaBackend`'s id (the pool refuses streams
    // of other ids, and every `CudaBackend` shares one), made on the primary
    // context of `lease.device()`; the lease is borrowed for the whole call,
    // so the stream stays leased to this caller alone until it returns.
    let out = unsafe { scoped(lease.handle(), lease.device(), f) };
    // cudarc's `wait` may have made the stream join a graph capture: the
    // lease's return asks before it queries.
    lease.note_capture();
    out
}

/// [`with_cudarc_stream`] for a stream the caller owns
/// ([`StreamLease::detach`]); the same rules.
///
/// Errors: [`CudaError::ForeignStream`] (nothing called, `f` not run) when
/// the stream was made by another backend than [`CudaBackend`] (its
/// [`backend_id`](OwnedStream::backend_id) is not
/// [`CudaBackend`]'s); otherwise as for [`with_cudarc_stream`].
pub fn with_cudarc_owned_stream<R>(
    stream: &OwnedStream,
    f: impl FnOnce(&CudaStream) -> R,
) -> Result<R, CudaError> {
    if stream.backend_id() != CudaBackend::new().id() {
        return Err(CudaError::ForeignStream(stream.handle()));
    }
    // SAFETY: an `OwnedStream` holds a live, non-special stream of `device`
    // made by a backend of its id (its invariant), which is `CudaBackend`'s
    // (checked above): a stream on `device`'s primary context. It is
    // borrowed for the whole call, so it cannot be put back or destroyed
    // before this returns.
    unsafe { scoped(stream.handle(), stream.device(), f) }
}

/// Wraps `handle` for the length of `f`.
///
/// # Safety
/// `handle` is a live stream created by a `CudaBackend` on `device`'s primary
/// context, and stays alive and held by the caller until this returns.
unsafe fn scoped<R>(
    handle: StreamHandle,
    device: DeviceId,
    f: impl FnOnce(&CudaStream) -> R,
) -> Result<R, CudaError> {
    let ctx = CudaBackend::new().context(device)?;
    // SAFETY: `handle` is a live stream of `ctx`, `device`'s primary context
    // (this function's contract), alive until this returns; the wrapper does
    // not destroy a borrowed stream, and it never leaves this function: `f`
    // sees only a `&CudaStream`, through which cudarc keeps no clone (module
    // documentation), and the `Arc` is dropped below, or during unwinding if
    // `f` panics.
    let stream: Arc<CudaStream> = unsafe { ctx.wrap_borrowed_stream(raw_stream(handle)) };
    // `device`'s primary context current for `f` and the capture check; the
    // thread's own afterwards (also on a panic) where gpupool keeps it alive,
    // the primary one otherwise, whatever `f` left current.
    let out = driver()?.with_context_around_user_code(device, |_| {
        let capture = OpenCapture::watch(handle)?;
        let out = f(&stream);
        capture.end()?;
        Ok(out)
    });
    drop(stream);
    out
}

/// Ends a graph capture that the closure began on the stream and left open:
/// by [`end`](Self::end), which reports it, or by its drop if the closure
/// panics. Otherwise the stream would go back to its pool (or owner) still
/// capturing, and every later user's work on it would be captured instead of
/// run, or fail. A stream that was already in a capture when the closure
/// began (a side stream of a fork made with `AccessOrder::wait`, say) is left
/// as it is: that capture is its owner's to end.
struct OpenCapture {
    stream: sys::CUstream,
    /// The stream was in a capture before the closure ran.
    was_capturing: bool,
}

impl OpenCapture {
    /// Notes whether `stream` is capturing before the closure runs. Called
    /// by `scoped` only, with its live created stream and a context current.
    fn watch(stream: StreamHandle) -> Result<Self, CudaError> {
        // SAFETY: `scoped`'s stream, live for the call, context current.
        let status = unsafe { CudaBackend::raw_capture_status(stream) }?;
        Ok(OpenCapture {
            stream: raw_stream(stream),
            was_capturing: status.is_capturing(),
        })
    }

    /// `Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)` if the closure left a
    /// capture open (ended now, its graph destroyed), or the driver's error.
    fn end(self) -> Result<(), CudaError> {
        let this = core::mem::ManuallyDrop::new(self);
        if this.was_capturing {
            return Ok(());
        }
        // SAFETY: made by `scoped` for its stream, a created stream that is
        // live while the guard exists (`scoped`'s contract).
        unsafe { end_open_capture(this.stream) }
    }
}

impl Drop for OpenCapture {
    fn drop(&mut self) {
        if self.was_capturing {
            return;
        }
        // Unwinding: nobody to report to; the capture is ended all the same.
        // SAFETY: as in `end`.
        let _ = unsafe { end_open_capture(self.stream) };
    }
}

/// If `stream` is capturing a graph (or its capture was invalidated but not
/// ended), ends the capture and destroys the graph. A created stream carries
/// its context; the calls need only some context current (`scoped` makes the
/// primary one current, and cudarc's calls in the closure keep one current).
///
/// # Safety
/// `stream` is a live created stream (not a special one).
unsafe fn end_open_capture(stream: sys::CUstream) -> Result<(), CudaError> {
    // SAFETY: a live stream (this function's contract).
    let status = unsafe { result::stream::is_capturing(stream) }?;
    if status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Ok(());
    }
    // SAFETY: as above; the capture is one this call ends (the closure that
    // began it can no longer end it).
    let graph = unsafe { result::stream::end_capture(stream) }?;
    if !graph.is_null() {
        // SAFETY: the graph `end_capture` just returned, ours alone: nothing
        // was instantiated from it.
        let _ = unsafe { result::graph::destroy(graph) };
    }
    Err(CudaError::Driver(DriverError(
        sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    )))
}

/// The leased stream as cudarc's [`CudaStream`], for all of cudarc's safe API
/// (`launch_builder`, `clone_htod`, `alloc_zeros`, ...). The lease keeps
/// ownership: dropping the returned stream does not destroy or return
/// anything (it is cudarc's `CudaContext::wrap_borrowed_stream`). Prefer
/// [`with_cudarc_stream`], which needs no `unsafe`, unless the work needs
/// the `Arc` (cudarc's own device allocations and copies).
///
/// The stream's context is the device's primary context
/// ([`CudaBackend::context`]); load modules there.
///
/// # Safety
///
/// The cudarc stream borrows the lease's CUDA stream but is an `Arc` with no
/// lifetime, so the compiler cannot hold it to the lease. The caller promises:
///
/// 1. The returned `Arc<CudaStream>`, every clone of it, and everything cudarc
///    made that keeps one (a `CudaSlice` allocated on it keeps it, and frees
///    its memory *on this stream* when dropped) are gone before the lease ends
///    (drop, [`return_to_pool`](StreamLease::return_to_pool)). After that the
///    stream belongs to the pool again: it may be leased to another thread,
///    whose work a late call would interleave with, or destroyed by a purge,
///    after which the handle is dangling. (After
///    [`detach`](StreamLease::detach), the caller owns the stream and the
///    same holds until it destroys or returns it.)
/// 2. Work issued through cudarc is ordered with the lease's other work by
///    stream order only: cudarc's own cross-stream tracking does not know
///    about gpupool's streams.
///
/// ```no_run
/// let lease = gpupool_cuda::streams().get(0)?;
/// {
///     // SAFETY: `stream` and the slice made on it are dropped at the end of
///     // this block, before the lease.
///     let stream = unsafe { gpupool_cuda::cudarc_stream(&lease) }?;
///     let x = stream.clone_htod(&[1.0f32, 2.0, 3.0])?;
///     let back = stream.clone_dtoh(&x)?;
///     assert_eq!(back, [1.0, 2.0, 3.0]);
/// }
/// drop(lease);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub unsafe fn cudarc_stream(
    lease: &StreamLease<'_, CudaBackend>,
) -> Result<Arc<CudaStream>, CudaError> {
    let ctx = CudaBackend::new().context(lease.device())?;
    // SAFETY: the lease's stream is a live stream created by `CudaBackend` on
    // `lease.device()`'s primary context, which is `ctx` (a `StreamPool` of
    // `CudaBackend` holds only streams of a backend with `CudaBackend`'s id,
    // which every `CudaBackend` shares); the caller keeps the wrapper within
    // the lease (this function's contract), and cudarc does not destroy a
    // borrowed stream.
    Ok(unsafe { ctx.wrap_borrowed_stream(raw_stream(lease.handle())) })
}

#[cfg(test)]
mod tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use gpupool_core::{Scratchpad, StreamPool};

    use super::*;

    fn capture_status(lease: &StreamLease<'_, CudaBackend>) -> sys::CUstreamCaptureStatus {
        with_cudarc_stream(lease, |s| s.capture_status())
            .unwrap()
            .unwrap()
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_capture_left_open_is_ended_before_the_stream_goes_back() {
        const NONE: sys::CUstreamCaptureStatus =
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let gpu = CudaBackend::new();
        let pool = StreamPool::new(gpu);
        let lease = pool.get(0).unwrap();

        // Left open when the closure returns: ended, and reported.
        let r = with_cudarc_stream(&lease, |s| s.begin_capture(mode));
        assert_eq!(
            r.map_err(|e| e.code()),
            Err(Some(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED))
        );
        assert_eq!(capture_status(&lease), NONE);

        // Left open by a panic: ended while unwinding.
        let caught = catch_unwind(AssertUnwindSafe(|| {
            with_cudarc_stream(&lease, |s| {
                s.begin_capture(mode).unwrap();
                panic!("inside the capture")
            })
        }));
        assert!(caught.is_err());
        assert_eq!(capture_status(&lease), NONE);

        // The stream runs work again: a round trip through scratch memory in
        // its order, and a closure that captures nothing succeeds.
        let scratch = Scratchpad::new(&gpu, lease.order()).unwrap();
        let x = scratch.to_device(&[1u32, 2, 3]).unwrap();
        assert_eq!(scratch.to_host(&x).unwrap(), [1, 2, 3]);
        drop(scratch);
        assert_eq!(with_cudarc_stream(&lease, |s| s.synchronize()), Ok(Ok(())));
    }
}
