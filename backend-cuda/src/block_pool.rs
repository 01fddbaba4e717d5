//! [`BlockPool`]: the pool of pinned (and managed) blocks behind
//! [`CudaBackend`]'s memory, one per device and kind.
//!
//! A raw `cuMemHostAlloc` costs 26 µs at 64 KiB and 0.9 ms at 2 MiB (and
//! `cuMemFreeHost` more), so blocks are kept and handed out again:
//!
//! - **Size classes**: powers of two from 4 KiB (a request takes the smallest
//!   class that holds it). The scratchpad asks for power-of-two blocks anyway
//!   (64 KiB, doubling), so nothing is wasted there; other callers may get up
//!   to twice what they asked for.
//! - **Free blocks** are kept per class, newest first (warm in the caches).
//! - **Parked blocks**: a stream-ordered free ([`give_after`](BlockPool::give_after))
//!   records an event on the stream and parks the block with it. A parked block
//!   re-enters the free list *only* after a query has seen its event complete,
//!   so a block is never handed out while work queued before its free may still
//!   use it. When a class has no free block, an allocation queries up to
//!   [`SCAN_LIMIT`] parked blocks of that class (starting where the previous
//!   scan stopped, so one long-running stream cannot hide the others) and takes
//!   the first whose event has completed; only then does it ask the driver.
//! - **Events** are raw `CUevent`s (timing disabled) kept in a free list of the
//!   pool: an event goes back there when its block leaves the parked list, and
//!   is never recorded again while a block waits on it.
//! - **Giving memory back**: blocks are kept until the process ends (the driver
//!   frees them then) or until [`trim`](BlockPool::trim), which frees every free
//!   block (after moving every completed parked block to the free list) and the
//!   idle events. Parked blocks whose event is still pending stay.
//!
//! ## Locking
//!
//! The lists sit behind one `Mutex` per pool. This is not a pool hot path like
//! the stream and event pools: the scratchpad keeps its blocks across
//! [`reset`](gpupool_core::Scratchpad::reset)s and comes here only to grow or
//! when a fence has not completed, and each visit replaces a driver call that
//! costs tens of microseconds or more. The lock is held for list operations
//! and, on a miss, for at most [`SCAN_LIMIT`] event queries (~0.2 µs each); it
//! is never held across an allocation, a free, or an event record.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::sys;
use gpupool_core::{
    Completion, DeviceId, EventBackend, EventFlags, EventHandle, StreamBackend, StreamHandle,
};

use crate::driver::driver;
use crate::error::{check, CudaError};
use crate::memory::{invalid_value, KindCounters};
use crate::CudaBackend;

/// log2 of the smallest block.
const MIN_BLOCK_SHIFT: u32 = 12;

/// The smallest block: 4 KiB, one page.
pub(crate) const MIN_BLOCK: usize = 1 << MIN_BLOCK_SHIFT;

/// How many parked blocks an allocation that finds its class empty queries at
/// most before it asks the driver.
pub(crate) const SCAN_LIMIT: usize = 16;

/// The size class of a request of `size` bytes: the power of two that holds
/// it (at least 4 KiB), counted from 4 KiB. `None` past the largest power of
/// two a `usize` holds.
pub(crate) fn class_of(size: usize) -> Option<usize> {
    let rounded = size.max(MIN_BLOCK).checked_next_power_of_two()?;
    Some((rounded.trailing_zeros() - MIN_BLOCK_SHIFT) as usize)
}

/// The size of the blocks of `class` (a value [`class_of`] returned).
pub(crate) fn class_size(class: usize) -> usize {
    MIN_BLOCK << class
}

/// What a pool's blocks are.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum PoolKind {
    /// `cuMemHostAlloc(PORTABLE | DEVICEMAP)`, freed with `cuMemFreeHost`.
    Pinned,
    /// `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`, freed with `cuMemFree`.
    Managed,
}

impl PoolKind {
    /// A new block of `bytes` from the driver, allocated in `device`'s
    /// primary context.
    fn raw_allocate(self, device: DeviceId, bytes: usize) -> Result<usize, CudaError> {
        driver()?.with_context(device, |_| match self {
            PoolKind::Pinned => {
                let mut host: *mut core::ffi::c_void = core::ptr::null_mut();
                // SAFETY: `host` is a valid place for the pointer. Portable:
                // page-locked for every context; device-mapped: kernels may
                // use it (under unified addressing, at the same address).
                check(unsafe {
                    sys::cuMemHostAlloc(
                        &mut host,
                        bytes,
                        sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
                    )
                })?;
                Ok(host as usize)
            }
            PoolKind::Managed => {
                let mut dptr: sys::CUdeviceptr = 0;
                // SAFETY: `dptr` is a valid place for the address; global
                // attachment makes it usable from every stream.
                check(unsafe {
                    sys::cuMemAllocManaged(
                        &mut dptr,
                        bytes,
                        sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32,
                    )
                })?;
                Ok(dptr as usize)
            }
        })
    }

    /// Gives a block back to the driver.
    ///
    /// # Safety
    /// `addr` came from [`raw_allocate`](Self::raw_allocate) of this kind, is
    /// freed once, and nothing (host or device) uses it any more.
    unsafe fn raw_free(self, device: DeviceId, addr: usize) -> Result<(), CudaError> {
        let r = driver()?.with_context(device, |_| match self {
            // SAFETY: the caller's contract.
            PoolKind::Pinned => check(unsafe { sys::cuMemFreeHost(addr as *mut _) }),
            // SAFETY: the caller's contract.
            PoolKind::Managed => check(unsafe { sys::cuMemFree_v2(addr as sys::CUdeviceptr) }),
        });
        match r {
            // At process exit the driver has already freed everything.
            Err(e) if e.is_deinitialized() => Ok(()),
            other => other,
        }
    }
}

/// A parked block: free once its event has completed.
#[derive(Copy, Clone, Debug)]
struct Parked {
    addr: usize,
    event: EventHandle,
}

/// The parked blocks of one class, oldest first, and where the next scan
/// starts.
#[derive(Debug, Default)]
struct ParkedClass {
    blocks: VecDeque<Parked>,
    cursor: usize,
}

/// Everything behind the pool's lock.
#[derive(Debug, Default)]
struct Lists {
    /// Free blocks per class (addresses), newest last.
    free: Vec<Vec<usize>>,
    /// Parked blocks per class.
    parked: Vec<ParkedClass>,
    /// Events that no block waits on.
    idle_events: Vec<EventHandle>,
    /// Bytes in `free`.
    free_bytes: usize,
    /// Blocks in `free`.
    free_blocks: usize,
    /// Blocks in `parked`.
    parked_blocks: usize,
}

impl Lists {
    fn push_free(&mut self, class: usize, addr: usize) {
        if self.free.len() <= class {
            self.free.resize_with(class + 1, Vec::new);
        }
        self.free[class].push(addr);
        self.free_bytes += class_size(class);
        self.free_blocks += 1;
    }

    fn pop_free(&mut self, class: usize) -> Option<usize> {
        let addr = self.free.get_mut(class)?.pop()?;
        self.free_bytes -= class_size(class);
        self.free_blocks -= 1;
        Some(addr)
    }

    fn park(&mut self, class: usize, block: Parked) {
        if self.parked.len() <= class {
            self.parked.resize_with(class + 1, ParkedClass::default);
        }
        self.parked[class].blocks.push_back(block);
        self.parked_blocks += 1;
    }

    /// Queries up to [`SCAN_LIMIT`] parked blocks of `class` and takes the
    /// first whose event has completed (its event becomes idle). A failed
    /// query counts as pending: the block is never reused on a guess.
    fn reclaim_one(&mut self, class: usize, device: DeviceId) -> Option<usize> {
        let gpu = CudaBackend::new();
        let pc = self.parked.get_mut(class)?;
        let len = pc.blocks.len();
        for k in 0..len.min(SCAN_LIMIT) {
            let i = (pc.cursor + k) % len;
            let Some(&p) = pc.blocks.get(i) else { break };
            if let Ok(Completion::Complete) = gpu.query_event(p.event, device) {
                pc.blocks.remove(i);
                pc.cursor = i;
                self.parked_blocks -= 1;
                self.idle_events.push(p.event);
                return Some(p.addr);
            }
        }
        pc.cursor = (pc.cursor + len.min(SCAN_LIMIT)) % len.max(1);
        None
    }

    /// Moves every parked block whose event has completed to the free list.
    fn reclaim_all(&mut self, device: DeviceId) {
        let gpu = CudaBackend::new();
        for class in 0..self.parked.len() {
            let blocks = core::mem::take(&mut self.parked[class].blocks);
            let mut pending = VecDeque::with_capacity(blocks.len());
            for p in blocks {
                if let Ok(Completion::Complete) = gpu.query_event(p.event, device) {
                    self.parked_blocks -= 1;
                    self.idle_events.push(p.event);
                    self.push_free(class, p.addr);
                } else {
                    pending.push_back(p);
                }
            }
            self.parked[class] = ParkedClass {
                blocks: pending,
                cursor: 0,
            };
        }
    }
}

/// A snapshot of a pool's lists.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct PoolCounts {
    pub(crate) parked_blocks: usize,
    pub(crate) free_blocks: usize,
    pub(crate) free_bytes: usize,
}

/// Pinned or managed blocks of one device. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct BlockPool {
    kind: PoolKind,
    lists: Mutex<Lists>,
    /// Upstream calls and reuses.
    pub(crate) counters: KindCounters,
}

impl BlockPool {
    pub(crate) fn new(kind: PoolKind) -> Self {
        BlockPool {
            kind,
            lists: Mutex::new(Lists::default()),
            counters: KindCounters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lists> {
        // Nothing panics while the lock is held; a poisoned lock still holds
        // consistent lists.
        self.lists.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of at least `size` bytes: a free one, else a parked one whose
    /// event has completed, else a new one from the driver. Never a block
    /// whose event has not been seen complete.
    pub(crate) fn take(&self, device: DeviceId, size: usize) -> Result<usize, CudaError> {
        let class = class_of(size).ok_or_else(invalid_value)?;
        let reused = {
            let mut lists = self.lock();
            match lists.pop_free(class) {
                Some(addr) => Some(addr),
                None => lists.reclaim_one(class, device),
            }
        };
        if let Some(addr) = reused {
            self.counters.reuses.fetch_add(1, Ordering::Relaxed);
            return Ok(addr);
        }
        let addr = self.kind.raw_allocate(device, class_size(class))?;
        self.counters
            .upstream_allocations
            .fetch_add(1, Ordering::Relaxed);
        Ok(addr)
    }

    /// Returns a block for immediate reuse.
    ///
    /// # Safety
    /// `addr` came from [`take`](Self::take) of this pool with a `size` of
    /// the same class, is returned once, and nothing uses it any more.
    pub(crate) unsafe fn give(&self, addr: usize, size: usize) -> Result<(), CudaError> {
        let class = class_of(size).ok_or_else(invalid_value)?;
        self.lock().push_free(class, addr);
        Ok(())
    }

    /// Returns a block in the order of `stream`: it is parked behind an event
    /// recorded on `stream` now. If no event can be recorded, the stream is
    /// synchronized instead and the block is free at once. On error the block
    /// is untouched and still the caller's.
    ///
    /// # Safety
    /// As for [`give`](Self::give), except that work already issued on
    /// `stream` (a live stream of `device`, or a special one) may still use
    /// the block.
    pub(crate) unsafe fn give_after(
        &self,
        device: DeviceId,
        addr: usize,
        size: usize,
        stream: StreamHandle,
    ) -> Result<(), CudaError> {
        let class = class_of(size).ok_or_else(invalid_value)?;
        let gpu = CudaBackend::new();
        let idle = self.lock().idle_events.pop();
        let event = match idle {
            Some(e) => Ok(e),
            None => gpu.create_event(device, EventFlags::DISABLE_TIMING),
        };
        let recorded = event.and_then(|e| match gpu.record_event(e, stream, device) {
            Ok(()) => Ok(e),
            Err(err) => {
                // Its state is unknown now: never reuse it.
                let _ = gpu.destroy_event(e, device);
                Err(err)
            }
        });
        match recorded {
            Ok(event) => {
                self.lock().park(class, Parked { addr, event });
                Ok(())
            }
            Err(err) => {
                // No event: wait for the stream, then the block is free.
                gpu.synchronize_stream(stream, device).map_err(|_| err)?;
                self.lock().push_free(class, addr);
                Ok(())
            }
        }
    }

    /// Frees every free block, and every parked block whose event has
    /// completed, back to the driver, and destroys the idle events. Returns
    /// the bytes freed. A block the driver refuses to free stays in the pool;
    /// the first such error is returned after everything else was tried.
    pub(crate) fn trim(&self, device: DeviceId) -> Result<usize, CudaError> {
        let (blocks, events) = {
            let mut lists = self.lock();
            lists.reclaim_all(device);
            let mut blocks = Vec::with_capacity(lists.free_blocks);
            for (class, list) in lists.free.iter_mut().enumerate() {
                blocks.extend(list.drain(..).map(|addr| (class, addr)));
            }
            lists.free_bytes = 0;
            lists.free_blocks = 0;
            (blocks, core::mem::take(&mut lists.idle_events))
        };
        let gpu = CudaBackend::new();
        let mut freed = 0;
        let mut first_error = None;
        for (class, addr) in blocks {
            // SAFETY: a free block of this pool: taken from the lists above,
            // so no one else holds it, and no work uses it (it was freed
            // synchronously, or its event has completed).
            match unsafe { self.kind.raw_free(device, addr) } {
                Ok(()) => {
                    freed += class_size(class);
                    self.counters.upstream_frees.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    self.lock().push_free(class, addr);
                }
            }
        }
        for e in events {
            if let Err(err) = gpu.destroy_event(e, device) {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(freed), Err)
    }

    /// How many blocks are parked and free, and the free bytes.
    pub(crate) fn counts(&self) -> PoolCounts {
        let lists = self.lock();
        PoolCounts {
            parked_blocks: lists.parked_blocks,
            free_blocks: lists.free_blocks,
            free_bytes: lists.free_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_powers_of_two_from_one_page() {
        assert_eq!(class_of(0), Some(0));
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_of(4096), Some(0));
        assert_eq!(class_of(4097), Some(1));
        assert_eq!(class_of(64 * 1024), Some(4));
        assert_eq!(class_of(64 * 1024 + 1), Some(5));
        assert_eq!(class_size(class_of(2 << 20).unwrap()), 2 << 20);
        assert_eq!(class_of(1 << 63), Some(63 - 12));
        assert_eq!(class_of((1 << 63) + 1), None);
        assert_eq!(class_of(usize::MAX), None);
        for size in [1, 100, 4095, 4096, 5000, 65536, 1 << 20, (1 << 20) + 3] {
            let c = class_of(size).unwrap();
            assert!(class_size(c) >= size);
            assert!(c == 0 || class_size(c - 1) < size);
        }
    }

    #[test]
    fn free_lists_count_blocks_and_bytes() {
        let mut l = Lists::default();
        assert_eq!(l.pop_free(3), None);
        l.push_free(3, 0x1000);
        l.push_free(0, 0x2000);
        l.push_free(3, 0x3000);
        assert_eq!((l.free_blocks, l.free_bytes), (3, 2 * 32768 + 4096));
        assert_eq!(l.pop_free(3), Some(0x3000), "newest first");
        assert_eq!(l.pop_free(1), None);
        assert_eq!(l.pop_free(3), Some(0x1000));
        assert_eq!(l.pop_free(0), Some(0x2000));
        assert_eq!((l.free_blocks, l.free_bytes), (0, 0));
    }

    #[test]
    fn a_class_without_parked_blocks_reclaims_nothing_and_asks_no_driver() {
        let mut l = Lists::default();
        assert_eq!(l.reclaim_one(2, DeviceId(0)), None);
        l.reclaim_all(DeviceId(0));
        assert_eq!(l.parked_blocks, 0);
    }
}
