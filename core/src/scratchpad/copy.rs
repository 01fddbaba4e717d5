//! The typed views of a [`Scratchpad`] (host-visible slices, [`DeviceSlice`]s),
//! its copy helpers, and [`KernelContext`].

use alloc::vec::Vec;
use core::marker::PhantomData;
use core::mem::{size_of, MaybeUninit};
use core::ops::Range;
use core::ptr::NonNull;

use crate::backend::{MemoryKind, StreamHandle};
use crate::error::{BackendOp, Error};
use crate::order::AccessOrder;

use super::{DeviceSlice, FirstError, ScratchBackend, Scratchpad};

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
        Ok(DeviceSlice {
            ptr,
            len: count,
            device: self.device_id()?,
            _memory: PhantomData,
        })
    }

    /// Shorthand for [`device_slice`](Self::device_slice).
    pub fn device<T>(&self, count: usize) -> Result<DeviceSlice<'_, T>, Error<B::Error>> {
        self.device_slice(count)
    }

    /// A copy of `src` in host-visible `kind` memory (DALI's `ToHost`,
    /// `ToPinned`, `ToManaged`).
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn copy_of<T: Copy>(
        &self,
        kind: MemoryKind,
        src: &[T],
    ) -> Result<&mut [T], Error<B::Error>> {
        let dst = self.uninit::<T>(kind, src.len())?;
        for (d, s) in dst.iter_mut().zip(src) {
            d.write(*s);
        }
        // SAFETY: every element was just initialised.
        Ok(unsafe { &mut *(dst as *mut [MaybeUninit<T>] as *mut [T]) })
    }

    /// `src` packed one after another into one block of host-visible `kind`
    /// memory, and the range each part occupies.
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn to_contiguous_host<T: Copy>(
        &self,
        kind: MemoryKind,
        parts: &[&[T]],
    ) -> Result<Packed<'_, T>, Error<B::Error>> {
        let (total, ranges) = pack_ranges(parts)?;
        let dst = self.uninit::<T>(kind, total)?;
        for (part, r) in parts.iter().zip(&ranges) {
            for (d, s) in dst[r.clone()].iter_mut().zip(part.iter()) {
                d.write(*s);
            }
        }
        // SAFETY: the ranges cover `0..total` exactly, so every element was
        // just initialised.
        Ok((
            unsafe { &mut *(dst as *mut [MaybeUninit<T>] as *mut [T]) },
            ranges,
        ))
    }

    /// A device copy of `src` (DALI's `ToGPU`), copied in the device order.
    /// `src` may be changed or dropped as soon as this returns, whatever
    /// memory it is in: it is staged through a pinned block first (see
    /// [`to_contiguous_device`](Self::to_contiguous_device)).
    pub fn to_device<T: Copy>(&self, src: &[T]) -> Result<DeviceSlice<'_, T>, Error<B::Error>> {
        self.to_contiguous_device(&[src]).map(|(dst, _)| dst)
    }

    /// `parts` packed into one block of device memory with a single copy in
    /// the device order (DALI's `ToContiguousGPU`).
    ///
    /// The parts are first packed by the host into a pinned staging block of
    /// their own, so they may be changed or dropped as soon as this returns
    /// (a pinned or managed source would otherwise be read when the copy runs,
    /// not when it is issued). The staging block is freed in the device order,
    /// after the copy. The copy runs in the device order, the order the
    /// device block is released in, so a reset or drop never frees or reuses
    /// the block before the copy is done. With host order as the device
    /// order, the copy runs on the device's null stream and is waited for
    /// before this returns.
    pub fn to_contiguous_device<T: Copy>(
        &self,
        parts: &[&[T]],
    ) -> Result<PackedDevice<'_, T>, Error<B::Error>> {
        let (total, ranges) = pack_ranges(parts)?;
        let dst = self.device_slice::<T>(total)?;
        let bytes = dst.byte_len();
        if bytes == 0 {
            return Ok((dst, ranges));
        }
        let device = dst.device;
        // The device order's stream (usable for the backend on `device`: the
        // order borrows it for the scratchpad's life, and its owner and device
        // were checked at construction), or the null stream, waited for.
        let (stream, wait_here) = match self.device_order.stream_handle() {
            Some(s) => (s, false),
            None => (StreamHandle::NULL, true),
        };
        let align = core::mem::align_of::<T>().max(256);
        let staging = self
            .backend
            .allocate(MemoryKind::Pinned, device, bytes, align)
            .map_err(Error::backend(BackendOp::Allocate))?;
        let base = staging.as_ptr().cast::<T>();
        for (part, r) in parts.iter().zip(&ranges) {
            // SAFETY: the staging block holds `total` `T`s, aligned; `r` lies in
            // `0..total`; `part` has `r.len()` elements and is a different object.
            unsafe { core::ptr::copy_nonoverlapping(part.as_ptr(), base.add(r.start), r.len()) };
        }
        // SAFETY: `stream` is usable on `device` (above); `dst` is `bytes` of
        // this scratchpad's device memory, released only in the device order
        // (after the copy) or, in host order, after the wait below; the
        // staging block is `bytes` of pinned memory nobody else knows of,
        // freed only after the copy (below). They do not overlap.
        let copied = unsafe {
            self.backend
                .copy_async(dst.ptr.cast(), staging, bytes, stream, device)
        };
        let waited = match (&copied, wait_here) {
            // SAFETY: the null stream is a usable stream of every device.
            (Ok(()), true) => unsafe { self.backend.synchronize_stream(stream, device) }
                .map_err(Error::backend(BackendOp::SynchronizeStream)),
            _ => Ok(()),
        };
        let freed = if copied.is_ok() && !wait_here {
            // SAFETY: the staging block came from `allocate` with these
            // arguments; the copy that reads it is ordered before this free on
            // `stream` (usable, see above), and nothing else uses it.
            unsafe {
                self.backend
                    .deallocate_async(MemoryKind::Pinned, device, staging, bytes, align, stream)
                    .map_err(Error::backend(BackendOp::DeallocateAsync))
            }
        } else if waited.is_ok() {
            // SAFETY: as above; no copy was issued, or it was waited for.
            unsafe {
                self.backend
                    .deallocate(MemoryKind::Pinned, device, staging, bytes, align)
                    .map_err(Error::backend(BackendOp::Deallocate))
            }
        } else {
            // The copy may still be reading the staging block and the wait
            // failed: freeing it could hand it out under the copy. Leaking
            // it is the safe choice; the error says why.
            Ok(())
        };
        // Several may fail: the copy's error is returned, the others reported.
        let mut errors = FirstError::new();
        if let Err(e) = copied {
            errors.push(Error::backend(BackendOp::CopyAsync)(e));
        }
        if let Err(e) = waited {
            errors.push(e);
        }
        if let Err(e) = freed {
            errors.push(e);
        }
        errors.result()?;
        Ok((dst, ranges))
    }
}

/// Packed parts: the block, and the range of each part in it.
pub type Packed<'a, T> = (&'a mut [T], Vec<Range<usize>>);

/// Parts packed in device memory: the slice, and the range of each part in it.
pub type PackedDevice<'a, T> = (DeviceSlice<'a, T>, Vec<Range<usize>>);

/// The total length of `parts` and the range each occupies when packed.
fn pack_ranges<T, E>(parts: &[&[T]]) -> Result<(usize, Vec<Range<usize>>), Error<E>> {
    let mut total = 0usize;
    let mut ranges = Vec::with_capacity(parts.len());
    for p in parts {
        let end = total.checked_add(p.len()).ok_or(Error::SizeOverflow)?;
        ranges.push(total..end);
        total = end;
    }
    Ok((total, ranges))
}

/// What a kernel needs to run: the order it runs in and, optionally, a
/// scratchpad for its temporary memory (DALI's `KernelContext`).
pub struct KernelContext<'s, 'b, B: ScratchBackend> {
    /// The stream (or host) order the kernel runs in.
    pub order: AccessOrder<'s>,
    /// Scratch memory for the kernel, borrowed.
    pub scratchpad: Option<&'s Scratchpad<'b, B>>,
}

impl<'s, 'b, B: ScratchBackend> KernelContext<'s, 'b, B> {
    /// A context running in `order` with no scratchpad.
    pub fn new(order: AccessOrder<'s>) -> Self {
        KernelContext {
            order,
            scratchpad: None,
        }
    }

    /// A context running in `order` with `scratchpad`.
    pub fn with_scratchpad(order: AccessOrder<'s>, scratchpad: &'s Scratchpad<'b, B>) -> Self {
        KernelContext {
            order,
            scratchpad: Some(scratchpad),
        }
    }
}
