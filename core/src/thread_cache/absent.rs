//! The per-thread caches without `std`: there are no thread-locals, so no
//! thread has a cell. The types keep the interface of the `std` build's
//! `thread_cache` so that the pools' code has one body in every build; a
//! [`Cell`] cannot exist (it is uninhabited), so every path through one is
//! dead code the compiler removes, and the pools use their shared lists.

use alloc::vec::Vec;
use core::convert::Infallible;
use core::marker::PhantomData;

/// A thread's cell: none exist without `std`.
pub(crate) enum Cell {}

impl Cell {
    #[inline]
    pub(crate) fn owner_mark(&self) -> usize {
        match *self {}
    }

    #[inline]
    pub(crate) fn take(&self) -> Option<usize> {
        match *self {}
    }

    #[inline]
    pub(crate) fn give(&self, _: usize) -> bool {
        match *self {}
    }

    #[inline]
    pub(crate) fn keep(&self, _: usize) -> bool {
        match *self {}
    }
}

/// An in-place lease's slot: none exist without `std`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InPlace<'a>(Infallible, PhantomData<&'a ()>);

impl InPlace<'_> {
    #[inline]
    pub(crate) fn unlease(self, _: usize) {
        match self.0 {}
    }

    #[inline]
    pub(crate) fn vacate(self) {
        match self.0 {}
    }
}

/// A pool's registry of per-thread cells: always empty without `std`.
pub(crate) struct ThreadCache;

impl ThreadCache {
    pub(crate) fn with_adoption(_: bool) -> Self {
        ThreadCache
    }

    /// No thread has a cell.
    #[inline]
    pub(crate) fn with_cell<R>(&self, _: usize, _: impl FnOnce(&Cell) -> R) -> Option<R> {
        None
    }

    /// No thread left handles behind.
    pub(crate) fn take_orphans(&self) -> Vec<(usize, usize)> {
        Vec::new()
    }

    /// No cell holds handles.
    pub(crate) fn drain(&self) -> Vec<(usize, usize)> {
        Vec::new()
    }

    /// No cell holds handles.
    pub(crate) fn drain_all(&mut self) -> Vec<(usize, usize)> {
        Vec::new()
    }

    /// No lease was served from or returned into a cell.
    pub(crate) fn counts(&self, _: usize) -> (usize, usize) {
        (0, 0)
    }
}
