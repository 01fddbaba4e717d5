//! The core's [`Backend`], [`StreamBackend`] and [`EventBackend`] for
//! [`CudaBackend`], over the CUDA driver API through cudarc.
//!
//! Every call first reaches the process-wide driver state (loading `libcuda`
//! on the very first call, see [`crate::driver`]), checks the device ordinal,
//! then makes the driver call under the context rules of that module. Special
//! streams (0, 1, 2) mean "the default stream of the current context", so a
//! call on one first makes the given device's primary context current for the
//! call (DALI #3957: waiting on the default stream of a device that is not the
//! current one failed with "invalid resource handle").

use std::sync::OnceLock;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use gpupool_core::{
    Backend, BackendId, CaptureStatus, Completion, DeviceId, EventBackend, EventFlags, EventHandle,
    StreamBackend, StreamHandle, StreamOptions,
};

use crate::backend::CudaBackend;
use crate::driver::{driver, raw_event, raw_stream, Driver};
use crate::error::{teardown_ok, CudaError};
use crate::graph::unrestricted;
use crate::memory;
use crate::raw;

/// The driver, and `device` checked against it.
#[inline]
fn checked(device: DeviceId) -> Result<&'static Driver, CudaError> {
    let drv = driver()?;
    drv.device(device)?;
    Ok(drv)
}

/// The one id of every `CudaBackend` ([`Backend::id`]): made on first use,
/// without any driver call.
fn process_id() -> BackendId {
    static ID: OnceLock<BackendId> = OnceLock::new();
    *ID.get_or_init(BackendId::unique)
}

// SAFETY: one id for the process, fixed on first use; every `CudaBackend`
// value speaks to the same driver, so a handle or address one of them hands
// out (streams and events on a device's primary context, memory of that
// device) is accepted by all of them.
unsafe impl Backend for CudaBackend {
    type Error = CudaError;

    /// One id for the whole process, shared by every `CudaBackend` value
    /// (they all speak to the same driver). Calls no driver function.
    fn id(&self) -> BackendId {
        process_id()
    }

    /// `cuDeviceGetCount`, asked once per process. `Ok(0)` when `cuInit` finds
    /// no device (`CUDA_ERROR_NO_DEVICE`); [`CudaError::NoDriver`] without
    /// `libcuda`; [`CudaError::Init`] when `cuInit` fails otherwise.
    fn device_count(&self) -> Result<u32, CudaError> {
        Ok(driver()?.count())
    }

    /// The device of the calling thread's current context, or device 0 when
    /// no context is current (the runtime API's default).
    fn current_device(&self) -> Result<DeviceId, CudaError> {
        driver()?.current_device()
    }
}

impl StreamBackend for CudaBackend {
    fn create_stream(
        &self,
        device: DeviceId,
        options: StreamOptions,
    ) -> Result<StreamHandle, CudaError> {
        let drv = driver()?;
        drv.with_context(device, |primary| {
            let kind = result::stream::StreamKind::NonBlocking;
            let s = match options.priority {
                None => result::stream::create(kind)?,
                Some(p) => result::stream::create_with_priority(kind, primary.clamp_priority(p))?,
            };
            // SAFETY: a stream the driver just created on `device`'s primary
            // context, non-blocking: a usable stream of `device` for every
            // `CudaBackend` until it is destroyed.
            Ok(unsafe { StreamHandle::from_raw(s as usize) })
        })
    }

    /// Gives the stream's [device cache](crate::device_cache) blocks back in
    /// its order, then `cuStreamDestroy`.
    ///
    /// # Safety
    /// The contract of [`StreamBackend::destroy_stream`], with the terms of
    /// the type documentation ("Raw handles"): `stream` is a live stream
    /// created by a `CudaBackend` on `device`, owned by the caller, who
    /// never uses it again.
    unsafe fn destroy_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), CudaError> {
        if stream.is_special() {
            return Err(CudaError::SpecialStream(stream));
        }
        teardown_ok((|| {
            let drv = checked(device)?;
            drv.ensure_context(device)?;
            // The device blocks cached for this stream go back to the driver
            // in its order while it is still alive. A failure leaves them
            // cached (never handed to another stream; freed by the next
            // `trim_memory`), so it does not stop the destroy.
            // SAFETY: a live created stream of `device` (this call's
            // contract), not special (checked above).
            let _ = unsafe { memory::forget_stream_blocks(stream, device) };
            // SAFETY: a created stream the caller owns and gives up (this
            // call's contract); work still queued on it completes.
            unsafe { result::stream::destroy(raw_stream(stream)) }?;
            Ok(())
        })())
    }

    /// `cuStreamQuery`.
    ///
    /// # Safety
    /// The contract of [`StreamBackend::query_stream`]: `stream` is a usable
    /// stream of `device` (type documentation, "Raw handles").
    unsafe fn query_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Completion, CudaError> {
        let drv = checked(device)?;
        unrestricted(|| {
            drv.on_stream(stream, device, || {
                // SAFETY: a live stream of `device` (this call's contract), or
                // a special stream of the context made current by `on_stream`.
                unsafe { raw::stream_query(stream) }
            })
        })
    }

    /// `cuStreamSynchronize`.
    ///
    /// # Safety
    /// The contract of [`StreamBackend::synchronize_stream`]: `stream` is a
    /// usable stream of `device` (type documentation, "Raw handles").
    unsafe fn synchronize_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), CudaError> {
        let drv = checked(device)?;
        unrestricted(|| {
            drv.on_stream(stream, device, || {
                // SAFETY: as in `query_stream`.
                unsafe { result::stream::synchronize(raw_stream(stream)) }?;
                Ok(())
            })
        })
    }

    /// `cuStreamWaitEvent`. The event may be of another device than the
    /// stream (CUDA allows waiting across devices).
    ///
    /// # Safety
    /// The contract of [`StreamBackend::stream_wait_event`]: `stream` is a
    /// usable stream of `device` and `event` a live event created by a
    /// `CudaBackend` (type documentation, "Raw handles").
    unsafe fn stream_wait_event(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        event: EventHandle,
    ) -> Result<(), CudaError> {
        let drv = checked(device)?;
        drv.on_stream(stream, device, || {
            // SAFETY: as in `query_stream`, and `event` is a live event (this
            // call's contract; of any device: CUDA waits across devices).
            unsafe {
                result::stream::wait_event(
                    raw_stream(stream),
                    raw_event(event),
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }?;
            Ok(())
        })
    }

    /// `cuStreamIsCapturing`: allowed on a capturing stream in every capture
    /// mode, and it breaks no capture (measured: `docs/graph-capture.md`);
    /// about as cheap as `cuStreamGetId`, and it does not serialise across
    /// threads as `cuStreamQuery` does (`docs/scratch-scaling.md`).
    ///
    /// # Safety
    /// The contract of [`StreamBackend::capture_status`]: `stream` is a
    /// usable stream of `device` (type documentation, "Raw handles").
    unsafe fn capture_status(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<CaptureStatus, CudaError> {
        let drv = checked(device)?;
        drv.on_stream(stream, device, || {
            // SAFETY: a live stream of `device` (this call's contract), or a
            // special stream of the context made current by `on_stream`.
            unsafe { Self::raw_capture_status(stream) }
        })
    }

    /// `cuStreamGetCaptureInfo` (its status and id; where this build's CUDA
    /// version has no known signature for it, `cuStreamIsCapturing` and id
    /// 0). Allowed on a capturing stream in every capture mode; it breaks no
    /// capture.
    ///
    /// # Safety
    /// The contract of [`StreamBackend::capture_id`]: `stream` is a usable
    /// stream of `device` (type documentation, "Raw handles").
    unsafe fn capture_id(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Option<u64>, CudaError> {
        let drv = checked(device)?;
        drv.on_stream(stream, device, || {
            // SAFETY: a live stream of `device` (this call's contract), or a
            // special stream of the context made current by `on_stream`.
            unsafe { crate::memory::current_capture(stream) }.map(|c| c.map(|c| c.id))
        })
    }

    /// `cuStreamGetId` for a created stream (the driver's id of the stream
    /// itself, unique in the process; drivers for CUDA 12.0 and later),
    /// looked up once in the driver library whatever CUDA version the
    /// bindings were built for; `None` for a special stream or where the
    /// driver has no such entry point.
    ///
    /// # Safety
    /// The contract of [`StreamBackend::stream_id`]: `stream` is a usable
    /// stream of `device` (type documentation, "Raw handles").
    unsafe fn stream_id(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Option<u64>, CudaError> {
        if stream.is_special() {
            return Ok(None);
        }
        checked(device)?;
        // SAFETY: a live created stream (this call's contract). The stream
        // names its context: no current context is needed.
        unsafe { raw::stream_get_id(stream) }.transpose()
    }

    /// `cuStreamGetCtx`, and the device of that context. A special stream
    /// belongs to the current context, so it gives
    /// [`current_device`](Backend::current_device) (as DALI's
    /// `DeviceFromStream` does).
    ///
    /// # Safety
    /// The contract of [`StreamBackend::stream_device`]: `stream` was created
    /// by a `CudaBackend` and is not destroyed before the call returns (type
    /// documentation, "Raw handles").
    unsafe fn stream_device(&self, stream: StreamHandle) -> Result<DeviceId, CudaError> {
        let drv = driver()?;
        if stream.is_special() {
            return drv.current_device();
        }
        // SAFETY: a live created stream (this call's contract).
        let ctx = unsafe { raw::stream_get_ctx(stream) }?;
        // A `CudaBackend` creates streams only on primary contexts that the
        // process-wide table retains (`create_stream`), so the context is
        // recognised by its handle; no other context is handed to the driver.
        drv.device_of_primary(ctx)
            .ok_or(CudaError::Driver(DriverError(
                sys::CUresult::CUDA_ERROR_INVALID_CONTEXT,
            )))
    }
}

impl CudaBackend {
    /// `cuStreamIsCapturing`, as a [`CaptureStatus`].
    ///
    /// # Safety
    /// `stream` is a usable stream of the current context (live, or special).
    pub(crate) unsafe fn raw_capture_status(
        stream: StreamHandle,
    ) -> Result<CaptureStatus, CudaError> {
        // SAFETY: the caller's contract.
        let status = unsafe { raw::stream_is_capturing(stream) }?;
        Ok(capture_status_of(status))
    }
}

/// The driver's capture status as a [`CaptureStatus`].
pub(crate) fn capture_status_of(status: sys::CUstreamCaptureStatus) -> CaptureStatus {
    match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::NotCapturing,
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active,
        _ => CaptureStatus::Invalidated,
    }
}

impl EventBackend for CudaBackend {
    /// `cuEventCreate` on `device`'s primary context. The bits of
    /// [`EventFlags`] are CUDA's `CU_EVENT_*` values and are passed unchanged.
    fn create_event(&self, device: DeviceId, flags: EventFlags) -> Result<EventHandle, CudaError> {
        let drv = driver()?;
        drv.with_context(device, |_| {
            // The driver rejects flag bits it does not know.
            let event = raw::event_create(flags.0)?;
            // SAFETY: an event the driver just created on `device`'s primary
            // context: a usable event of `device` until it is destroyed.
            Ok(unsafe { EventHandle::from_raw(event as usize) })
        })
    }

    /// `cuEventDestroy`.
    ///
    /// # Safety
    /// The contract of [`EventBackend::destroy_event`]: `event` is a live
    /// event created by a `CudaBackend` on `device`, owned by the caller, who
    /// never uses it again (type documentation, "Raw handles").
    unsafe fn destroy_event(&self, event: EventHandle, device: DeviceId) -> Result<(), CudaError> {
        teardown_ok((|| {
            let drv = checked(device)?;
            drv.ensure_context(device)?;
            // SAFETY: a live event the caller owns and gives up (this call's
            // contract); destroying a pending event is allowed.
            unsafe { result::event::destroy(raw_event(event)) }?;
            Ok(())
        })())
    }

    /// `cuEventRecord`. `device` is the stream's device, which must also be
    /// the event's (CUDA records only within one context).
    ///
    /// # Safety
    /// The contract of [`EventBackend::record_event`]: `event` is a usable
    /// event and `stream` a usable stream, both of `device` (type
    /// documentation, "Raw handles").
    unsafe fn record_event(
        &self,
        event: EventHandle,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), CudaError> {
        let drv = checked(device)?;
        drv.on_stream(stream, device, || {
            // SAFETY: a live event, and a live stream of `device` or a special
            // stream of the context made current by `on_stream` (this call's
            // contract).
            unsafe { result::event::record(raw_event(event), raw_stream(stream)) }?;
            Ok(())
        })
    }

    /// `cuEventQuery`.
    ///
    /// # Safety
    /// The contract of [`EventBackend::query_event`]: `event` is a usable
    /// event of `device` (type documentation, "Raw handles").
    unsafe fn query_event(
        &self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<Completion, CudaError> {
        let drv = checked(device)?;
        drv.ensure_context(device)?;
        // SAFETY: a live event (this call's contract).
        unrestricted(|| unsafe { raw::event_query(event) })
    }

    /// `queries` with the thread's capture interaction mode relaxed
    /// (`cuThreadExchangeStreamCaptureMode`), then put back.
    fn relaxed_queries(&self, queries: &mut dyn FnMut()) {
        if driver().is_err() {
            return queries();
        }
        crate::graph::with_relaxed_mode(queries)
    }

    /// `cuEventSynchronize`.
    ///
    /// # Safety
    /// The contract of [`EventBackend::synchronize_event`]: `event` is a
    /// usable event of `device` (type documentation, "Raw handles").
    unsafe fn synchronize_event(
        &self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<(), CudaError> {
        let drv = checked(device)?;
        drv.ensure_context(device)?;
        unrestricted(|| {
            // SAFETY: a live event (this call's contract).
            unsafe { result::event::synchronize(raw_event(event)) }?;
            Ok(())
        })
    }
}
