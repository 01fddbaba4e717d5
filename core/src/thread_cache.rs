//! Per-thread caches in front of a pool's shared stacks (`std` only).
//!
//! The shared stacks cost an epoch pin, a CAS on a line every thread touches,
//! a node allocation and a retirement per get+put: fine at one thread, a serial
//! point at sixteen. A runtime thread usually returns what it leased and leases
//! again soon after, so each thread keeps a few handles of one device in a
//! [`Cell`] of its own: `take` and `give` touch only that thread's cell (plain
//! loads and one uncontended swap or store), no epoch, no allocation, no shared
//! counter. A cell holds handles of one device for its whole life; a thread
//! that leases on several devices has a cell per device.
//!
//! Every handle in a cell stays reachable by the pool: cells are registered in
//! the pool's [`ThreadCache`], and [`ThreadCache::drain`] (purge, drop) swaps
//! every handle out of every cell. A handle is in at most one place: a cell
//! slot holds it until exactly one `swap` (the owner's `take` or a drain) takes
//! it out, and `give` claims an empty slot with a compare-and-swap, so no
//! handle is ever overwritten. (A plain store after a load was enough by the
//! argument "only the owner writes nonzero values", but the loom model of an
//! owner racing a drain lost a handle with it; the CAS makes the slot's
//! modification order settle the race, and the model passes.)
//!
//! A thread that exits marks its cells orphaned; the next thread that
//! registers with the pool adopts an orphaned cell, handles included, so a
//! pool used by short-lived threads does not strand handles or grow its
//! registry without bound. Pool ids are never reused, so a cell of a dropped
//! pool is never found again (threads prune such entries when they register).

use std::sync::atomic::AtomicU64;
use std::vec::Vec;

use crate::sync::{Arc, AtomicBool, AtomicUsize, Mutex, Ordering};

/// Handles one cell keeps.
pub(crate) const SLOTS: usize = 4;
/// Devices served by cells (higher device ids always use the shared stacks).
#[cfg_attr(loom, allow(dead_code))] // the pools use the cache only without loom
pub(crate) const CACHED_DEVICES: usize = 8;

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// One thread's cache for one pool and one device.
pub(crate) struct Cell {
    /// The device the handles belong to; fixed for the cell's life.
    device: usize,
    /// Handles, 0 for an empty slot. Nonzero values are written only by the
    /// owner; drains write 0 with `swap`.
    slots: [AtomicUsize; SLOTS],
    /// Leases served from this cell (written by its owner only).
    served: AtomicUsize,
    /// Leases returned into this cell (written by its owner only).
    kept: AtomicUsize,
    /// Whether a live thread owns this cell.
    owned: AtomicBool,
    /// Whether the pool is gone (set by the pool's drop).
    dead: AtomicBool,
    /// The registry's "a cell was orphaned" flag, raised when the owner exits.
    orphaned: Arc<AtomicBool>,
}

impl Cell {
    fn new(device: usize, orphaned: Arc<AtomicBool>) -> Self {
        Cell {
            orphaned,
            device,
            slots: [(); SLOTS].map(|_| AtomicUsize::new(0)),
            served: AtomicUsize::new(0),
            kept: AtomicUsize::new(0),
            owned: AtomicBool::new(true),
            dead: AtomicBool::new(false),
        }
    }

    /// Owner-only increment (no read-modify-write needed: nobody else writes).
    #[inline]
    fn bump(c: &AtomicUsize) {
        // Relaxed: a tally read only for statistics.
        c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Takes a handle, if the cell holds one. Owner only.
    #[inline]
    pub(crate) fn take(&self) -> Option<usize> {
        // Last filled first: `give` fills from the front, so this is LIFO.
        for s in self.slots.iter().rev() {
            // Relaxed pre-check: only the owner makes a slot nonzero; a drain
            // may zero it meanwhile, which the swap below settles.
            if s.load(Ordering::Relaxed) != 0 {
                // Acquire: pairs with the Release store that put the handle in
                // (this thread's own, or an exited owner's, handed over through
                // the registry's lock).
                let h = s.swap(0, Ordering::Acquire);
                if h != 0 {
                    Self::bump(&self.served);
                    return Some(h);
                }
            }
        }
        None
    }

    /// Keeps `handle` (of the cell's device) if there is room, counting it as
    /// a returned lease. Owner only.
    #[inline]
    pub(crate) fn give(&self, handle: usize) -> bool {
        let kept = self.keep(handle);
        if kept {
            Self::bump(&self.kept);
        }
        kept
    }

    /// Keeps `handle` if there is room, without counting a returned lease (a
    /// handle `put` into the pool, not returned by a lease). Owner only.
    #[inline]
    pub(crate) fn keep(&self, handle: usize) -> bool {
        debug_assert!(handle != 0);
        for s in &self.slots {
            // Relaxed pre-check: skips full slots without a read-modify-write.
            // The CAS then claims the slot only if it is still empty; it is an
            // RMW (not a plain store) so that it takes its place in the slot's
            // modification order against a concurrent drain's `swap`, and the
            // drain either takes the handle or ran before it arrived.
            // Release on success: publishes the handle to whoever swaps it out.
            if s.load(Ordering::Relaxed) == 0
                && s.compare_exchange(0, handle, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
            {
                return true;
            }
        }
        false
    }

    /// Gives the cell up: its owner is exiting, and the next thread that
    /// registers with the pool adopts it. Owner only, once, and the last thing
    /// the owner does with the cell.
    pub(crate) fn release_owner(&self) {
        // Release: the handles the thread left in the cell are published to
        // the adopter, which reads `owned` with Acquire under the registry
        // lock.
        self.owned.store(false, Ordering::Release);
        // Release: pairs with the Acquire swap in `take_orphans`.
        self.orphaned.store(true, Ordering::Release);
    }
}

/// The calling thread's cells; marks them orphaned when the thread exits.
#[cfg(not(loom))]
struct Owned(Vec<(u64, usize, Arc<Cell>)>);

#[cfg(not(loom))]
impl Drop for Owned {
    fn drop(&mut self) {
        // The cells are about to become adoptable by other threads: forget them
        // here first, so that a later thread-local destructor of this thread
        // that returns a lease cannot reach a cell it no longer owns.
        let _ = MEMO.try_with(|m| m.iter().for_each(|e| e.set(EMPTY_MEMO)));
        for (_, _, cell) in &self.0 {
            cell.release_owner();
        }
    }
}

#[cfg(not(loom))]
std::thread_local! {
    static CELLS: core::cell::RefCell<Owned> = const { core::cell::RefCell::new(Owned(Vec::new())) };
}

/// A memo entry: (pool id, device, the cell). Pool id 0 is never used.
#[cfg(not(loom))]
type Memo = (u64, usize, *const Cell);

#[cfg(not(loom))]
const EMPTY_MEMO: Memo = (0, 0, core::ptr::null());

/// Entries of the memo: enough for a thread that uses a stream pool and an
/// event pool on a device or two without evicting one another.
#[cfg(not(loom))]
const MEMO_WAYS: usize = 4;

#[cfg(not(loom))]
std::thread_local! {
    /// The calling thread's most recently used cells, found without the
    /// `RefCell` borrow and the search of [`CELLS`]. No destructor, so it is
    /// reachable until the thread is gone (and is cleared when `CELLS` is
    /// destroyed). An entry's pointer is dereferenced only when its pool id
    /// matches the pool asking, which is then alive; the pool's registry holds
    /// an `Arc` of every cell until the pool drops, so the cell is alive too.
    static MEMO: [core::cell::Cell<Memo>; MEMO_WAYS] =
        const { [const { core::cell::Cell::new(EMPTY_MEMO) }; MEMO_WAYS] };
}

/// A pool's registry of per-thread cells.
pub(crate) struct ThreadCache {
    #[cfg_attr(loom, allow(dead_code))]
    id: u64,
    /// Whether a thread adopting an orphaned cell may use the handles left in
    /// it. Events: yes. Streams kept unqueried: no (they may run the exited
    /// thread's work), so they move to `orphans` instead.
    adopt_handles: bool,
    /// Handles taken out of orphaned cells when `adopt_handles` is off.
    orphans: Mutex<Vec<(usize, usize)>>,
    /// Raised when a cell's owner exits (its cell is orphaned).
    orphaned: Arc<AtomicBool>,
    /// Every cell ever handed to a thread of this pool. Locked only to
    /// register a thread, and by drains and statistics: never on a hit.
    cells: Mutex<Vec<Arc<Cell>>>,
}

impl ThreadCache {
    /// A registry whose adopted cells keep their handles.
    pub(crate) fn new() -> Self {
        Self::with_adoption(true)
    }

    /// A registry; `adopt_handles` says whether an adopted cell's handles may
    /// be served to its new owner.
    pub(crate) fn with_adoption(adopt_handles: bool) -> Self {
        ThreadCache {
            adopt_handles,
            orphans: Mutex::new(Vec::new()),
            orphaned: Arc::new(AtomicBool::new(false)),
            // Relaxed: a unique id; nothing is published with it. (A std
            // atomic also under loom: it orders nothing the models check.)
            id: NEXT_POOL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            cells: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on the calling thread's cell of this pool for `device`,
    /// (Not under loom: loom's thread-locals make a model nondeterministic
    /// here; the models drive cells through `register` directly.)
    /// registering one first if needed. `None` for devices past
    /// [`CACHED_DEVICES`], or if the thread is exiting (no thread-locals).
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn with_cell<R>(&self, device: usize, f: impl FnOnce(&Cell) -> R) -> Option<R> {
        match self.memo(device) {
            Some(cell) => Some(f(cell)),
            None => self.with_cell_slow(device, f),
        }
    }

    /// The calling thread's cell for `device` if the memo has it: two
    /// thread-local loads and a compare, nothing shared.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn memo(&self, device: usize) -> Option<&Cell> {
        let way = Self::way(self.id, device);
        let (id, d, p) = MEMO.try_with(|m| m[way].get()).ok()?;
        if id == self.id && d == device {
            // SAFETY: entries are written only by `with_cell_slow` of this
            // thread, with a cell of pool `id` registered to this thread, and
            // cleared before the thread gives its cells up (`Owned::drop`).
            // Pool ids are never reused, and `self` is pool `id`, alive: its
            // registry holds an `Arc` of the cell until the pool drops.
            Some(unsafe { &*p })
        } else {
            None
        }
    }

    /// The memo entry for `(pool, device)`.
    #[cfg(not(loom))]
    #[inline]
    fn way(pool: u64, device: usize) -> usize {
        // Pool ids are consecutive, so pools made together (a stream pool and
        // an event pool, say) land in different entries for the same device.
        (pool as usize).wrapping_add(device) % MEMO_WAYS
    }

    #[cfg(not(loom))]
    #[cold]
    fn with_cell_slow<R>(&self, device: usize, f: impl FnOnce(&Cell) -> R) -> Option<R> {
        if device >= CACHED_DEVICES {
            return None;
        }
        CELLS
            .try_with(|cells| {
                let mut cells = cells.borrow_mut();
                let cell = match cells
                    .0
                    .iter()
                    .find(|(id, d, _)| *id == self.id && *d == device)
                {
                    Some((_, _, c)) => c.clone(),
                    None => {
                        let cell = self.register(device);
                        // Forget the cells of pools that are gone. Relaxed: a
                        // hint for pruning; a stale `false` only keeps an entry
                        // a little longer.
                        cells.0.retain(|(_, _, c)| !c.dead.load(Ordering::Relaxed));
                        cells.0.push((self.id, device, cell.clone()));
                        cell
                    }
                };
                let way = Self::way(self.id, device);
                // The entry stays valid as long as pool `self.id` lives (see
                // `memo`); if MEMO is gone the thread is exiting and the slow
                // path is taken every time, which is fine.
                let _ = MEMO.try_with(|m| m[way].set((self.id, device, Arc::as_ptr(&cell))));
                f(&cell)
            })
            .ok()
    }

    /// An orphaned cell of this pool for `device`, or a new one.
    pub(crate) fn register(&self, device: usize) -> Arc<Cell> {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        for c in cells.iter() {
            // Acquire: sees the handles the exited owner left (its Release).
            if c.device == device && !c.owned.load(Ordering::Acquire) {
                c.owned.store(true, Ordering::Relaxed);
                if !self.adopt_handles {
                    let mut orphans = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
                    for s in &c.slots {
                        // Acquire: the exited owner's Release store of the handle.
                        let h = s.swap(0, Ordering::Acquire);
                        if h != 0 {
                            orphans.push((c.device, h));
                        }
                    }
                    // Release: the next `take_orphans` collects them.
                    self.orphaned.store(true, Ordering::Release);
                }
                return c.clone();
            }
        }
        let c = Arc::new(Cell::new(device, self.orphaned.clone()));
        cells.push(c.clone());
        c
    }

    /// Takes the handles left by exited threads (when `adopt_handles` is
    /// off): `(device, handle)` pairs. Cheap when no thread exited since the
    /// last call (one flag).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn take_orphans(&self) -> Vec<(usize, usize)> {
        // Acquire: pairs with the exiting owner's Release, so its handles are
        // visible to the swaps below.
        // Relaxed pre-check: a plain load keeps the common case (no thread
        // exited) off the flag's line; a flag raised meanwhile is seen next time.
        if !self.orphaned.load(Ordering::Relaxed) || !self.orphaned.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        if !self.adopt_handles {
            let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
            let mut orphans = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
            for c in cells.iter() {
                // Acquire: as above, per cell.
                if !c.owned.load(Ordering::Acquire) {
                    for s in &c.slots {
                        let h = s.swap(0, Ordering::Acquire);
                        if h != 0 {
                            orphans.push((c.device, h));
                        }
                    }
                }
            }
        }
        core::mem::take(&mut *self.orphans.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes every handle out of every cell (and the orphans): `(device,
    /// handle)` pairs.
    pub(crate) fn drain(&self) -> Vec<(usize, usize)> {
        let mut out = core::mem::take(&mut *self.orphans.lock().unwrap_or_else(|e| e.into_inner()));
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        for c in cells.iter() {
            for s in &c.slots {
                // Acquire: pairs with the owner's Release store of the handle;
                // the swap makes this drain its only taker.
                let h = s.swap(0, Ordering::Acquire);
                if h != 0 {
                    out.push((c.device, h));
                }
            }
        }
        out
    }

    /// Leases served from and returned into cells, for `device`.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn counts(&self, device: usize) -> (usize, usize) {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells
            .iter()
            .filter(|c| c.device == device)
            .fold((0, 0), |(s, k), c| {
                // Relaxed: independent tallies.
                (
                    s.wrapping_add(c.served.load(Ordering::Relaxed)),
                    k.wrapping_add(c.kept.load(Ordering::Relaxed)),
                )
            })
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        for c in cells.iter() {
            // Relaxed: threads only use it to prune their list.
            c.dead.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn take_is_lifo_give_fills_and_drain_empties() {
        let cache = ThreadCache::new();
        let cell = cache.register(0);
        assert!(cell.give(1) && cell.give(2));
        assert_eq!(cell.take(), Some(2));
        assert_eq!(cell.take(), Some(1));
        assert_eq!(cell.take(), None);
        assert!(cell.give(2));
        assert_eq!(cache.drain(), [(0, 2)]);
        assert_eq!(cell.take(), None);
        for h in 1..=SLOTS {
            assert!(cell.give(h));
        }
        assert!(!cell.give(99), "full");
        assert_eq!(cache.drain().len(), SLOTS);
    }
}
