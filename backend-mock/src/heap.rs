//! [`Allocation`]: one block of real host memory from `std::alloc`, zeroed,
//! owned, returned to the allocator when dropped.
//!
//! This file holds the crate's allocator `unsafe`; the other `unsafe` blocks
//! are the memcpy of `copy_async` (in `backend.rs`) and the reads and writes
//! of the simulated kernel (`kernel.rs`). Everything above them (kinds,
//! stream order, hazards) is safe bookkeeping.
//!
//! Blocks are zeroed (`alloc_zeroed`), not left uninitialised: real device
//! memory has no "uninitialised" state visible to Rust (its bytes come back
//! through the driver), and the core reads scratch device memory back as any
//! `AnyBitPattern` type (`Scratchpad::to_host`), never-written bytes included.
//! Uninitialised mock blocks would make that read undefined behaviour here
//! (Miri reports it), though it is sound on a GPU.

use core::alloc::Layout;
use core::ptr::NonNull;

/// A block of `layout.size()` bytes aligned to `layout.align()`, from
/// `std::alloc::alloc_zeroed`, freed with the same layout on drop.
///
/// Invariants: `ptr` was returned by `std::alloc::alloc_zeroed(layout)`, has
/// not been freed, and `layout.size() > 0`. The block starts zeroed; the
/// mock itself writes only initialised bytes into it (copies of initialised
/// sources, by `copy_async`'s contract, and kernel outputs). The pointer keeps the allocator's
/// provenance; callers get copies of it, never a pointer rebuilt from an address.
#[derive(Debug)]
pub(crate) struct Allocation {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: an `Allocation` owns its block exclusively, like a `Box<[u8]>`; it
// never reads or writes the memory itself and hands out only the pointer value,
// so moving the owner to another thread (under the mock's lock) is sound. Any
// access through the handed-out pointer is governed by the caller's contract.
unsafe impl Send for Allocation {}

// SAFETY: a shared `&Allocation` gives access to nothing but copies of the
// pointer value and the layout (no interior mutability; the memory is neither
// read nor written through it, and only `Drop`, through `&mut`, frees it), so
// sharing one between threads, as the mock's read lock does, is sound, like
// sharing a `&Box<[u8]>`.
unsafe impl Sync for Allocation {}

impl Allocation {
    /// Allocates a zeroed block of `layout`; `None` if the size is zero or
    /// the allocator fails.
    pub(crate) fn new(layout: Layout) -> Option<Self> {
        if layout.size() == 0 {
            return None;
        }
        // SAFETY: `layout` has a nonzero size (checked above), the one
        // requirement of `alloc_zeroed`.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(raw).map(|ptr| Allocation { ptr, layout })
    }

    /// The start of the block, with the allocation's provenance.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The start address (for lookups; never turned back into a pointer).
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr().addr()
    }

    /// The size and alignment it was allocated with.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: by the type's invariants `ptr` came from `alloc_zeroed(layout)` with
        // this very layout and is freed only here, once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
