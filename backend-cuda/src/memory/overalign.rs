//! The over-alignment table of a device: a request whose alignment the block
//! does not meet takes `size + align` bytes and hands out the aligned address
//! inside; the address allocated is kept in the table, under the address
//! handed out, until the free (the parent module's documentation,
//! "Alignment").

use core::ptr::NonNull;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use gpupool_core::{MemoryKind, StreamHandle};

use super::kinds::BlockLayout;
use super::state::DeviceMemory;
use crate::block_pool::MIN_BLOCK;
use crate::driver::Driver;
use crate::error::{invalid_value, out_of_memory, CudaError};

/// The alignment CUDA guarantees for every allocation.
const CUDA_ALIGN: usize = 256;

/// The alignment up to which a kind's blocks are tried as they come (and
/// checked); above it a request is over-allocated.
fn direct_align(kind: MemoryKind) -> usize {
    match kind {
        MemoryKind::Device => CUDA_ALIGN,
        _ => MIN_BLOCK,
    }
}

/// A block's address as the pointer handed out.
fn non_null(addr: usize) -> Result<NonNull<u8>, CudaError> {
    NonNull::new(addr as *mut u8).ok_or_else(out_of_memory)
}

impl DeviceMemory {
    pub(super) fn overaligned(&self) -> MutexGuard<'_, HashMap<usize, usize>> {
        self.overaligned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of `b`'s kind (not host) aligned to its alignment (layout
    /// checked).
    ///
    /// # Safety
    /// `stream`, if any, is a usable stream of `device` (the contract of
    /// [`MemoryBackend::allocate_async`](gpupool_core::MemoryBackend::allocate_async)).
    pub(super) unsafe fn allocate_aligned(
        &'static self,
        drv: &Driver,
        b: BlockLayout,
        stream: Option<StreamHandle>,
    ) -> Result<NonNull<u8>, CudaError> {
        let align = b.align();
        if align <= direct_align(b.kind()) {
            // SAFETY: this function's contract.
            let addr = unsafe { self.raw_allocate(drv, b, stream) }?;
            if addr % align == 0 {
                return non_null(addr);
            }
            // Less aligned than expected: give it back, over-allocate.
            // SAFETY: allocated just now with these arguments, never handed
            // out; a stream-ordered free is ordered after the allocation.
            unsafe { self.raw_free(drv, b, addr, stream) }?;
        }
        let total = b.size().checked_add(align).ok_or_else(invalid_value)?;
        let whole = b.with_size(total);
        // SAFETY: this function's contract.
        let raw = unsafe { self.raw_allocate(drv, whole, stream) }?;
        let Some(aligned) = raw.checked_add(align - 1).map(|a| a & !(align - 1)) else {
            // SAFETY: as above.
            unsafe { self.raw_free(drv, whole, raw, stream) }?;
            return Err(invalid_value());
        };
        // `raw <= aligned < raw + align`, so `size` bytes from `aligned` lie
        // inside the `size + align` allocated.
        let mut table = self.overaligned();
        table.insert(aligned, raw);
        self.overaligned_len.store(table.len(), Ordering::Release);
        drop(table);
        non_null(aligned)
    }

    /// Frees a block of [`allocate_aligned`](Self::allocate_aligned).
    ///
    /// # Safety
    /// `addr` came from `allocate_aligned` with the same `b`, and is freed
    /// once; with `stream`, only work already issued on it may still use the
    /// block; without, nothing does.
    pub(super) unsafe fn free_aligned(
        &'static self,
        drv: &Driver,
        b: BlockLayout,
        addr: usize,
        stream: Option<StreamHandle>,
    ) -> Result<(), CudaError> {
        // The allocation stored its entry before handing `addr` out, so a
        // nonzero count is visible here whenever `addr` is in the table.
        let raw = if self.overaligned_len.load(Ordering::Acquire) > 0 {
            let mut table = self.overaligned();
            let raw = table.remove(&addr);
            self.overaligned_len.store(table.len(), Ordering::Release);
            raw
        } else {
            None
        };
        let Some(raw) = raw else {
            // SAFETY: the caller's contract; not over-aligned, so `addr` is
            // the block `raw_allocate` returned, of `size` bytes.
            return unsafe { self.raw_free(drv, b, addr, stream) };
        };
        let total = b.size().checked_add(b.align()).ok_or_else(invalid_value);
        // SAFETY: the caller's contract; `raw` is the block `raw_allocate`
        // returned for `addr`, of `size + align` bytes.
        let freed = total.and_then(|t| unsafe { self.raw_free(drv, b.with_size(t), raw, stream) });
        if freed.is_err() {
            // Still the caller's: keep the mapping for a later free.
            let mut table = self.overaligned();
            table.insert(addr, raw);
            self.overaligned_len.store(table.len(), Ordering::Release);
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_alignments() {
        assert_eq!(direct_align(MemoryKind::Device), 256);
        assert_eq!(direct_align(MemoryKind::Pinned), 4096);
        assert_eq!(direct_align(MemoryKind::Managed), 4096);
    }
}
