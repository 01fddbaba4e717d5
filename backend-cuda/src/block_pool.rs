//! `BlockPool`: the pool of pinned (and managed) blocks behind
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
//! - **Parked blocks**: a stream-ordered free ([`give_after`](Pool::give_after))
//!   first asks whether the stream is idle (one query); if it is, the block is
//!   free at once. Otherwise it records an event on the stream and parks the
//!   block with it (and the next few such frees skip the question: streams
//!   are busy when blocks come back). A parked block
//!   re-enters the free list *only* after a query has seen its event complete,
//!   so a block is never handed out while work queued before its free may still
//!   use it. When a class has no free block, an allocation queries up to
//!   `SCAN_LIMIT` parked blocks of that class (starting where the previous
//!   scan stopped, so one long-running stream cannot hide the others) and takes
//!   the first whose event has completed; only then does it ask the driver.
//! - **Events** are raw `CUevent`s (timing disabled) kept in a free list of the
//!   pool: an event goes back there when its block leaves the parked list, and
//!   is never recorded again while a block waits on it.
//! - **Giving memory back**: blocks are kept until the process ends (the driver
//!   frees them then) or until [`trim`](Pool::trim), which frees every free
//!   block (after moving every completed parked block to the free list) and the
//!   idle events. Parked blocks whose event is still pending stay.
//!
//! ## Each thread's own blocks, in front
//!
//! The lists above are shared by every thread of the process. In front of
//! them each thread keeps its own blocks (`local.rs`: [`ThreadBlocks`], one
//! per thread, device and kind, in a [`Shard`](crate::shards::Shard)): the
//! blocks it freed, proven free, and the blocks it freed in the order of a
//! stream, by stream id, until one stream query proves a whole batch free
//! ([`QUERY_BATCH_BLOCKS`]). A warm thread's allocation and free take only
//! its own lock and make one stream query per batch instead of one per free;
//! it comes to the shared lists on a miss, with a busy batch (parked here
//! behind fences as above), and with what it holds past its bound. When it
//! exits, its blocks become the orphans of its shards, which other threads'
//! misses and batches adopt. `local.rs` says why one query per batch is the
//! floor.
//!
//! ## Locking
//!
//! The shared lists sit behind one `Mutex` per pool. With the threads' own
//! blocks in front, a warm thread comes here only on a miss, for a busy batch
//! or to spill past its bound, and each visit replaces a driver call that
//! costs tens of microseconds or more. The lock is held for list operations
//! and, on a miss, for at most `SCAN_LIMIT` event queries (~0.2 µs each); it
//! is never held across an allocation, a free, or an event record. No
//! thread's own lock is taken while the shared lock is held.
//!
//! ## Separated from the driver
//!
//! The bookkeeping above is [`Pool`], generic over an [`Upstream`]: where
//! blocks come from and go back to, and the fences that prove a stream has
//! finished with a block. The CUDA pools are `Pool<PoolKind>` (`BlockPool`):
//! blocks from `cuMemHostAlloc` / `cuMemAllocManaged`, fences that are
//! `CUevent`s of [`CudaBackend`]. The loom models (`loom-tests`, models
//! `block_pool::*`) run the same `Pool` over a fake upstream whose fences a
//! simulated stream completes, with the lock through `crate::sync` (loom's
//! `Mutex` under `--cfg loom`). This module is public only for them
//! (`#[doc(hidden)]`, not part of the API).

mod local;
mod upstream;

use std::collections::VecDeque;
// The tallies in `KindCounters` are std atomics in every build (loom
// included): relaxed statistics, read by the models only after every thread
// has been joined.
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use gpupool_core::{Completion, DeviceId, StreamHandle};
// For the unit tests' `use super::*`.
#[cfg(all(test, not(loom)))]
use gpupool_core::EventHandle;

use crate::backend::CudaBackend;
use crate::sync::{Mutex, MutexGuard};

pub use self::local::{
    LocalCounts, ThreadBlocks, QUERY_BATCH_BLOCKS, QUERY_BATCH_BYTES, THREAD_FREE_BYTES,
};
pub(crate) use self::upstream::PoolKind;
pub use self::upstream::Upstream;

/// log2 of the smallest block.
const MIN_BLOCK_SHIFT: u32 = 12;

/// The smallest block: 4 KiB, one page.
pub(crate) const MIN_BLOCK: usize = 1 << MIN_BLOCK_SHIFT;

/// How many parked blocks an allocation that finds its class empty queries at
/// most before it asks the driver.
pub(crate) const SCAN_LIMIT: usize = 16;

/// Process-wide switch ([`CudaBackend::set_idle_probe`]).
static IDLE_PROBE: AtomicBool = AtomicBool::new(true);

impl CudaBackend {
    /// Whether a stream-ordered free of pinned or managed memory first asks
    /// if the stream is idle and, if so, frees the block at once (on by
    /// default). Off, every such free records an event and parks the block
    /// until the event completes, as DALI's pinned pool does; the
    /// side-by-side benchmark turns it off for its baselines.
    pub fn set_idle_probe(&self, enabled: bool) {
        // Relaxed: see `stream_is_idle`.
        IDLE_PROBE.store(enabled, Ordering::Relaxed);
    }
}

/// Whether the idle probe is on ([`CudaBackend::set_idle_probe`]).
pub(crate) fn idle_probe() -> bool {
    // Relaxed: a switch that guards no memory.
    IDLE_PROBE.load(Ordering::Relaxed)
}

/// How many stream-ordered returns record their fence without asking whether
/// the stream is idle, after it was found busy.
pub(crate) const PROBE_BACKOFF: usize = 7;

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

/// A parked block: free once its fence has completed.
#[derive(Copy, Clone, Debug)]
struct Parked<F> {
    addr: usize,
    fence: F,
}

/// The parked blocks of one class, oldest first, and where the next scan
/// starts.
#[derive(Debug)]
struct ParkedClass<F> {
    blocks: VecDeque<Parked<F>>,
    cursor: usize,
}

impl<F> Default for ParkedClass<F> {
    fn default() -> Self {
        ParkedClass {
            blocks: VecDeque::new(),
            cursor: 0,
        }
    }
}

/// Everything behind the pool's lock.
#[derive(Debug)]
struct Lists<F> {
    /// Free blocks per class (addresses), newest last.
    free: Vec<Vec<usize>>,
    /// Parked blocks per class.
    parked: Vec<ParkedClass<F>>,
    /// Fences that no block waits on.
    idle_fences: Vec<F>,
    /// Bytes in `free`.
    free_bytes: usize,
    /// Blocks in `free`.
    free_blocks: usize,
    /// Blocks in `parked`.
    parked_blocks: usize,
}

impl<F> Default for Lists<F> {
    fn default() -> Self {
        Lists {
            free: Vec::new(),
            parked: Vec::new(),
            idle_fences: Vec::new(),
            free_bytes: 0,
            free_blocks: 0,
            parked_blocks: 0,
        }
    }
}

impl<F: Copy> Lists<F> {
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

    fn park(&mut self, class: usize, block: Parked<F>) {
        if self.parked.len() <= class {
            self.parked.resize_with(class + 1, ParkedClass::default);
        }
        self.parked[class].blocks.push_back(block);
        self.parked_blocks += 1;
    }

    /// Queries up to `SCAN_LIMIT` parked blocks of `class` and takes the
    /// first whose fence has completed (its fence becomes idle). A failed
    /// query counts as pending: the block is never reused on a guess.
    fn reclaim_one<U: Upstream<Fence = F>>(
        &mut self,
        upstream: &U,
        class: usize,
        device: DeviceId,
    ) -> Option<usize> {
        let pc = self.parked.get_mut(class)?;
        let len = pc.blocks.len();
        for k in 0..len.min(SCAN_LIMIT) {
            let i = (pc.cursor + k) % len;
            let Some(&p) = pc.blocks.get(i) else { break };
            if let Ok(Completion::Complete) = upstream.query_fence(p.fence, device) {
                pc.blocks.remove(i);
                pc.cursor = i;
                self.parked_blocks -= 1;
                self.idle_fences.push(p.fence);
                return Some(p.addr);
            }
        }
        pc.cursor = (pc.cursor + len.min(SCAN_LIMIT)) % len.max(1);
        None
    }

    /// Moves every parked block whose fence has completed to the free list.
    fn reclaim_all<U: Upstream<Fence = F>>(&mut self, upstream: &U, device: DeviceId) {
        for class in 0..self.parked.len() {
            let blocks = core::mem::take(&mut self.parked[class].blocks);
            let mut pending = VecDeque::with_capacity(blocks.len());
            for p in blocks {
                if let Ok(Completion::Complete) = upstream.query_fence(p.fence, device) {
                    self.parked_blocks -= 1;
                    self.idle_fences.push(p.fence);
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
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// Blocks waiting for their fence.
    pub parked_blocks: usize,
    /// Blocks ready for reuse.
    pub free_blocks: usize,
    /// The bytes of the free blocks.
    pub free_bytes: usize,
}

/// The tallies of a pool's upstream calls and reuses.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolTallies {
    /// Blocks taken from the upstream.
    pub upstream_allocations: u64,
    /// Blocks given back to the upstream.
    pub upstream_frees: u64,
    /// Blocks handed out again without an upstream call.
    pub reuses: u64,
}

/// Counters of one memory kind on one device: kept by each pool for its
/// blocks, and by the memory state for host and device memory
/// ([`MemoryStats`](crate::MemoryStats) reads them). Independent relaxed
/// tallies.
#[derive(Debug, Default)]
pub(crate) struct KindCounters {
    /// Blocks taken from the upstream allocator.
    pub(crate) upstream_allocations: AtomicU64,
    /// Blocks given back to the upstream allocator.
    pub(crate) upstream_frees: AtomicU64,
    /// Blocks handed out again by a pool, without an upstream call.
    pub(crate) reuses: AtomicU64,
}

/// The pooling logic over any [`Upstream`]. See the [module documentation](self).
#[derive(Debug)]
pub struct Pool<U: Upstream> {
    upstream: U,
    lists: Mutex<Lists<U::Fence>>,
    /// Stream-ordered returns left before one asks its stream whether it is
    /// idle again (0: the next one asks). See [`give_after`](Self::give_after).
    skip_probes: AtomicUsize,
    /// Upstream calls and reuses.
    pub(crate) counters: KindCounters,
    /// How many blocks a thread's pending group of a stream holds before one
    /// query proves them free ([`QUERY_BATCH_BLOCKS`]; the models lower it).
    query_batch_blocks: usize,
}

/// Pinned or managed blocks of one device.
pub(crate) type BlockPool = Pool<PoolKind>;

impl<U: Upstream> Pool<U> {
    /// An empty pool over `upstream`.
    pub fn new(upstream: U) -> Self {
        Pool {
            upstream,
            lists: Mutex::new(Lists::default()),
            skip_probes: AtomicUsize::new(0),
            counters: KindCounters::default(),
            query_batch_blocks: QUERY_BATCH_BLOCKS,
        }
    }

    /// The same pool, proving a thread's stream-ordered frees free once a
    /// stream's group holds `blocks` blocks (at least 1) instead of
    /// [`QUERY_BATCH_BLOCKS`]: for the models and unit tests, which cannot
    /// afford thirty-two frees per batch.
    #[doc(hidden)]
    pub fn with_query_batch(mut self, blocks: usize) -> Self {
        self.query_batch_blocks = blocks.max(1);
        self
    }

    /// The upstream.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    fn lock(&self) -> MutexGuard<'_, Lists<U::Fence>> {
        // Nothing panics while the lock is held; a poisoned lock still holds
        // consistent lists.
        self.lists.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of at least `size` bytes: a free one, else a parked one whose
    /// fence has completed, else a new one from the upstream. Never a block
    /// whose fence has not been seen complete.
    pub fn take(&self, device: DeviceId, size: usize) -> Result<usize, U::Error> {
        let class = class_of(size).ok_or_else(|| self.upstream.invalid_size())?;
        let reused = {
            let mut lists = self.lock();
            match lists.pop_free(class) {
                Some(addr) => Some(addr),
                None => lists.reclaim_one(&self.upstream, class, device),
            }
        };
        if let Some(addr) = reused {
            // Relaxed: an independent tally (see `KindCounters`).
            self.counters.reuses.fetch_add(1, Ordering::Relaxed);
            return Ok(addr);
        }
        let addr = self.upstream.allocate(device, class_size(class))?;
        // Relaxed: an independent tally.
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
    pub unsafe fn give(&self, addr: usize, size: usize) -> Result<(), U::Error> {
        let class = class_of(size).ok_or_else(|| self.upstream.invalid_size())?;
        self.lock().push_free(class, addr);
        Ok(())
    }

    /// Returns a block in the order of `stream`. If the stream has finished
    /// all of its work (one query), the block is free at once; otherwise it is
    /// parked behind a fence recorded on `stream` now. If no fence can be
    /// recorded, the stream is synchronized instead and the block is free at
    /// once. On error the block is untouched and still the caller's.
    ///
    /// A stream found busy makes the next `PROBE_BACKOFF` returns (from any
    /// stream) record their fence without asking: where streams are busy when
    /// blocks come back, the query would be paid for nothing each time.
    ///
    /// # Safety
    /// As for [`give`](Self::give), except that work already issued on
    /// `stream` (a live stream of `device`, or a special one) may still use
    /// the block.
    pub unsafe fn give_after(
        &self,
        device: DeviceId,
        addr: usize,
        size: usize,
        stream: StreamHandle,
    ) -> Result<(), U::Error> {
        let class = class_of(size).ok_or_else(|| self.upstream.invalid_size())?;
        if self.stream_is_idle(stream, device) {
            // Everything issued on `stream` before this call has finished, and
            // only that work may use the block (the caller's contract).
            self.lock().push_free(class, addr);
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { self.park_after(device, addr, class, stream) }
    }

    /// Parks a block of `class` behind a fence recorded on `stream` now,
    /// without asking whether the stream is idle; if no fence can be
    /// recorded, synchronizes the stream and frees the block. On error the
    /// block is untouched and still the caller's.
    ///
    /// # Safety
    /// As for [`give_after`](Self::give_after).
    unsafe fn park_after(
        &self,
        device: DeviceId,
        addr: usize,
        class: usize,
        stream: StreamHandle,
    ) -> Result<(), U::Error> {
        let idle = self.lock().idle_fences.pop();
        let fence = match idle {
            Some(f) => Ok(f),
            None => self.upstream.create_fence(device),
        };
        let recorded = fence.and_then(|f| match self.upstream.record_fence(f, stream, device) {
            Ok(()) => Ok(f),
            Err(err) => {
                // Its state is unknown now: never reuse it.
                let _ = self.upstream.destroy_fence(f, device);
                Err(err)
            }
        });
        match recorded {
            Ok(fence) => {
                self.lock().park(class, Parked { addr, fence });
                Ok(())
            }
            Err(err) => {
                // No fence: wait for the stream, then the block is free.
                self.upstream.synchronize(stream, device).map_err(|_| err)?;
                self.lock().push_free(class, addr);
                Ok(())
            }
        }
    }

    /// Asks whether `stream` is idle, unless a recent answer was "busy" (or
    /// the question is switched off: [`CudaBackend::set_idle_probe`]).
    fn stream_is_idle(&self, stream: StreamHandle, device: DeviceId) -> bool {
        // Relaxed: a switch that guards no memory.
        if !IDLE_PROBE.load(Ordering::Relaxed) {
            return false;
        }
        // Relaxed: a hint of when to ask, guarding no memory; racing returns
        // may lose an update, which only moves the next question.
        let skip = self.skip_probes.load(Ordering::Relaxed);
        if skip > 0 {
            self.skip_probes.store(skip - 1, Ordering::Relaxed);
            return false;
        }
        if let Ok(Completion::Complete) = self.upstream.query_stream(stream, device) {
            return true;
        }
        // Relaxed: as above.
        self.skip_probes.store(PROBE_BACKOFF, Ordering::Relaxed);
        false
    }

    /// Frees every free block, and every parked block whose fence has
    /// completed, back to the upstream, and destroys the idle fences. Returns
    /// the bytes freed. A block the upstream refuses to free stays in the
    /// pool; the first such error is returned after everything else was tried.
    pub fn trim(&self, device: DeviceId) -> Result<usize, U::Error> {
        let (blocks, fences) = {
            let mut lists = self.lock();
            lists.reclaim_all(&self.upstream, device);
            let mut blocks = Vec::with_capacity(lists.free_blocks);
            for (class, list) in lists.free.iter_mut().enumerate() {
                blocks.extend(list.drain(..).map(|addr| (class, addr)));
            }
            lists.free_bytes = 0;
            lists.free_blocks = 0;
            (blocks, core::mem::take(&mut lists.idle_fences))
        };
        let mut freed = 0;
        let mut first_error = None;
        for (class, addr) in blocks {
            // SAFETY: a free block of this pool: taken from the lists above,
            // so no one else holds it, and no work uses it (it was freed
            // synchronously, or its fence has completed).
            match unsafe { self.upstream.free(device, addr) } {
                Ok(()) => {
                    freed += class_size(class);
                    // Relaxed: an independent tally.
                    self.counters.upstream_frees.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    self.lock().push_free(class, addr);
                }
            }
        }
        for f in fences {
            if let Err(err) = self.upstream.destroy_fence(f, device) {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(freed), Err)
    }

    /// How many blocks are parked and free, and the free bytes.
    pub fn counts(&self) -> PoolCounts {
        let lists = self.lock();
        PoolCounts {
            parked_blocks: lists.parked_blocks,
            free_blocks: lists.free_blocks,
            free_bytes: lists.free_bytes,
        }
    }

    /// The upstream calls and reuses so far.
    pub fn tallies(&self) -> PoolTallies {
        // Relaxed: a snapshot of independent tallies.
        PoolTallies {
            upstream_allocations: self.counters.upstream_allocations.load(Ordering::Relaxed),
            upstream_frees: self.counters.upstream_frees.load(Ordering::Relaxed),
            reuses: self.counters.reuses.load(Ordering::Relaxed),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
