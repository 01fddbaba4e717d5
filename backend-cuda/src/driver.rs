//! The process-wide view of the CUDA driver: loaded and initialised once, on
//! first use; one lazily retained primary context per device; and the rules
//! for which context is current on the calling thread.
//!
//! ## Loading
//!
//! Nothing touches the driver until the first backend call. That call checks
//! that `libcuda` can be loaded at all (cudarc's `is_culib_present`: cudarc
//! panics on the first driver call when it cannot find the library), then runs
//! `cuInit` and counts the devices. The outcome is kept for the life of the
//! process: [`CudaError::NoDriver`], a failed `cuInit`, or the device table
//! (empty when `cuInit` says `CUDA_ERROR_NO_DEVICE`).
//!
//! ## Contexts
//!
//! Streams and events are created on the device's *primary* context (the one
//! the CUDA runtime uses), retained once per device through cudarc's
//! [`CudaContext::new`] and never released: the process-wide table is never
//! dropped, as the runtime keeps its contexts until exit.
//!
//! Which context is current on the calling thread:
//! 1. A call on a created stream or event does not switch: the handle carries
//!    its context. The driver refuses most calls when *no* context is current,
//!    so if none is, the device's primary context is made current and left
//!    there (as cudarc's `bind_to_thread` does). That costs one
//!    `cuCtxGetCurrent` (~11 ns) per call.
//! 2. A call that needs a particular context (creating a stream or an event;
//!    anything on a special stream 0, 1 or 2, which means "the current
//!    context's") makes the device's primary context current for the call only
//!    (`cuCtxSetCurrent`, skipped when it already is) and restores the
//!    previous one afterwards, like DALI's `DeviceGuard`; a thread that had no
//!    context keeps the new one, as in rule 1. The restore is a scope guard's
//!    (`Restore`): it happens even when the call panics, so a panic never
//!    leaves the caller's thread on another context.

use std::sync::{Arc, OnceLock};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::safe::CudaContext;
use cudarc::driver::sys;
use gpupool_core::{DeviceId, EventHandle, StreamHandle};

use crate::error::{check, CudaError};
use crate::library;

/// The driver as this process found it.
pub(crate) struct Driver {
    /// One entry per device ordinal, in ordinal order.
    devices: Box<[Device]>,
}

/// One device.
pub(crate) struct Device {
    ordinal: u32,
    /// `cuDeviceGet(ordinal)`.
    cu_device: sys::CUdevice,
    /// Set once, by the first call that needs the context.
    primary: OnceLock<Primary>,
}

/// A device's retained primary context.
pub(crate) struct Primary {
    /// Holds the retain (cudarc releases it on drop, which never happens for
    /// the process-wide table; a racing loser's copy is dropped at once).
    ctx: Arc<CudaContext>,
    /// `cuCtxGetStreamPriorityRange`: the numerically largest (lowest) priority.
    least: i32,
    /// The numerically smallest (highest) priority; `greatest <= least`.
    greatest: i32,
}

static DRIVER: OnceLock<Result<Driver, CudaError>> = OnceLock::new();

/// The driver, loading and initialising it on the first call.
pub(crate) fn driver() -> Result<&'static Driver, CudaError> {
    match DRIVER.get_or_init(load) {
        Ok(d) => Ok(d),
        Err(e) => Err(*e),
    }
}

fn load() -> Result<Driver, CudaError> {
    if !library::present() {
        return Err(CudaError::NoDriver);
    }
    match result::init() {
        Ok(()) => {}
        Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => {
            return Ok(Driver {
                devices: Box::new([]),
            })
        }
        Err(e) => return Err(CudaError::Init(e)),
    }
    let count = result::device::get_count().map_err(CudaError::Init)?;
    let devices = (0..count.max(0))
        .map(|i| {
            Ok(Device {
                ordinal: i as u32,
                cu_device: result::device::get(i)?,
                primary: OnceLock::new(),
            })
        })
        .collect::<Result<Box<[Device]>, DriverError>>()
        .map_err(CudaError::Init)?;
    Ok(Driver { devices })
}

impl Driver {
    /// How many devices the driver reports.
    pub(crate) fn count(&self) -> u32 {
        self.devices.len() as u32
    }

    /// The device `id`, if it exists.
    pub(crate) fn device(&self, id: DeviceId) -> Result<&Device, CudaError> {
        self.devices
            .get(id.index())
            .ok_or(CudaError::DeviceOutOfRange {
                device: id,
                count: self.count(),
            })
    }

    /// The ordinal of a driver device handle.
    fn ordinal_of(&self, cu_device: sys::CUdevice) -> Option<DeviceId> {
        self.devices
            .iter()
            .find(|d| d.cu_device == cu_device)
            .map(|d| DeviceId(d.ordinal))
    }

    /// The device a context belongs to. A retained primary context is
    /// recognised by its handle; any other context (one the application
    /// created) is pushed, asked with `cuCtxGetDevice`, and popped.
    ///
    /// # Safety
    /// `ctx` is a live context: the calling thread's current one, or the
    /// context of a live stream, just returned by the driver.
    pub(crate) unsafe fn device_of_context(
        &self,
        ctx: sys::CUcontext,
    ) -> Result<DeviceId, CudaError> {
        let known = self
            .devices
            .iter()
            .find(|d| d.primary.get().is_some_and(|p| p.ctx.cu_ctx() == ctx));
        if let Some(d) = known {
            return Ok(DeviceId(d.ordinal));
        }
        let mut cu_device: sys::CUdevice = 0;
        // SAFETY: `ctx` is live (this function's contract); pushing it and
        // popping it right after leaves the thread's context stack as it was.
        check(unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
        // SAFETY: `cu_device` is a valid place for the driver to write to.
        let asked = check(unsafe { sys::cuCtxGetDevice(&mut cu_device) });
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context pushed above; `popped` is a valid place.
        let pop = check(unsafe { sys::cuCtxPopCurrent_v2(&mut popped) });
        asked?;
        pop?;
        self.ordinal_of(cu_device)
            .ok_or(CudaError::Driver(DriverError(
                sys::CUresult::CUDA_ERROR_INVALID_DEVICE,
            )))
    }

    /// The device of the calling thread's current context; device 0 when no
    /// context is current (as the runtime API's `cudaGetDevice` says).
    pub(crate) fn current_device(&self) -> Result<DeviceId, CudaError> {
        match result::ctx::get_current()? {
            None => Ok(DeviceId(0)),
            // SAFETY: the thread's current context, just returned.
            Some(ctx) => unsafe { self.device_of_context(ctx) },
        }
    }

    /// Rule 1 of the [module documentation](self): if no context is current,
    /// makes `device`'s primary context current and leaves it there.
    #[inline]
    pub(crate) fn ensure_context(&self, device: DeviceId) -> Result<(), CudaError> {
        if result::ctx::get_current()?.is_none() {
            let ctx = self.device(device)?.primary()?.ctx.cu_ctx();
            // SAFETY: a retained primary context, never released.
            unsafe { result::ctx::set_current(ctx) }?;
        }
        Ok(())
    }

    /// Runs `op` in the right context for a call on `stream`: rule 2 (the
    /// device's primary context, for the call only) for a special stream,
    /// which means "the current context's"; rule 1 (any current context, the
    /// device's primary one if the thread has none) for a created stream,
    /// which carries its context.
    #[inline]
    pub(crate) fn on_stream<T>(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        op: impl FnOnce() -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        if stream.is_special() {
            self.with_context(device, |_| op())
        } else {
            self.ensure_context(device)?;
            op()
        }
    }

    /// Rule 2 of the [module documentation](self): runs `op` with `device`'s
    /// primary context current, then restores the previous one, also when
    /// `op` panics (the scope guard's drop does it then).
    pub(crate) fn with_context<T>(
        &self,
        device: DeviceId,
        op: impl FnOnce(&Primary) -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        let primary = self.device(device)?.primary()?;
        let scope = ContextScope::enter(primary.ctx.cu_ctx())?;
        scoped(scope, || op(primary))
    }
}

impl Device {
    /// The primary context, retained on first use.
    pub(crate) fn primary(&self) -> Result<&Primary, CudaError> {
        if let Some(p) = self.primary.get() {
            return Ok(p);
        }
        self.retain_primary()
    }

    #[cold]
    fn retain_primary(&self) -> Result<&Primary, CudaError> {
        // `CudaContext::new` makes the context current (and so would dropping
        // a copy that lost the race below); put the caller's context back,
        // whatever happens (the guard's drop does it on a panic).
        let previous = result::ctx::get_current()?;
        let guard = Restore::new(previous, set_current_back);
        let made = CudaContext::new(self.ordinal as usize).and_then(|ctx| {
            let (least, greatest) = result::stream::get_priority_range()?;
            Ok(Primary {
                ctx,
                least,
                greatest,
            })
        });
        let out = made.map(|p| self.primary.get_or_init(|| p));
        guard.finish()?;
        Ok(out?)
    }
}

impl Primary {
    /// cudarc's handle to the context.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// `priority` moved into the device's range (`greatest..=least`).
    pub(crate) fn clamp_priority(&self, priority: i32) -> i32 {
        priority.clamp(self.greatest, self.least)
    }
}

/// The driver's handle of a stream.
#[inline]
pub(crate) fn raw_stream(s: StreamHandle) -> sys::CUstream {
    s.as_raw() as sys::CUstream
}

/// The driver's handle of an event.
#[inline]
pub(crate) fn raw_event(e: EventHandle) -> sys::CUevent {
    e.as_raw() as sys::CUevent
}

/// Puts something back when dropped: `put(value)` runs once, from
/// [`finish`](Restore::finish) (which reports its error) or, if the guard is
/// dropped without it (an early return, a panic unwinding through the
/// scope), from `Drop` (which cannot report it). Nothing to put back
/// (`None`): nothing runs.
///
/// Generic so that the logic can be tested without a driver.
struct Restore<T, F: FnMut(T) -> Result<(), CudaError>> {
    pending: Option<T>,
    put: F,
}

impl<T, F: FnMut(T) -> Result<(), CudaError>> Restore<T, F> {
    fn new(pending: Option<T>, put: F) -> Self {
        Restore { pending, put }
    }

    /// Puts the value back now, reporting a failure.
    fn finish(mut self) -> Result<(), CudaError> {
        match self.pending.take() {
            Some(v) => (self.put)(v),
            None => Ok(()),
        }
    }
}

impl<T, F: FnMut(T) -> Result<(), CudaError>> Drop for Restore<T, F> {
    fn drop(&mut self) {
        if let Some(v) = self.pending.take() {
            // Unwinding or an early exit: nobody to report a failure to (the
            // next driver call on this thread meets the same broken state).
            let _ = (self.put)(v);
        }
    }
}

/// Runs `op` inside `scope`, then ends the scope: `op`'s error first, else
/// the restore's. A panic in `op` unwinds through `scope`, whose drop
/// restores.
fn scoped<T, C, F: FnMut(C) -> Result<(), CudaError>>(
    scope: Restore<C, F>,
    op: impl FnOnce() -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    let out = op();
    let restored = scope.finish();
    let out = out?;
    restored?;
    Ok(out)
}

/// Makes `prev` current again on the calling thread.
///
/// Only ever called by a [`Restore`] guard with the context that was current
/// on this thread when the guard was made (`ContextScope::enter`,
/// `Device::retain_primary`): the caller keeps its own context alive across
/// a backend call, and primary contexts are never released.
fn set_current_back(prev: sys::CUcontext) -> Result<(), CudaError> {
    // SAFETY: `prev` was current on this thread before the guarded scope and
    // is still alive (see above); setting it current again is what the thread
    // had.
    unsafe { result::ctx::set_current(prev) }?;
    Ok(())
}

/// A context made current for one call (rule 2): the guard that puts the
/// previous one back ([`Restore::finish`] on the normal path, its drop on a
/// panic).
type ContextScope = Restore<sys::CUcontext, fn(sys::CUcontext) -> Result<(), CudaError>>;

impl ContextScope {
    /// Makes `ctx` current, remembering what to restore: nothing when it
    /// already was current, or when the thread had no context before (rule
    /// 1 keeps the new one).
    fn enter(ctx: sys::CUcontext) -> Result<Self, CudaError> {
        let current = result::ctx::get_current()?;
        if current == Some(ctx) {
            return Ok(Self::new(None, set_current_back));
        }
        // SAFETY: `ctx` is a retained primary context, never released.
        unsafe { result::ctx::set_current(ctx) }?;
        Ok(Self::new(current, set_current_back))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    fn invalid() -> CudaError {
        CudaError::Driver(DriverError(sys::CUresult::CUDA_ERROR_INVALID_CONTEXT))
    }

    #[test]
    fn raw_handles_are_the_driver_values() {
        for s in [
            StreamHandle::NULL,
            StreamHandle::LEGACY,
            StreamHandle::PER_THREAD,
        ] {
            assert_eq!(raw_stream(s) as usize, s.as_raw());
        }
        assert!(raw_stream(StreamHandle::NULL).is_null());
    }

    #[test]
    fn loading_is_answered_once_and_remembered() {
        let present = library::present();
        assert_eq!(library::is_loaded(), present);
        assert_eq!(library::present(), present);
    }

    #[test]
    fn a_panic_in_the_scope_still_restores() {
        let restored = RefCell::new(Vec::new());
        let put = |v: u32| {
            restored.borrow_mut().push(v);
            Ok(())
        };
        let caught = catch_unwind(AssertUnwindSafe(|| {
            scoped(Restore::new(Some(7), put), || -> Result<(), CudaError> {
                panic!("the call panics")
            })
        }));
        assert!(caught.is_err());
        assert_eq!(*restored.borrow(), [7], "restored once, by the drop");
    }

    #[test]
    fn the_normal_path_restores_once_and_reports() {
        let calls = RefCell::new(0);
        let put = |_: u32| {
            *calls.borrow_mut() += 1;
            Err(invalid())
        };
        assert_eq!(scoped(Restore::new(Some(1), put), || Ok(5)), Err(invalid()));
        assert_eq!(*calls.borrow(), 1, "finish, not the drop again");
        // The call's own error comes first.
        let other = CudaError::Driver(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
        let r: Result<(), _> = scoped(Restore::new(Some(1), put), || Err(other));
        assert_eq!(r, Err(other));
        assert_eq!(*calls.borrow(), 2);
        // Nothing to restore: nothing called.
        assert_eq!(scoped(Restore::new(None, put), || Ok(3)), Ok(3));
        assert_eq!(*calls.borrow(), 2);
    }

    #[test]
    fn an_early_drop_restores() {
        let restored = RefCell::new(Vec::new());
        let guard = Restore::new(Some(2), |v: u32| {
            restored.borrow_mut().push(v);
            Ok(())
        });
        drop(guard);
        assert_eq!(*restored.borrow(), [2]);
    }
}
