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
//! dropped, as the runtime keeps its contexts until exit. A device's primary
//! context is retained when gpupool first works on that device, or when it is
//! the context current on a thread that makes a rule-2 call (below, "Which
//! previous context is put back"); never for a device whose primary context
//! is not active already (retaining it would initialise it on that GPU).
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
//!    (`cuCtxSetCurrent`, skipped when it already is) and puts the previous
//!    one back afterwards, like DALI's `DeviceGuard`, where gpupool can vouch
//!    that it is still alive then (below); a thread that had no context, or
//!    one gpupool cannot vouch for, keeps the device's primary one, as in
//!    rule 1. The restore is a scope guard's (`Restore`): it happens even
//!    when the call panics, so a panic never leaves the caller's thread on
//!    another context.
//!
//! ## Which previous context is put back
//!
//! Putting a context back hands its handle to the driver, so it must still be
//! alive then, and safe code can destroy one meanwhile: dropping the last
//! `Arc<CudaContext>` of cudarc's safe API releases a primary context
//! ([`CudaContext::new`]) or destroys a non-primary one (`new_non_primary`,
//! `new_cig`), and a `with_cudarc_stream` closure runs between the save and
//! the restore (another thread can do it at any time). A primary context
//! released to zero even stays current on the releasing thread (the driver
//! does not pop it). The driver has no call that tells whether a handle is
//! still alive, so the rule is to put back only a context that gpupool itself
//! keeps alive:
//!
//! - the previous context's device is asked with `cuCtxGetDevice` while that
//!   context is still current: the call reads the thread's own current
//!   context, so no handle is passed (nothing is pushed), and a context
//!   destroyed while current is reported as `CUDA_ERROR_CONTEXT_IS_DESTROYED`
//!   (nothing to put back then);
//! - if the handle is that device's primary context, which the table retains
//!   (retaining it now if the primary context is active, that is retained by
//!   someone), the table's retain keeps it alive until the process exits: it
//!   is put back;
//! - any other context is not put back: a non-primary context
//!   (`cuCtxCreate`, cudarc's `new_non_primary` or `new_cig`, a green
//!   context's) cannot be retained by anyone but its creator. The device's
//!   primary context stays current instead. cudarc's safe API binds its own
//!   context before every call and does not notice; code that calls the driver
//!   or the runtime directly on a non-primary context makes it current again
//!   after such a gpupool call.
//!
//! The device of the current context ([`Driver::current_device`]) is read
//! the same way: a retained primary context is recognised by its handle, any
//! other is asked with `cuCtxGetDevice` (never pushed: it may be dead).

use std::sync::{Arc, OnceLock};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::safe::CudaContext;
use cudarc::driver::sys;
use gpupool_core::{DeviceId, StreamHandle};

use crate::error::CudaError;
use crate::library;
use crate::raw;
pub(crate) use crate::raw::{raw_event, raw_stream};

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
    /// Set once: by the first call that needs the context, or that finds it
    /// current on the calling thread (`Driver::pin_current`); never unset.
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

    /// The device of a driver device handle.
    fn device_of_handle(&self, cu_device: sys::CUdevice) -> Option<&Device> {
        self.devices.iter().find(|d| d.cu_device == cu_device)
    }

    /// The device whose retained primary context is `ctx`, recognised by its
    /// handle (no driver call); `None` for any other context. The table's
    /// retain keeps a recognised context alive, so the answer cannot be a
    /// dead context's.
    pub(crate) fn device_of_primary(&self, ctx: sys::CUcontext) -> Option<DeviceId> {
        self.devices
            .iter()
            .find(|d| d.primary.get().is_some_and(|p| p.cu_ctx() == ctx))
            .map(Device::id)
    }

    /// The device of the calling thread's current context; device 0 when no
    /// context is current (as the runtime API's `cudaGetDevice` says). A
    /// retained primary context is recognised by its handle; any other is
    /// asked with `cuCtxGetDevice`, which reads the current context without
    /// being handed it, so one that the application destroyed while it was
    /// current is reported (`CUDA_ERROR_CONTEXT_IS_DESTROYED`), not used.
    pub(crate) fn current_device(&self) -> Result<DeviceId, CudaError> {
        let Some(ctx) = result::ctx::get_current()? else {
            return Ok(DeviceId(0));
        };
        if let Some(d) = self.device_of_primary(ctx) {
            return Ok(d);
        }
        let cu_device = raw::ctx_get_device()?;
        self.device_of_handle(cu_device)
            .map(Device::id)
            .ok_or(CudaError::Driver(DriverError(
                sys::CUresult::CUDA_ERROR_INVALID_DEVICE,
            )))
    }

    /// `device`'s primary context, retained on first use. The first use runs
    /// in a rule-2 scope ([`with_context`](Self::with_context)): cudarc's
    /// retain makes the context current, and the scope puts the thread's
    /// previous context back where it can.
    pub(crate) fn primary(&self, device: DeviceId) -> Result<&Primary, CudaError> {
        if let Some(p) = self.device(device)?.primary.get() {
            return Ok(p);
        }
        self.with_context(device, Ok)
    }

    /// Rule 1 of the [module documentation](self): if no context is current,
    /// makes `device`'s primary context current and leaves it there.
    #[inline]
    pub(crate) fn ensure_context(&self, device: DeviceId) -> Result<(), CudaError> {
        if result::ctx::get_current()?.is_none() {
            // No context to put back: retaining (which makes the context
            // current) needs no scope.
            let ctx = self.device(device)?.retained()?.cu_ctx();
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
    /// primary context current, then puts the previous one back if gpupool
    /// keeps it alive, also when `op` panics (the scope guard's drop does it
    /// then).
    #[inline]
    pub(crate) fn with_context<'d, T>(
        &'d self,
        device: DeviceId,
        op: impl FnOnce(&'d Primary) -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        // The common case, inline: the primary context is current already,
        // so there is nothing to put back (and no guard to keep).
        if let Some(p) = self.device(device)?.primary.get() {
            if result::ctx::get_current()? == Some(p.cu_ctx()) {
                return op(p);
            }
        }
        let (scope, primary) = self.enter(device)?;
        scoped(scope, || op(primary))
    }

    /// [`with_context`](Self::with_context) around code of the crate's
    /// caller (the closures of [`crate::interop`]), which may change the
    /// current context or destroy contexts: afterwards (also after a panic)
    /// the thread's context is the previous one where rule 2 puts it back
    /// (a primary context, kept alive by the table), and `device`'s primary
    /// context otherwise, whatever the code left current.
    pub(crate) fn with_context_around_user_code<'d, T>(
        &'d self,
        device: DeviceId,
        op: impl FnOnce(&'d Primary) -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        let (scope, primary) = self.enter(device)?;
        scoped(scope.or_put(primary.cu_ctx()), || op(primary))
    }

    /// Makes `device`'s primary context current (retaining it on first use)
    /// and returns the guard that puts the previous context back: nothing
    /// when the primary context already was current or no context was, or
    /// when the previous one is not a context that gpupool keeps alive
    /// ([`pin_current`](Self::pin_current)).
    #[cold]
    fn enter(&self, device: DeviceId) -> Result<(ContextScope, &Primary), CudaError> {
        let dev = self.device(device)?;
        let current = result::ctx::get_current()?;
        if let Some(p) = dev.primary.get() {
            if current == Some(p.cu_ctx()) {
                return Ok((ContextScope::new(None, set_current_back), p));
            }
        }
        let keep = match current {
            None => None,
            Some(prev) => self.pin_current(prev)?,
        };
        // From here on the guard puts `keep` back, also if what follows
        // fails (the retain below may have made another context current).
        let scope = ContextScope::new(keep, set_current_back);
        let primary = dev.retained()?;
        // Unconditionally: a retain above (this device's, or the previous
        // context's device's in `pin_current`) may have made another primary
        // context current.
        // SAFETY: a retained primary context, never released.
        unsafe { result::ctx::set_current(primary.cu_ctx()) }?;
        Ok((scope, primary))
    }

    /// `prev`, the calling thread's current context, if gpupool keeps it
    /// alive until the process exits, so that a scope may put it back: that
    /// is when it is its device's primary context and the table retains it.
    /// Its device is asked with `cuCtxGetDevice` (no handle passed); if that
    /// device's primary context is not in the table yet but is active
    /// (someone retains it: retaining it again initialises nothing), it is
    /// retained into the table now, which makes it current (the caller makes
    /// its own context current next). `None` for a context destroyed while
    /// current, a non-primary context, or one of a device whose primary
    /// context is not active (then `prev` is not that primary context, which
    /// would be active while alive). (Were that primary context released to
    /// zero by another thread between the question and the retain, the retain
    /// would initialise it again: the cost of a race the application began,
    /// not a dead handle: the retain's handle is alive, and `prev` is put
    /// back only if it is that handle.)
    fn pin_current(&self, prev: sys::CUcontext) -> Result<Option<sys::CUcontext>, CudaError> {
        pinned(prev, raw::ctx_get_device(), |cu_device| {
            let Some(dev) = self.device_of_handle(cu_device) else {
                return Ok(None);
            };
            if let Some(p) = dev.primary.get() {
                return Ok(Some(p.cu_ctx()));
            }
            if !dev.primary_is_active()? {
                return Ok(None);
            }
            Ok(Some(dev.retained()?.cu_ctx()))
        })
    }
}

/// The decision of [`Driver::pin_current`], apart from the driver so that it
/// can be tested without one: `prev` if `asked` (its device, from
/// `cuCtxGetDevice`) names a device whose retained primary context
/// (`retained_primary`, which may retain it) is `prev`; `None` if the context
/// was destroyed while current, or is not that primary context; the driver's
/// other errors as they are.
fn pinned(
    prev: sys::CUcontext,
    asked: Result<sys::CUdevice, CudaError>,
    retained_primary: impl FnOnce(sys::CUdevice) -> Result<Option<sys::CUcontext>, CudaError>,
) -> Result<Option<sys::CUcontext>, CudaError> {
    let cu_device = match asked {
        Ok(d) => d,
        Err(e) if e.code() == Some(sys::CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED) => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    Ok(retained_primary(cu_device)?.filter(|&p| p == prev))
}

impl Device {
    /// The device's ordinal.
    fn id(&self) -> DeviceId {
        DeviceId(self.ordinal)
    }

    /// The primary context, retained now if it is not yet ([`retain`](Self::retain):
    /// it may become current).
    fn retained(&self) -> Result<&Primary, CudaError> {
        match self.primary.get() {
            Some(p) => Ok(p),
            None => self.retain(),
        }
    }

    /// Retains the primary context into the table. cudarc's retain makes it
    /// current on the calling thread, and it is left current: the callers
    /// make the context they need current next (`Driver::enter`, inside a
    /// scope that puts the thread's previous context back;
    /// `Driver::ensure_context`, on a thread that had none).
    ///
    /// A racing loser's copy is released at once (its drop makes it current
    /// too; the winner's retain keeps it alive). If the priority query fails,
    /// the retain is released again; were it the only one, the context would
    /// be destroyed while current on this thread, which the driver reports
    /// on the next call (`CUDA_ERROR_CONTEXT_IS_DESTROYED`) and gpupool never
    /// puts back ([`Driver::pin_current`]).
    #[cold]
    fn retain(&self) -> Result<&Primary, CudaError> {
        let ctx = CudaContext::new(self.ordinal as usize)?;
        let (least, greatest) = result::stream::get_priority_range()?;
        Ok(self.primary.get_or_init(|| Primary {
            ctx,
            least,
            greatest,
        }))
    }

    /// `cuDevicePrimaryCtxGetState`: whether the device's primary context is
    /// active (retained by someone), so that retaining it initialises
    /// nothing.
    fn primary_is_active(&self) -> Result<bool, CudaError> {
        // SAFETY: a device handle from `cuDeviceGet`.
        let (_flags, active) = unsafe { raw::device_primary_ctx_get_state(self.cu_device) }?;
        Ok(active != 0)
    }
}

impl Primary {
    /// cudarc's handle to the context.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The driver's handle of the context.
    pub(crate) fn cu_ctx(&self) -> sys::CUcontext {
        self.ctx.cu_ctx()
    }

    /// `priority` moved into the device's range (`greatest..=least`).
    pub(crate) fn clamp_priority(&self, priority: i32) -> i32 {
        priority.clamp(self.greatest, self.least)
    }
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

    /// The same guard, putting back `value` if it had nothing to put back.
    fn or_put(mut self, value: T) -> Self {
        self.pending.get_or_insert(value);
        self
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
/// Only ever called by a [`ContextScope`] guard, whose value is a primary
/// context that the process-wide table retains (never released): the
/// thread's previous context as [`Driver::pin_current`] vouched for it, or
/// the device's own ([`Driver::with_context_around_user_code`]).
fn set_current_back(prev: sys::CUcontext) -> Result<(), CudaError> {
    // SAFETY: `prev` is a primary context the table retains and never
    // releases (see above), so it is alive whatever ran meanwhile.
    unsafe { result::ctx::set_current(prev) }?;
    Ok(())
}

/// A context made current for one call (rule 2): the guard that puts the
/// previous one back ([`Restore::finish`] on the normal path, its drop on a
/// panic), made by [`Driver::enter`].
type ContextScope = Restore<sys::CUcontext, fn(sys::CUcontext) -> Result<(), CudaError>>;

#[cfg(test)]
mod tests;
