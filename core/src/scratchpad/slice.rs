//! [`DeviceSlice`], a typed range of scratch device memory, and its impls.

use core::fmt;
use core::marker::PhantomData;
use core::mem::size_of;
use core::ptr::NonNull;

use crate::backend::{BackendId, DeviceId};

/// A typed range of scratch device memory: its address, length, device and
/// backend. It borrows the scratchpad, so it cannot outlive the memory. The
/// host cannot dereference it; pass [`as_ptr`](Self::as_ptr) or
/// [`addr`](Self::addr) to kernels, and read it back with
/// [`Scratchpad::to_host`](crate::Scratchpad::to_host).
///
/// Only a scratchpad makes one (safe code cannot forge one), so its range
/// always lies in a live device block of [`backend_id`](Self::backend_id)'s
/// backend, aligned for `T`.
pub struct DeviceSlice<'a, T> {
    /// Aligned for `T`; valid for `len` `T`s of device memory of `device`
    /// (dangling when the slice is empty).
    pub(super) ptr: NonNull<T>,
    pub(super) len: usize,
    pub(super) device: DeviceId,
    /// The backend the memory belongs to.
    pub(super) owner: BackendId,
    /// Where the memory may be a graph's own allocation (made while the
    /// scratchpad's device order was capturing): the address of the
    /// scratchpad, which the slice's borrow keeps in place and which no
    /// other live scratchpad has. Only that scratchpad knows when a capture
    /// that ended took the memory with it; another refuses to read it.
    pub(super) graph_of: Option<core::num::NonZeroUsize>,
    pub(super) _memory: PhantomData<&'a mut [T]>,
}

// SAFETY: a slice is an address, a length and ids: the host never reads or
// writes through it (only the backend's calls, each thread-safe, reach the
// memory), and its borrow of the scratchpad, not the thread it is on, keeps
// the memory alive. Like `&mut [T]`: `Send` when `T` is.
unsafe impl<T: Send> Send for DeviceSlice<'_, T> {}
// SAFETY: as above; `&DeviceSlice` gives only the address and the ids. Like
// `&mut [T]`: `Sync` when `T` is.
unsafe impl<T: Sync> Sync for DeviceSlice<'_, T> {}

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

    /// The backend the memory belongs to (see [`BackendId`]).
    #[inline]
    pub fn backend_id(&self) -> BackendId {
        self.owner
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
