//! The typed views of a [`Scratchpad`]: uninitialised host-visible slices of
//! each kind, and [`DeviceSlice`]s of device memory.

use core::marker::PhantomData;
use core::mem::{size_of, MaybeUninit};
use core::ptr::NonNull;

use super::{DeviceSlice, ScratchBackend, Scratchpad};
use crate::backend::{DeviceId, MemoryKind};
use crate::error::Error;

impl<'b, B: ScratchBackend> Scratchpad<'b, B> {
    fn alloc_typed<T>(
        &self,
        kind: MemoryKind,
        count: usize,
    ) -> Result<NonNull<T>, Error<B::Error>> {
        let bytes = count
            .checked_mul(size_of::<T>())
            .ok_or(Error::SizeOverflow)?;
        match self.alloc(kind, bytes, core::mem::align_of::<T>())? {
            Some(p) => Ok(p.cast()),
            None => Ok(NonNull::dangling()),
        }
    }

    /// `count` uninitialised `T`s of a host-visible kind (host, pinned, managed).
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn uninit<T>(
        &self,
        kind: MemoryKind,
        count: usize,
    ) -> Result<&mut [MaybeUninit<T>], Error<B::Error>> {
        if !kind.is_host_accessible() {
            return Err(Error::NotHostAccessible);
        }
        let p = self.alloc_typed::<T>(kind, count)?;
        // SAFETY: `p` is aligned for `T` and valid for `count` elements of a
        // host-accessible block (or dangling with `count * size_of::<T>() == 0`).
        // The range was handed out by this call only and lives until `reset` or
        // drop, which need `&mut self` or ownership and so end this borrow first.
        Ok(unsafe { core::slice::from_raw_parts_mut(p.as_ptr().cast::<MaybeUninit<T>>(), count) })
    }

    /// `count` uninitialised `T`s of pageable host memory.
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn host<T>(&self, count: usize) -> Result<&mut [MaybeUninit<T>], Error<B::Error>> {
        self.uninit(MemoryKind::Host, count)
    }

    /// `count` uninitialised `T`s of pinned host memory.
    ///
    /// ```
    /// use gpupool_core::{AccessOrder, Scratchpad};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let scratch = Scratchpad::new(&gpu, AccessOrder::host())?;
    /// let staging = scratch.pinned::<u32>(4)?;
    /// for (i, x) in staging.iter_mut().enumerate() {
    ///     x.write(i as u32);
    /// }
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn pinned<T>(&self, count: usize) -> Result<&mut [MaybeUninit<T>], Error<B::Error>> {
        self.uninit(MemoryKind::Pinned, count)
    }

    /// `count` uninitialised `T`s of managed memory.
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn managed<T>(&self, count: usize) -> Result<&mut [MaybeUninit<T>], Error<B::Error>> {
        self.uninit(MemoryKind::Managed, count)
    }

    /// `count` `T`s of device memory.
    pub fn device_slice<T>(&self, count: usize) -> Result<DeviceSlice<'_, T>, Error<B::Error>> {
        let ptr = self.alloc_typed::<T>(MemoryKind::Device, count)?;
        Ok(self.device_view(ptr, count, self.device_id()?))
    }

    /// The slice of `len` `T`s at `ptr`, device memory of this scratchpad on
    /// `device` just handed out (or dangling for no bytes).
    pub(super) fn device_view<T>(
        &self,
        ptr: NonNull<T>,
        len: usize,
        device: DeviceId,
    ) -> DeviceSlice<'_, T> {
        // Graph mode (the allocation, just made, saw the capture): the
        // memory may be the graph's own.
        let graph = self.device_order.may_capture() && self.watch.graph().is_some();
        DeviceSlice {
            ptr,
            len,
            device,
            owner: self.id,
            graph_of: if graph { self.identity() } else { None },
            _memory: PhantomData,
        }
    }

    /// This scratchpad's address: no other live scratchpad has it, and a
    /// slice's borrow keeps it in place.
    pub(super) fn identity(&self) -> Option<core::num::NonZeroUsize> {
        core::num::NonZeroUsize::new((self as *const Self).addr())
    }

    /// Shorthand for [`device_slice`](Self::device_slice).
    ///
    /// ```
    /// use gpupool_core::{AccessOrder, Scratchpad};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let scratch = Scratchpad::new(&gpu, AccessOrder::host())?;
    /// let out = scratch.device::<f32>(1024)?; // for a kernel to write
    /// assert_eq!(out.len(), 1024);
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn device<T>(&self, count: usize) -> Result<DeviceSlice<'_, T>, Error<B::Error>> {
        self.device_slice(count)
    }
}
