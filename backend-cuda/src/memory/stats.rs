//! Watching and trimming the memory held: [`MemoryStats`] and
//! [`CudaBackend::memory_stats`], which reads the counters each kind keeps per
//! device together with what the pools and the device cache hold, and
//! [`CudaBackend::trim_memory`], which gives that memory back.

use std::sync::atomic::Ordering;

use cudarc::driver::sys;
use gpupool_core::{DeviceId, MemoryKind};

use super::host_shelf::with_shelf;
use super::state::state;
use crate::backend::CudaBackend;
use crate::error::CudaError;
use crate::raw;

/// What [`CudaBackend`]'s memory has asked of its upstream allocators on one
/// device, and what its pools hold. Every array is indexed by
/// [`MemoryKind::index`] (host, pinned, device, managed).
///
/// The upstream allocators are `std::alloc` (host), `cuMemHostAlloc`
/// (pinned), `cuMemAllocFromPoolAsync` on gpupool's own memory pool of the
/// device ([`CudaBackend::memory_pool`]; a driver call even when the pool has
/// the memory), and
/// `cuMemAllocManaged` (managed). The counters cover every caller in the
/// process, not one scratchpad.
///
/// ```
/// use gpupool_core::MemoryKind;
/// use gpupool_cuda::{CudaBackend, CudaError};
///
/// match CudaBackend::new().memory_stats(gpupool_core::DeviceId(0)) {
///     Ok(stats) => println!(
///         "{} pinned blocks from cuMemHostAlloc so far",
///         stats.upstream_allocations[MemoryKind::Pinned.index()]
///     ),
///     Err(CudaError::NoDriver) => println!("no CUDA driver here"),
///     Err(e) => println!("{e}"),
/// }
/// ```
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Blocks taken from the upstream allocator, per kind.
    pub upstream_allocations: [u64; 4],
    /// Blocks given back to the upstream allocator, per kind (pinned and
    /// managed: only by [`CudaBackend::trim_memory`]).
    pub upstream_frees: [u64; 4],
    /// Blocks the pinned and managed pools, and the device cache, handed out
    /// again instead of asking the driver.
    pub reuses: [u64; 4],
    /// Pinned and managed blocks waiting for their stream-ordered free to
    /// complete.
    pub parked_blocks: [usize; 4],
    /// Free pinned and managed blocks held for reuse, and device blocks held
    /// by the device cache.
    pub cached_blocks: [usize; 4],
    /// The bytes of those free blocks.
    pub cached_bytes: [usize; 4],
    /// Stream-ordered device allocations the [device
    /// cache](crate::device_cache) answered.
    pub device_cache_hits: u64,
    /// Stream-ordered device allocations on a created stream that the
    /// device cache (when on) could not answer: they asked the driver.
    pub device_cache_misses: u64,
    /// Device blocks the cache gave to the driver to stay within its bound:
    /// older blocks of the freeing stream, or the freed block itself.
    pub device_cache_evictions: u64,
    /// Blocks freed in the order of a stream that was capturing a graph
    /// (and, for device memory, not allocated in that capture), per kind,
    /// not given back yet: the graph's replays may use them whenever they
    /// run, so they are never handed out while it can run. The graph holds a
    /// CUDA user object for each; once the graph, every executable graph made
    /// from it and their launches are gone, [`CudaBackend::trim_memory`]
    /// gives the block back. A block whose graph could not be told (a device
    /// block of a graph freed outside its capture, or a build whose CUDA
    /// version the crate's features do not name) is kept for the life of the
    /// process. See `docs/graph-capture.md`.
    pub kept_for_graphs: [usize; 4],
    /// The bytes of those blocks.
    pub kept_for_graphs_bytes: [usize; 4],
}

impl MemoryStats {
    /// Upstream allocations of every kind together.
    pub fn total_upstream_allocations(&self) -> u64 {
        self.upstream_allocations.iter().sum()
    }
}

impl CudaBackend {
    /// What the memory calls have asked of the upstream allocators on
    /// `device` so far, and what the pinned and managed pools and the device
    /// cache hold ([`MemoryStats`]). Cheap (relaxed counters and three short
    /// locks).
    pub fn memory_stats(&self, device: DeviceId) -> Result<MemoryStats, CudaError> {
        let (_, mem) = state(device)?;
        let mut s = MemoryStats::default();
        for kind in MemoryKind::ALL {
            let c = mem.counters(kind);
            let i = kind.index();
            s.upstream_allocations[i] = c.upstream_allocations.load(Ordering::Relaxed);
            s.upstream_frees[i] = c.upstream_frees.load(Ordering::Relaxed);
            s.reuses[i] = c.reuses.load(Ordering::Relaxed);
        }
        for kind in [MemoryKind::Pinned, MemoryKind::Managed] {
            let Some((pool, threads, _)) = mem.host_visible(kind) else {
                continue;
            };
            let counts = pool.counts();
            let local = pool.local_counts(threads);
            let i = kind.index();
            s.parked_blocks[i] = counts.parked_blocks + local.pending_blocks;
            s.cached_blocks[i] = counts.free_blocks + local.free_blocks;
            s.cached_bytes[i] = counts.free_bytes + local.free_bytes;
            s.reuses[i] += local.reuses;
        }
        let cache = mem.cache.counts();
        let i = MemoryKind::Device.index();
        s.cached_blocks[i] = cache.blocks;
        s.cached_bytes[i] = cache.bytes;
        s.device_cache_hits = cache.tallies.hits;
        s.reuses[i] += cache.tallies.hits;
        s.device_cache_misses = cache.tallies.misses;
        s.device_cache_evictions = cache.tallies.evictions;
        (s.kept_for_graphs, s.kept_for_graphs_bytes) = mem.kept_for_graphs();
        Ok(s)
    }

    /// Gives the memory held for reuse on `device` back to the driver: every
    /// free pinned and managed block (parked blocks whose event has completed
    /// included; those still waiting stay), every pinned and managed block the
    /// threads keep for a stream query that has not come yet (when there are
    /// any, this first **synchronizes the device's primary context**: their
    /// streams may be gone), the idle events of those pools,
    /// every block of the [device cache](crate::device_cache) (when it holds
    /// any, this first **synchronizes the device's primary context**: the
    /// blocks' streams may be gone), and the unused memory of gpupool's own
    /// memory pool on `device` ([`memory_pool`](Self::memory_pool),
    /// `cuMemPoolTrimTo(pool, 0)`; the device's default pool is not
    /// touched). First, the blocks kept for graphs that are gone
    /// ([`MemoryStats::kept_for_graphs`]) go back where they came from (when
    /// there are any, after **synchronizing the device's primary context**:
    /// work issued before a capture may still use them). The calling
    /// thread's freed host blocks (its shelf: at most 8 blocks and 8 MiB,
    /// whichever device they were asked for) go back to `std::alloc` too;
    /// another thread's go when it exits. Returns the bytes freed (pinned,
    /// managed, device cache, the calling thread's host shelf, and the host
    /// and device blocks of gone graphs).
    ///
    /// Without it, the memory is kept until the process exits. Later
    /// allocations take new blocks from the driver again.
    ///
    /// ```
    /// use gpupool_cuda::{CudaBackend, CudaError};
    ///
    /// match CudaBackend::new().trim_memory(gpupool_core::DeviceId(0)) {
    ///     Ok(bytes) => println!("{bytes} bytes of pinned and managed memory freed"),
    ///     Err(CudaError::NoDriver) => println!("no CUDA driver here"),
    ///     Err(e) => println!("{e}"),
    /// }
    /// ```
    pub fn trim_memory(&self, device: DeviceId) -> Result<usize, CudaError> {
        let (drv, mem) = state(device)?;
        let mut freed = 0;
        let mut first_error = None;
        // Blocks kept for graphs that are gone, back where they came from
        // first (the pinned and managed ones to their pools, trimmed below).
        match mem.give_back_graphs_blocks(drv) {
            Ok(n) => freed += n,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
        if let Some((blocks, bytes)) = with_shelf(|s| s.clear()) {
            freed += bytes;
            // Relaxed: an independent tally, read only for statistics.
            mem.host
                .upstream_frees
                .fetch_add(blocks as u64, Ordering::Relaxed);
        }
        for kind in [MemoryKind::Pinned, MemoryKind::Managed] {
            let Some((pool, threads, _)) = mem.host_visible(kind) else {
                continue;
            };
            // The threads' blocks first: the free ones to the pool's lists;
            // those still waiting for a query of their stream (which may be
            // gone) are proven free by a synchronization of the context.
            let pending = pool.drain_local(threads);
            if !pending.is_empty() {
                // Waits for all work of the primary context, work left on
                // destroyed streams included.
                let synced = drv.with_context(device, |_| raw::ctx_synchronize());
                match synced {
                    // SAFETY: every block was freed in the order of a stream
                    // of the primary context, whose work has all finished:
                    // nothing uses them any more.
                    Ok(()) => unsafe { pool.give_all(pending) },
                    Err(e) => {
                        first_error.get_or_insert(e);
                        // SAFETY: the pending blocks `drain_local` returned,
                        // kept once.
                        unsafe { pool.keep_pending(threads, pending) };
                    }
                }
            }
            match pool.trim(device) {
                Ok(n) => freed += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if mem.cache.counts().blocks > 0 {
            let cache_trim = mem.sync_stream(device).and_then(|private| {
                // SAFETY: the private stream of `device`, never destroyed.
                unsafe {
                    mem.cache
                        .trim(drv, device, private, &mem.device.upstream_frees)
                }
            });
            match cache_trim {
                Ok((_, bytes)) => freed += bytes,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(&pool) = mem.mempool.get() {
            let trimmed = drv.ensure_context(device).and_then(|()| {
                // SAFETY: gpupool's pool of `device`, never destroyed;
                // trimming frees only memory no allocation holds.
                unsafe { raw::mem_pool_trim_to(pool as sys::CUmemoryPool, 0) }
            });
            if let Err(e) = trimmed {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(freed), Err)
    }
}
