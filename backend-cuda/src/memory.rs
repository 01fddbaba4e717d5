//! [`MemoryBackend`] for [`CudaBackend`]: host, pinned, device and managed
//! memory, synchronously and in stream order, with the pools that make them
//! cheap to ask for again.
//!
//! | kind | allocate (host order) | allocate in stream order | free (host order) | free in stream order |
//! |---|---|---|---|---|
//! | host | the thread's shelf (same size and alignment), else `std::alloc` | the same | onto the thread's shelf, else `std::alloc::dealloc` | synchronize the stream, then as in host order |
//! | pinned | pinned pool | the same | back to the pool's free list | free at once if the stream is idle (one query), else an event on the stream and the block parked until it completes |
//! | device | device pool, then synchronize a private stream | the [device cache](crate::device_cache) (same stream, same size), else `cuMemAllocFromPoolAsync` on the stream | `cuMemFreeAsync` on a private stream | kept by the device cache, else `cuMemFreeAsync` on the stream |
//! | managed | managed pool | the same | back to the pool's free list | free at once if the stream is idle (one query), else an event on the stream and the block parked until it completes |
//!
//! ## Device memory
//!
//! Device memory comes from a **memory pool of gpupool's own** per device
//! ([`CudaBackend::memory_pool`]) through `cuMemAllocFromPoolAsync` /
//! `cuMemFreeAsync`. The pool is created on the first device allocation on
//! that device (`cuMemPoolCreate`: device memory of that device, no handle
//! for sharing between processes), under its primary context, and its release
//! threshold is raised to `u64::MAX` (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`): at
//! the default of 0, every synchronization hands the pool's memory back to
//! the OS and the next allocation costs ~100 µs instead of ~1.8 µs. A device
//! whose pool cannot be created gets that error for device memory (there is
//! no fallback to another pool).
//!
//! The device's **default** memory pool (`cuDeviceGetDefaultMemPool`, which
//! the CUDA runtime's `cudaMallocAsync` and the driver's `cuMemAllocAsync`,
//! cudarc's `alloc`, use unless the application sets another) is not
//! touched: gpupool changes nothing for other users of stream-ordered
//! allocation in the process. The memory gpupool's pool keeps for reuse is
//! its own, given back by [`CudaBackend::trim_memory`].
//!
//! The pool lives until the process exits and is never destroyed (the driver
//! releases it at exit): gpupool may allocate from it, and free into it in
//! stream order, at any time up to exit (a scratchpad dropped late, a block
//! held by the process-wide pools), so there is no point at which it is done
//! with it.
//!
//! The host-order calls use the same pool on a private non-blocking stream
//! per device, not `cuMemAlloc` / `cuMemFree`: `cuMemAlloc` costs 4.6–12 µs
//! at 64 KiB and ~65 µs at 1 MiB, and `cuMemFree` may synchronize the whole
//! device, which would stall every other thread's work. A host-order
//! allocation is `cuMemAllocFromPoolAsync` on the private stream followed by
//! `cuStreamSynchronize` of that stream (which has no other work, so this
//! waits only for a dependency the pool may have inserted to reuse memory
//! freed on another stream): the block is then usable from every stream. A
//! host-order free is `cuMemFreeAsync` on the private stream, without a wait:
//! the caller promises nothing uses the block any more, and the pool reuses
//! it once the private stream has passed the free, which is at once.
//!
//! In front of the driver's pool sits the [device cache](crate::device_cache):
//! a block freed in the order of a created stream is kept on the host,
//! tagged with the stream's id (`cuStreamGetId`) and its size, and handed
//! back to the next allocation of that size **in the order of the same
//! stream** without a driver call (the driver's own same-stream reuse rule;
//! the safety argument and the contract for destroying such streams are in
//! that module). An allocation that meets `CUDA_ERROR_OUT_OF_MEMORY` while the
//! cache holds blocks empties it (which synchronizes the device) and tries
//! once more.
//!
//! A device without memory pool support (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`
//! is 0: very old GPUs, some virtualised ones) gets `CUDA_ERROR_NOT_SUPPORTED`
//! for device memory.
//!
//! ## Pinned and managed memory
//!
//! Pinned blocks (`cuMemHostAlloc`, portable and device-mapped) and managed
//! blocks (`cuMemAllocManaged`, attached globally) come from a pool per
//! device and kind:
//!
//! - power-of-two size classes from 4 KiB (a scratchpad with the default
//!   first block size asks for power-of-two blocks, so it wastes nothing;
//!   other sizes may get up to twice what they asked for);
//! - a block freed in host order goes straight back to its class's free list;
//! - a block freed in stream order is *parked* behind an event (timing
//!   disabled, taken from the pool's own free list of events) recorded on the
//!   stream, and re-enters the free list only once a query has seen that
//!   event complete. An allocation that finds its class empty queries up to
//!   16 parked blocks of the class (resuming where the last scan stopped, so
//!   one long-running stream does not hide the others) and takes the first
//!   completed one; only then does it ask the driver. So a block is never
//!   handed out while work queued before its free may still use it;
//! - if no event can be recorded, the stream is synchronized instead;
//! - blocks are kept until the process ends or until
//!   [`CudaBackend::trim_memory`].
//!
//! Both kinds are allocated in host order even when asked in stream order:
//! the host may write them as soon as it has them.
//!
//! Pinned blocks are usable by kernels at their host address (unified
//! addressing, which every 64-bit platform CUDA supports, maps memory from
//! `cuMemHostAlloc` at the same address on every device).
//!
//! ## Host memory
//!
//! `std::alloc` with the size and alignment given, each thread's shelf of
//! freed blocks (at most 8 blocks, 8 MiB) in front: a scratchpad made anew for
//! each request gets its blocks back without the C library's lock. A
//! stream-ordered free synchronizes the stream first: nothing in gpupool frees
//! host memory that way, and with heterogeneous memory management a kernel
//! can read pageable memory, so an earlier free could not be proven safe.
//!
//! ## Alignment
//!
//! CUDA aligns every allocation to at least 256 bytes; pinned and managed
//! blocks are page-aligned in practice. A request whose alignment the block
//! does not meet (device: above 256; pinned and managed: above 4096, or a
//! block that turns out less aligned) takes `size + align` bytes and hands out
//! the aligned address inside; the original address is kept in a table per
//! device (behind a `Mutex`, consulted on a free only while it is not empty),
//! as DALI's `cuda_malloc_async_memory_resource` does.
//!
//! ## Threads, contexts, errors
//!
//! Everything here may be called from any thread at once. Allocations and
//! frees make `device`'s primary context current for the call (and restore
//! the thread's own); a copy follows the stream calls' rule (a created stream
//! carries its context). The pinned and
//! managed pools and the over-alignment table are each behind a `Mutex`: they
//! are not on the stream and event pools' hot paths, and every visit to a
//! pool replaces a driver call that costs tens of microseconds or more.
//! Nothing panics. A size of 0, an alignment that is not a power of two, or a
//! layout past `isize::MAX` is `CUDA_ERROR_INVALID_VALUE`; host memory that
//! `std::alloc` cannot provide is `CUDA_ERROR_OUT_OF_MEMORY`. A free that
//! fails leaves the block with the caller.
//!
//! ## Watching it
//!
//! [`CudaBackend::memory_stats`] counts, per device and kind, the calls made
//! to the upstream allocator (`std::alloc`, `cuMemHostAlloc`,
//! `cuMemAllocFromPoolAsync`, `cuMemAllocManaged`) and the blocks the pools
//! reused, parked and cached: a scratchpad reset loop in steady state makes
//! no upstream allocation.
//!
//! ## Example
//!
//! ```
//! use gpupool_core::{Error, Scratchpad};
//! use gpupool_cuda::{CudaBackend, CudaError};
//!
//! fn run() -> Result<(), Error<CudaError>> {
//!     let gpu = CudaBackend::new();
//!     let stream = gpupool_cuda::streams().get(0)?;
//!     let mut scratch = Scratchpad::new(&gpu, stream.order())?;
//!     for _round in 0..3 {
//!         let staging = scratch.pinned::<f32>(1024)?; // written by the host now
//!         staging.iter_mut().for_each(|x| { x.write(1.0); });
//!         let on_gpu = scratch.device::<f32>(1024)?; // used by kernels on `stream`
//!         // ... copy `staging` into `on_gpu`, launch kernels on `stream` ...
//!         # let _ = on_gpu;
//!         scratch.reset()?; // in stream order: nothing is asked of the driver next round
//!     }
//!     Ok(())
//! }
//!
//! match run() {
//!     Ok(()) => println!("done"),
//!     Err(Error::Backend { source: CudaError::NoDriver, .. }) => println!("no CUDA driver here"),
//!     Err(e) => panic!("{e}"),
//! }
//! ```

mod capture;
mod device;
mod host_shelf;
mod kinds;
mod overalign;
mod state;
mod stats;

use core::ptr::NonNull;

use cudarc::driver::sys;
use gpupool_core::{DeviceId, MemoryBackend, MemoryKind, StreamHandle};

use crate::backend::CudaBackend;
use crate::block_pool::ThreadBlocks;
use crate::driver::{driver, Driver};
use crate::error::CudaError;
use crate::graph::no_capture_ends;
use crate::raw;
use crate::shards::LocalShards;
pub(crate) use capture::current_capture;
use capture::GiveBack;
use kinds::{allocate_in, deallocate_in, BlockLayout};
use state::{state, DeviceMemory};

thread_local! {
    /// This thread's pinned and managed blocks, by device and kind (see
    /// [`DeviceMemory::host_visible`]).
    static LOCAL_BLOCKS: LocalShards<ThreadBlocks> = const { LocalShards::new() };
}

pub use stats::MemoryStats;

/// Frees the device-cache blocks of `stream` on `device` in its order
/// ([`CudaBackend::forget_stream`], and [`StreamBackend::destroy_stream`]
/// before it destroys the stream). Nothing to do, and no driver call, when no
/// memory call has touched `device` yet.
///
/// # Safety
/// `stream` is a live stream of `device`'s primary context (or a special
/// stream, which has nothing cached).
pub(crate) unsafe fn forget_stream_blocks(
    stream: StreamHandle,
    device: DeviceId,
) -> Result<usize, CudaError> {
    let drv = driver()?;
    let Some(mem) = state::existing(device) else {
        drv.device(device)?;
        return Ok(0);
    };
    drv.ensure_context(device)?;
    for kind in [MemoryKind::Pinned, MemoryKind::Managed] {
        if let Some((pool, threads, _)) = mem.host_visible(kind) {
            // SAFETY: this function's contract: a usable stream of `device`.
            unsafe { pool.forget_stream_local(threads, device, stream) };
        }
    }
    // SAFETY: this function's contract.
    unsafe { mem.cache.forget(stream, &mem.device.upstream_frees) }
}

impl CudaBackend {
    /// Gives the device blocks cached for `stream` (freed in its order; see
    /// [`device_cache`](crate::device_cache)) back to the driver, with `cuMemFreeAsync` on
    /// `stream`. Returns how many.
    ///
    /// [`destroy_stream`](gpupool_core::StreamBackend::destroy_stream) of this backend does
    /// this itself; call it before destroying a stream some other way (raw
    /// cudarc, the CUDA runtime) to have its blocks back at once rather than
    /// at the next [`trim_memory`](Self::trim_memory). Not calling it is
    /// safe: the blocks stay cached, and are never handed to another stream.
    ///
    /// A stream capturing a graph is refused
    /// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); a special stream has
    /// nothing cached (`Ok(0)`).
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` in the sense of
    /// [`CudaBackend`]'s "Raw handles" (the core traits' contract): a live
    /// stream created on `device` (on its primary context; by a
    /// `CudaBackend`, the CUDA runtime, or cudarc on that context), not
    /// destroyed before this call returns; or a special stream.
    pub unsafe fn forget_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<usize, CudaError> {
        // SAFETY: this function's contract.
        unsafe { forget_stream_blocks(stream, device) }
    }
}

/// Memory of the four kinds; see the [module documentation](self).
///
/// Sizes must be nonzero and alignments powers of two
/// (`CUDA_ERROR_INVALID_VALUE` otherwise); a device that does not exist is
/// [`CudaError::DeviceOutOfRange`]. Those are checked. What the driver cannot
/// check is the contract of the `unsafe fn`s (the trait's `# Safety` lists,
/// in the terms of [`CudaBackend`]'s "Raw handles"):
///
/// - a **stream** passed in is a stream created by a `CudaBackend`
///   (non-blocking, on the device's primary context) and still alive, or one
///   of the special streams 0, 1, 2, meaning `device`'s default streams;
/// - the **device** named is that stream's device;
/// - an **address** freed came from this backend's
///   [`allocate`](MemoryBackend::allocate) or
///   [`allocate_async`](MemoryBackend::allocate_async) for the same kind,
///   device, size and alignment, and is freed once; an address copied is
///   such a block or host memory the caller owns, valid for the copy's
///   bytes until the copy has run.
///
/// Device memory allocated in the order of a stream counts as in use by that
/// stream until the stream has reached the allocation: free it in the same
/// stream's order, or in host order only after that point (the trait's "no
/// work pending" covers the allocation itself).
///
/// Device blocks freed in the order of a created stream go to the [device
/// cache](crate::device_cache) and come back to the next allocation of the
/// same size in the order of the **same** stream (told apart by
/// `cuStreamGetId`, never by the handle value): the driver pool's own
/// same-stream reuse rule, without its calls. The contract that comes with
/// it: streams given to the stream-ordered device calls belong to the
/// device's primary context; a stream may be destroyed any way, but only
/// [`destroy_stream`](gpupool_core::StreamBackend::destroy_stream) of this backend (or
/// [`CudaBackend::forget_stream`] before destroying it elsewhere) gives its
/// cached blocks back at once; otherwise they wait for
/// [`CudaBackend::trim_memory`], which then synchronizes the device.
impl MemoryBackend for CudaBackend {
    fn allocate(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, CudaError> {
        // SAFETY: no stream.
        unsafe { allocate_in(BlockLayout::new(kind, device, size, align), None) }
    }

    /// Device memory: `cuMemFreeAsync` on the backend's private stream (no
    /// wait). Pinned and managed: back to the pool's free list.
    ///
    /// # Safety
    /// The contract of [`MemoryBackend::deallocate`] (see the impl's
    /// documentation for what it means here).
    unsafe fn deallocate(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's contract (the trait's).
        unsafe { deallocate_in(BlockLayout::new(kind, device, size, align), ptr, None) }
    }

    /// Device memory: a block of the device cache freed on the same stream
    /// with the same size, else `cuMemAllocFromPoolAsync` on `stream`. The other kinds
    /// are allocated as by [`allocate`](Self::allocate): the host may use
    /// them at once.
    ///
    /// # Safety
    /// The contract of [`MemoryBackend::allocate_async`]: `stream` is a
    /// usable stream of `device` (see the impl's documentation).
    unsafe fn allocate_async(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        size: usize,
        align: usize,
        stream: StreamHandle,
    ) -> Result<NonNull<u8>, CudaError> {
        // SAFETY: this call's contract.
        unsafe { allocate_in(BlockLayout::new(kind, device, size, align), Some(stream)) }
    }

    /// Device memory: kept by the device cache for `stream` (a created
    /// stream not capturing a graph, within the cache's bound), else
    /// `cuMemFreeAsync` on `stream`. Pinned and managed: the block is parked
    /// behind an event recorded on `stream` and reused only once the event
    /// has completed. Host: `stream` is synchronized, then the block freed.
    ///
    /// On a stream capturing a graph: a device block allocated in that
    /// capture is freed by a free node of the graph; one allocated outside
    /// it is kept while the graph can use it ([`MemoryStats::kept_for_graphs`]:
    /// the graph holds a user object for it, and
    /// [`trim_memory`](CudaBackend::trim_memory) gives it back once the graph
    /// is gone), since the graph's replays may use it whenever they run. A host, pinned or managed block must not be
    /// freed on a capturing stream (the stream cannot be synchronized or asked
    /// when the graph is done with it; a host free fails with the driver's
    /// error and the capture breaks): [`Scratchpad`](gpupool_core::Scratchpad)
    /// gives such blocks to [`keep_for_graph`](MemoryBackend::keep_for_graph).
    ///
    /// # Safety
    /// The contract of [`MemoryBackend::deallocate_async`] (see the impl's
    /// documentation for what it means here).
    unsafe fn deallocate_async(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        stream: StreamHandle,
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's contract (the trait's).
        unsafe {
            deallocate_in(
                BlockLayout::new(kind, device, size, align),
                ptr,
                Some(stream),
            )
        }
    }

    /// `cuMemcpyAsync` on `stream`: unified addressing tells the driver what
    /// kind each side is. From pageable host memory the driver stages the
    /// data before returning; into pageable host memory it returns after the
    /// copy. A side that lies in a graph's own allocation (device memory
    /// allocated on a capturing stream, not freed) is refused with
    /// [`CudaError::GraphMemory`] unless `stream` is capturing.
    ///
    /// # Safety
    /// The contract of [`MemoryBackend::copy_async`] (see the impl's
    /// documentation for what it means here).
    unsafe fn copy_async(
        &self,
        dst: NonNull<u8>,
        src: NonNull<u8>,
        size: usize,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), CudaError> {
        let (drv, mem) = state(device)?;
        if size == 0 {
            return Ok(());
        }
        // A graph's own allocation means nothing outside its graph's work: a
        // copy that names one is refused unless it is captured into that
        // graph (the capture that allocated it).
        // The capture the check saw is still the stream's when the copy is
        // issued (no capture gpupool ends ends meanwhile); a copy that names
        // no graph allocation takes no lock.
        let touches = [dst.as_ptr() as usize, src.as_ptr() as usize]
            .into_iter()
            .any(|addr| mem.graph_allocation_touched(addr, size).is_some());
        if !touches {
            // SAFETY: the caller's contract.
            return unsafe { Self::issue_copy(drv, dst, src, size, stream, device) };
        }
        no_capture_ends(|| {
            for addr in [dst.as_ptr() as usize, src.as_ptr() as usize] {
                if let Some(made) = mem.graph_allocation_touched(addr, size) {
                    // SAFETY: the caller's contract: a usable stream of `device`.
                    let now = unsafe { DeviceMemory::capture_of(drv, stream, device) }?;
                    if made == 0 || now != Some(made) {
                        return Err(CudaError::GraphMemory { addr });
                    }
                }
            }
            // SAFETY: the caller's contract.
            unsafe { Self::issue_copy(drv, dst, src, size, stream, device) }
        })
    }

    /// Counts the block in [`MemoryStats::kept_for_graphs`] and never hands
    /// it out while the graph being captured on `stream` can use it: the
    /// graph holds a CUDA user object for it, and once that graph, every
    /// executable graph made from it and their launches are gone,
    /// [`trim_memory`](CudaBackend::trim_memory) gives the block back. A
    /// device block allocated in this capture (an allocation node) is freed
    /// in it instead (a free node), so that the graph can be launched again.
    /// Where `stream` is no longer in capture `capture`, or the graph cannot
    /// be told (see [`MemoryStats::kept_for_graphs`]), the block is kept for
    /// the life of the process.
    ///
    /// # Safety
    /// The contract of [`MemoryBackend::keep_for_graph`].
    unsafe fn keep_for_graph(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        stream: StreamHandle,
        capture: u64,
    ) -> Result<(), CudaError> {
        let (drv, mem) = state(device)?;
        let how = GiveBack::Block { align };
        let addr = ptr.as_ptr() as usize;
        drv.on_stream(stream, device, || {
            // The capture seen stays the stream's until the block is freed in
            // it or given to its graph (no capture gpupool ends ends
            // meanwhile).
            no_capture_ends(|| {
                // SAFETY: the caller's contract: `stream` is usable on
                // `device`, its context current (`on_stream`).
                let now = unsafe { current_capture(stream) }?.map(|c| c.id);
                if capture == 0 || now != Some(capture) {
                    // The capture has ended (or cannot be told): its graph
                    // can no longer be given a reference.
                    // SAFETY: no stream; the block is the caller's to give up.
                    unsafe { mem.keep_for_graphs(device, kind, addr, size, how, None) };
                    return Ok(());
                }
                if kind == MemoryKind::Device && mem.allocated_in_capture(addr, capture) {
                    // SAFETY: the caller's contract (the block is the
                    // caller's, freed once, used only by work issued on
                    // `stream`): a free node of the graph's own allocation,
                    // in its own capture (checked just now, and no capture
                    // gpupool ends ends meanwhile).
                    return unsafe {
                        let b = BlockLayout::new(kind, device, size, align);
                        mem.deallocate(drv, b, ptr, Some(stream))
                    };
                }
                // SAFETY: the caller's contract: `stream` is usable and in
                // capture `capture`; the block is the caller's to give up.
                unsafe {
                    mem.keep_for_graphs(device, kind, addr, size, how, Some((stream, capture)))
                };
                Ok(())
            })
        })
    }

    /// Counts the block in [`MemoryStats::kept_for_graphs`] and keeps it for
    /// the life of the process: the graphs that may use it were captured
    /// earlier and cannot be given a reference to it any more, so nothing
    /// tells when they are gone. (A scratchpad calls this only for a round
    /// that outlived a capture it overlapped; `docs/graph-capture.md` says
    /// how to end rounds inside the capture instead.)
    ///
    /// # Safety
    /// The contract of [`MemoryBackend::keep_for_ended_captures`].
    unsafe fn keep_for_ended_captures(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) -> Result<(), CudaError> {
        let (_, mem) = state(device)?;
        let how = GiveBack::Block { align };
        // SAFETY: no stream; the block is the caller's to give up, and is
        // never given back (kept for the life of the process).
        unsafe { mem.keep_for_graphs(device, kind, ptr.as_ptr() as usize, size, how, None) };
        Ok(())
    }

    /// True while the idle probe is on ([`CudaBackend::set_idle_probe`]):
    /// each thread keeps its stream-ordered pinned and managed frees and
    /// proves them free with one stream query per batch
    /// ([`QUERY_BATCH_BLOCKS`](crate::block_pool::QUERY_BATCH_BLOCKS)), so a
    /// scratchpad reset gives its kept block back instead of asking the
    /// stream. Off, every free records an event, and a reset asks the stream
    /// as before.
    fn batches_host_reuse(&self) -> bool {
        crate::block_pool::idle_probe()
    }
}

impl CudaBackend {
    /// `cuMemcpyAsync` on `stream`.
    ///
    /// # Safety
    /// The contract of [`MemoryBackend::copy_async`].
    unsafe fn issue_copy(
        drv: &Driver,
        dst: NonNull<u8>,
        src: NonNull<u8>,
        size: usize,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), CudaError> {
        drv.on_stream(stream, device, || {
            // SAFETY: the caller's contract: both ranges are valid for `size`
            // bytes until the copy has run on `stream`, and do not overlap;
            // `stream` is a live stream of `device` or a special stream of
            // the context `Driver::on_stream` made current.
            unsafe {
                raw::memcpy_async(
                    dst.as_ptr() as usize as sys::CUdeviceptr,
                    src.as_ptr() as usize as sys::CUdeviceptr,
                    size,
                    stream,
                )
            }
        })
    }
}
