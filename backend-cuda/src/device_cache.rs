//! The device cache: device blocks freed in the order of a stream, kept on
//! the host and handed back to the next allocation of the same size in the
//! order of the **same stream**, without a driver allocation call.
//!
//! `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` cost ~0.6 µs a pair even when
//! the driver's pool has the memory, and the pair serialises across threads
//! (33 µs per pair per thread at 16 threads on an H200); a scratchpad made
//! anew each round asks for the same few block sizes on the same stream every
//! round. The cache answers those from a short list instead: two driver
//! queries that do not serialise (`cuStreamIsCapturing`, `cuStreamGetId`:
//! about 20 ns at 1 and at 16 threads) and a lock that only the calling
//! thread takes.
//!
//! ## One shelf per thread
//!
//! Each thread that frees device memory in stream order has its own shelf
//! per device (a [`Shard`](crate::shards::Shard) of the device's
//! [`Shards`]): its frees go there and its allocations look there first, so
//! a warm thread touches no lock or cache line that another thread writes
//! (its shelf's lock is taken by others only to trim, forget a stream or read
//! statistics). The thread is only the shard: the key stays the **stream
//! id**, so a block freed on thread A for stream S goes to A's shelf under S
//! and is handed only to an allocation on S (a scratchpad may move between
//! threads). When a thread exits, its blocks move, still keyed by stream id,
//! to the device's orphans, with no driver call (the exit may come during
//! process teardown, and their streams may be gone); the next allocation on
//! one of those streams that misses its own shelf, on any thread, adopts the
//! orphans of that stream into its shelf. [`CudaBackend::forget_stream`],
//! [`StreamBackend::destroy_stream`] and [`CudaBackend::trim_memory`] visit
//! every shelf and the orphans.
//!
//! ## What is cached
//!
//! - Only **device** memory, only blocks **freed in stream order**
//!   ([`MemoryBackend::deallocate_async`]) on a **created** stream that is
//!   **not capturing** a graph, only when the driver has `cuStreamGetId`
//!   (CUDA 12.0 and later; without it the cache is off and every call goes to
//!   the driver as before). A free on a special stream (0, 1, 2: the legacy or
//!   per-thread default stream), a free in host order, or a free on a
//!   capturing stream goes to the driver as before.
//! - Each block is kept with the **id of the stream** it was freed on
//!   (`cuStreamGetId`: unique per stream in the process, never reused, unlike
//!   the `CUstream` handle value, which a new stream may get after
//!   `cuStreamDestroy`) and its size: the size the backend asked the driver
//!   for (an over-aligned request's `size + align`), so alignment needs no
//!   key of its own (every device block is aligned to 256 bytes).
//! - Only an allocation **in the order of a stream with the same id**, of
//!   **exactly that size**, on a stream that is not capturing, takes it (the
//!   most recently freed first). A host-order allocation, or one on any other
//!   stream, never does: it asks the driver.
//! - **Bounds.** The cache holds at most [`MAX_BYTES`] bytes per device, all
//!   threads and the orphans together, and at most [`MAX_BLOCKS`] blocks per
//!   thread and device. A thread reserves bytes of the device's budget in
//!   whole [`RESERVE_CHUNK`]s and keeps one spare chunk, so the shared
//!   counter is touched only when its cached bytes cross a chunk, not on
//!   every free. A free that would go past the thread's bound (its blocks, or
//!   its reservation when the budget has no chunk left) first gives back the
//!   oldest blocks that thread cached for the **same stream** (with
//!   `cuMemFreeAsync` on that stream, which is the live stream of the call);
//!   if that cannot make room, the new block goes to the driver as before.
//!   Blocks of other streams are never evicted by a free (nothing says their
//!   stream is still alive).
//!
//! ## Why reuse on the same stream is safe
//!
//! A block freed in stream order on S may still be used by work queued on S
//! before the free; the caller of the free promised that every other use (on
//! other streams, or by the host) was ordered before that point of S. An
//! allocation in the order of the same S hands the block out to work that is
//! queued on S after the allocation, which is after the free, which is after
//! every old use: the new uses cannot start before the old ones have finished.
//! That is the driver pool's own rule for reusing memory freed on the stream
//! it is allocated on (which it does without waiting). Work on another stream
//! that uses the new block must be ordered after the allocation point on S
//! (the contract of [`MemoryBackend::allocate_async`]), hence after the old
//! uses too; a host-order free of it needs S to have passed the allocation,
//! hence the old uses. Device memory is not host-accessible, so no host
//! access can race with the old uses.
//!
//! Stream identity is the stream id, not the handle: a block freed on a stream
//! that was destroyed is never handed to a new stream that got the same handle
//! value, because the new stream has a new id. `cuStreamGetId` is called once
//! per cache operation, on the handle the caller passes (live, by the calls'
//! contract).
//!
//! A stream that is capturing a graph queues nothing: a free or an allocation
//! on it becomes a graph node that runs when the graph is launched, possibly
//! on another stream, so the same-stream argument does not hold. Such calls
//! bypass the cache.
//!
//! ## Giving cached blocks back
//!
//! A cached block may still be in use by work queued on its stream before the
//! free, so it is given back to the driver only in a way that is ordered after
//! that work:
//!
//! - **eviction** (the bound): `cuMemFreeAsync` on the stream of the freeing
//!   call, which is the block's stream (same id) and live;
//! - **[`StreamBackend::destroy_stream`] of [`CudaBackend`]**: before the
//!   stream is destroyed, the blocks cached for it (on the device given to
//!   the call) are freed with `cuMemFreeAsync` on it (the stream pools destroy streams
//!   this way, so purging a pool returns its streams' blocks);
//! - **[`CudaBackend::forget_stream`]**: the same, for a stream that is about
//!   to be destroyed some other way (raw cudarc, the runtime), or just to give
//!   its blocks back;
//! - **[`CudaBackend::trim_memory`]** (and an allocation that meets
//!   `CUDA_ERROR_OUT_OF_MEMORY` while the cache holds blocks): every cached
//!   block of the device, whatever its stream. The streams may be gone, so
//!   this **synchronizes the device's primary context** (`cuCtxSynchronize`,
//!   which also waits for work left on destroyed streams) and then frees the
//!   blocks on the backend's private stream. Only when the cache holds
//!   something.
//!
//! The contract is therefore weak: a stream used for stream-ordered device
//! frees may be destroyed any way at all; its cached blocks are never handed
//! to another stream, and a stream destroyed without
//! [`destroy_stream`](StreamBackend::destroy_stream) or
//! [`forget_stream`](CudaBackend::forget_stream) merely leaves its blocks in
//! the cache (counted against the bound) until the next
//! [`trim_memory`](CudaBackend::trim_memory). The streams given to the memory
//! calls must belong to the device's primary context (every stream this
//! backend, the stream pools and the CUDA runtime create does): that is the
//! context `trim_memory` synchronizes.
//!
//! ## Watching it
//!
//! [`CudaBackend::memory_stats`] reports the hits, misses and evictions
//! ([`MemoryStats`](crate::MemoryStats)), the blocks and bytes cached (in
//! `cached_blocks` / `cached_bytes` at the device index), and counts each hit
//! in `reuses`, all threads (and the threads that exited) together. [`CudaBackend::set_device_cache`] turns the cache off and on
//! for the whole process (to compare, or to rule it out).

mod shelf;
mod thread_shelf;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use cudarc::driver::sys;
use gpupool_core::{DeviceId, StreamHandle};
#[cfg(doc)]
use gpupool_core::{MemoryBackend, StreamBackend};

use crate::backend::CudaBackend;
use crate::driver::Driver;
use crate::error::{invalid_value, CudaError};
use crate::raw;
use crate::shards::{LocalShards, ShardState, Shards};

pub(crate) use self::shelf::Shelf;
pub(crate) use self::thread_shelf::{CacheTallies, ThreadShelf};
// For the unit tests' `use super::*`.
#[cfg(test)]
use self::shelf::Put;

/// The most blocks the cache holds per device **for one thread** (the
/// blocks its stream-ordered frees put there).
pub const MAX_BLOCKS: usize = 64;

/// The most bytes the cache holds per device, all threads together; a larger
/// block is never cached.
pub const MAX_BYTES: usize = 256 << 20;

/// The step in which a thread reserves bytes of [`MAX_BYTES`] for its blocks
/// (and gives them back): the shared budget is touched only when a thread's
/// cached bytes cross a chunk, not on every free and allocation.
pub const RESERVE_CHUNK: usize = 1 << 20;

/// Whether a stream's frees may be cached at all: not the special streams
/// (legacy and per-thread default stream, whose handle names a different
/// stream on each context or thread).
#[inline]
pub(crate) fn cacheable(stream: StreamHandle) -> bool {
    !stream.is_special()
}

// ---------------------------------------------------------------------------
// The driver side

/// Process-wide switch ([`CudaBackend::set_device_cache`]).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Whether the loaded driver has `cuStreamGetId` (looked up at run time,
/// so the cache works with every CUDA version feature, and a missing symbol
/// switches it off). False until the driver has loaded.
fn supported() -> bool {
    raw::has_stream_get_id()
}

/// Whether the cache is on (switched on, and the driver can tell streams
/// apart).
#[inline]
fn active() -> bool {
    // Relaxed: a switch, not a synchronization; a call racing with it may go
    // either way, both of which are correct.
    ENABLED.load(Ordering::Relaxed) && supported()
}

/// `cuStreamGetId` of a live created stream; `None` if the driver refuses
/// or lacks the call.
///
/// # Safety
/// `stream` is a live created stream of this process's driver.
unsafe fn stream_id(stream: StreamHandle) -> Option<u64> {
    // SAFETY: a live created stream (this function's contract).
    unsafe { raw::stream_get_id(stream) }?.ok()
}

/// `cuStreamGetId` of a usable stream; `None` for a special stream (never
/// asked), or if the driver refuses or lacks the call.
///
/// # Safety
/// `stream` is a usable stream of this process's driver (live, or special).
pub(crate) unsafe fn id_of(stream: StreamHandle) -> Option<u64> {
    if stream.is_special() {
        return None;
    }
    // SAFETY: a live created stream (not special; this function's contract).
    unsafe { stream_id(stream) }
}

/// Whether `stream` is capturing a graph (or the driver cannot say, which is
/// treated the same: no caching).
///
/// # Safety
/// The driver is loaded, and `stream` is a live created stream of it.
unsafe fn capturing(stream: StreamHandle) -> bool {
    // SAFETY: a live created stream (this function's contract), which
    // carries its context.
    unsafe { CudaBackend::raw_capture_status(stream) }.map_or(true, |s| s.is_capturing())
}

/// `cuMemFreeAsync(addr, stream)`.
///
/// # Safety
/// `addr` is a device block of gpupool's pool that nothing uses after the
/// work queued on `stream` so far; `stream` is live (or a special stream of
/// the current context).
unsafe fn free_on(addr: usize, stream: StreamHandle) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    unsafe { raw::mem_free_async(addr as sys::CUdeviceptr, stream) }
}

/// The device cache of one device: a [`ThreadShelf`] per thread that frees
/// device memory in stream order, and the byte budget they share.
#[derive(Debug)]
pub(crate) struct DeviceCache {
    /// The device's index: this thread's shard is at this index of `LOCAL`.
    index: usize,
    shards: Shards<ThreadShelf>,
}

/// What the cache of a device holds and has done.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct CacheCounts {
    pub(crate) blocks: usize,
    pub(crate) bytes: usize,
    pub(crate) tallies: CacheTallies,
}

thread_local! {
    /// This thread's shards of the device caches, by device index.
    static LOCAL: LocalShards<ThreadShelf> = const { LocalShards::new() };
}

impl DeviceCache {
    pub(crate) fn new(index: usize) -> Self {
        DeviceCache {
            index,
            shards: Shards::new(),
        }
    }

    /// The byte budget's reservations.
    fn reserved(&self) -> &AtomicUsize {
        self.shards.shared()
    }

    /// Runs `f` on the calling thread's shard (registered now if it has
    /// none); `None` while the thread's locals are being destroyed.
    fn with_shard<R>(&'static self, f: impl FnOnce(&mut ThreadShelf) -> R) -> Option<R> {
        LocalShards::with_local(&LOCAL, self.index, &self.shards, f)
    }

    pub(crate) fn counts(&self) -> CacheCounts {
        let mut c = CacheCounts::default();
        self.shards.each(|t| {
            c.blocks += t.shelf.len();
            c.bytes += t.shelf.bytes();
            c.tallies += t.tallies;
        });
        c
    }

    /// A cached block of exactly `size` bytes freed on the stream `stream`
    /// is now, for an allocation in its order; `None`: ask the driver.
    ///
    /// # Safety
    /// Called with a context current; `stream` is a usable stream of the
    /// cache's device (live, of its primary context, or a special stream,
    /// which is never cached).
    pub(crate) unsafe fn take(&'static self, stream: StreamHandle, size: usize) -> Option<usize> {
        if !cacheable(stream) || !active() {
            return None;
        }
        self.with_shard(|mine| {
            let nothing_cached = mine.is_empty() && !self.shards.may_have_orphans();
            // SAFETY: (both driver calls) `active()` saw the driver loaded
            // with `cuStreamGetId`; `stream` is a live created stream (not
            // special, checked above; this function's contract).
            let found = if nothing_cached || unsafe { capturing(stream) } {
                None
            } else {
                // SAFETY: as above.
                unsafe { stream_id(stream) }.and_then(|id| {
                    mine.shelf.take(id, size).or_else(|| {
                        self.adopt(mine, id);
                        mine.shelf.take(id, size)
                    })
                })
            };
            match found {
                Some(_) => {
                    mine.tallies.hits += 1;
                    mine.release_surplus(RESERVE_CHUNK, self.reserved());
                }
                None => mine.tallies.misses += 1,
            }
            found
        })
        .flatten()
    }

    /// Moves the orphaned blocks of stream `id` (of threads that exited)
    /// into `mine`, with their reservation.
    fn adopt(&self, mine: &mut ThreadShelf, id: u64) {
        let Some(mut orphans) = self.shards.orphans() else {
            return;
        };
        let blocks = orphans.shelf.drain_stream(id);
        let bytes: usize = blocks.iter().map(|&(size, _)| size).sum();
        orphans.reserved -= bytes;
        self.shards.release_orphans(orphans);
        mine.reserved += bytes;
        for (size, addr) in blocks {
            mine.shelf.force(id, size, addr);
        }
        mine.shelf.set_max_bytes(mine.reserved);
    }

    /// Keeps `addr` (`size` bytes) freed in the order of `stream`. `false`:
    /// not kept, the caller frees it to the driver. Blocks evicted to make
    /// room are freed here, on `stream`, and counted in `frees`. Call with a
    /// context current.
    ///
    /// # Safety
    /// `addr` is a block of gpupool's pool of the device that the caller gives
    /// up, with only work already queued on `stream` still using it (the
    /// contract of a stream-ordered free); `stream` is a usable stream of the
    /// cache's device (live, of its primary context, or a special stream).
    pub(crate) unsafe fn put(
        &'static self,
        stream: StreamHandle,
        addr: usize,
        size: usize,
        frees: &AtomicU64,
    ) -> bool {
        // SAFETY: `active()` saw the driver loaded with `cuStreamGetId`;
        // `stream` is a live created stream (not special, checked first;
        // this function's contract).
        if !cacheable(stream) || !active() || unsafe { capturing(stream) } {
            return false;
        }
        // SAFETY: as above.
        let Some(id) = (unsafe { stream_id(stream) }) else {
            return false;
        };
        let Some(put) = self.with_shard(|mine| {
            mine.reserve_for(size, self.reserved());
            let put = mine.shelf.put(id, size, addr);
            mine.tallies.evictions += put.evicted.len() as u64 + u64::from(put.refused.is_some());
            put
        }) else {
            return false;
        };
        for old in put.evicted {
            // SAFETY: `old` was freed earlier in the order of the stream with
            // id `id`, which is `stream` (ids are never reused), so every use
            // of it was ordered before a point `stream` has already queued;
            // `stream` is live (this call's contract). If the free fails, the
            // block stays with the driver's pool unfreed until the context
            // goes away (only a broken or exiting context fails here).
            if unsafe { free_on(old, stream) }.is_ok() {
                // Relaxed: statistics.
                frees.fetch_add(1, Ordering::Relaxed);
            }
        }
        put.refused.is_none()
    }

    /// Frees every block cached for `stream`, on every thread's shard and
    /// among the orphans, with `cuMemFreeAsync` on it. Returns how many.
    ///
    /// # Safety
    /// Called with a context current; `stream` is a usable stream of the
    /// cache's device (live, of its primary context, or a special stream,
    /// which has nothing cached).
    pub(crate) unsafe fn forget(
        &self,
        stream: StreamHandle,
        frees: &AtomicU64,
    ) -> Result<usize, CudaError> {
        // Relaxed: a hint; nothing is cached anywhere while nothing is
        // reserved, and the frees the caller wants handled happen-before
        // this call (the reservation for them was made before them).
        if !cacheable(stream) || self.reserved().load(Ordering::Relaxed) == 0 || !supported() {
            return Ok(0);
        }
        // SAFETY: `supported()` saw the driver loaded with `cuStreamGetId`;
        // `stream` is a live created stream (not special, checked above;
        // this function's contract).
        if unsafe { capturing(stream) } {
            // A free now would become a graph node.
            return Err(capture_unsupported());
        }
        // SAFETY: as above.
        let Some(id) = (unsafe { stream_id(stream) }) else {
            return Err(invalid_value());
        };
        let mut blocks = Vec::new();
        self.shards
            .each(|t| blocks.extend(t.drain_stream(id, self.reserved())));
        // SAFETY: the blocks were freed in the order of the stream with id
        // `id`, which is `stream` (ids are never reused), so every use of them
        // is ordered before the work queued on it so far; it is live.
        unsafe { self.give_back(blocks, stream, frees) }
            .map(|(n, _)| n)
            .map_err(|(e, left)| {
                self.reshelve(left.into_iter().map(|(size, addr)| (id, size, addr)));
                e
            })
    }

    /// Frees every cached block of `device`, whatever its stream and thread:
    /// waits for the primary context's work, then frees them on `private`
    /// (the backend's private stream of the device). Returns how many, and
    /// their bytes. Nothing is synchronized when nothing is cached.
    ///
    /// # Safety
    /// `private` is a live stream of `device`'s primary context that is
    /// never destroyed (the backend's private stream).
    pub(crate) unsafe fn trim(
        &self,
        drv: &Driver,
        device: DeviceId,
        private: StreamHandle,
        frees: &AtomicU64,
    ) -> Result<(usize, usize), CudaError> {
        let mut blocks = Vec::new();
        self.shards
            .each(|t| blocks.extend(t.drain_all(self.reserved())));
        if blocks.is_empty() {
            return Ok((0, 0));
        }
        let mut left = Vec::new();
        let done = drv.with_context(device, |_| {
            // Waits for all work of the primary context (the context of
            // every stream a block was freed on, the module's contract), work
            // left on destroyed streams included.
            if let Err(e) = raw::ctx_synchronize() {
                left = core::mem::take(&mut blocks);
                return Err(e);
            }
            // SAFETY: every use of every block was queued before its
            // stream-ordered free, and all of that work has finished: any
            // stream may free them now; `private` is live (this function's
            // contract) and its primary context is current.
            let freed = unsafe {
                self.give_back(
                    blocks.iter().map(|&(_, size, addr)| (size, addr)).collect(),
                    private,
                    frees,
                )
            }
            .map_err(|(e, rest)| {
                left = blocks
                    .iter()
                    .filter(|b| rest.iter().any(|r| r.1 == b.2))
                    .copied()
                    .collect();
                e
            })?;
            // SAFETY: `private` is live (this function's contract); lets a
            // following pool trim see the frees.
            unsafe { raw::stream_synchronize(private) }?;
            Ok(freed)
        });
        // Not freed: still ours, kept for a later try.
        self.reshelve(left);
        done
    }

    /// Frees `blocks` (size, address) on `stream`, counting them in
    /// `frees`. Returns how many and their bytes; on a failure, the error
    /// and the blocks not freed (the failed one first).
    ///
    /// # Safety
    /// Called with a context current; `stream` is a live stream of the
    /// cache's device; every block is one of gpupool's pool of the device, given
    /// up by the cache, and every use of it is ordered before the work queued
    /// on `stream` so far.
    unsafe fn give_back(
        &self,
        blocks: Vec<(usize, usize)>,
        stream: StreamHandle,
        frees: &AtomicU64,
    ) -> Result<(usize, usize), GiveBackError> {
        let mut freed = (0, 0);
        let mut rest = blocks.into_iter();
        let mut failed = None;
        for (size, addr) in rest.by_ref() {
            // SAFETY: this function's contract: every use of the block is
            // ordered before the work queued on `stream` so far (it was freed
            // in the order of `stream` itself, or all work has finished),
            // and `stream` is live.
            match unsafe { free_on(addr, stream) } {
                Ok(()) => {
                    freed.0 += 1;
                    freed.1 += size;
                }
                Err(e) => {
                    failed = Some((e, (size, addr)));
                    break;
                }
            }
        }
        // Relaxed: statistics.
        frees.fetch_add(freed.0 as u64, Ordering::Relaxed);
        match failed {
            None => Ok(freed),
            Some((e, first)) => Err((e, std::iter::once(first).chain(rest).collect())),
        }
    }

    /// Keeps blocks (stream id, size, address) that could not be given back
    /// among the orphans, reserved whatever the budget says (the bound is
    /// exceeded until they go).
    fn reshelve(&self, blocks: impl IntoIterator<Item = (u64, usize, usize)>) {
        let mut blocks = blocks.into_iter().peekable();
        if blocks.peek().is_none() {
            return;
        }
        let mut kept = ThreadShelf::default();
        for (stream, size, addr) in blocks {
            kept.shelf.force(stream, size, addr);
            kept.reserved += size;
        }
        // Relaxed: see `ThreadShelf::reserve_for`.
        self.reserved().fetch_add(kept.reserved, Ordering::Relaxed);
        let mut orphans = self.shards.lock_orphans();
        orphans.absorb(&mut kept, self.reserved());
        self.shards.release_orphans(orphans);
    }
}

/// A failed [`DeviceCache::give_back`]: the error, and the blocks (size,
/// address) not freed.
type GiveBackError = (CudaError, Vec<(usize, usize)>);

/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
fn capture_unsupported() -> CudaError {
    CudaError::Driver(cudarc::driver::result::DriverError(
        sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    ))
}

impl CudaBackend {
    /// Turns the device cache ([`device_cache`](self)) on or off for the
    /// whole process (on by default). Off, stream-ordered device calls go
    /// to the driver; blocks already cached stay until their stream is
    /// destroyed or forgotten, or [`trim_memory`](Self::trim_memory).
    pub fn set_device_cache(&self, enabled: bool) {
        // Relaxed: see `active`.
        ENABLED.store(enabled, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
