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
//!    context keeps the new one, as in rule 1.

use std::sync::{Arc, OnceLock};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::safe::CudaContext;
use cudarc::driver::sys;
use gpupool_core::DeviceId;

use crate::error::{check, CudaError};

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

/// Whether `libcuda` has been loaded (so that asking it to describe an error
/// cannot panic): true once the first call found it, even if `cuInit` failed.
pub(crate) fn is_loaded() -> bool {
    matches!(DRIVER.get(), Some(Ok(_) | Err(CudaError::Init(_))))
}

fn load() -> Result<Driver, CudaError> {
    // SAFETY: `is_culib_present` only tries to open the library under its
    // usual names and closes it again; opening `libcuda` runs the driver's own
    // initialisers, which every use of the driver does anyway.
    if !unsafe { sys::is_culib_present() } {
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
    pub(crate) fn device_of_context(&self, ctx: sys::CUcontext) -> Result<DeviceId, CudaError> {
        let known = self
            .devices
            .iter()
            .find(|d| d.primary.get().is_some_and(|p| p.ctx.cu_ctx() == ctx));
        if let Some(d) = known {
            return Ok(DeviceId(d.ordinal));
        }
        let mut cu_device: sys::CUdevice = 0;
        // SAFETY: `ctx` was just returned by the driver for a live stream or as
        // the current context; pushing it and popping it right after leaves the
        // thread's context stack as it was.
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
            Some(ctx) => self.device_of_context(ctx),
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

    /// Rule 2 of the [module documentation](self): runs `op` with `device`'s
    /// primary context current, then restores the previous one.
    pub(crate) fn with_context<T>(
        &self,
        device: DeviceId,
        op: impl FnOnce(&Primary) -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        let primary = self.device(device)?.primary()?;
        let scope = ContextScope::enter(primary.ctx.cu_ctx())?;
        let out = op(primary);
        let restored = scope.exit();
        let out = out?;
        restored?;
        Ok(out)
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
        // a copy that lost the race below); put the caller's context back.
        let previous = result::ctx::get_current()?;
        let made = CudaContext::new(self.ordinal as usize).and_then(|ctx| {
            let (least, greatest) = result::stream::get_priority_range()?;
            Ok(Primary {
                ctx,
                least,
                greatest,
            })
        });
        let out = made.map(|p| self.primary.get_or_init(|| p));
        if let Some(prev) = previous {
            // SAFETY: `prev` was current on this thread a moment ago and the
            // caller still holds it.
            unsafe { result::ctx::set_current(prev) }?;
        }
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

/// A context made current for one call (rule 2), to be put back by
/// [`exit`](ContextScope::exit).
struct ContextScope {
    /// The context to restore: `None` when nothing changed, or when the thread
    /// had no context before (rule 1 keeps the new one).
    restore: Option<sys::CUcontext>,
}

impl ContextScope {
    fn enter(ctx: sys::CUcontext) -> Result<Self, CudaError> {
        let current = result::ctx::get_current()?;
        if current == Some(ctx) {
            return Ok(ContextScope { restore: None });
        }
        // SAFETY: `ctx` is a retained primary context, never released.
        unsafe { result::ctx::set_current(ctx) }?;
        Ok(ContextScope { restore: current })
    }

    fn exit(self) -> Result<(), CudaError> {
        if let Some(prev) = self.restore {
            // SAFETY: `prev` was current on this thread before `enter`; the
            // caller keeps its own context alive across a backend call.
            unsafe { result::ctx::set_current(prev) }?;
        }
        Ok(())
    }
}
