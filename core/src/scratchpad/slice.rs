//! [`DeviceSlice`], a typed range of scratch device memory, and its impls.

use core::fmt;
use core::marker::PhantomData;
use core::mem::size_of;
use core::ptr::NonNull;

use crate::backend::DeviceId;

/// A typed range of scratch device memory: its address, length and device. It
/// borrows the scratchpad, so it cannot outlive the memory. The host cannot
/// dereference it; pass [`as_ptr`](Self::as_ptr) to kernels and copies.
pub struct DeviceSlice<'a, T> {
    pub(super) ptr: NonNull<T>,
    pub(super) len: usize,
    pub(super) device: DeviceId,
    pub(super) _memory: PhantomData<&'a mut [T]>,
}

impl<T> DeviceSlice<'_, T> {
    /// The device address of the first element (dangling, well aligned, for an
    /// empty slice).
    #[inline]
    pub fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// The device address as an integer (a `CUdeviceptr` on CUDA).
    #[inline]
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr().addr()
    }

    /// Number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no element.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    #[inline]
    pub fn byte_len(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device the memory belongs to.
    #[inline]
    pub fn device(&self) -> DeviceId {
        self.device
    }
}

impl<T> fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSlice")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}
