//! Safe wrappers around the crate's private lock-free stacks, for the loom
//! models and stress tests in other crates of this workspace. Not part of the
//! public API: names and shapes may change at any time.

use alloc::vec::Vec;

use crate::stack::{Bag, Stack};
use crate::sync::epoch::Collector;

/// A Treiber stack together with the collector its pops pin, so that every pop is
/// protected by the right collector.
pub struct GuardedStack<T> {
    stack: Stack<T>,
    collector: Collector,
}

impl<T> GuardedStack<T> {
    /// An empty stack with its own collector.
    pub fn new() -> Self {
        GuardedStack {
            stack: Stack::new(),
            collector: Collector::new(),
        }
    }

    /// Pushes an item.
    pub fn push(&self, value: T) {
        self.stack.push(value)
    }

    /// Pops the top item, pinning the stack's own collector.
    pub fn pop(&self) -> Option<T> {
        let handle = self.collector.register();
        let guard = handle.pin();
        self.stack.pop(&guard)
    }

    /// Takes every item, top first.
    pub fn drain(&self) -> Vec<T> {
        let handle = self.collector.register();
        let guard = handle.pin();
        self.stack.drain(&guard)
    }

    /// Moves every item of `bag` onto this stack, reusing the bag's nodes.
    pub fn take_from(&self, bag: &PushOnlyBag<T>) -> usize {
        let mut chain = bag.bag.take_all();
        let mut n = 0;
        while self.stack.push_from(&mut chain) {
            n += 1;
        }
        n
    }
}

impl<T> Default for GuardedStack<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A push-and-take-all bag: push, and take everything at once.
pub struct PushOnlyBag<T> {
    bag: Bag<T>,
}

impl<T> PushOnlyBag<T> {
    /// An empty bag.
    pub fn new() -> Self {
        PushOnlyBag { bag: Bag::new() }
    }

    /// Pushes an item.
    pub fn push(&self, value: T) {
        self.bag.push(value)
    }

    /// Takes every item, top first.
    pub fn take_all(&self) -> Vec<T> {
        let mut chain = self.bag.take_all();
        let mut out = Vec::new();
        while let Some(v) = chain.pop_first() {
            out.push(v);
        }
        out
    }
}

impl<T> Default for PushOnlyBag<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A pool's per-thread cache with its cells driven directly (no
/// thread-locals), for the loom models of owners, registrations, thread exits
/// and adoptions racing drains.
#[cfg(feature = "std")]
pub struct CacheModel {
    cache: crate::thread_cache::ThreadCache,
}

#[cfg(feature = "std")]
impl CacheModel {
    /// An empty cache whose adopted cells keep their handles (the event
    /// pool's, and the stream pool's by default: its cells keep streams found
    /// idle when they came back).
    pub fn new() -> Self {
        CacheModel {
            cache: crate::thread_cache::ThreadCache::new(),
        }
    }

    /// An empty cache whose adopted cells' handles go to the orphans (the
    /// stream pool's with `same_thread_reuse`, whose cells keep streams
    /// unqueried: they may still run the exited thread's work).
    pub fn without_adoption() -> Self {
        CacheModel {
            cache: crate::thread_cache::ThreadCache::with_adoption(false),
        }
    }

    /// A cell for `device` (the owner's, in the model): registers one, as a
    /// thread's first lease on the pool does; that adopts a cell whose owner
    /// exited, if there is one.
    pub fn cell(&self, device: usize) -> CellModel {
        CellModel(self.cache.register(device))
    }

    /// Takes every handle from every cell, as purge does.
    pub fn drain(&self) -> Vec<usize> {
        self.cache.drain().into_iter().map(|(_, h)| h).collect()
    }

    /// Takes the handles exited owners left, as the stream pool's `get` does
    /// before it goes to the shared lists.
    pub fn take_orphans(&self) -> Vec<usize> {
        self.cache
            .take_orphans()
            .into_iter()
            .map(|(_, h)| h)
            .collect()
    }

    /// Leases served from and returned into `device`'s cells, as the pools'
    /// statistics add them: `(served, kept)`.
    pub fn served_and_kept(&self, device: usize) -> (usize, usize) {
        self.cache.counts(device)
    }
}

#[cfg(feature = "std")]
impl Default for CacheModel {
    fn default() -> Self {
        Self::new()
    }
}

/// One cell; only its owner may call [`take`](Self::take), [`give`](Self::give)
/// and [`exit`](Self::exit).
#[cfg(feature = "std")]
pub struct CellModel(crate::sync::Arc<crate::thread_cache::Cell>);

#[cfg(feature = "std")]
impl CellModel {
    /// The owner takes a handle.
    pub fn take(&self) -> Option<usize> {
        self.0.take()
    }

    /// The owner keeps a handle; `false` if the cell is full.
    pub fn give(&self, handle: usize) -> bool {
        self.0.give(handle)
    }

    /// The owner leases a handle in place (the event pool's fast path): the
    /// slot stays claimed until the returned [`InPlaceModel`] ends the lease,
    /// on any thread.
    pub fn lease(&self) -> Option<(usize, InPlaceModel)> {
        let (h, slot) = self.0.lease()?;
        let index = self
            .0
            .slot_index(slot)
            .expect("lease returns one of the cell's own slots");
        Some((
            h,
            InPlaceModel {
                cell: self.0.clone(),
                index,
            },
        ))
    }

    /// Which cell this is: a thread that adopts a cell gets the exited
    /// owner's, with the same id (ids are not reused while the cache lives).
    pub fn id(&self) -> usize {
        crate::sync::Arc::as_ptr(&self.0) as usize
    }

    /// The owner thread exits: the cell is orphaned, as the thread-local
    /// destructor of an exiting thread does, and the next registration for its
    /// device adopts it.
    pub fn exit(self) {
        self.0.release_owner()
    }
}

/// An in-place lease of a cell slot ([`CellModel::lease`]); may be sent to
/// another thread, which ends it.
#[cfg(feature = "std")]
pub struct InPlaceModel {
    cell: crate::sync::Arc<crate::thread_cache::Cell>,
    index: usize,
}

#[cfg(feature = "std")]
impl InPlaceModel {
    /// Ends the lease, putting `handle` (the leased one) back, as the event
    /// lease's drop does.
    pub fn unlease(self, handle: usize) {
        crate::thread_cache::unlease(self.cell.slot(self.index), handle)
    }

    /// Ends the lease without putting the handle back, as `release` and
    /// `discard` do.
    pub fn vacate(self) {
        crate::thread_cache::vacate(self.cell.slot(self.index))
    }
}
