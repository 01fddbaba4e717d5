//! Each thread's shelf of freed host blocks, in front of `std::alloc`.
//!
//! A scratchpad made anew for every request asks for the same few host block
//! sizes each time, and frees them when it drops. Once the process has
//! threads (libcuda starts some), every `malloc` and `free` of the C library
//! takes a lock, and blocks of 64 KiB and more may come from fresh pages;
//! three blocks a round cost a host scratch round more than its sixteen bump
//! allocations. The shelf keeps the blocks a thread frees, exactly as they
//! were allocated (size and alignment), and hands them to the same thread's
//! next request for that layout: no lock, no atomic, no shared line.
//!
//! - **What goes on it**: a block freed in host order, or in a stream's order
//!   after the stream was synchronized (see [`DeviceMemory::deallocate`]):
//!   nothing uses it any more, as for `std::alloc::dealloc`.
//! - **Bounds**: at most [`SHELF_BLOCKS`] blocks and [`SHELF_BYTES`] bytes per
//!   thread; a block that does not fit is freed at once. A thread's blocks
//!   are freed when it exits, and the calling thread's by
//!   [`CudaBackend::trim_memory`](crate::CudaBackend::trim_memory). Another
//!   thread's shelf cannot be reached (no lock guards it), which the bounds
//!   make harmless.
//! - **Which block**: the most recently freed block of exactly the requested
//!   size and alignment (a block is freed with the layout it was allocated
//!   with, so only that layout may take it).
//!
//! [`DeviceMemory::deallocate`]: super::state::DeviceMemory

use core::cell::RefCell;
use core::ptr::NonNull;
use std::alloc::Layout;
use std::vec::Vec;

/// The most blocks one thread's shelf keeps.
pub(crate) const SHELF_BLOCKS: usize = 8;
/// The most bytes one thread's shelf keeps.
pub(crate) const SHELF_BYTES: usize = 8 << 20;

/// One thread's freed host blocks.
#[derive(Debug)]
pub(crate) struct HostShelf {
    /// Freed blocks, oldest first: each with the layout it was allocated with.
    blocks: Vec<(Layout, NonNull<u8>)>,
    /// The bytes of `blocks`.
    bytes: usize,
}

impl HostShelf {
    /// An empty shelf (no allocation until the first block is kept).
    pub(crate) const fn new() -> Self {
        HostShelf {
            blocks: Vec::new(),
            bytes: 0,
        }
    }

    /// The most recently kept block of exactly `layout`, taken off the shelf.
    pub(crate) fn take(&mut self, layout: Layout) -> Option<NonNull<u8>> {
        let i = self.blocks.iter().rposition(|(l, _)| *l == layout)?;
        let (_, ptr) = self.blocks.remove(i);
        self.bytes -= layout.size();
        Some(ptr)
    }

    /// Keeps a freed block if the bounds allow; else gives it back.
    ///
    /// # Safety
    /// `ptr` came from `std::alloc::alloc(layout)`, is not freed or kept yet,
    /// and nothing uses it any more (the contract of `dealloc`).
    pub(crate) unsafe fn keep(&mut self, layout: Layout, ptr: NonNull<u8>) -> Kept {
        if self.blocks.len() < SHELF_BLOCKS && self.bytes + layout.size() <= SHELF_BYTES {
            self.blocks.push((layout, ptr));
            self.bytes += layout.size();
            return Kept::Kept;
        }
        // SAFETY: the caller's contract.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        Kept::Freed
    }

    /// Frees every block on the shelf; returns how many and their bytes.
    pub(crate) fn clear(&mut self) -> (usize, usize) {
        let freed = (self.blocks.len(), self.bytes);
        for (layout, ptr) in self.blocks.drain(..) {
            // SAFETY: `keep`'s contract: allocated with `layout`, kept once,
            // unused since; taken off the shelf here, so freed once.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        }
        self.bytes = 0;
        freed
    }

    /// How many blocks and bytes the shelf keeps.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        (self.blocks.len(), self.bytes)
    }
}

impl Drop for HostShelf {
    fn drop(&mut self) {
        self.clear();
    }
}

/// What [`HostShelf::keep`] did with a block.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    /// On the shelf.
    Kept,
    /// Given back to `std::alloc` (the shelf was full).
    Freed,
}

std::thread_local! {
    /// The calling thread's shelf.
    static SHELF: RefCell<HostShelf> = const { RefCell::new(HostShelf::new()) };
}

/// `f` with the calling thread's shelf; `None` while the thread is exiting
/// (its shelf is gone or going) or if the shelf is in use further up this
/// thread's stack (never, but a `RefCell` says so instead of panicking).
pub(crate) fn with_shelf<R>(f: impl FnOnce(&mut HostShelf) -> R) -> Option<R> {
    SHELF
        .try_with(|s| s.try_borrow_mut().ok().map(|mut s| f(&mut s)))
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(layout: Layout) -> NonNull<u8> {
        // SAFETY: a nonzero size in every test below.
        NonNull::new(unsafe { std::alloc::alloc(layout) }).expect("host memory")
    }

    #[test]
    fn a_block_goes_only_to_its_own_layout_newest_first() {
        let mut shelf = HostShelf::new();
        let small = Layout::from_size_align(4096, 8).unwrap();
        let aligned = Layout::from_size_align(4096, 64).unwrap();
        let (a, b, c) = (block(small), block(small), block(aligned));
        // SAFETY: fresh blocks of these layouts, kept once, unused.
        unsafe {
            assert_eq!(shelf.keep(small, a), Kept::Kept);
            assert_eq!(shelf.keep(small, b), Kept::Kept);
            assert_eq!(shelf.keep(aligned, c), Kept::Kept);
        }
        assert_eq!(shelf.counts(), (3, 3 * 4096));
        assert_eq!(shelf.take(Layout::from_size_align(8192, 8).unwrap()), None);
        assert_eq!(shelf.take(small), Some(b));
        assert_eq!(shelf.take(aligned), Some(c));
        assert_eq!(shelf.take(aligned), None);
        assert_eq!(shelf.counts(), (1, 4096));
        // SAFETY: `b` and `c` were taken off the shelf and are freed once.
        unsafe {
            std::alloc::dealloc(b.as_ptr(), small);
            std::alloc::dealloc(c.as_ptr(), aligned);
        }
        // `a` is freed by the shelf's drop.
    }

    #[test]
    fn the_bounds_free_what_does_not_fit() {
        let mut shelf = HostShelf::new();
        let page = Layout::from_size_align(4096, 8).unwrap();
        for _ in 0..SHELF_BLOCKS {
            // SAFETY: a fresh block, kept once.
            assert_eq!(unsafe { shelf.keep(page, block(page)) }, Kept::Kept);
        }
        // SAFETY: as above.
        assert_eq!(unsafe { shelf.keep(page, block(page)) }, Kept::Freed);
        assert_eq!(shelf.counts(), (SHELF_BLOCKS, SHELF_BLOCKS * 4096));
        assert_eq!(shelf.clear(), (SHELF_BLOCKS, SHELF_BLOCKS * 4096));
        assert_eq!(shelf.counts(), (0, 0));
        let big = Layout::from_size_align(SHELF_BYTES + 1, 8).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { shelf.keep(big, block(big)) }, Kept::Freed);
        assert_eq!(shelf.counts(), (0, 0));
    }

    #[test]
    fn each_thread_has_its_own_shelf() {
        let page = Layout::from_size_align(4096, 8).unwrap();
        let p = block(page);
        // SAFETY: a fresh block, kept once.
        let kept = with_shelf(|s| unsafe { s.keep(page, p) });
        assert_eq!(kept, Some(Kept::Kept));
        let elsewhere = std::thread::spawn(move || with_shelf(|s| s.take(page).is_some()))
            .join()
            .unwrap();
        assert_eq!(elsewhere, Some(false), "another thread's shelf is empty");
        assert_eq!(with_shelf(|s| s.take(page)), Some(Some(p)));
        // SAFETY: taken back above, freed once.
        unsafe { std::alloc::dealloc(p.as_ptr(), page) };
    }
}
