//! Device memory from gpupool's own memory pool per device: the pool (created
//! on first use, its release threshold raised), the private stream of the
//! host-order calls, and allocation and free in front of which sits the
//! [device cache](crate::device_cache). The why is in the parent module's
//! documentation ("Device memory").

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use cudarc::driver::result;
use cudarc::driver::sys;
use gpupool_core::{DeviceId, MemoryKind, StreamBackend, StreamHandle, StreamOptions};

use super::capture::GiveBack;
use super::state::{state, DeviceMemory};
use crate::backend::CudaBackend;
use crate::driver::Driver;
use crate::error::{invalid_value, not_supported, teardown_ok, CudaError};
use crate::graph::no_capture_ends;
use crate::raw;

/// `CUmemLocation` as the CUDA headers lay it out in every version: the
/// location type, then the id. From CUDA 13.2 the id sits in an anonymous
/// union at the same offset, which cudarc's bindings for those versions spell
/// as another field; building the value through this struct works with every
/// CUDA version feature.
#[repr(C)]
struct Location {
    type_: sys::CUmemLocationType,
    id: c_int,
}

/// The location of device `ordinal`'s memory.
fn device_location(ordinal: c_int) -> sys::CUmemLocation {
    let location = Location {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    };
    // SAFETY: `CUmemLocation` is `#[repr(C)]` { the same `CUmemLocationType`,
    // then either a `c_int` id or (CUDA 13.2 and later) a `#[repr(C)]` union
    // whose `id: c_int` member starts at its first byte and which is no
    // larger than a `c_int` }: the same size (`transmute` checks it at compile
    // time), the same offsets, and every byte of the union initialised by the
    // `c_int`.
    unsafe { core::mem::transmute::<Location, sys::CUmemLocation>(location) }
}

/// The properties of gpupool's pool on device `ordinal`: ordinary device
/// memory (`CU_MEM_ALLOCATION_TYPE_PINNED`, which for a pool means resident
/// device memory, not pinned host memory), no handle for sharing between
/// processes, every other property at its default (zero).
fn pool_props(ordinal: c_int) -> sys::CUmemPoolProps {
    // SAFETY: every field of `CUmemPoolProps`, in each CUDA version cudarc
    // has bindings for, is an integer, a raw pointer, a byte array, a union
    // of integers, or an enum with a variant of value 0 (`..._INVALID`,
    // `CU_MEM_HANDLE_TYPE_NONE`): all zero bytes is a valid value, and the
    // one the CUDA documentation asks for in the fields not set below.
    let mut props: sys::CUmemPoolProps = unsafe { core::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    props.location = device_location(ordinal);
    props
}

impl DeviceMemory {
    /// gpupool's own memory pool on `device`, created on first use (once:
    /// a thread that loses the race to create it destroys its own, never
    /// used), its release threshold raised to `u64::MAX`. Never destroyed.
    fn mempool(&self, drv: &Driver, device: DeviceId) -> Result<sys::CUmemoryPool, CudaError> {
        if let Some(&p) = self.mempool.get() {
            return Ok(p as sys::CUmemoryPool);
        }
        let made = drv.with_context(device, |_| {
            let ordinal = c_int::try_from(device.0).map_err(|_| invalid_value())?;
            let dev = result::device::get(ordinal)?;
            // SAFETY: `dev` was just returned by `cuDeviceGet`.
            let supported = unsafe {
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                )
            }?;
            if supported == 0 {
                return Err(not_supported());
            }
            let props = pool_props(ordinal);
            // SAFETY: `props` is a valid `CUmemPoolProps` (`pool_props`),
            // read by the driver during the call only.
            let pool = unsafe { result::mem_pool::create(&props) }?;
            let mut threshold: u64 = u64::MAX;
            // SAFETY: `pool` was just created and is alive; the release
            // threshold is a `cuuint64_t`, which `threshold` is.
            let raised = unsafe {
                result::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&raw mut threshold).cast(),
                )
            };
            if let Err(e) = raised {
                // SAFETY: created just now, nothing allocated from it, never
                // handed out.
                let _ = unsafe { result::mem_pool::destroy(pool) };
                return Err(e.into());
            }
            Ok(pool as usize)
        })?;
        let kept = *self.mempool.get_or_init(|| made);
        if kept != made {
            // Another thread's pool won the race; ours was never used.
            let _ = drv.with_context(device, |_| {
                // SAFETY: created above by this call, nothing allocated from
                // it, never handed out: ours to destroy.
                unsafe { result::mem_pool::destroy(made as sys::CUmemoryPool) }?;
                Ok(())
            });
        }
        Ok(kept as sys::CUmemoryPool)
    }

    /// The private stream for host-order device memory calls, created on
    /// first use (non-blocking, never destroyed).
    pub(super) fn sync_stream(&self, device: DeviceId) -> Result<StreamHandle, CudaError> {
        if let Some(&s) = self.sync_stream.get() {
            return Ok(s);
        }
        let gpu = CudaBackend::new();
        let made = gpu.create_stream(device, StreamOptions::default())?;
        let kept = *self.sync_stream.get_or_init(|| made);
        if kept != made {
            // Another thread's stream won the race; ours was never used.
            // SAFETY: created just now on `device` by this backend, never
            // handed out: ours to destroy.
            let _ = unsafe { gpu.destroy_stream(made, device) };
        }
        Ok(kept)
    }

    /// Device memory from gpupool's pool: in the order of `stream` (from
    /// the device cache when it has a block of this size freed on the same
    /// stream), or (`None`) usable by every stream when this returns.
    ///
    /// # Safety
    /// `stream`, if any, is a usable stream of `device` (the contract of
    /// [`MemoryBackend::allocate_async`](gpupool_core::MemoryBackend::allocate_async)).
    pub(super) unsafe fn device_allocate(
        &'static self,
        drv: &Driver,
        device: DeviceId,
        size: usize,
        stream: Option<StreamHandle>,
    ) -> Result<usize, CudaError> {
        let pool = self.mempool(drv, device)?;
        let (s, wait) = match stream {
            Some(s) => (s, false),
            None => (self.sync_stream(device)?, true),
        };
        let attempt = || {
            drv.with_context(device, |_| {
                if !wait {
                    // SAFETY: `s` is the caller's stream, usable on `device`
                    // (this function's contract); `device`'s primary context
                    // is current.
                    if let Some(addr) = unsafe { self.cache.take(s, size) } {
                        return Ok((addr, true));
                    }
                }
                // SAFETY: `s` is the caller's stream (as above) or the private
                // stream, live for the whole process; the context is
                // `device`'s primary one.
                unsafe { Self::driver_allocate(pool, s, wait, size) }.map(|a| (a, false))
            })
        };
        let (addr, cached) = match attempt() {
            Err(e) if e.code() == Some(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => {
                // The cache's blocks are invisible to the driver's pool: give
                // them back, then try once more.
                let private = self.sync_stream(device)?;
                // SAFETY: the private stream of `device`, never destroyed.
                let (n, _) = unsafe {
                    self.cache
                        .trim(drv, device, private, &self.device.upstream_frees)
                }?;
                if n == 0 {
                    return Err(e);
                }
                attempt()?
            }
            other => other?,
        };
        if let (false, Some(s)) = (cached, stream) {
            // A driver allocation on a capturing stream is an allocation node
            // of the graph: only a free in the same capture may name it.
            // SAFETY: `s` is the caller's stream (this function's contract).
            if let Some(capture) = unsafe { Self::capture_of(drv, s, device) }? {
                self.note_graph_allocation(addr, size, capture);
            }
        }
        if !cached {
            // Relaxed: statistics. (A cache hit is counted by the calling
            // thread's shard of the cache, off the shared lines:
            // `memory_stats` adds the hits to the device reuses.)
            self.device
                .upstream_allocations
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(addr)
    }

    /// `cuMemAllocFromPoolAsync` on `s`, then (`wait`) synchronizing `s`.
    ///
    /// # Safety
    /// Called with `device`'s primary context current; `pool` is gpupool's
    /// pool of `device` ([`mempool`](Self::mempool)); `s` is a usable stream
    /// of `device`.
    unsafe fn driver_allocate(
        pool: sys::CUmemoryPool,
        s: StreamHandle,
        wait: bool,
        size: usize,
    ) -> Result<usize, CudaError> {
        // SAFETY: `pool` is gpupool's live pool of `device`; `s` is a live
        // stream of `device` or a special stream, which means the context
        // current: `device`'s (this function's contract).
        let dptr = unsafe { raw::mem_alloc_from_pool_async(size, pool, s) }?;
        if wait {
            // SAFETY: `s` is usable (this function's contract); with `wait`,
            // it is the private stream, live for the whole process.
            if let Err(e) = unsafe { raw::stream_synchronize(s) } {
                // SAFETY: allocated just now on `s` and never handed out.
                let _ = unsafe { raw::mem_free_async(dptr, s) };
                return Err(e);
            }
        }
        Ok(dptr as usize)
    }

    /// Frees device memory in the order of `stream` (into the device cache
    /// when it keeps the block), or (`None`) on the private stream.
    ///
    /// # Safety
    /// `addr` came from [`device_allocate`](Self::device_allocate) with
    /// `size`, is freed once, and only work already issued on `stream` may
    /// still use it.
    pub(super) unsafe fn device_free(
        &'static self,
        drv: &Driver,
        device: DeviceId,
        addr: usize,
        size: usize,
        stream: Option<StreamHandle>,
    ) -> Result<(), CudaError> {
        let s = match stream {
            Some(s) => s,
            None => self.sync_stream(device)?,
        };
        let frees = &self.device.upstream_frees;
        teardown_ok(
            drv.with_context(device, |_| {
                // A graph's allocation (made on a capturing stream) never
                // goes to the cache: its address is valid only while the
                // graph's work runs.
                let graph_allocation = self.forget_graph_allocation(addr);
                if stream.is_some() && graph_allocation.is_none() {
                    // SAFETY: the caller's contract (a stream-ordered free on `s`).
                    if unsafe { self.cache.put(s, addr, size, frees) } {
                        return Ok(false);
                    }
                }
                // The capture seen is still the stream's when the block is
                // freed or kept for it (no capture gpupool ends ends
                // meanwhile).
                no_capture_ends(|| {
                    let capture = match stream {
                        // SAFETY: the caller's contract: `s` is usable on
                        // `device`.
                        Some(_) => unsafe { Self::capture_of(drv, s, device) }?,
                        None => None,
                    };
                    let keep_for = match (graph_allocation, capture) {
                        // Outside any capture, a block of gpupool's: freed.
                        (None, None) => None,
                        // Inside a capture the driver frees only the graph's
                        // own allocations (a free node).
                        (Some(made), Some(now)) if made == now && now != 0 => None,
                        // A block allocated outside the capture: the graph's
                        // replays may use it whenever they run. Kept for
                        // that capture.
                        (None, Some(now)) => Some(Some((s, now))),
                        // A graph's allocation freed outside its own
                        // capture: it belongs to the graph's launches, which
                        // gpupool cannot see. Kept.
                        (Some(_), _) => Some(None),
                    };
                    if let Some(capture) = keep_for {
                        // SAFETY: a capture named here is the one `s` (usable:
                        // the caller's contract) was seen in just now;
                        // `device`'s context is current; the block is not used
                        // by gpupool again.
                        unsafe {
                            self.keep_for_graphs(
                                device,
                                MemoryKind::Device,
                                addr,
                                size,
                                GiveBack::DeviceBlock,
                                capture,
                            );
                        }
                        return Ok(false);
                    }
                    // SAFETY: the caller's contract; `s` is a live stream of
                    // `device` or a special stream of the context just made
                    // current. Inside a capture, a free node of the graph's
                    // own allocation, in the capture that made it.
                    unsafe { raw::mem_free_async(addr as sys::CUdeviceptr, s) }?;
                    Ok(true)
                })
            })
            .map(|freed| {
                if freed {
                    // Relaxed: statistics.
                    frees.fetch_add(1, Ordering::Relaxed);
                }
            }),
        )
    }
}

impl CudaBackend {
    /// gpupool's own memory pool on `device` (a `CUmemoryPool`), the one
    /// every device allocation of this backend comes from; created now if no
    /// device memory call has needed it yet. See the [memory
    /// documentation](crate::memory) ("Device memory").
    ///
    /// For reading the pool's attributes with the driver API
    /// (`cuMemPoolGetAttribute`: `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, ...), or telling an address
    /// of this pool from others (`CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`). The
    /// handle is a raw pointer: nothing in safe code can destroy the pool,
    /// and every driver call that could (`cuMemPoolDestroy`) is `unsafe`;
    /// the pool must outlive every allocation of this backend, so it is never
    /// destroyed.
    ///
    /// Errors: [`CudaError::NoDriver`], [`CudaError::DeviceOutOfRange`], and
    /// the driver's own (`CUDA_ERROR_NOT_SUPPORTED` on a device without
    /// memory pools).
    ///
    /// ```
    /// use gpupool_cuda::{CudaBackend, CudaError};
    ///
    /// match CudaBackend::new().memory_pool(gpupool_core::DeviceId(0)) {
    ///     Ok(pool) => println!("device 0's memory comes from pool {pool:p}"),
    ///     Err(CudaError::NoDriver) => println!("no CUDA driver here"),
    ///     Err(e) => println!("{e}"),
    /// }
    /// ```
    pub fn memory_pool(&self, device: DeviceId) -> Result<sys::CUmemoryPool, CudaError> {
        let (drv, mem) = state(device)?;
        mem.mempool(drv, device)
    }
}
