//! Device memory from the device's default memory pool: the pool (its
//! release threshold raised on first use), the private stream of the
//! host-order calls, and allocation and free in front of which sits the
//! [device cache](crate::device_cache). The why is in the parent module's
//! documentation ("Device memory").

use std::sync::atomic::Ordering;

use cudarc::driver::result;
use cudarc::driver::sys;
use gpupool_core::{DeviceId, StreamBackend, StreamHandle, StreamOptions};

use super::{invalid_value, not_supported, raw_stream, teardown_ok, DeviceMemory};
use crate::driver::Driver;
use crate::error::{check, CudaError};
use crate::CudaBackend;

impl DeviceMemory {
    /// The device's default memory pool, its release threshold raised on
    /// first use.
    fn mempool(&self, drv: &Driver, device: DeviceId) -> Result<sys::CUmemoryPool, CudaError> {
        if let Some(&p) = self.mempool.get() {
            return Ok(p as sys::CUmemoryPool);
        }
        let made = drv.with_context(device, |_| {
            let ordinal = i32::try_from(device.0).map_err(|_| invalid_value())?;
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
            // SAFETY: as above.
            let pool = unsafe { result::device::get_default_mem_pool(dev) }?;
            let mut threshold: u64 = u64::MAX;
            // SAFETY: `pool` is the device's default pool, which lives as
            // long as the process; the release threshold is a `cuuint64_t`,
            // which `threshold` is.
            unsafe {
                result::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&raw mut threshold).cast(),
                )
            }?;
            Ok(pool as usize)
        })?;
        // A racing thread did the same to the same pool: keep either.
        Ok(*self.mempool.get_or_init(|| made) as sys::CUmemoryPool)
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

    /// Device memory from the default pool: in the order of `stream` (from
    /// the device cache when it has a block of this size freed on the same
    /// stream), or (`None`) usable by every stream when this returns.
    ///
    /// # Safety
    /// `stream`, if any, is a usable stream of `device` (the contract of
    /// [`MemoryBackend::allocate_async`](gpupool_core::MemoryBackend::allocate_async)).
    pub(super) unsafe fn device_allocate(
        &self,
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
        // Relaxed: statistics.
        let counter = if cached {
            &self.device.reuses
        } else {
            &self.device.upstream_allocations
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(addr)
    }

    /// `cuMemAllocFromPoolAsync` on `s`, then (`wait`) synchronizing `s`.
    ///
    /// # Safety
    /// Called with `device`'s primary context current; `pool` is `device`'s
    /// default pool; `s` is a usable stream of `device`.
    unsafe fn driver_allocate(
        pool: sys::CUmemoryPool,
        s: StreamHandle,
        wait: bool,
        size: usize,
    ) -> Result<usize, CudaError> {
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `dptr` is a valid place for the address; `pool` is the
        // device's default pool; `s` is a live stream of `device` or a
        // special stream, which means the context current: `device`'s (this
        // function's contract).
        check(unsafe { sys::cuMemAllocFromPoolAsync(&mut dptr, size, pool, raw_stream(s)) })?;
        if wait {
            // SAFETY: `s` is usable (this function's contract); with `wait`,
            // it is the private stream, live for the whole process.
            if let Err(e) = check(unsafe { sys::cuStreamSynchronize(raw_stream(s)) }) {
                // SAFETY: allocated just now on `s` and never handed out.
                let _ = unsafe { sys::cuMemFreeAsync(dptr, raw_stream(s)) };
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
        &self,
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
                // SAFETY: the caller's contract (a stream-ordered free on `s`).
                if stream.is_some() && unsafe { self.cache.put(s, addr, size, frees) } {
                    return Ok(false);
                }
                // SAFETY: the caller's contract; `s` is a live stream of `device`
                // or a special stream of the context just made current.
                check(unsafe { sys::cuMemFreeAsync(addr as sys::CUdeviceptr, raw_stream(s)) })?;
                Ok(true)
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
