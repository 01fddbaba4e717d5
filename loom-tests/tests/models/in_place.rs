//! Models of the event pool's in-place leases, run through the pool itself:
//! a thread's `get` that finds an event in its memoised cell marks the
//! event's slot leased with one compare-and-swap, and the lease, moved to
//! another thread, ends it with one plain store: of the event back (the
//! lease dropped) or of 0 (the lease detached). Meanwhile the owner of the
//! cell puts and leases events in it, a purge drains every cell, and the
//! owner may exit (its thread-locals dropped, its cell orphaned) and another
//! thread adopt the cell.
//!
//! Each model keeps a [`Ledger`] of the events it made: a purge never
//! destroys an event whose lease is out, and each hand-off publishes what the
//! previous holder did. After the joins the pool's tallies must be exact and,
//! once the pool is dropped, the mock must have seen every event destroyed
//! exactly once.

use loom::sync::Mutex;

use gpupool_core::{EventHandle, EventLease, EventPool, OwnedEvent};
use gpupool_mock::MockBackend;

use super::ledger::{idle_events_with_ledger, lease_once, Ledger};
use super::thread_exit::Outcomes;
use super::{model_deep, spawn_scoped};

/// Puts `events` in the calling thread's cell and leases the last one in
/// place (recorded in `ledger`).
fn lease_second_in_place<'p, const N: usize>(
    pool: &'p EventPool<MockBackend>,
    ledger: &Ledger<EventHandle, N>,
    events: [OwnedEvent; 2],
) -> EventLease<'p, MockBackend> {
    let second = events[1].handle();
    for e in events {
        ledger.put(pool, e);
    }
    let lease = pool.get(0).unwrap();
    assert_eq!(lease.handle(), second, "the most recently kept event");
    ledger.out(second);
    lease
}

/// This thread keeps two events in its cell and leases the second in place;
/// the lease goes to another thread, which drops it (`unlease`), while this
/// thread purges (a drain must pass the leased slot by) and leases again.
#[test]
fn lease_ends_on_another_thread_racing_a_drain() {
    model_deep(|| {
        let (mock, pool, [e1, e2], ledger) = idle_events_with_ledger();
        let lease = lease_second_in_place(&pool, &ledger, [e1, e2]);
        let (pool, ledger, mock) = (&pool, &ledger, &mock);
        let holder = spawn_scoped(move || {
            ledger.back(lease.handle());
            drop(lease);
        });
        ledger.purge(pool, mock);
        let mine = pool.get(0).unwrap();
        ledger.out(mine.handle());
        ledger.back(mine.handle());
        drop(mine);
        holder.join();
        // Two detached, the in-place lease, this thread's second lease.
        ledger.finish(pool, mock, 4);
    });
}

/// This thread keeps one event in its cell and leases it in place (its
/// claim of the slot a plain store) while another thread purges: the drain
/// takes the event first (the lease is then a new one), or passes the
/// leased slot by; in between it may take the event after this thread read
/// the slot and before its store landed, which this thread must detect. Both
/// outcomes must be reached: the lease got the kept event, and got a new one.
#[test]
fn owner_lease_races_a_drain() {
    Outcomes::model_deep(|| {
        let (mock, pool, [e1], ledger) = idle_events_with_ledger();
        ledger.put(&pool, e1);
        let (pool, ledger, mock) = (&pool, &ledger, &mock);
        let purge = spawn_scoped(move || ledger.purge(pool, mock));
        let reused = lease_once(pool, ledger);
        purge.join();
        // One detached, this thread's lease.
        ledger.finish(pool, mock, 2);
        reused
    });
}

/// This thread keeps two events and leases the second in place; the lease
/// goes to another thread, which detaches it (`vacate`: the event leaves the
/// pool) and destroys it, while a third thread purges and this one puts two
/// more events in (one may land in the vacated slot).
#[test]
fn vacate_races_give_and_drain() {
    model_deep(|| {
        let (mock, pool, [e1, e2, e3, e4], ledger) = idle_events_with_ledger();
        let lease = lease_second_in_place(&pool, &ledger, [e1, e2]);
        let (pool, ledger, mock) = (&pool, &ledger, &mock);
        let holder = spawn_scoped(move || {
            ledger.gone(lease.handle());
            lease.detach().destroy(mock).unwrap();
        });
        let purge = spawn_scoped(move || {
            ledger.purge(pool, mock);
        });
        ledger.put(pool, e3);
        ledger.put(pool, e4);
        holder.join();
        purge.join();
        ledger.finish(pool, mock, 5);
    });
}

/// A thread keeps two events in its cell, leases the second in place, hands
/// the lease to this thread and exits with the lease out; another thread
/// registers meanwhile (adopting the exited thread's cell, or making its own
/// if it comes first) and leases once, while this thread drops the first
/// lease (`unlease`, into the orphaned or adopted cell); then it purges. Both outcomes must be reached: the
/// adopter served an event the exited thread left, and served one of its own.
#[test]
fn lease_ends_after_its_owner_exits() {
    Outcomes::model_deep(|| {
        let (mock, pool, [e1, e2], ledger) = idle_events_with_ledger();
        // Where the exiting thread leaves its lease (a lease borrows the
        // pool, so it cannot be a thread's result).
        let handoff = Mutex::new(None);
        let (pool, ledger, mock, handoff) = (&pool, &ledger, &mock, &handoff);
        let owner = spawn_scoped(move || {
            ledger.put(pool, e1);
            ledger.put(pool, e2);
            let lease = pool.get(0).unwrap();
            ledger.out(lease.handle());
            *handoff.lock().unwrap() = Some(lease);
        });
        let adopter = spawn_scoped(move || lease_once(pool, ledger));
        owner.join();
        let lease = handoff
            .lock()
            .unwrap()
            .take()
            .expect("the exited thread's lease");
        ledger.back(lease.handle());
        drop(lease);
        let reused = adopter.join();
        // Two detached, the owner's lease, the adopter's.
        ledger.finish(pool, mock, 4);
        reused
    });
}
