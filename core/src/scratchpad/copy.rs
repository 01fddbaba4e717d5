//! A [`Scratchpad`]'s copy helpers (to the device, packed, and back to the
//! host) and [`KernelContext`] (its typed views are in `typed.rs`).
//!
//! Device memory has no "uninitialised" state the host can see: on a GPU its
//! bytes come back through the driver, and the mock's blocks start zeroed.
//! What it holds is whatever was last written, possibly under another type
//! (a reset hands the same bytes out again). So the copies keep two bounds
//! from `bytemuck`: what goes to the device is `NoUninit` (every byte
//! initialised, no padding), and what is read back is `AnyBitPattern` (every
//! bit pattern a valid value).

use alloc::vec::Vec;

use core::mem::{align_of, MaybeUninit};
use core::ops::Range;
use core::ptr::NonNull;

use bytemuck::{AnyBitPattern, NoUninit};

use crate::backend::{DeviceId, MemoryKind, StreamHandle};
use crate::error::{BackendOp, Error};
use crate::monotonic::{release_in_order, Block};
use crate::order::AccessOrder;

use super::{DeviceSlice, FirstError, ScratchBackend, Scratchpad};

impl<'b, B: ScratchBackend> Scratchpad<'b, B> {
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
    ///
    /// Parts of one element type; for parts of several types see
    /// [`to_contiguous_device_bytes`](Self::to_contiguous_device_bytes).
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
    ///
    /// `T: NoUninit` (no padding, no uninitialised bytes): device memory can
    /// be read back as any [`AnyBitPattern`] type ([`to_host`](Self::to_host)),
    /// after a reset under another type too, so every byte written to it
    /// must be initialised.
    ///
    /// ```
    /// use gpupool_core::{AccessOrder, Scratchpad};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let scratch = Scratchpad::new(&gpu, AccessOrder::host())?;
    /// let on_gpu = scratch.to_device(&[1u16, 2, 3])?; // staged in pinned memory, copied in order
    /// assert_eq!(on_gpu.len(), 3);
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn to_device<T: NoUninit>(&self, src: &[T]) -> Result<DeviceSlice<'_, T>, Error<B::Error>> {
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
    ///
    /// Parts of one element type `T` (`NoUninit`: see
    /// [`to_device`](Self::to_device)). Parts of several types (DALI packs
    /// any mix) go in one copy through
    /// [`to_contiguous_device_bytes`](Self::to_contiguous_device_bytes), each
    /// part as bytes (`bytemuck::cast_slice`) and aligned for the most
    /// demanding type; or one call per type, one copy each.
    pub fn to_contiguous_device<T: NoUninit>(
        &self,
        parts: &[&[T]],
    ) -> Result<PackedDevice<'_, T>, Error<B::Error>> {
        let (total, ranges) = pack_ranges(parts)?;
        let dst = self.device_slice::<T>(total)?;
        if dst.byte_len() == 0 {
            return Ok((dst, ranges));
        }
        self.upload(&dst, align_of::<T>(), |staging| {
            let base = staging.as_ptr().cast::<T>();
            for (part, r) in parts.iter().zip(&ranges) {
                // SAFETY: the staging block holds `total` `T`s, aligned for
                // `T`; `r` lies in `0..total`; `part` has `r.len()` elements
                // and is a different object. The ranges cover `0..total`, so
                // every byte is written, with initialised bytes (`NoUninit`).
                unsafe {
                    core::ptr::copy_nonoverlapping(part.as_ptr(), base.add(r.start), r.len())
                };
            }
        })?;
        Ok((dst, ranges))
    }

    /// Byte `parts`, of any types, packed into one block of device memory with
    /// a single copy in the device order, each part starting at a multiple of
    /// `align` (DALI's `ToContiguousGPU` of mixed parts). Returns the block and
    /// the byte range of each part in it; the gaps between parts are zeroed.
    /// Staged and ordered as [`to_contiguous_device`](Self::to_contiguous_device).
    ///
    /// Pass each part as bytes with `bytemuck::cast_slice` (its element type
    /// `NoUninit`: see [`to_device`](Self::to_device)) and `align` at least
    /// the largest alignment among the parts' types; a kernel finds part `i`
    /// at `block.addr() + ranges[i].start`.
    ///
    /// ```
    /// use gpupool_core::{bytemuck, AccessOrder, Scratchpad};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let scratch = Scratchpad::new(&gpu, AccessOrder::host())?;
    /// let (ids, weights): (&[u16], &[f64]) = (&[1, 2, 3], &[0.5, 0.25]);
    /// let (block, ranges) = scratch.to_contiguous_device_bytes(
    ///     &[bytemuck::cast_slice(ids), bytemuck::cast_slice(weights)],
    ///     align_of::<f64>(),
    /// )?;
    /// assert_eq!(ranges, [0..6, 8..24]); // `weights` starts 8-aligned
    /// assert_eq!(block.addr() % 8, 0);
    /// let back = scratch.to_host(&block)?;
    /// // (`back` is a `Vec<u8>`, aligned for bytes only: compare bytes.)
    /// assert_eq!(&back[8..24], bytemuck::cast_slice::<f64, u8>(weights));
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    ///
    /// Errors: [`Error::InvalidAlignment`] for an `align` that is not a
    /// nonzero power of two, [`Error::SizeOverflow`], or a backend failure;
    /// as for `to_contiguous_device`.
    pub fn to_contiguous_device_bytes(
        &self,
        parts: &[&[u8]],
        align: usize,
    ) -> Result<PackedDevice<'_, u8>, Error<B::Error>> {
        if !align.is_power_of_two() {
            return Err(Error::InvalidAlignment { align });
        }
        let mut total = 0usize;
        let mut ranges = Vec::with_capacity(parts.len());
        for p in parts {
            let start = total.checked_add(align - 1).ok_or(Error::SizeOverflow)? & !(align - 1);
            let end = start.checked_add(p.len()).ok_or(Error::SizeOverflow)?;
            ranges.push(start..end);
            total = end;
        }
        let dst = match self.alloc(MemoryKind::Device, total, align)? {
            Some(p) => self.device_view(p, total, self.device_id()?),
            None => self.device_view(NonNull::dangling(), 0, self.device_id()?),
        };
        if total == 0 {
            return Ok((dst, ranges));
        }
        self.upload(&dst, align, |staging| {
            let base = staging.as_ptr();
            let mut at = 0;
            for (part, r) in parts.iter().zip(&ranges) {
                // SAFETY: the staging block holds `total` bytes; `at..r.end`
                // lies in it (the ranges are increasing and end at `total`);
                // `part` has `r.len()` bytes and is a different object.
                unsafe {
                    core::ptr::write_bytes(base.add(at), 0, r.start - at);
                    core::ptr::copy_nonoverlapping(part.as_ptr(), base.add(r.start), r.len());
                }
                at = r.end;
            }
        })?;
        Ok((dst, ranges))
    }

    /// Copies `src` to `dst` on the host, in the device order: the copy runs
    /// after the work issued in the device order so far (the kernels that
    /// wrote `src`, if they ran there), and this returns once it has run.
    ///
    /// The bytes are staged through a pinned block of their own (a copy
    /// straight into `dst` would need `dst` to stay put until the copy runs):
    /// the device order's stream copies `src` there, the host waits for that
    /// stream, then copies the staged bytes into `dst`. With host order as
    /// the device order the copy runs on the device's null stream, waited for
    /// the same way. Work on other streams that writes `src` must be ordered
    /// before the device order first ([`AccessOrder::wait`]).
    ///
    /// `T: AnyBitPattern`: device memory holds whatever bytes were written to
    /// it (a kernel's output, or another type's before a
    /// [`reset`](Self::reset)), so only a type for which every bit pattern is
    /// a valid value can be read back from it.
    ///
    /// Errors, with `dst` untouched: [`Error::LengthMismatch`] when `dst` is
    /// not as long as `src`; [`Error::ForeignHandle`] for a slice of another
    /// backend, [`Error::WrongDevice`] for one of another device than the
    /// scratchpad's; [`Error::StreamCapturing`] when the device order's
    /// stream is capturing a graph (the host cannot wait for a copy that
    /// runs at each replay); [`Error::GraphMemory`] for memory a graph
    /// capture allocated, once that capture has ended (it is the graph's),
    /// or, if `src` is another scratchpad's, at any time; a backend failure
    /// (the copy, the wait, the staging block). An empty slice makes no
    /// backend call.
    pub fn copy_to_host<T: AnyBitPattern>(
        &self,
        src: &DeviceSlice<'_, T>,
        dst: &mut [T],
    ) -> Result<(), Error<B::Error>> {
        if dst.len() != src.len() {
            return Err(Error::LengthMismatch {
                expected: src.len(),
                actual: dst.len(),
            });
        }
        if src.owner != self.id {
            return Err(Error::ForeignHandle);
        }
        if src.byte_len() == 0 {
            return Ok(());
        }
        // Memory of another scratchpad's graph: only that scratchpad knows
        // whether the capture has ended and taken it.
        if src.graph_of.is_some() && src.graph_of != self.identity() {
            return Err(Error::GraphMemory);
        }
        let device = self.device_id()?;
        if src.device != device {
            return Err(Error::WrongDevice {
                given: device,
                actual: src.device,
            });
        }
        // The host waits for the copy: not possible on a capturing stream
        // (the copy would run at each replay, and the driver refuses the
        // wait, breaking the capture).
        // SAFETY: the device order's stream is usable for the backend for the
        // scratchpad's life (checked at construction; the order borrows it).
        if unsafe { self.device_order.capturing(self.backend) }? {
            return Err(Error::StreamCapturing);
        }
        // Nor can it read a graph's own allocation once its capture has
        // ended.
        self.check_not_retired(src.addr(), src.byte_len(), device)?;
        self.download(src, |staged| {
            // SAFETY: `staged` holds the bytes of `src`, aligned for
            // `T` (the staging alignment is at least `align_of::<T>()`), and
            // the copy into it has completed. They are initialised: every
            // writer of device memory writes initialised bytes (`NoUninit`
            // copies, `MemoryBackend::copy_async`'s contract; the driver's
            // output on a GPU; mock blocks start zeroed), and any bytes are a
            // valid `T` (`AnyBitPattern`). `dst` holds `src.len()` `T`s and is
            // host memory of the caller's, not the staging block.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    staged.as_ptr().cast::<T>(),
                    dst.as_mut_ptr(),
                    dst.len(),
                )
            };
        })
    }

    /// `src` read back into a new `Vec` ([`copy_to_host`](Self::copy_to_host)).
    ///
    /// ```
    /// use gpupool_core::{AccessOrder, Scratchpad};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let scratch = Scratchpad::new(&gpu, AccessOrder::host())?;
    /// let on_gpu = scratch.to_device(&[1.5f32, 2.5])?;
    /// assert_eq!(scratch.to_host(&on_gpu)?, [1.5, 2.5]);
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn to_host<T: AnyBitPattern>(
        &self,
        src: &DeviceSlice<'_, T>,
    ) -> Result<Vec<T>, Error<B::Error>> {
        let mut dst = alloc::vec![T::zeroed(); src.len()];
        self.copy_to_host(src, &mut dst)?;
        Ok(dst)
    }

    /// The stream copies run on in the device order, and whether the host
    /// waits for each: the device order's stream (usable for the backend on
    /// the scratchpad's device: the order borrows it for the scratchpad's
    /// life, and its owner and device were checked at construction), or, in
    /// host order, the null stream, waited for.
    fn copy_stream(&self) -> (StreamHandle, bool) {
        match self.device_order.stream_handle() {
            Some(s) => (s, false),
            None => (StreamHandle::NULL, true),
        }
    }

    /// A fresh pinned staging block for a copy of `bytes` bytes on `device`,
    /// aligned to at least `align`.
    fn staging(
        &self,
        bytes: usize,
        align: usize,
        device: DeviceId,
    ) -> Result<Staging, Error<B::Error>> {
        let align = align.max(STAGING_ALIGN);
        let ptr = self
            .backend
            .allocate(MemoryKind::Pinned, device, bytes, align)
            .map_err(Error::backend(BackendOp::Allocate))?;
        Ok(Staging {
            ptr,
            bytes,
            align,
            device,
        })
    }

    /// Frees a staging block: in stream order on `stream`, or (`None`) at
    /// once.
    ///
    /// # Safety
    /// 1. `staging` came from [`staging`](Self::staging) of this scratchpad;
    /// 2. `stream`, if any, is a usable stream of the block's device, and
    ///    every copy that uses the block is ordered before this point of it;
    ///    without a stream, no copy that uses the block is pending;
    /// 3. nothing else uses the block afterwards.
    unsafe fn free_staging(
        &self,
        staging: Staging,
        stream: Option<StreamHandle>,
    ) -> Result<(), Error<B::Error>> {
        let Staging {
            ptr,
            bytes,
            align,
            device,
        } = staging;
        let kind = MemoryKind::Pinned;
        let block = Block {
            ptr,
            size: bytes,
            align,
        };
        // SAFETY: the block came from `allocate` with these arguments (1.);
        // the stream is usable (the device order's, `copy_stream`), and
        // nothing uses the block after this free takes effect (2., 3.).
        unsafe {
            match stream {
                Some(s) => {
                    release_in_order(self.backend, &self.device_order, kind, device, block, s)
                }
                None => self
                    .backend
                    .deallocate(kind, device, ptr, bytes, align)
                    .map_err(Error::backend(BackendOp::Deallocate)),
            }
        }
    }

    /// Copies `dst`'s bytes from the host (`dst` is device memory of this
    /// scratchpad, released only in the device order) in the device order,
    /// through a fresh pinned staging block that `fill` writes first: `fill`
    /// gets the block (`dst.byte_len()` bytes aligned to at least `align`)
    /// and must initialise all of it. The staging block is freed in the
    /// device order, after the copy (or, in host order, after the wait).
    fn upload<T>(
        &self,
        dst: &DeviceSlice<'_, T>,
        align: usize,
        fill: impl FnOnce(NonNull<u8>),
    ) -> Result<(), Error<B::Error>> {
        let (stream, wait_here) = self.copy_stream();
        let (bytes, device) = (dst.byte_len(), dst.device);
        let staging = self.staging(bytes, align, device)?;
        fill(staging.ptr);
        // SAFETY: `stream` is usable on `device` (`copy_stream`); `dst` is
        // `bytes` of this scratchpad's device memory, released only in the
        // device order (after the copy) or, in host order, after the wait
        // below; the staging block is `bytes` of pinned memory nobody else
        // knows of, all initialised by `fill`, freed only after the copy
        // (below). They do not overlap.
        let copied = unsafe {
            self.backend
                .copy_async(dst.ptr.cast(), staging.ptr, bytes, stream, device)
        };
        let waited = match (&copied, wait_here) {
            // SAFETY: the null stream is a usable stream of every device.
            (Ok(()), true) => unsafe { self.backend.synchronize_stream(stream, device) }
                .map_err(Error::backend(BackendOp::SynchronizeStream)),
            _ => Ok(()),
        };
        let freed = if copied.is_ok() && !wait_here {
            // SAFETY: the block came from `staging`; the copy that reads it
            // is ordered before this free on `stream` (usable, see above),
            // and nothing else uses it.
            unsafe { self.free_staging(staging, Some(stream)) }
        } else if waited.is_ok() {
            // SAFETY: the block came from `staging`; no copy was issued, or
            // it was waited for.
            unsafe { self.free_staging(staging, None) }
        } else {
            // The copy may still be reading the staging block and the wait
            // failed: freeing it could hand it out under the copy. Leaking
            // it is the safe choice; the error says why.
            Ok(())
        };
        staged_copy_result(copied, waited, freed)
    }

    /// Copies `src` (device memory of this scratchpad's device, valid while
    /// the caller's borrow lasts) into a fresh pinned staging block in the
    /// device order, waits for the copy's stream, hands the block
    /// (`src.byte_len()` bytes aligned for `T`, the copy complete) to `read`,
    /// and frees it. `read` runs only if the copy and the wait succeeded.
    fn download<T>(
        &self,
        src: &DeviceSlice<'_, T>,
        read: impl FnOnce(NonNull<u8>),
    ) -> Result<(), Error<B::Error>> {
        let (stream, _) = self.copy_stream();
        let (bytes, device) = (src.byte_len(), src.device);
        let staging = self.staging(bytes, align_of::<T>(), device)?;
        // SAFETY: `stream` is usable on `device` (`copy_stream`); `src` is
        // `bytes` of device memory of `device` that the caller's borrow keeps
        // allocated until this returns, which is after the copy has run (the
        // wait below) unless the wait fails; the staging block is `bytes` of
        // pinned memory nobody else knows of. They do not overlap.
        let copied = unsafe {
            self.backend
                .copy_async(staging.ptr, src.ptr.cast(), bytes, stream, device)
        };
        let waited = match &copied {
            // SAFETY: `stream` as above.
            Ok(()) => unsafe { self.backend.synchronize_stream(stream, device) }
                .map_err(Error::backend(BackendOp::SynchronizeStream)),
            Err(_) => Ok(()),
        };
        if copied.is_ok() && waited.is_ok() {
            read(staging.ptr);
        }
        let freed = if waited.is_ok() {
            // SAFETY: the block came from `staging`; no copy was issued, or
            // it has run (waited for above); `read` is done with it.
            unsafe { self.free_staging(staging, None) }
        } else {
            // The copy may still be writing the staging block and the wait
            // failed: leaking it is the safe choice (as in `upload`).
            Ok(())
        };
        staged_copy_result(copied, waited, freed)
    }
}

/// A pinned staging block of a copy between the host and the device: `bytes`
/// bytes at `ptr`, aligned to `align`, allocated for `device`.
struct Staging {
    ptr: NonNull<u8>,
    bytes: usize,
    align: usize,
    device: DeviceId,
}

/// The least alignment of a pinned staging block (that of CUDA's allocations).
const STAGING_ALIGN: usize = 256;

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

/// The outcome of a copy through a staging block: the copy's error first, the
/// wait's and the free's reported after it (several may fail).
fn staged_copy_result<E: core::fmt::Display>(
    copied: Result<(), E>,
    waited: Result<(), Error<E>>,
    freed: Result<(), Error<E>>,
) -> Result<(), Error<E>> {
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
    errors.result()
}
