//! Models of a thread exiting with handles in its per-thread cell, run
//! through the pools themselves: the exiting thread's thread-locals are
//! dropped (loom drops a model thread's thread-locals when it ends, as the
//! operating system does), which orphans its cells; the next thread that
//! registers with the pool adopts one, racing a purge and, for the stream
//! pool with `same_thread_reuse`, the collection of the exited thread's
//! streams (`take_orphans`).
//!
//! Each model also checks, once loom has explored every execution, that both
//! outcomes of the race were reached (see [`Outcomes`]). The tally is a plain
//! `std` atomic: loom does not reset it between executions, and no model
//! thread reads it.

use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering::Relaxed};
use std::sync::Arc as StdArc;

use gpupool_core::StreamPoolConfig;
use gpupool_mock::{CallKind, MockBackend};

use super::ledger::{assert_all_destroyed, assert_tallies, idle_events_with_ledger, lease_once};
use super::stream_pool;
use super::{model_deep, spawn_scoped};

/// How many executions of a model took one branch of its race and how many
/// the other (also used by `in_place.rs`).
pub(super) struct Outcomes {
    one: StdAtomicUsize,
    other: StdAtomicUsize,
}

impl Outcomes {
    pub(super) const fn new() -> Self {
        Outcomes {
            one: StdAtomicUsize::new(0),
            other: StdAtomicUsize::new(0),
        }
    }

    pub(super) fn record(&self, one: bool) {
        let n = if one { &self.one } else { &self.other };
        n.fetch_add(1, Relaxed);
    }

    /// `loom::model` of `execution`, tallying the outcome each execution
    /// returns; then checks that both outcomes were reached.
    pub(super) fn model(execution: impl Fn() -> bool + Sync + Send + 'static) {
        let tally = StdArc::new(Outcomes::new());
        let outcomes = StdArc::clone(&tally);
        loom::model(move || tally.record(execution()));
        outcomes.assert_both_reached();
    }

    /// [`Outcomes::model`] with [`model_deep`]'s preemption bound.
    pub(super) fn model_deep(execution: impl Fn() -> bool + Sync + Send + 'static) {
        let tally = StdArc::new(Outcomes::new());
        let outcomes = StdArc::clone(&tally);
        model_deep(move || tally.record(execution()));
        outcomes.assert_both_reached();
    }

    pub(super) fn assert_both_reached(&self) {
        let (a, b) = (self.one.load(Relaxed), self.other.load(Relaxed));
        assert!(
            a > 0 && b > 0,
            "the model missed an outcome: {a} executions took one branch, {b} the other"
        );
    }
}

/// The event pool (an adopted cell keeps its handles: events are idle when
/// pooled). A thread puts an event in its cell, leases it in place, ends the
/// lease and exits, while another thread leases once (its first `get`
/// registers it, adopting the exited thread's cell if that thread is gone,
/// and takes the event from it) and returns the lease; then this thread
/// purges. The adopter continues the exited thread's tallies: they add up
/// exactly, which needs the exited thread's writes to happen before the
/// adopter's (the cell's `owned` flag, Release on exit, Acquire on
/// adoption). Both outcomes must be reached: the adopter served the event the
/// exited thread left, and made one of its own.
#[test]
fn adopter_keeps_the_handles_racing_a_drain() {
    Outcomes::model_deep(|| {
        let (mock, pool, [e1], ledger) = idle_events_with_ledger();
        let (pool, ledger, mock) = (&pool, &ledger, &mock);
        let owner = spawn_scoped(move || {
            ledger.put(pool, e1);
            let lease = pool.get(0).unwrap();
            ledger.out(lease.handle());
            ledger.back(lease.handle());
            drop(lease);
        });
        let adopter = spawn_scoped(move || lease_once(pool, ledger));
        owner.join();
        let reused = adopter.join();
        // One detached, the owner's lease, the adopter's.
        ledger.finish(pool, mock, 3);
        reused
    });
}

/// The event pool: a thread puts an event in its cell and exits, and two
/// other threads lease for the first time. Their registrations may both find
/// the exited thread's cell; only one may adopt it (it marks the cell owned
/// under the registry's lock), or the two would share one cell and race on
/// its owner-only tallies, which would then not add up. Every event is
/// destroyed once; both outcomes must be reached (one of them served the
/// exited thread's event, neither did).
#[test]
fn one_adopter_per_orphaned_cell() {
    Outcomes::model(|| {
        let (mock, pool, [e1], ledger) = idle_events_with_ledger();
        let (pool, ledger, mock) = (&pool, &ledger, &mock);
        // (loom's `join` returns before the joined thread's thread-locals
        // are dropped, so the exit still races the registrations below.)
        spawn_scoped(move || ledger.put(pool, e1)).join();
        let first = spawn_scoped(move || lease_once(pool, ledger));
        let second = spawn_scoped(move || lease_once(pool, ledger));
        let reused = first.join() | second.join();
        // One detached, one each for the two adopters.
        ledger.finish(pool, mock, 3);
        reused
    });
}

/// The stream pool with `same_thread_reuse`: cells keep streams unqueried,
/// so the streams an exited thread left may still run its work and must
/// reach no other thread before a query finds them idle. A thread leases a
/// stream, queues work on it, returns it (kept in its cell) and exits, while
/// this thread leases for the first time: its registration adopts the exited
/// thread's cell if that thread is gone (the stream then goes to the
/// orphans, and to the busy list), else makes a new cell.
///
/// - This thread is never served the stream the exited thread left (it is
///   pending: only a query may release it, and it finds it busy).
/// - Exact tallies; every stream destroyed once.
///
/// (Not checked here: that a stream left in an orphaned cell is collected by
/// the next `take_orphans`. loom's `join` returns before the joined thread's
/// thread-locals are dropped, so a model cannot tell a cell not yet released
/// from one stranded.)
///
/// Both outcomes must be reached: this thread's first lease found the exited
/// thread's stream (and queried it busy), and did not meet it.
#[test]
fn adopter_is_not_served_the_orphans() {
    Outcomes::model_deep(|| {
        // Manual completion: queued work stays pending until completed.
        let mock = MockBackend::new(1);
        let config = StreamPoolConfig {
            same_thread_reuse: true,
            ..StreamPoolConfig::default()
        };
        let pool = stream_pool(&mock, config);
        let (pool, mock) = (&pool, &mock);
        let owner = spawn_scoped(move || {
            let lease = pool.get(0).unwrap();
            let left = lease.handle();
            mock.enqueue_work(left).unwrap();
            drop(lease);
            left
        });
        let mine = pool.get(0).unwrap().handle();
        let queried = mock.calls(CallKind::QueryStream);
        let left = owner.join();
        assert_ne!(
            mine, left,
            "served a stream an exited thread left unqueried"
        );
        assert_tallies(pool.total_stats(), 2, 2);
        mock.complete_everything();
        pool.purge().unwrap();
        assert_all_destroyed(mock);
        queried > 0
    });
}
