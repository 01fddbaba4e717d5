//! cudarc interop for pooled streams: [`with_cudarc_stream`] and
//! [`with_cudarc_owned_stream`] (safe, scoped), which lend a closure the
//! stream as a [`LeasedStream`], and [`cudarc_stream`] (`unsafe`, unscoped).
//!
//! ## Why the scoped form is safe
//!
//! Two things must hold for a closure that gets the stream through safe code.
//! It must not keep the stream past the call (the lease then goes back to its
//! pool). And it must not make the stream begin or join a graph capture:
//! gpupool's pools and scratchpads know that a stream may be capturing only
//! through calls gpupool makes ([`AccessOrder::wait`](gpupool_core::AccessOrder::wait),
//! [`StreamLease::note_capture`]), so a capture begun or joined in the closure
//! and ended before gpupool looks would be invisible to them, and scratch
//! memory used in it would be reused while the graph replays it.
//!
//! cudarc's `CudaContext::wrap_borrowed_stream` makes an `Arc<CudaStream>`
//! that does not destroy the stream when dropped but has no lifetime. The
//! scoped functions keep that `Arc` to themselves, lend the closure a
//! [`LeasedStream`] that borrows it, and drop it when the closure returns or
//! unwinds. `LeasedStream` is a type of this crate, with no `Deref`, no public
//! field, and no method that hands out the `&CudaStream` or an `Arc` of it, so
//! the closure reaches cudarc's `CudaStream` only through these methods (in
//! cudarc 0.19.10, checked against its source: every method of `CudaStream`,
//! and of the `LaunchArgs` that `launch_builder` returns):
//!
//! - [`launch_builder`](LeasedStream::launch_builder): cudarc's
//!   `LaunchArgs`, which borrows the stream through a private field and has
//!   `arg`, `record_kernel_launch` and the `unsafe` `launch` and
//!   `launch_cooperative`; none hands the stream out. A launch first makes
//!   the stream wait on the events cudarc keeps in its tracked arguments,
//!   which would make it join a capture that recorded one of them: that is
//!   excluded by the launch's `unsafe` contract (see `launch_builder`).
//! - [`record_event`](LeasedStream::record_event): recording begins no capture
//!   and joins none (waiting does), and the `CudaEvent` keeps the context,
//!   not the stream.
//! - [`synchronize`](LeasedStream::synchronize) (refused on a capturing
//!   stream before the driver is asked), [`capture_status`](LeasedStream::capture_status),
//!   [`context`](LeasedStream::context) (the device's primary context, which
//!   [`CudaBackend::context`] hands out anyway; nothing reachable from it
//!   names this stream) and [`cu_stream`](LeasedStream::cu_stream) (the raw
//!   handle: every cudarc function that takes a raw `CUstream` is `unsafe`).
//!
//! Left out, so not callable in the closure:
//!
//! - `wait(&CudaEvent)` and `join(&CudaStream)`: waiting on an event recorded
//!   on a capturing stream makes this stream join that capture;
//! - `begin_capture`: begins one (and `end_capture` takes the `Arc`);
//! - `fork`: a new stream of cudarc's that waits on this one, so it would join
//!   a capture this stream is in (one its owner began), with no way to join
//!   it back;
//! - everything that takes `self: &Arc<CudaStream>` because what it returns
//!   keeps a clone of the stream: the allocations and copies of `CudaSlice`s
//!   (`alloc`, `alloc_zeros`, `null`, `clone_htod`, `clone_dtoh`,
//!   `clone_dtod`, `memcpy_*`, `memset_zeros`, `upgrade_device_ptr`),
//!   `end_capture`, `UnifiedSlice::attach`; and the functions that take a
//!   `&CudaStream` argument (`CudaEvent::record`, the `device_ptr` and
//!   `view_ptr` of cudarc's slices), which cannot be given one.
//!
//! The closure's type, `FnOnce(&LeasedStream<'_>) -> R` for every lifetime,
//! keeps any borrow of the wrapper (a `LaunchArgs`, say) out of `R`, and a
//! thread the closure starts can hold the wrapper only within a
//! `std::thread::scope`, which ends before the closure does.
//!
//! So nothing cudarc makes inside the closure uses the stream after the call;
//! the lease (or owned stream), borrowed for the whole call, cannot be
//! returned, detached, put back or destroyed during it; and the stream is in
//! a graph capture after the call only if it was before (one that its owner
//! began and told gpupool of). Work queued through cudarc stays queued on the
//! stream in its order, as if issued through the raw handle; an event a
//! kernel launch records into a `CudaSlice` made elsewhere marks a point of
//! this stream's work and stays valid after the stream is reused.
//!
//! What the closure cannot do for these reasons: copies between the host and
//! cudarc's `CudaSlice`s (they need the `Arc`), and waits on other streams.
//! Use gpupool's scratch memory and its copies
//! ([`Scratchpad`](gpupool_core::Scratchpad)) for the data, gpupool's orders
//! ([`AccessOrder::wait`](gpupool_core::AccessOrder::wait)) for the waits,
//! and the closure for kernels ([`DeviceSliceExt::kernel_arg`](crate::DeviceSliceExt)),
//! or [`cudarc_stream`] with its contract.
//!
//! ## The thread's context
//!
//! The closure runs with the stream's device's primary context current.
//! Afterwards, also after a panic, the context current before the call is
//! current again if it was a primary context: gpupool's process-wide table
//! retains it (from that moment on, if it did not yet), so the closure cannot
//! destroy it meanwhile, even by dropping the application's last
//! `Arc<CudaContext>` of it. Otherwise the device's primary context is
//! current afterwards: when the thread had none, and when it had a
//! non-primary context (cudarc's safe `CudaContext::new_non_primary` and
//! `new_cig` make one, and dropping their last `Arc` destroys it, inside the
//! closure as well as anywhere else), which nobody but its creator can keep
//! alive, so gpupool never makes it current again. cudarc's safe API makes its
//! own context current before each call and does not notice; code that uses
//! the driver or the runtime directly on a non-primary context makes it
//! current again after the call. (The same holds for every gpupool call that
//! switches contexts: see [`CudaBackend`]'s "The thread's current context".)

use std::sync::Arc;

use cudarc::driver::safe::{CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchArgs};
use cudarc::driver::sys;
use gpupool_core::{Backend, CaptureStatus, DeviceId, OwnedStream, StreamHandle, StreamLease};

use crate::backend::CudaBackend;
use crate::driver::{driver, raw_stream};
use crate::error::CudaError;
use crate::streams_events::capture_status_of;

/// A pooled stream lent to the closure of [`with_cudarc_stream`] or
/// [`with_cudarc_owned_stream`], with the part of cudarc's `CudaStream` that
/// cannot begin or join a graph capture nor keep the stream past the call:
/// kernel launches ([`launch_builder`](Self::launch_builder)), events
/// recorded on it, synchronization, its capture status, its context and its
/// raw handle. Why that part and no more: the
/// [module documentation](crate::interop).
///
/// What it does not offer does not compile. No capture can be begun:
///
/// ```compile_fail,E0599
/// use gpupool_cuda::cudarc::driver::sys::CUstreamCaptureMode;
/// use gpupool_cuda::LeasedStream;
///
/// fn begin(s: &LeasedStream<'_>) {
///     let _ = s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
/// }
/// ```
///
/// nor joined by waiting on an event or another stream:
///
/// ```compile_fail,E0599
/// use gpupool_cuda::cudarc::driver::CudaEvent;
/// use gpupool_cuda::LeasedStream;
///
/// fn wait(s: &LeasedStream<'_>, capturing: &CudaEvent) {
///     let _ = s.wait(capturing);
/// }
/// ```
///
/// ```compile_fail,E0599
/// use gpupool_cuda::cudarc::driver::CudaStream;
/// use gpupool_cuda::LeasedStream;
///
/// fn join(s: &LeasedStream<'_>, capturing: &CudaStream) {
///     let _ = s.join(capturing);
/// }
/// ```
///
/// ```compile_fail,E0599
/// use gpupool_cuda::LeasedStream;
///
/// fn fork(s: &LeasedStream<'_>) {
///     let _ = s.fork();
/// }
/// ```
///
/// and cudarc's stream itself is not reachable from it:
///
/// ```compile_fail,E0308
/// use gpupool_cuda::cudarc::driver::CudaStream;
/// use gpupool_cuda::LeasedStream;
///
/// fn unwrap<'a>(s: &'a LeasedStream<'_>) -> &'a CudaStream {
///     s
/// }
/// ```
///
/// What it offers, in a closure:
///
/// ```no_run
/// use gpupool_core::CaptureStatus;
/// use gpupool_cuda::with_cudarc_stream;
///
/// let lease = gpupool_cuda::streams().get(0)?;
/// with_cudarc_stream(&lease, |s| {
///     assert_eq!(s.cu_stream() as usize, lease.handle().as_raw());
///     assert_eq!(s.capture_status()?, CaptureStatus::NotCapturing);
///     let done = s.record_event(None)?; // after the work queued so far
///     s.synchronize()?;
///     assert!(done.is_complete());
///     Ok::<_, gpupool_cuda::CudaError>(())
/// })??;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct LeasedStream<'a> {
    /// Borrowed from the `Arc` that `scoped` keeps; never handed out (the
    /// soundness argument of the module documentation rests on it).
    stream: &'a CudaStream,
    /// The same stream as gpupool's handle, for errors.
    handle: StreamHandle,
}

impl LeasedStream<'_> {
    /// cudarc's kernel launch builder for `func` on this stream
    /// (`CudaStream::launch_builder`): add the arguments with cudarc's
    /// `PushKernelArg::arg`, then `launch`, which is `unsafe`.
    ///
    /// Besides what cudarc's `launch` asks (argument types, bounds, the
    /// mutability the kernel really has), its contract here includes one
    /// thing: cudarc's tracked arguments (`&CudaSlice`, `&mut CudaSlice`,
    /// `CudaView`, `CudaViewMut`, `UnifiedSlice` and its views) make the
    /// launch first make this stream *wait* on the events cudarc keeps for
    /// them (their last write, and for a mutable one its last read too;
    /// only while cudarc's context tracks events across streams). If such an
    /// event was recorded by work captured into a graph (the argument was
    /// used on a capturing stream), the wait makes this stream join that
    /// capture, which gpupool would not know of. The caller of `launch`
    /// promises that no argument was last used in a graph capture. Plain
    /// values and gpupool's scratch memory
    /// ([`KernelPtr`](crate::KernelPtr), from
    /// [`DeviceSliceExt::kernel_arg`](crate::DeviceSliceExt::kernel_arg))
    /// carry no events.
    ///
    /// The events a launch records for its tracked arguments (and
    /// `record_kernel_launch`'s) are recorded on this stream, which is
    /// harmless.
    pub fn launch_builder<'s>(&'s self, func: &'s CudaFunction) -> LaunchArgs<'s> {
        self.stream.launch_builder(func)
    }

    /// A new cudarc event (`flags`: cudarc's default, timing disabled, for
    /// `None`) recorded on this stream after the work queued so far
    /// (`CudaStream::record_event`). Recording begins and joins no capture;
    /// on a capturing stream the record is captured, as any work is.
    pub fn record_event(&self, flags: Option<sys::CUevent_flags>) -> Result<CudaEvent, CudaError> {
        Ok(self.stream.record_event(flags)?)
    }

    /// Waits on the host until the work queued on this stream is done
    /// (`cuStreamSynchronize`). The capture status is asked first: a
    /// capturing stream (active, or invalidated and not yet ended) gives
    /// [`CudaError::StreamCapturing`] and nothing else is called, where the
    /// driver would refuse the call and break the capture. (The status can
    /// change between the question and the call only if another thread makes
    /// this stream join a capture meanwhile, through the lease's order: then
    /// the driver refuses, as it would without the question.)
    pub fn synchronize(&self) -> Result<(), CudaError> {
        if self.capture_status()?.is_capturing() {
            return Err(CudaError::StreamCapturing(self.handle));
        }
        Ok(self.stream.synchronize()?)
    }

    /// Whether the stream is in a graph capture (`cuStreamIsCapturing`:
    /// allowed during every capture, and it breaks none). Only the owner of a
    /// capture that this stream was in before the call can have put it
    /// there: nothing in the closure can.
    pub fn capture_status(&self) -> Result<CaptureStatus, CudaError> {
        Ok(capture_status_of(self.stream.capture_status()?))
    }

    /// The stream's context: its device's primary context, the one
    /// [`CudaBackend::context`] gives (load modules there).
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// The driver's handle of the stream (the lease's
    /// [`handle`](StreamLease::handle)). Using it needs `unsafe` code: every
    /// cudarc function that takes a raw `CUstream` is `unsafe`, and the
    /// handle is the lease's, not the caller's, after the call.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }
}

/// Runs `f` with the leased stream lent as a [`LeasedStream`], for cudarc's
/// kernel launches ([`launch_builder`](LeasedStream::launch_builder)), events
/// recorded on it and synchronization. Safe: nothing `f` can do through it
/// keeps the stream past the call, or begins or joins a graph capture (the
/// argument is in the [module documentation](crate::interop)); the wrapper is
/// dropped when `f` returns, or while a panic in `f` unwinds.
///
/// The stream belongs to the device's primary context
/// ([`CudaBackend::context`]): load modules there. Work issued through cudarc
/// is ordered with the lease's other work by the stream alone (cudarc's
/// cross-stream event tracking does not know gpupool's streams): scratch
/// memory made in the lease's order ([`Scratchpad`](gpupool_core::Scratchpad)
/// on [`lease.order()`](StreamLease::order)) is right for kernels launched
/// here. cudarc's copies to and from its own `CudaSlice`s need the
/// `Arc<CudaStream>` and so are not available in `f` (see [`cudarc_stream`]).
/// If the lease's stream is in a graph capture that its owner began (and told
/// the lease of, [`StreamLease::note_capture`]), kernels launched in `f` are
/// captured, and [`LeasedStream::synchronize`] is refused.
///
/// `f` runs with the device's primary context current (cudarc's calls make
/// it current anyway). Afterwards, also when `f` panics, the thread's previous
/// context is current again if it was a primary context, and the device's
/// primary context otherwise (see "The thread's context" in the
/// [module documentation](crate::interop)).
///
/// Errors, before `f` runs: [`CudaError::NoDriver`] and the driver's, from
/// retaining the device's primary context on first use. After it: a failure
/// to make the thread's context current again.
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
///     // floats of scratch memory in this stream's order; no argument
///     // carries cudarc events.
///     unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
///     stream.synchronize()
/// })??;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn with_cudarc_stream<R>(
    lease: &StreamLease<'_, CudaBackend>,
    f: impl FnOnce(&LeasedStream<'_>) -> R,
) -> Result<R, CudaError> {
    // SAFETY: a lease of a `StreamPool<CudaBackend>` holds a live created
    // stream of a backend with `CudaBackend`'s id (the pool refuses streams
    // of other ids, and every `CudaBackend` shares one), made on the primary
    // context of `lease.device()`; the lease is borrowed for the whole call,
    // so the stream stays leased to this caller alone until it returns.
    unsafe { scoped(lease.handle(), lease.device(), f) }
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
    f: impl FnOnce(&LeasedStream<'_>) -> R,
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

/// Lends `handle` to `f` as a [`LeasedStream`], with `device`'s primary
/// context current and the thread's context put back afterwards (see "The
/// thread's context" in the module documentation).
///
/// # Safety
/// `handle` is a live stream created by a `CudaBackend` on `device`'s primary
/// context, and stays alive and held by the caller until this returns.
unsafe fn scoped<R>(
    handle: StreamHandle,
    device: DeviceId,
    f: impl FnOnce(&LeasedStream<'_>) -> R,
) -> Result<R, CudaError> {
    driver()?.with_context_around_user_code(device, |primary| {
        // SAFETY: `handle` is a live stream of `primary`, `device`'s primary
        // context (this function's contract), alive until this returns; the
        // wrapper does not destroy a borrowed stream, and it never leaves
        // this closure: `f` sees only a `LeasedStream` borrowing it, through
        // which nothing keeps a clone (module documentation), and the `Arc`
        // is dropped when this closure returns, or during unwinding if `f`
        // panics.
        let stream: Arc<CudaStream> =
            unsafe { primary.context().wrap_borrowed_stream(raw_stream(handle)) };
        Ok(f(&LeasedStream {
            stream: &stream,
            handle,
        }))
    })
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
/// 3. A graph capture begun or joined through it (`begin_capture`, `wait`,
///    `join`, a launch that waits on a captured event) is told to the lease
///    ([`StreamLease::note_capture`]) right after it begins, as for one begun
///    through the raw handle.
///
/// ```no_run
/// let lease = gpupool_cuda::streams().get(0)?;
/// {
///     // SAFETY: `stream` and the slice made on it are dropped at the end of
///     // this block, before the lease; nothing here captures.
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
    use cudarc::driver::{result, LaunchConfig, PushKernelArg};
    use cudarc::nvrtc::Ptx;
    use gpupool_core::{Scratchpad, StreamPool};

    use super::*;
    use crate::DeviceSliceExt;

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_closure_launching_a_kernel_and_synchronizing_works() {
        const N: usize = 100_003; // several blocks, the last one partly full
        let gpu = CudaBackend::new();
        let pool = StreamPool::new(gpu);
        let lease = pool.get(0).unwrap();
        let module = gpu
            .context(lease.device())
            .unwrap()
            .load_module(Ptx::from_src(crate::testing::AFFINE_PTX))
            .unwrap();
        let affine = module.load_function("affine").unwrap();
        let host_x: Vec<f32> = (0..N).map(|i| i as f32).collect();
        let scratch = Scratchpad::new(&gpu, lease.order()).unwrap();
        let x = scratch.to_device(&host_x).unwrap();
        let y = scratch.device::<f32>(N).unwrap();
        let n = N as u32;

        let status = with_cudarc_stream(&lease, |s| {
            assert_eq!(s.cu_stream() as usize, lease.handle().as_raw());
            assert_eq!(
                s.context().cu_ctx(),
                gpu.context(lease.device())?.cu_ctx(),
                "the device's primary context"
            );
            let (y_arg, x_arg) = (y.kernel_arg(), x.kernel_arg());
            let mut launch = s.launch_builder(&affine);
            launch.arg(&y_arg).arg(&x_arg).arg(&n);
            // SAFETY: `affine(float *y, const float *x, unsigned n)`: `y` and
            // `x` hold `n` floats each of scratch memory in this stream's
            // order, the grid covers `n` threads, and no argument carries
            // cudarc events.
            unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
            let done = s.record_event(None)?;
            s.synchronize()?;
            assert!(
                done.is_complete(),
                "recorded after the launch, synchronized"
            );
            s.capture_status()
        })
        .expect("the primary context")
        .expect("the launch and the synchronization");
        assert_eq!(status, CaptureStatus::NotCapturing);

        let host_y = scratch.to_host(&y).expect("read y back");
        assert_eq!(host_y.len(), N);
        let wrong: Vec<(usize, f32)> = host_y
            .iter()
            .enumerate()
            .filter(|&(i, &v)| v != 2.0 * host_x[i] + 1.0)
            .map(|(i, &v)| (i, v))
            .take(5)
            .collect();
        assert!(wrong.is_empty(), "first wrong (index, value): {wrong:?}");
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn synchronize_is_refused_on_a_capturing_stream_and_the_capture_survives() {
        let gpu = CudaBackend::new();
        let pool = StreamPool::new(gpu);
        let lease = pool.get(0).unwrap();
        let raw = raw_stream(lease.handle());
        let relaxed = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: the lease's live stream; the capture is told to the lease
        // at once and ended below, before the lease ends.
        unsafe { result::stream::begin_capture(raw, relaxed) }.unwrap();
        lease.note_capture();

        let (status, synced) =
            with_cudarc_stream(&lease, |s| (s.capture_status(), s.synchronize())).unwrap();
        assert_eq!(status, Ok(CaptureStatus::Active));
        assert_eq!(synced, Err(CudaError::StreamCapturing(lease.handle())));

        // Nothing broke the capture: it ends without an error.
        // SAFETY: the capture begun above, on the lease's live stream.
        let graph = unsafe { result::stream::end_capture(raw) }.expect("an intact capture");
        if !graph.is_null() {
            // SAFETY: the graph just returned, ours alone.
            unsafe { result::graph::destroy(graph) }.unwrap();
        }
        let after = with_cudarc_stream(&lease, |s| (s.capture_status(), s.synchronize()));
        assert_eq!(after, Ok((Ok(CaptureStatus::NotCapturing), Ok(()))));
    }
}
