//! Models of the event pool's in-place leases (`Cell::lease`): the owner's
//! CAS marks the handle's slot leased, and the lease, moved to another
//! thread, ends it with one plain store: of the handle back (`unlease`, a
//! lease dropped) or of 0 (`vacate`, a lease detached or destroyed). Meanwhile
//! the owner keeps and takes handles in the same cell (`give` claims only
//! empty slots), purges drain it (they take only handles, never a slot marked
//! leased), and the owner may exit and its cell be adopted.
//!
//! Driven through `internals::CacheModel` (`CellModel::lease`,
//! `InPlaceModel::{unlease, vacate}`), like the thread-exit models: the pools
//! reach the cells through thread-locals, compiled out under loom.
//!
//! Every model keeps a [`Ledger`]: where each handle is (with the owner,
//! in the cell, leased in place, vacated, drained), in a loom `UnsafeCell` per
//! handle that whoever moves the handle updates. loom checks every access to
//! it happens after the previous one, so the ledger checks both that a handle
//! moves only between the places the protocol allows (a drain never returns a
//! handle whose lease is out, or one its lease vacated) and that each hand-off
//! publishes what the previous holder did with the handle (the Release of
//! `unlease` and `keep` against the Acquire of `lease` and the takers).

use loom::cell::UnsafeCell;

use gpupool_core::internals::CacheModel;

use super::thread_exit::Outcomes;
use super::{model_deep, spawn_scoped};

/// Where a handle is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    /// Outside the cache, with the owner (where every handle starts).
    Owner,
    /// In a cell slot.
    Cell,
    /// Leased in place: its slot is marked leased.
    Leased,
    /// Its in-place lease was vacated: gone from the pool.
    Vacated,
    /// Returned by a drain.
    Drained,
}

/// Where handles `1..=N` are (index `h - 1`).
struct Ledger<const N: usize>([UnsafeCell<Where>; N]);

// SAFETY: every access goes through loom's `UnsafeCell::with_mut`, which
// fails the model if two accesses are not ordered by happens-before: the
// threads share the ledger only as loom checks they may.
unsafe impl<const N: usize> Sync for Ledger<N> {}

impl<const N: usize> Ledger<N> {
    fn new() -> Self {
        Ledger([(); N].map(|_| UnsafeCell::new(Where::Owner)))
    }

    /// Moves handle `h` from `from` to `to`; `what` did it.
    fn step(&self, h: usize, from: Where, to: Where, what: &str) {
        assert!((1..=N).contains(&h), "{what}: returned handle {h:#x}");
        self.0[h - 1].with_mut(|w| {
            // SAFETY: loom checks that no other access to this cell is
            // concurrent with this one (and fails the model if one is).
            let w = unsafe { &mut *w };
            assert_eq!(*w, from, "{what}: handle {h} was {:?}", *w);
            *w = to;
        });
    }

    fn give(&self, h: usize) {
        self.step(h, Where::Owner, Where::Cell, "give");
    }

    fn take(&self, h: usize) {
        self.step(h, Where::Cell, Where::Owner, "take");
    }

    fn lease(&self, h: usize) {
        self.step(h, Where::Cell, Where::Leased, "lease");
    }

    fn unlease(&self, h: usize) {
        self.step(h, Where::Leased, Where::Cell, "unlease");
    }

    fn vacate(&self, h: usize) {
        self.step(h, Where::Leased, Where::Vacated, "vacate");
    }

    fn drained(&self, handles: &[usize]) {
        for &h in handles {
            self.step(h, Where::Cell, Where::Drained, "a drain");
        }
    }
}

/// The owner keeps two handles and leases the second in place; the lease
/// goes to another thread, which drops it (`unlease`), while a third thread
/// drains the cache and the owner takes a handle, keeps a new one and gives
/// the taken one back. A drain never returns the leased handle while its
/// lease is out (the ledger), every handle ends in exactly one place (drained
/// once, or still in the cell for the drain after the joins), and the tallies
/// are exact: the in-place lease counts as served, and as returned once it has
/// ended.
#[test]
fn lease_ends_on_another_thread_racing_a_drain() {
    model_deep(|| {
        let cache = CacheModel::new();
        let ledger = Ledger::<3>::new();
        let cell = cache.cell(0);
        for h in [1, 2] {
            ledger.give(h);
            assert!(cell.give(h));
        }
        let (h, lease) = cell.lease().expect("a kept handle");
        assert_eq!(h, 2, "the most recently kept handle");
        ledger.lease(h);
        let ledger = &ledger;
        let holder = spawn_scoped(move || {
            ledger.unlease(h);
            lease.unlease(h);
        });
        let purge = spawn_scoped(|| {
            let drained = cache.drain();
            ledger.drained(&drained);
            drained
        });
        let took = cell.take();
        if let Some(t) = took {
            // 1, or 2 once its lease has ended; never while it is out.
            ledger.take(t);
        }
        ledger.give(3);
        assert!(cell.give(3));
        if let Some(t) = took {
            ledger.give(t);
            assert!(cell.give(t));
        }
        holder.join();
        let mut found = purge.join();
        let served = 1 + usize::from(took.is_some());
        let kept = 3 + usize::from(took.is_some());
        assert_eq!(
            cache.served_and_kept(0),
            (served, kept + 1),
            "tallies: the ended in-place lease counts as returned"
        );
        let last = cache.drain();
        ledger.drained(&last);
        found.extend(last);
        found.sort();
        assert_eq!(found, [1, 2, 3], "a cached handle was lost or duplicated");
        assert_eq!(cell.take(), None);
    });
}

/// The owner keeps two handles and leases the second in place; the lease
/// goes to another thread, which detaches it (`vacate`: the handle leaves the
/// pool), while a third thread drains the cache and the owner keeps two new
/// handles, which may land in the vacated slot. No handle is lost (a `give`
/// never claims the slot while it is marked leased, so the vacating store
/// overwrites nothing) or duplicated, and the vacated handle never shows up
/// in a drain.
#[test]
fn vacate_races_give_and_drain() {
    model_deep(|| {
        let cache = CacheModel::new();
        let ledger = Ledger::<4>::new();
        let cell = cache.cell(0);
        for h in [1, 2] {
            ledger.give(h);
            assert!(cell.give(h));
        }
        let (h, lease) = cell.lease().expect("a kept handle");
        assert_eq!(h, 2, "the most recently kept handle");
        ledger.lease(h);
        let ledger = &ledger;
        let holder = spawn_scoped(move || {
            ledger.vacate(h);
            lease.vacate();
        });
        let purge = spawn_scoped(|| {
            let drained = cache.drain();
            ledger.drained(&drained);
            drained
        });
        for h in [3, 4] {
            ledger.give(h);
            assert!(cell.give(h));
        }
        holder.join();
        let mut found = purge.join();
        assert_eq!(cache.served_and_kept(0), (1, 4 + 1));
        let last = cache.drain();
        ledger.drained(&last);
        found.extend(last);
        found.sort();
        assert_eq!(
            found,
            [1, 3, 4],
            "a cached handle was lost or duplicated, or the vacated one drained"
        );
        assert_eq!(cell.take(), None);
    });
}

/// The owner keeps two handles, leases the second in place, hands the lease
/// to another thread and exits while the lease is out; the next thread that
/// registers adopts the cell (or, registering first, gets a new one), leases
/// in place from it, ends that lease and keeps a handle of its own, while the
/// first lease ends (`unlease`) on its own thread, putting its handle back in
/// the orphaned, or adopted, cell, and a purge runs (on the main thread,
/// after the exit). Every handle is drained exactly once, by the purge or by
/// the drain after the joins, and never while its lease is out; an adopter
/// leasing the handle sees it only after the lease ended; the tallies are
/// exact. Also checks that loom reached both outcomes (cell adopted, new
/// cell).
#[test]
fn lease_ends_after_its_owner_exits() {
    static OUTCOMES: Outcomes = Outcomes::new();
    model_deep(|| {
        let cache = CacheModel::new();
        let ledger = Ledger::<3>::new();
        let cell = cache.cell(0);
        for h in [1, 2] {
            ledger.give(h);
            assert!(cell.give(h));
        }
        let (h, lease) = cell.lease().expect("a kept handle");
        assert_eq!(h, 2, "the most recently kept handle");
        ledger.lease(h);
        let owner_cell = cell.id();
        let ledger = &ledger;
        let holder = spawn_scoped(move || {
            ledger.unlease(h);
            lease.unlease(h);
        });
        let adopter = spawn_scoped(|| {
            let cell = cache.cell(0);
            let got = cell.lease().map(|(h, lease)| {
                ledger.lease(h);
                ledger.unlease(h);
                lease.unlease(h);
                h
            });
            ledger.give(3);
            assert!(cell.give(3));
            (cell, got)
        });
        cell.exit();
        // A purge, racing the lease's end and the adoption.
        let mut found = cache.drain();
        ledger.drained(&found);
        holder.join();
        let (cell, got) = adopter.join();
        let adopted = cell.id() == owner_cell;
        if let Some(h) = got {
            assert!(adopted, "a new cell served handle {h}");
        }
        let leases = 1 + usize::from(got.is_some());
        assert_eq!(
            cache.served_and_kept(0),
            (leases, 3 + leases),
            "a tally of the adopted cell was lost"
        );
        let last = cache.drain();
        ledger.drained(&last);
        found.extend(last);
        found.sort();
        assert_eq!(found, [1, 2, 3], "a cached handle was lost or duplicated");
        assert_eq!(cell.take(), None);
        OUTCOMES.record(adopted);
    });
    OUTCOMES.assert_both_reached();
}
