//! Counters the pools keep per device, and the slot where errors met during a
//! `Drop` are parked until someone asks for them.
//!
//! Counters are relaxed atomics: each is an independent tally, read only as a
//! snapshot, never used to decide anything, so no ordering is needed.

use alloc::boxed::Box;
use core::ptr;

use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// One device's tallies inside a pool. Every lease is counted once, by how it
/// was served (`created`, `reused` or `busy_hits`), so the lease total is their
/// sum and a `get` touches one counter.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) created: AtomicUsize,
    pub(crate) reused: AtomicUsize,
    pub(crate) busy_hits: AtomicUsize,
    pub(crate) promoted: AtomicUsize,
    pub(crate) destroyed: AtomicUsize,
    pub(crate) quarantined: AtomicUsize,
    pub(crate) returned: AtomicUsize,
    /// Handles taken in by `put` (not by a lease's return).
    pub(crate) put: AtomicUsize,
    /// Leases ended by `detach`: their handles left the pool.
    pub(crate) detached: AtomicUsize,
}

impl Counters {
    #[inline]
    pub(crate) fn bump(c: &AtomicUsize) {
        // Relaxed: an independent tally (module doc).
        c.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn add(c: &AtomicUsize, n: usize) {
        // Relaxed: an independent tally (module doc).
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The tallies, with `(served, kept)` leases served from and returned into
    /// per-thread caches added (their own counts, kept apart from these).
    pub(crate) fn snapshot_with(&self, (served, kept): (usize, usize)) -> PoolStats {
        // Relaxed: a snapshot of independent tallies (module doc).
        let r = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        // `returned` first: a lease counted there was counted as served before
        // it, so a lease that comes and goes between the loads can only make
        // `live_leases` look higher for an instant, never wrap. (The cache
        // counts were read by the caller before these; an instant's skew
        // between the two sets shows the same way or is absorbed by the
        // saturating subtraction.)
        let returned = r(&self.returned).wrapping_add(kept);
        let (created, busy_hits) = (r(&self.created), r(&self.busy_hits));
        let reused = r(&self.reused).wrapping_add(served);
        let leased = created.wrapping_add(reused).wrapping_add(busy_hits);
        let live_leases = leased.saturating_sub(returned);
        let destroyed = r(&self.destroyed);
        // Handles the pool owns: made or put in, less those destroyed or
        // detached; those not leased out are held. (A call that runs between
        // the loads skews the snapshot by its own step, as for `live_leases`;
        // the subtractions saturate, never wrap.)
        let owned = created
            .wrapping_add(r(&self.put))
            .saturating_sub(destroyed.wrapping_add(r(&self.detached)));
        PoolStats {
            created,
            reused,
            busy_hits,
            promoted: r(&self.promoted),
            destroyed,
            quarantined: r(&self.quarantined),
            leases: leased,
            live_leases,
            pooled: owned.saturating_sub(live_leases),
        }
    }
}

/// A snapshot of a pool's tallies, for one device or summed over all.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Handles the pool asked the backend to create (each for a lease).
    pub created: usize,
    /// Leases served from the ready list, without a backend call.
    pub reused: usize,
    /// Leases served by finding a finished stream in the busy list (stream pool).
    pub busy_hits: usize,
    /// Finished busy streams moved to the ready list by a scan (stream pool).
    pub promoted: usize,
    /// Handles the pool destroyed (purge, or a lease discarded), not counting
    /// the final destruction when the pool is dropped.
    pub destroyed: usize,
    /// Handles set aside after a backend call on them failed (a query on
    /// return or during a scan, a destroy): never leased again, destroyed
    /// again by the next purge or the pool's drop.
    pub quarantined: usize,
    /// Leases handed out in total.
    pub leases: usize,
    /// Leases out right now (handed out and not yet returned or released).
    pub live_leases: usize,
    /// Handles the pool holds right now and has not leased out: ready, busy
    /// (streams returned with work pending), kept in threads' cells, and
    /// quarantined (set aside after a failed call, destroyed by the next
    /// purge). In other words, what a purge would try to destroy now.
    ///
    /// Computed from the tallies when asked (no cost on a lease's path):
    /// handles created or `put` in, less those destroyed or detached, less
    /// the live leases. Exact when no call on the pool is in flight; a
    /// snapshot taken while other threads lease and return may be off by the
    /// calls in flight, like `live_leases`.
    pub pooled: usize,
}

impl core::ops::Add for PoolStats {
    type Output = PoolStats;
    fn add(self, o: PoolStats) -> PoolStats {
        PoolStats {
            created: self.created.wrapping_add(o.created),
            reused: self.reused.wrapping_add(o.reused),
            busy_hits: self.busy_hits.wrapping_add(o.busy_hits),
            promoted: self.promoted.wrapping_add(o.promoted),
            destroyed: self.destroyed.wrapping_add(o.destroyed),
            leases: self.leases.wrapping_add(o.leases),
            live_leases: self.live_leases.wrapping_add(o.live_leases),
            quarantined: self.quarantined.wrapping_add(o.quarantined),
            pooled: self.pooled.wrapping_add(o.pooled),
        }
    }
}

/// Holds the first error met where it could not be returned (in a `Drop`),
/// until [`take`](ParkedError::take) collects it; later ones are counted.
pub(crate) struct ParkedError<E> {
    /// Null, or a `Box<E>` owned by this slot.
    slot: AtomicPtr<E>,
    /// Errors met while the slot was full.
    dropped: AtomicUsize,
}

// SAFETY: the slot owns at most one `E` and moves it to whoever takes it.
unsafe impl<E: Send> Send for ParkedError<E> {}
// SAFETY: `&ParkedError` only moves `E`s in and out; it never shares a `&E`.
unsafe impl<E: Send> Sync for ParkedError<E> {}

impl<E> ParkedError<E> {
    pub(crate) fn new() -> Self {
        ParkedError {
            slot: AtomicPtr::new(ptr::null_mut()),
            dropped: AtomicUsize::new(0),
        }
    }

    /// Parks `e` if the slot is empty; otherwise counts it and drops it.
    pub(crate) fn park(&self, e: E) {
        let p = Box::into_raw(Box::new(e));
        // AcqRel: Release publishes the boxed error to the taker's Acquire swap.
        match self
            .slot
            .compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => {}
            Err(_) => {
                // SAFETY: `p` was never published; we still own it.
                drop(unsafe { Box::from_raw(p) });
                // Relaxed: an independent tally.
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Takes the parked error, if any.
    pub(crate) fn take(&self) -> Option<E> {
        // Acquire: synchronises with the parking CAS, so the error is visible.
        let p = self.slot.swap(ptr::null_mut(), Ordering::Acquire);
        if p.is_null() {
            None
        } else {
            // SAFETY: the swap gave us sole ownership of the published box.
            Some(*unsafe { Box::from_raw(p) })
        }
    }

    /// How many errors were met while one was already parked.
    pub(crate) fn dropped(&self) -> usize {
        // Relaxed: an independent tally.
        self.dropped.load(Ordering::Relaxed)
    }
}

impl<E> Drop for ParkedError<E> {
    fn drop(&mut self) {
        drop(self.take());
    }
}
