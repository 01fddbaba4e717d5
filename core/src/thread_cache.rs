//! Per-thread caches in front of a pool's shared stacks (`std` only).
//!
//! The shared stacks cost an epoch pin, a CAS on a line every thread touches,
//! a node allocation and a retirement per get+put: fine at one thread, a serial
//! point at sixteen. A runtime thread usually returns what it leased and leases
//! again soon after, so each thread keeps a few handles of one device in a
//! [`Cell`] of its own: `take` and `give` touch only that thread's cell (plain
//! loads and stores, no read-modify-write), no epoch, no allocation, no
//! shared counter. A cell holds handles of one device for its whole life; a thread
//! that leases on several devices has a cell per device.
//!
//! Every handle in a cell stays reachable by the pool: cells are registered in
//! the pool's [`ThreadCache`], and [`ThreadCache::drain`] (purge, drop) takes
//! every handle out of every cell. A handle is in at most one place: a cell
//! slot holds it until one taker takes it out (a drain with a
//! compare-and-swap; the owner's `take` with a plain store, the race between
//! the two settled as described in [`in_place`]), and `give` fills only an
//! empty slot, which no other thread writes, so no handle is ever
//! overwritten.
//!
//! The event pool leases *in place* ([`Cell::lease`]): the owner replaces
//! the handle in its slot with the [`LEASED`] marker by a plain store (a
//! drain, the one thread that may compete for it, settles the race with an
//! asymmetric barrier: see [`in_place`]), and the lease ends with one plain
//! store of the handle back into that slot ([`InPlace::unlease`]), or of 0
//! ([`InPlace::vacate`]), from whichever thread holds it. While a slot holds
//! the marker nobody else writes it: `give` claims only empty slots, and
//! `lease`, `take` and the drains take only handles. A get+put is then no
//! read-modify-write at all.
//!
//! A thread that exits marks its cells orphaned; the next thread that
//! registers with the pool adopts an orphaned cell, handles included, so a
//! pool used by short-lived threads does not strand handles or grow its
//! registry without bound. Pool ids are never reused, so a cell of a dropped
//! pool is never found again (threads prune such entries when they register).

use std::sync::atomic::AtomicU64;
use std::vec::Vec;

use crate::sync::{const_thread_local, Arc, AtomicBool, AtomicUsize, Mutex, Ordering};

mod in_place;
pub(crate) use in_place::InPlace;

/// Handles one cell keeps.
pub(crate) const SLOTS: usize = 4;
/// What a slot holds while its handle is leased *in place* ([`Cell::lease`]):
/// the slot stays claimed, and only the lease writes it until it ends (the
/// lease holds the handle itself). A handle with this value is never kept in a
/// cell (it goes to the shared lists; no real handle is the all-ones word).
pub(crate) const LEASED: usize = usize::MAX;
/// Devices served by cells (higher device ids always use the shared stacks).
pub(crate) const CACHED_DEVICES: usize = 8;

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh [`Cell::owner_mark`]: never 0 (which means "no mark"), never
/// repeated (a wrap needs 2^64 registrations on 64-bit targets).
fn next_owner_mark() -> usize {
    static NEXT_MARK: AtomicU64 = AtomicU64::new(1);
    // Relaxed: a unique number; nothing is published with it. (A std atomic
    // also under loom: it orders nothing the models check.)
    NEXT_MARK.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as usize
}

/// One thread's cache for one pool and one device.
pub(crate) struct Cell {
    /// The device the handles belong to; fixed for the cell's life.
    device: usize,
    /// Names the cell's current ownership: a number no other cell and no
    /// other owner of this cell ever had (a fresh one when an exited
    /// thread's cell is adopted). A lease records it to tell, when it ends,
    /// whether it ends on the thread that took it (`same_thread_reuse`).
    /// Written only while no thread owns the cell (creation, adoption under
    /// the registry lock, which also publishes it to the new owner).
    owner_mark: AtomicUsize,
    /// Handles, 0 for an empty slot, or [`LEASED`]. The owner fills empty
    /// slots and claims handles (see [`in_place`]); an in-place lease ends
    /// by writing its handle back (or 0) from any thread; drains take
    /// handles with a compare-and-swap.
    slots: [AtomicUsize; SLOTS],
    /// Leases served from this cell by `take` (written by its owner only).
    served: AtomicUsize,
    /// Leases returned into this cell (written by its owner only).
    kept: AtomicUsize,
    /// Leases served in place (written by its owner only); those no longer
    /// marked [`LEASED`] have ended.
    in_place: AtomicUsize,
    /// Drains of this cell (see [`in_place`]): `DRAINING` while one takes
    /// handles, and below it a bit per slot that each take from the slot
    /// flips. Written by drains only.
    drain: AtomicUsize,
    /// Whether a live thread owns this cell.
    owned: AtomicBool,
    /// Whether the pool is gone (set by the pool's drop).
    dead: AtomicBool,
    /// What the cell shares with its registry.
    registry: Arc<Shared>,
}

/// What a registry shares with its cells.
struct Shared {
    /// Raised when a cell's owner exits (its cell is orphaned).
    orphaned: AtomicBool,
    /// Held by a drain from before it raises its cells' `DRAINING` bits to
    /// after it lowers them: an owner that must wait for a drain's verdict
    /// sleeps on it (see [`in_place`]).
    drain_lock: Mutex<()>,
}

impl Cell {
    fn new(device: usize, registry: Arc<Shared>) -> Self {
        Cell {
            registry,
            device,
            owner_mark: AtomicUsize::new(next_owner_mark()),
            slots: [(); SLOTS].map(|_| AtomicUsize::new(0)),
            served: AtomicUsize::new(0),
            kept: AtomicUsize::new(0),
            in_place: AtomicUsize::new(0),
            drain: AtomicUsize::new(0),
            owned: AtomicBool::new(true),
            dead: AtomicBool::new(false),
        }
    }

    /// The mark of the cell's current ownership (see the field). Owner only:
    /// what the owner reads was written before it took the cell.
    #[inline]
    pub(crate) fn owner_mark(&self) -> usize {
        // Relaxed: written before this thread became the owner (at creation,
        // or under the registry lock it took to adopt the cell).
        self.owner_mark.load(Ordering::Relaxed)
    }

    /// Owner-only increment (no read-modify-write needed: nobody else writes).
    #[inline]
    fn bump(c: &AtomicUsize) {
        // Relaxed: a tally read only for statistics.
        c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
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
        // 0 reads as an empty slot and LEASED as a leased one: such a value
        // would never be taken or drained. (No live handle is either: the
        // pools refuse null handles.) The shared lists take it instead.
        if handle == 0 || handle == LEASED {
            return false;
        }
        for s in &self.slots {
            // A plain store into an empty slot: only the owner turns an empty
            // slot into a full one, and no other thread writes an empty slot
            // (drains and `take_slot` empty full ones, a lease's end writes
            // only the slot it holds marked). Acquire: after whatever emptied
            // it (a lease's Release `vacate`, say). Release: publishes the
            // handle to whoever takes it out.
            if s.load(Ordering::Acquire) == 0 {
                s.store(handle, Ordering::Release);
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
        self.registry.orphaned.store(true, Ordering::Release);
    }
}

/// Takes the handle out of `slot` if it holds one that is not leased in place.
/// Any thread: the owner's `take`, drains, orphan collection.
#[inline]
fn take_slot(slot: &AtomicUsize) -> Option<usize> {
    // Acquire: pairs with the Release store that put the handle in (the
    // owner's `keep`, a lease's `unlease`, an exited owner's, handed over
    // through the registry's lock).
    let mut h = slot.load(Ordering::Acquire);
    while h != 0 && h != LEASED {
        // A CAS, not a swap: a slot leased in place belongs to its lease, and
        // must not be emptied under it. Acquire on success and failure: as
        // above, for the value found.
        match slot.compare_exchange_weak(h, 0, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => return Some(h),
            Err(now) => h = now,
        }
    }
    None
}

/// The calling thread's cells; marks them orphaned when the thread exits.
struct Owned(Vec<(u64, usize, Arc<Cell>)>);

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

const_thread_local! {
    static CELLS: core::cell::RefCell<Owned> = core::cell::RefCell::new(Owned(Vec::new()));
}

/// A memo entry: (pool id, device, the cell). Pool id 0 is never used.
type Memo = (u64, usize, *const Cell);

const EMPTY_MEMO: Memo = (0, 0, core::ptr::null());

/// Entries of the memo: enough for a thread that uses a stream pool and an
/// event pool on a device or two without evicting one another.
const MEMO_WAYS: usize = 4;

const_thread_local! {
    /// The calling thread's most recently used cells, found without the
    /// `RefCell` borrow and the search of [`CELLS`]. No destructor, so it is
    /// reachable until the thread is gone (and is cleared when `CELLS` is
    /// destroyed). An entry's pointer is dereferenced only when its pool id
    /// matches the pool asking, which is then alive; the pool's registry holds
    /// an `Arc` of every cell until the pool drops, so the cell is alive too.
    static MEMO: [core::cell::Cell<Memo>; MEMO_WAYS] =
        [const { core::cell::Cell::new(EMPTY_MEMO) }; MEMO_WAYS];
}

/// A pool's registry of per-thread cells.
pub(crate) struct ThreadCache {
    id: u64,
    /// Whether a thread adopting an orphaned cell may use the handles left in
    /// it. Events: yes. Streams kept unqueried: no (they may run the exited
    /// thread's work), so they move to `orphans` instead.
    adopt_handles: bool,
    /// Handles taken out of orphaned cells when `adopt_handles` is off.
    orphans: Mutex<Vec<(usize, usize)>>,
    /// The orphan flag and the drain lock, shared with the cells.
    shared: Arc<Shared>,
    /// Every cell ever handed to a thread of this pool. Locked only to
    /// register a thread, and by drains and statistics: never on a hit.
    cells: Mutex<Vec<Arc<Cell>>>,
}

impl ThreadCache {
    /// A registry; `adopt_handles` says whether an adopted cell's handles may
    /// be served to its new owner.
    pub(crate) fn with_adoption(adopt_handles: bool) -> Self {
        in_place::choose_barriers();
        ThreadCache {
            adopt_handles,
            orphans: Mutex::new(Vec::new()),
            shared: Arc::new(Shared {
                orphaned: AtomicBool::new(false),
                drain_lock: Mutex::new(()),
            }),
            // Relaxed: a unique id; nothing is published with it. (A std
            // atomic also under loom: it orders nothing the models check.)
            id: NEXT_POOL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            cells: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on the calling thread's cell of this pool for `device`,
    /// registering one first if needed. `None` for devices past
    /// [`CACHED_DEVICES`], or if the thread is exiting (no thread-locals).
    #[inline]
    pub(crate) fn with_cell<R>(&self, device: usize, f: impl FnOnce(&Cell) -> R) -> Option<R> {
        match self.memo(device) {
            Some(cell) => Some(f(cell)),
            None => self.with_cell_slow(device, f),
        }
    }

    /// The calling thread's cell for `device` if the memo has it: two
    /// thread-local loads and a compare, nothing shared.
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
    #[inline]
    fn way(pool: u64, device: usize) -> usize {
        // Pool ids are consecutive, so pools made together (a stream pool and
        // an event pool, say) land in different entries for the same device.
        (pool as usize).wrapping_add(device) % MEMO_WAYS
    }

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
    fn register(&self, device: usize) -> Arc<Cell> {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        for c in cells.iter() {
            // Acquire: sees the handles the exited owner left (its Release).
            if c.device == device && !c.owned.load(Ordering::Acquire) {
                c.owned.store(true, Ordering::Relaxed);
                // A new ownership: leases the exited owner took no longer
                // match this cell. Relaxed: published to the new owner by the
                // registry lock (released when this returns).
                c.owner_mark.store(next_owner_mark(), Ordering::Relaxed);
                if !self.adopt_handles {
                    let mut orphans = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
                    // (Acquire inside: the exited owner's Release store of the
                    // handle.)
                    orphans.extend(c.slots.iter().filter_map(take_slot).map(|h| (c.device, h)));
                    // Release: the next `take_orphans` collects them.
                    self.shared.orphaned.store(true, Ordering::Release);
                }
                return c.clone();
            }
        }
        let c = Arc::new(Cell::new(device, self.shared.clone()));
        cells.push(c.clone());
        c
    }

    /// Takes the handles left by exited threads (when `adopt_handles` is
    /// off): `(device, handle)` pairs. Cheap when no thread exited since the
    /// last call (one flag).
    pub(crate) fn take_orphans(&self) -> Vec<(usize, usize)> {
        // Acquire: pairs with the exiting owner's Release, so its handles are
        // visible to the takes below.
        // Relaxed pre-check: a plain load keeps the common case (no thread
        // exited) off the flag's line; a flag raised meanwhile is seen next time.
        let orphaned = &self.shared.orphaned;
        if !orphaned.load(Ordering::Relaxed) || !orphaned.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        if !self.adopt_handles {
            let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
            let mut orphans = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
            for c in cells.iter() {
                // Acquire: as above, per cell.
                if !c.owned.load(Ordering::Acquire) {
                    orphans.extend(c.slots.iter().filter_map(take_slot).map(|h| (c.device, h)));
                }
            }
        }
        core::mem::take(&mut *self.orphans.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes every handle out of every cell (and the orphans): `(device,
    /// handle)` pairs. Handles in the cells of live threads are taken only
    /// if the heavy barrier can be made (it fails only where the kernel
    /// refuses `membarrier` after registering the process for it: a seccomp
    /// filter on the calling thread, say); then they stay for a later drain.
    pub(crate) fn drain(&self) -> Vec<(usize, usize)> {
        self.drain_cells(true)
    }

    /// [`drain`](Self::drain) when no other thread can use the pool (its
    /// drop; every get borrows the pool, so no owner is claiming): every
    /// handle of every cell, with no barrier.
    pub(crate) fn drain_all(&mut self) -> Vec<(usize, usize)> {
        self.drain_cells(false)
    }

    /// The drains; `owners_may_race`: live owners may be claiming handles
    /// meanwhile (see `in_place`).
    fn drain_cells(&self, owners_may_race: bool) -> Vec<(usize, usize)> {
        let mut out = core::mem::take(&mut *self.orphans.lock().unwrap_or_else(|e| e.into_inner()));
        // Drains are serialised by the registry lock.
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        // Taken before any `DRAINING` is raised, released after all are
        // lowered: an owner that sees the bit can sleep on it.
        let draining = owners_may_race.then(|| {
            self.shared
                .drain_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        });
        if owners_may_race {
            for c in cells.iter() {
                // Relaxed: ordered before the takes by the heavy barrier.
                c.drain.fetch_or(in_place::DRAINING, Ordering::Relaxed);
            }
        }
        // Owners claim handles with a plain store: with the barrier, each
        // either sees `DRAINING` or has its store seen by the takes below
        // (see `in_place`). Without it, live owners' cells are left alone.
        let raced_owners_seen = !owners_may_race || in_place::heavy();
        for c in cells.iter() {
            // Acquire: as in `register`.
            if raced_owners_seen || !c.owned.load(Ordering::Acquire) {
                for (i, s) in c.slots.iter().enumerate() {
                    // The CAS in `take_slot` makes this drain the handle's
                    // only taker among drains; a handle leased in place is
                    // out, and comes back to its slot (or leaves it) when its
                    // lease ends.
                    if let Some(h) = take_slot(s) {
                        // Release: an owner that reads the flip reads the
                        // slot emptied.
                        c.drain.fetch_xor(1 << i, Ordering::Release);
                        out.push((c.device, h));
                    }
                }
            }
        }
        if owners_may_race {
            for c in cells.iter() {
                // Release: an owner that reads `DRAINING` lowered sees the
                // flips and the takes above (see `Cell::lease`).
                c.drain.fetch_and(!in_place::DRAINING, Ordering::Release);
            }
        }
        drop(draining);
        out
    }

    /// Leases served from and returned into cells, for `device`.
    pub(crate) fn counts(&self, device: usize) -> (usize, usize) {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells
            .iter()
            .filter(|c| c.device == device)
            .fold((0, 0), |(s, k), c| {
                // Relaxed: independent tallies.
                let r = |a: &AtomicUsize| a.load(Ordering::Relaxed);
                // In-place leases end without a tally: those not marked any
                // more have ended.
                let out = c.slots.iter().filter(|x| r(x) == LEASED).count();
                // (Saturating: an owner's `lease` marks a slot before it
                // counts the lease, and may mark one it then gives up.)
                let ended = r(&c.in_place).saturating_sub(out);
                (
                    s.wrapping_add(r(&c.served)).wrapping_add(r(&c.in_place)),
                    k.wrapping_add(r(&c.kept)).wrapping_add(ended),
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
    fn an_in_place_lease_is_passed_by_drains_and_comes_back_with_one_store() {
        let cache = ThreadCache::with_adoption(true);
        let cell = cache.register(0);
        assert!(cell.give(7) && cell.give(8));
        let (h, slot) = cell.lease().expect("a kept handle");
        assert_eq!(h, 8, "the most recently kept one");
        assert_eq!(cell.take(), Some(7), "take passes the leased slot by");
        assert!(
            cache.drain().is_empty(),
            "a drain leaves a leased slot alone"
        );
        assert!(cell.give(9), "give claims another, empty slot");
        // Served: the in-place lease and the take; kept: three gives.
        assert_eq!(cache.counts(0), (2, 3), "the in-place lease is out");
        slot.unlease(h);
        assert_eq!(cache.counts(0), (2, 4), "the in-place lease ended");
        let (h, slot) = cell.lease().expect("8 is back");
        slot.vacate();
        let mut left: Vec<usize> = cache.drain().into_iter().map(|(_, h)| h).collect();
        left.sort_unstable();
        assert_eq!(
            (h, left.as_slice()),
            (8, &[9][..]),
            "vacated: 8 left the cell"
        );
        assert!(!cell.give(LEASED), "the marker value is never kept");
    }

    #[test]
    fn take_is_lifo_give_fills_and_drain_empties() {
        let cache = ThreadCache::with_adoption(true);
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
