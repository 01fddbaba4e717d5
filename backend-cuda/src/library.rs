//! Whether the CUDA driver library (`libcuda`) can be loaded on this machine:
//! asked once, by the first call that needs the driver ([`crate::driver`]),
//! and remembered for the life of the process.
//!
//! The lowest module of the crate: an error is described by the driver
//! (`cuGetErrorString`) only once this has said yes, because cudarc panics on
//! a driver call when it cannot find the library.

use std::sync::OnceLock;

use cudarc::driver::sys;

/// The answer, once asked.
static PRESENT: OnceLock<bool> = OnceLock::new();

/// Whether `libcuda` can be loaded, asking the first time (cudarc's
/// `is_culib_present`).
pub(crate) fn present() -> bool {
    *PRESENT.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to open the library under its
        // usual names and closes it again; opening `libcuda` runs the
        // driver's own initialisers, which every use of the driver does
        // anyway.
        unsafe { sys::is_culib_present() }
    })
}

/// Whether `libcuda` has been found (so that asking it to describe an error
/// cannot panic): true once [`present`] has said yes, even if `cuInit` then
/// failed. Never asks the library itself.
pub(crate) fn is_loaded() -> bool {
    PRESENT.get() == Some(&true)
}
