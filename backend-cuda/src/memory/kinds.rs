//! Each kind's raw blocks for one device ([`DeviceMemory`]): allocation and
//! free in host order and in stream order, with the kind's own alignment
//! (over-aligned requests are built on these in `overalign.rs`).

use core::ptr::NonNull;
use std::alloc::Layout;
use std::sync::atomic::Ordering;

use gpupool_core::{DeviceId, MemoryKind, StreamBackend, StreamHandle};

use super::host_shelf::{with_shelf, Kept};
use super::state::{state, DeviceMemory};
use super::LOCAL_BLOCKS;
use crate::backend::CudaBackend;
use crate::driver::Driver;
use crate::error::{invalid_value, out_of_memory, CudaError};
use crate::graph::unrestricted;
use crate::shards::LocalShards;

/// What an allocation asks for and its free repeats: the kind, the device,
/// the size and the alignment (a raw block of a kind has the kind's own
/// alignment: there `align` is not looked at).
#[derive(Clone, Copy, Debug)]
pub(super) struct BlockLayout {
    kind: MemoryKind,
    device: DeviceId,
    size: usize,
    align: usize,
}

impl BlockLayout {
    #[inline(always)]
    pub(super) fn new(kind: MemoryKind, device: DeviceId, size: usize, align: usize) -> Self {
        BlockLayout {
            kind,
            device,
            size,
            align,
        }
    }

    pub(super) fn kind(self) -> MemoryKind {
        self.kind
    }

    pub(super) fn size(self) -> usize {
        self.size
    }

    pub(super) fn align(self) -> usize {
        self.align
    }

    /// The same block with `size` bytes.
    pub(super) fn with_size(self, size: usize) -> BlockLayout {
        BlockLayout { size, ..self }
    }
}

impl DeviceMemory {
    /// A block of `b.kind` (not host) and `b.size` bytes on `b.device`, with
    /// the kind's own alignment.
    ///
    /// # Safety
    /// `stream`, if any, is a usable stream of `device` (the contract of
    /// [`MemoryBackend::allocate_async`]; see [`CudaBackend`], "Raw
    /// handles").
    pub(super) unsafe fn raw_allocate(
        &'static self,
        drv: &Driver,
        b: BlockLayout,
        stream: Option<StreamHandle>,
    ) -> Result<usize, CudaError> {
        let BlockLayout {
            kind, device, size, ..
        } = b;
        match kind {
            // SAFETY: this function's contract.
            MemoryKind::Device => unsafe { self.device_allocate(drv, device, size, stream) },
            MemoryKind::Pinned | MemoryKind::Managed => {
                let Some((pool, threads, index)) = self.host_visible(kind) else {
                    return Err(invalid_value());
                };
                LocalShards::with_local(&LOCAL_BLOCKS, index, threads, |mine| {
                    pool.take_local(mine, threads, device, size)
                })
                .unwrap_or_else(|| pool.take(device, size))
            }
            MemoryKind::Host => Err(invalid_value()),
        }
    }

    /// Frees a block of [`raw_allocate`](Self::raw_allocate).
    ///
    /// # Safety
    /// `addr` came from `raw_allocate` with the same kind, device and size
    /// in `b`, is freed once; with `stream`, only work already issued on it
    /// may still use the block; without, nothing does.
    pub(super) unsafe fn raw_free(
        &'static self,
        drv: &Driver,
        b: BlockLayout,
        addr: usize,
        stream: Option<StreamHandle>,
    ) -> Result<(), CudaError> {
        let BlockLayout {
            kind, device, size, ..
        } = b;
        if kind == MemoryKind::Device {
            // SAFETY: the caller's contract.
            return unsafe { self.device_free(drv, device, addr, size, stream) };
        }
        let Some((pool, threads, index)) = self.host_visible(kind) else {
            return Err(invalid_value());
        };
        let local = LocalShards::with_local(&LOCAL_BLOCKS, index, threads, |mine| match stream {
            // SAFETY: the caller's contract (the block came from `take` of
            // this pool with this size).
            None => unsafe { pool.give_local(mine, addr, size) },
            // SAFETY: as above.
            Some(s) => unsafe { pool.give_after_local(mine, threads, device, addr, size, s) },
        });
        match (local, stream) {
            (Some(done), _) => done,
            // The thread's locals are gone (it is exiting): the shared lists.
            // SAFETY: as above.
            (None, None) => unsafe { pool.give(addr, size) },
            // SAFETY: as above.
            (None, Some(s)) => unsafe { pool.give_after(device, addr, size, s) },
        }
    }

    /// Host memory: a block of this thread's [shelf](super::host_shelf) of
    /// exactly this layout, else `std::alloc` (layout checked).
    pub(super) fn host_allocate(
        &self,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, CudaError> {
        let layout = Layout::from_size_align(size, align).map_err(|_| invalid_value())?;
        if let Some(p) = with_shelf(|s| s.take(layout)).flatten() {
            // Relaxed: an independent tally, read only for statistics.
            self.host.reuses.fetch_add(1, Ordering::Relaxed);
            return Ok(p);
        }
        // SAFETY: `layout` has a nonzero size (`check_layout`).
        let p = NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or_else(out_of_memory)?;
        self.host
            .upstream_allocations
            .fetch_add(1, Ordering::Relaxed);
        Ok(p)
    }

    /// Frees host memory: onto this thread's shelf if it has room, else
    /// back to `std::alloc`.
    ///
    /// # Safety
    /// `ptr` came from [`host_allocate`](Self::host_allocate) with `size` and
    /// `align`, is freed once, and nothing uses it any more.
    pub(super) unsafe fn host_free(
        &self,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) -> Result<(), CudaError> {
        let layout = Layout::from_size_align(size, align).map_err(|_| invalid_value())?;
        // SAFETY: the caller's contract: allocated by `std::alloc::alloc`
        // with this layout (`host_allocate`: fresh, or a shelf's block of
        // this layout), not freed yet, unused.
        let kept = with_shelf(|s| unsafe { s.keep(layout, ptr) });
        if kept == Some(Kept::Kept) {
            return Ok(());
        }
        if kept.is_none() {
            // The thread's shelf is gone (it is exiting).
            // SAFETY: as above; the shelf did not take it.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        }
        self.host.upstream_frees.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// # Safety
    /// The contract of [`MemoryBackend::deallocate`] (`stream: None`) or
    /// [`MemoryBackend::deallocate_async`].
    pub(super) unsafe fn deallocate(
        &'static self,
        drv: &Driver,
        b: BlockLayout,
        ptr: NonNull<u8>,
        stream: Option<StreamHandle>,
    ) -> Result<(), CudaError> {
        if b.kind == MemoryKind::Host {
            if let Some(s) = stream {
                // No capture question here (it would cost every host free
                // `cuStreamIsCapturing`, 10 % of a host scratch round): a
                // release in a capturing stream's order goes to
                // `keep_for_graph` (the scratchpad asks where the stream may
                // capture). On a capturing stream the synchronization fails
                // with the driver's error and the block stays allocated.
                // SAFETY: a usable stream of `device` (the contract of
                // `deallocate_async`).
                unsafe { CudaBackend::new().synchronize_stream(s, b.device) }?;
            }
            // SAFETY: the caller's contract; work issued on `stream` before
            // the free has finished.
            return unsafe { self.host_free(ptr, b.size, b.align) };
        }
        // SAFETY: the caller's contract.
        unsafe { self.free_aligned(drv, b, ptr.as_ptr() as usize, stream) }
    }
}

/// A size and alignment every kind accepts: nonzero size, power-of-two
/// alignment, and both together within `isize::MAX`.
fn check_layout(size: usize, align: usize) -> Result<(), CudaError> {
    if size == 0 || Layout::from_size_align(size, align).is_err() {
        return Err(invalid_value());
    }
    Ok(())
}

/// The layout checked ([`check_layout`]), then the driver and the block's
/// device's memory state: what every allocation and free starts with.
fn checked_state(b: BlockLayout) -> Result<(&'static Driver, &'static DeviceMemory), CudaError> {
    check_layout(b.size, b.align)?;
    state(b.device)
}

/// An allocation of the trait: in host order (`stream: None`) or in
/// `stream`'s order.
///
/// # Safety
/// `stream`, if any, is a usable stream of `device` (the contract of
/// [`MemoryBackend::allocate_async`]).
#[inline(always)]
pub(super) unsafe fn allocate_in(
    b: BlockLayout,
    stream: Option<StreamHandle>,
) -> Result<NonNull<u8>, CudaError> {
    let (drv, mem) = checked_state(b)?;
    unrestricted(move || match b.kind {
        MemoryKind::Host => mem.host_allocate(b.size, b.align),
        // Host-visible: allocated in host order, whatever the stream.
        // SAFETY: no stream.
        MemoryKind::Pinned | MemoryKind::Managed => unsafe { mem.allocate_aligned(drv, b, None) },
        // SAFETY: this function's contract.
        MemoryKind::Device => unsafe { mem.allocate_aligned(drv, b, stream) },
    })
}

/// A free of the trait: in host order (`stream: None`) or in `stream`'s
/// order.
///
/// # Safety
/// The contract of [`MemoryBackend::deallocate`] (no stream) or
/// [`MemoryBackend::deallocate_async`].
#[inline(always)]
pub(super) unsafe fn deallocate_in(
    b: BlockLayout,
    ptr: NonNull<u8>,
    stream: Option<StreamHandle>,
) -> Result<(), CudaError> {
    let (drv, mem) = checked_state(b)?;
    // SAFETY: the caller's contract (the trait's).
    unrestricted(move || unsafe { mem.deallocate(drv, b, ptr, stream) })
}

#[cfg(test)]
mod tests {
    use gpupool_core::MemoryBackend;

    use super::*;

    #[test]
    fn layouts_are_checked_before_the_driver() {
        assert_eq!(check_layout(0, 1), Err(invalid_value()));
        assert_eq!(check_layout(1, 0), Err(invalid_value()));
        assert_eq!(check_layout(1, 3), Err(invalid_value()));
        assert_eq!(check_layout(isize::MAX as usize, 2), Err(invalid_value()));
        assert_eq!(check_layout(isize::MAX as usize, 1), Ok(()));
        assert_eq!(check_layout(1, 1 << 20), Ok(()));
        let gpu = CudaBackend::new();
        for kind in MemoryKind::ALL {
            assert_eq!(
                gpu.allocate(kind, DeviceId(0), 0, 8).map(drop),
                Err(invalid_value())
            );
            // SAFETY: the null stream is a usable stream of every device
            // (and the layout is refused before the driver is asked).
            let r = unsafe { gpu.allocate_async(kind, DeviceId(0), 8, 12, StreamHandle::NULL) };
            assert_eq!(r.map(drop), Err(invalid_value()));
        }
    }
}
