//! Models of a thread exiting with handles in its per-thread cell, and of the
//! next thread that registers with the pool adopting that cell, racing a
//! purge (`drain`) and, for the stream pool with `same_thread_reuse`,
//! `take_orphans`.
//!
//! The pools reach the cells through thread-locals, and a thread exit through
//! a thread-local destructor (`Owned::drop`), both compiled out under loom;
//! these models drive the same code through `internals::CacheModel`:
//! `CacheModel::cell` is the registration (`ThreadCache::register`, which
//! adopts an orphaned cell), `CellModel::exit` the exit (`Cell::release_owner`,
//! what `Owned::drop` runs for each of the thread's cells).
//!
//! Each model also checks, once loom has explored every execution, that both
//! outcomes of the race were reached: some executions adopted the exited
//! owner's cell and some registered a new one (the adopter came first). The
//! tally is a plain `std` atomic: loom does not reset it between executions,
//! and no model thread reads it.

use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering::Relaxed};

use gpupool_core::internals::CacheModel;

use super::{model_deep, spawn_scoped};

/// How many executions of a model adopted the exited owner's cell, and how
/// many registered a new one (also used by `in_place.rs`).
pub(super) struct Outcomes {
    adopted: StdAtomicUsize,
    fresh: StdAtomicUsize,
}

impl Outcomes {
    pub(super) const fn new() -> Self {
        Outcomes {
            adopted: StdAtomicUsize::new(0),
            fresh: StdAtomicUsize::new(0),
        }
    }

    pub(super) fn record(&self, adopted: bool) {
        let n = if adopted { &self.adopted } else { &self.fresh };
        n.fetch_add(1, Relaxed);
    }

    pub(super) fn assert_both_reached(&self) {
        let (a, f) = (self.adopted.load(Relaxed), self.fresh.load(Relaxed));
        assert!(
            a > 0 && f > 0,
            "the model missed an outcome: {a} executions adopted the cell, {f} did not"
        );
    }
}

/// The event pool, and the stream pool by default (cells keep streams that
/// were idle on return): an adopted cell keeps its handles. The owner fills
/// its cell, takes one back and exits while a second thread registers (and
/// adopts the cell if the owner is gone) and takes and gives, and a purge
/// drains the cache. Every handle ends in exactly one place (served to the
/// owner or to the adopter, drained by the purge, or still in a cell at the
/// end), and the tallies are exact: the adopter continues the exited owner's
/// counts, which needs the owner's writes to happen before its own (the
/// `owned` flag's Release/Acquire).
#[test]
fn adopter_keeps_the_handles_racing_a_drain() {
    static OUTCOMES: Outcomes = Outcomes::new();
    model_deep(|| {
        let cache = CacheModel::new();
        let owner = spawn_scoped(|| {
            let cell = cache.cell(0);
            assert!(cell.give(1));
            assert!(cell.give(2));
            let took = cell.take();
            let id = cell.id();
            cell.exit();
            (id, took)
        });
        let adopter = spawn_scoped(|| {
            let cell = cache.cell(0);
            let took = cell.take();
            assert!(cell.give(3));
            (cell, took)
        });
        let mut found = cache.drain();
        let (owner_cell, owner_took) = owner.join();
        let (cell, adopter_took) = adopter.join();
        let adopted = cell.id() == owner_cell;
        if let Some(h) = adopter_took {
            assert!(adopted, "a new cell served handle {h}");
            assert!(h == 1 || h == 2);
        }
        let served = usize::from(owner_took.is_some()) + usize::from(adopter_took.is_some());
        assert_eq!(
            cache.served_and_kept(0),
            (served, 3),
            "a tally of the adopted cell was lost"
        );
        found.extend(owner_took);
        found.extend(adopter_took);
        found.extend(cache.drain());
        found.sort();
        assert_eq!(found, [1, 2, 3], "a cached handle was lost or duplicated");
        assert_eq!(cell.take(), None);
        OUTCOMES.record(adopted);
    });
    OUTCOMES.assert_both_reached();
}

/// The stream pool with `same_thread_reuse`: cells keep streams unqueried,
/// so the streams an exited owner left may still run its work. The owner
/// fills its cell and exits while a second thread registers (adopting the
/// cell if the owner is gone) and does what `get` does (its cell first, then
/// `take_orphans`), and a purge drains the cache. The adopter is never served
/// a stream the owner left: those reach it only through `take_orphans` (to
/// the busy list) or the purge; then it keeps a stream of its own in its cell,
/// which `take_orphans` must leave alone. Nothing is lost or duplicated, the
/// tallies are exact, and once the owner has exited a `take_orphans` collects
/// whatever of its streams is still in a cell: none stays stranded in an
/// orphaned cell until the next purge.
#[test]
fn adopter_is_not_served_the_orphans() {
    static OUTCOMES: Outcomes = Outcomes::new();
    model_deep(|| {
        let cache = CacheModel::without_adoption();
        let owner = spawn_scoped(|| {
            let cell = cache.cell(0);
            assert!(cell.give(1));
            assert!(cell.give(2));
            let id = cell.id();
            cell.exit();
            id
        });
        let adopter = spawn_scoped(|| {
            let cell = cache.cell(0);
            let took = cell.take();
            assert_eq!(took, None, "served a stream an exited thread left");
            let orphans = cache.take_orphans();
            // A stream of its own, returned for same-thread reuse.
            assert!(cell.give(3));
            (cell, orphans)
        });
        let mut found = cache.drain();
        let owner_cell = owner.join();
        let (cell, orphans) = adopter.join();
        let adopted = cell.id() == owner_cell;
        found.extend(orphans);
        let late = cache.take_orphans();
        assert!(
            !late.contains(&3),
            "take_orphans took a stream from a live thread's cell"
        );
        found.extend(late);
        let left = cache.drain();
        assert!(
            !left.contains(&1) && !left.contains(&2),
            "take_orphans after the exit left the owner's streams in its cell"
        );
        found.extend(left);
        found.sort();
        assert_eq!(found, [1, 2, 3], "a cached stream was lost or duplicated");
        assert_eq!(cache.served_and_kept(0), (0, 3));
        assert_eq!(cell.take(), None);
        OUTCOMES.record(adopted);
    });
    OUTCOMES.assert_both_reached();
}
