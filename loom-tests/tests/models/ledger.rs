//! Where each of a model's handles is, kept by the threads that move them.
//!
//! A [`Ledger`] has one loom `UnsafeCell` per handle, written by whichever
//! thread moves the handle (right after it takes the handle out of the pool,
//! right before it gives it back). loom fails the model if two of those
//! writes are not ordered by happens-before, so a ledger checks both where a
//! handle may be (a purge never destroys a handle that is out, a thread is
//! never served one that is out) and that each hand-off through the pool's
//! per-thread cells publishes what the previous holder did with the handle
//! (the Release stores that put a handle in a cell slot against the Acquire
//! compare-and-swaps that take it out).

use loom::cell::UnsafeCell;

use gpupool_core::{
    EventHandle, EventPool, OwnedEvent, OwnedStream, PoolStats, StreamHandle, StreamPool,
};
use gpupool_mock::MockBackend;

/// Where a handle is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Where {
    /// Held by a thread outside the pool: leased, or detached.
    Out,
    /// In the pool: a thread's cell (leased in place counts as out) or a
    /// shared list.
    Pooled,
    /// Destroyed by a purge.
    Destroyed,
    /// Detached and destroyed by its holder: no longer the pool's.
    Gone,
}

/// Where each of `N` handles (of type `H`) is.
pub(super) struct Ledger<H, const N: usize> {
    handles: [H; N],
    places: [UnsafeCell<Where>; N],
}

// SAFETY: every access to `places` goes through loom's `UnsafeCell::with_mut`,
// which fails the model unless the previous access happens-before it: the
// threads share the ledger only as loom checks they may.
unsafe impl<H: Sync, const N: usize> Sync for Ledger<H, N> {}

impl<H: Copy + Eq + core::fmt::Debug, const N: usize> Ledger<H, N> {
    /// A ledger of `handles`, all held by the caller.
    pub(super) fn new(handles: [H; N]) -> Self {
        Ledger {
            handles,
            places: [(); N].map(|_| UnsafeCell::new(Where::Out)),
        }
    }

    /// Whether `h` is one of the ledger's handles.
    pub(super) fn knows(&self, h: H) -> bool {
        self.handles.contains(&h)
    }

    /// Moves `h` from `from` to `to`; `what` did it. Handles the ledger does
    /// not know (made by the pool during the model) are not tracked.
    pub(super) fn step(&self, h: H, from: Where, to: Where, what: &str) {
        let Some(i) = self.handles.iter().position(|&k| k == h) else {
            return;
        };
        self.places[i].with_mut(|w| {
            // SAFETY: loom checks that no other access to this cell is
            // concurrent with this one (and fails the model if one is).
            let w = unsafe { &mut *w };
            assert_eq!(*w, from, "{what}: handle {h:?} was {:?}", *w);
            *w = to;
        });
    }

    /// A thread was served `h` by the pool.
    pub(super) fn out(&self, h: H) {
        self.step(h, Where::Pooled, Where::Out, "a get");
    }

    /// A thread is about to give `h` back (a lease's drop, a `put`).
    pub(super) fn back(&self, h: H) {
        self.step(h, Where::Out, Where::Pooled, "a return");
    }

    /// The holder destroyed `h` itself (detached, then destroyed).
    pub(super) fn gone(&self, h: H) {
        self.step(h, Where::Out, Where::Gone, "a detach");
    }

    /// After a purge on this thread: every handle the purge destroyed must
    /// have been in the pool.
    pub(super) fn purged(&self, live: impl Fn(H) -> bool) {
        for (i, &h) in self.handles.iter().enumerate() {
            if !live(h) {
                // Destroyed: by this purge (then it is this thread's to
                // record, taken out of the pool by it), or earlier.
                self.places[i].with_mut(|w| {
                    // SAFETY: as in `step`.
                    let w = unsafe { &mut *w };
                    assert!(
                        matches!(*w, Where::Pooled | Where::Destroyed | Where::Gone),
                        "a purge destroyed handle {h:?} while it was {:?}",
                        *w
                    );
                    if *w == Where::Pooled {
                        *w = Where::Destroyed;
                    }
                });
            }
        }
    }
}

impl<H: Copy + Eq + core::fmt::Debug, const N: usize> Ledger<H, N> {
    /// Gives `owned` to `pool` (`put`), recorded first.
    pub(super) fn put<P: ModelPool<Handle = H>>(&self, pool: &P, owned: P::Owned) {
        self.back(P::handle_of(&owned));
        pool.put_back(owned);
    }

    /// Purges `pool` and records what the purge destroyed.
    pub(super) fn purge<P: ModelPool<Handle = H>>(&self, pool: &P, mock: &MockBackend) {
        pool.purge_all();
        self.purged(|h| P::is_live(mock, h));
    }

    /// Once every thread has joined: exact tallies ([`assert_tallies`],
    /// `leases` in all), then a last purge, after which the mock must have
    /// seen every handle destroyed exactly once.
    pub(super) fn finish<P: ModelPool<Handle = H>>(
        &self,
        pool: &P,
        mock: &MockBackend,
        leases: usize,
    ) {
        assert_tallies(pool.total(), leases, P::live(mock));
        self.purge(pool, mock);
        assert_all_destroyed(mock);
    }
}

/// What a ledger needs of a pool over the mock.
pub(super) trait ModelPool {
    type Handle: Copy + Eq + core::fmt::Debug;
    /// A handle outside the pool (`OwnedStream`, `OwnedEvent`).
    type Owned;
    fn handle_of(owned: &Self::Owned) -> Self::Handle;
    fn put_back(&self, owned: Self::Owned);
    fn purge_all(&self);
    fn total(&self) -> PoolStats;
    fn is_live(mock: &MockBackend, h: Self::Handle) -> bool;
    /// How many handles of this kind the mock has alive.
    fn live(mock: &MockBackend) -> usize;
}

/// Implements [`ModelPool`] for one pool type.
macro_rules! model_pool {
    ($pool:ty, $handle:ty, $owned:ty, $is_live:ident, $live:ident) => {
        impl ModelPool for $pool {
            type Handle = $handle;
            type Owned = $owned;
            fn handle_of(owned: &$owned) -> $handle {
                owned.handle()
            }
            fn put_back(&self, owned: $owned) {
                self.put(owned, None).unwrap();
            }
            fn purge_all(&self) {
                self.purge().unwrap();
            }
            fn total(&self) -> PoolStats {
                self.total_stats()
            }
            fn is_live(mock: &MockBackend, h: $handle) -> bool {
                mock.$is_live(h)
            }
            fn live(mock: &MockBackend) -> usize {
                mock.$live()
            }
        }
    };
}

model_pool!(
    StreamPool<MockBackend>,
    StreamHandle,
    OwnedStream,
    is_live_stream,
    live_streams
);
model_pool!(
    EventPool<MockBackend>,
    EventHandle,
    OwnedEvent,
    is_live_event,
    live_events
);

/// A first lease on this thread, returned at once (recorded in `ledger`):
/// whether it was one of the ledger's handles.
pub(super) fn lease_once<const N: usize>(
    pool: &EventPool<MockBackend>,
    ledger: &Ledger<EventHandle, N>,
) -> bool {
    let lease = pool.get(0).unwrap();
    let h = lease.handle();
    ledger.out(h);
    ledger.back(h);
    drop(lease);
    ledger.knows(h)
}

/// Checks that the mock saw no misuse (no handle destroyed twice or used
/// after its destroy) and that every stream and event is destroyed.
pub(super) fn assert_all_destroyed(mock: &MockBackend) {
    assert_eq!(
        mock.misuses(),
        [],
        "a handle was destroyed twice or used dead"
    );
    assert_eq!(mock.live_streams(), 0, "a stream was lost");
    assert_eq!(mock.live_events(), 0, "an event was lost");
}

/// `N` events made by `pool` on device 0 and detached: handles the model
/// knows before its threads start (the calling thread's cell is registered
/// on the way).
pub(super) fn detached_events<const N: usize>(pool: &EventPool<MockBackend>) -> [OwnedEvent; N] {
    [(); N].map(|_| pool.get(0).unwrap().detach())
}

/// The start of the event models: an idle one-device mock, its event pool,
/// `N` events detached from it ([`detached_events`]) and a ledger of their
/// handles.
pub(super) fn idle_events_with_ledger<const N: usize>() -> (
    MockBackend,
    EventPool<MockBackend>,
    [OwnedEvent; N],
    Ledger<EventHandle, N>,
) {
    let mock = super::idle_mock(1);
    let pool = super::event_pool(&mock);
    let events = detached_events(&pool);
    let ledger = Ledger::new(std::array::from_fn(|i| events[i].handle()));
    (mock, pool, events, ledger)
}

/// `N` streams made by `pool` on device 0 and detached, as
/// [`detached_events`].
pub(super) fn detached_streams<const N: usize>(pool: &StreamPool<MockBackend>) -> [OwnedStream; N] {
    [(); N].map(|_| pool.get(0).unwrap().detach())
}

/// Checks a pool's tallies once every thread has joined: `leases` handed out
/// in all, none out, and the pool holding exactly the handles the mock has
/// alive (`live`): the per-thread cells' tallies, adopted cells' included,
/// add up with the shared ones.
pub(super) fn assert_tallies(stats: PoolStats, leases: usize, live: usize) {
    assert_eq!(
        (stats.leases, stats.live_leases, stats.pooled),
        (leases, 0, live),
        "tallies (leases, live leases, pooled) off: {stats:?}"
    );
}
