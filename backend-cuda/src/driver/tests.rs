//! The driver layer's unit tests (no GPU needed unless marked).

use super::*;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The error of a driver call that returned `code`.
fn driver_error(code: sys::CUresult) -> CudaError {
    CudaError::Driver(DriverError(code))
}

fn invalid() -> CudaError {
    driver_error(sys::CUresult::CUDA_ERROR_INVALID_CONTEXT)
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

/// A `put` for [`Restore`] that records what it puts back in `restored`.
fn recording_put(
    restored: &RefCell<Vec<u32>>,
) -> impl Fn(u32) -> Result<(), CudaError> + Copy + '_ {
    move |v| {
        restored.borrow_mut().push(v);
        Ok(())
    }
}

#[test]
fn a_panic_in_the_scope_still_restores() {
    let restored = RefCell::new(Vec::new());
    let put = recording_put(&restored);
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
    let other = driver_error(sys::CUresult::CUDA_ERROR_INVALID_VALUE);
    let r: Result<(), _> = scoped(Restore::new(Some(1), put), || Err(other));
    assert_eq!(r, Err(other));
    assert_eq!(*calls.borrow(), 2);
    // Nothing to restore: nothing called.
    assert_eq!(scoped(Restore::new(None, put), || Ok(3)), Ok(3));
    assert_eq!(*calls.borrow(), 2);
}

#[test]
fn or_put_fills_only_an_empty_guard() {
    let restored = RefCell::new(Vec::new());
    let put = recording_put(&restored);
    // Nothing to put back (the thread had no context, or the device's
    // own was current): the fallback is put back.
    assert_eq!(scoped(Restore::new(None, put).or_put(9), || Ok(())), Ok(()));
    // Something to put back: it wins.
    assert_eq!(
        scoped(Restore::new(Some(4), put).or_put(9), || Ok(())),
        Ok(())
    );
    // Also when the scope panics.
    let caught = catch_unwind(AssertUnwindSafe(|| {
        scoped(
            Restore::new(None, put).or_put(8),
            || -> Result<(), CudaError> { panic!("the caller's code panics") },
        )
    }));
    assert!(caught.is_err());
    assert_eq!(*restored.borrow(), [9, 4, 8]);
}

/// A made-up context handle: `pinned` only compares them.
fn ctx(n: usize) -> sys::CUcontext {
    n as sys::CUcontext
}

/// `pinned` of context 0x100 for the device `asked`, whose table lookup (and
/// retain) panics with `why`: it must not be reached.
fn pinned_without_a_lookup(
    asked: Result<sys::CUdevice, CudaError>,
    why: &str,
) -> Result<Option<sys::CUcontext>, CudaError> {
    pinned(ctx(0x100), asked, |_| -> Result<_, CudaError> {
        panic!("{why}")
    })
}

#[test]
fn only_a_retained_primary_context_is_pinned() {
    let prev = ctx(0x100);
    let dev: sys::CUdevice = 3;
    // The table's primary context of the asked device is `prev`.
    let asked = |d: sys::CUdevice| {
        assert_eq!(d, dev, "the device cuCtxGetDevice named");
        Ok(Some(prev))
    };
    assert_eq!(pinned(prev, Ok(dev), asked), Ok(Some(prev)));
    // Another context of that device (a non-primary one).
    assert_eq!(pinned(prev, Ok(dev), |_| Ok(Some(ctx(0x200)))), Ok(None));
    // A device gpupool does not know, or whose primary context is not
    // active (so not `prev`): nothing retained, nothing pinned.
    assert_eq!(pinned(prev, Ok(dev), |_| Ok(None)), Ok(None));
}

#[test]
fn a_context_destroyed_while_current_is_not_pinned_and_not_looked_up() {
    let destroyed = driver_error(sys::CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
    let r = pinned_without_a_lookup(
        Err(destroyed),
        "no table lookup (nor retain) for a destroyed context",
    );
    assert_eq!(r, Ok(None));
}

#[test]
fn other_failures_are_reported_before_anything_is_retained() {
    let deinit = driver_error(sys::CUresult::CUDA_ERROR_DEINITIALIZED);
    let r = pinned_without_a_lookup(Err(deinit), "no table lookup after a failed cuCtxGetDevice");
    assert_eq!(r, Err(deinit));
    // A failed retain is reported too (the scope is not entered).
    let failed = driver_error(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(pinned(ctx(0x100), Ok(0), |_| Err(failed)), Err(failed));
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
