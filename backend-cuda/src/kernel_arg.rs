//! Scratch device memory as a cudarc kernel argument: [`KernelPtr`], and
//! [`DeviceSliceExt::kernel_arg`], which makes one from a scratchpad's
//! [`DeviceSlice`].
//!
//! A [`DeviceSlice`] (gpupool-core) and cudarc's `PushKernelArg` are both
//! foreign to this crate, so the bridge is a type of this crate: a device
//! address that implements cudarc's [`DeviceRepr`] and so goes to
//! `LaunchArgs::arg` like any other plain parameter, still borrowing the
//! scratch memory it points into.

use core::fmt;
use core::marker::PhantomData;

use cudarc::driver::{sys, DeviceRepr};
use gpupool_core::DeviceSlice;

/// The device address of a [`DeviceSlice`] as a kernel parameter (a `T *` on
/// the kernel's side; `.param .u64` in PTX), borrowing the slice, so it cannot
/// outlive the scratch memory.
///
/// Pass it to cudarc's launch builder by reference, like any other
/// parameter: `builder.arg(&slice.kernel_arg())` (see
/// [`DeviceSliceExt::kernel_arg`]).
///
/// **The kernel must use the memory in the scratchpad's device order**: on
/// the stream the scratchpad was made with
/// ([`Scratchpad::device_order`](gpupool_core::Scratchpad::device_order)),
/// or on a stream made to wait for that point of it (and before the
/// scratchpad's reset or drop, which hand the memory back in that order).
/// The borrow keeps the host from resetting the scratchpad while the value
/// lives; the order on the GPU is the launch's business, which is `unsafe`
/// in cudarc for that reason among others (the kernel's parameter types are
/// not checked either).
///
/// The scratchpad cannot be reset (or dropped) while one lives:
///
/// ```compile_fail,E0502
/// use gpupool_core::{AccessOrder, Error, Scratchpad};
/// use gpupool_cuda::{CudaBackend, CudaError, DeviceSliceExt};
///
/// fn stale(gpu: &CudaBackend, order: AccessOrder<'_>) -> Result<(), Error<CudaError>> {
///     let mut scratch = Scratchpad::new(gpu, order)?;
///     let y = scratch.device::<f32>(256)?;
///     let arg = y.kernel_arg();
///     scratch.reset()?; // the memory goes back: `arg` must not be usable
///     println!("{arg:?}");
///     Ok(())
/// }
/// ```
#[repr(transparent)]
pub struct KernelPtr<'a, T> {
    /// A device address inside the borrowed slice (its first element).
    addr: sys::CUdeviceptr,
    _memory: PhantomData<&'a [T]>,
}

// SAFETY: cudarc's `PushKernelArg<&U> for LaunchArgs` (U: DeviceRepr) pushes
// a pointer to the value itself into the kernel parameter array, and the
// driver copies `sizeof(parameter)` bytes from there when the kernel is
// launched. `KernelPtr` is `#[repr(transparent)]` over `CUdeviceptr` (a
// `u64`; the marker is zero-sized), so those bytes are exactly a 64-bit
// device address, what a pointer parameter (`T *`, `.u64`) of a kernel on a
// 64-bit platform expects. cudarc's other uses of `DeviceRepr` (copies of
// `U` between host and device) copy bytes: every bit pattern is a valid
// `u64`, so no invalid value can arise, and safe code never dereferences the
// address (only a kernel does, and launching one is `unsafe`).
unsafe impl<T> DeviceRepr for KernelPtr<'_, T> {}

impl<T> KernelPtr<'_, T> {
    /// The device address (a `CUdeviceptr`).
    #[inline]
    pub fn addr(&self) -> sys::CUdeviceptr {
        self.addr
    }
}

// Not derived: a derive would ask `T: Clone` / `T: Copy`.
impl<T> Clone for KernelPtr<'_, T> {
    #[inline]
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for KernelPtr<'_, T> {}

impl<T> fmt::Debug for KernelPtr<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KernelPtr")
            .field(&format_args!("{:#x}", self.addr))
            .finish()
    }
}

mod sealed {
    /// Only this crate implements [`DeviceSliceExt`](super::DeviceSliceExt).
    pub trait Sealed {}
    impl<T> Sealed for gpupool_core::DeviceSlice<'_, T> {}
}

/// CUDA conveniences for gpupool-core's [`DeviceSlice`]: bring it into scope
/// (`use gpupool_cuda::DeviceSliceExt;`) and pass scratch memory to a cudarc
/// kernel launch as `&slice.kernel_arg()`.
///
/// Sealed: implemented for [`DeviceSlice`] only.
///
/// ```no_run
/// use gpupool_core::Scratchpad;
/// use gpupool_cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
/// use gpupool_cuda::cudarc::nvrtc::Ptx;
/// use gpupool_cuda::{with_cudarc_stream, CudaBackend, DeviceSliceExt};
///
/// # const PTX: &str = "";
/// let gpu = CudaBackend::new();
/// let lease = gpupool_cuda::streams().get(0)?;
/// let scratch = Scratchpad::new(&gpu, lease.order())?;
/// let x = scratch.to_device(&[1.0f32, 2.0, 3.0])?; // in the lease's order
/// let y = scratch.device::<f32>(3)?;
/// let module = gpu.context(lease.device())?.load_module(Ptx::from_src(PTX))?;
/// let affine = module.load_function("affine")?;
/// let n = 3u32;
/// with_cudarc_stream(&lease, |stream| {
///     // SAFETY: `affine(float *y, const float *x, unsigned n)`; `y` and `x`
///     // hold `n` floats each, scratch memory of this stream's order; no
///     // argument carries cudarc events.
///     unsafe {
///         stream
///             .launch_builder(&affine)
///             .arg(&y.kernel_arg())
///             .arg(&x.kernel_arg())
///             .arg(&n)
///             .launch(LaunchConfig::for_num_elems(n))
///     }
/// })??;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait DeviceSliceExt<T>: sealed::Sealed {
    /// The slice's device address as a cudarc kernel argument, borrowing the
    /// slice (see [`KernelPtr`] for the order the kernel must respect). An
    /// empty slice gives a dangling, aligned address.
    fn kernel_arg(&self) -> KernelPtr<'_, T>;
}

impl<T> DeviceSliceExt<T> for DeviceSlice<'_, T> {
    #[inline]
    fn kernel_arg(&self) -> KernelPtr<'_, T> {
        KernelPtr {
            addr: self.addr() as sys::CUdeviceptr,
            _memory: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn a_kernel_ptr_is_a_bare_64_bit_address() {
        assert_eq!(size_of::<KernelPtr<'_, f32>>(), size_of::<u64>());
        assert_eq!(align_of::<KernelPtr<'_, f32>>(), align_of::<u64>());
        let p = KernelPtr::<'_, u8> {
            addr: 0x7f00_0000_1000,
            _memory: PhantomData,
        };
        let q = p; // Copy, whatever `T` is
        assert_eq!(q.addr(), 0x7f00_0000_1000);
        assert_eq!(format!("{p:?}"), "KernelPtr(0x7f0000001000)");
        // The bytes a launch copies are the address itself.
        // SAFETY: `KernelPtr` is `repr(transparent)` over a `u64`.
        let raw: u64 = unsafe { core::mem::transmute(p) };
        assert_eq!(raw, 0x7f00_0000_1000);
    }
}
