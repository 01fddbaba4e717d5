//! [`AnyPool`]: what a stream pool and an event pool have in common, for the
//! tests that check one behaviour of both: each is written once, generic over
//! the pool, and run for either.

use core::fmt::Debug;
use core::hash::Hash;

use gpupool_core::epoch_crate::Guard;
use gpupool_core::{
    BackendId, BackendOp, DeviceId, Error, EventBackend, EventHandle, EventLease, EventPool,
    OwnedEvent, OwnedStream, PoolStats, Rejected, StreamBackend, StreamHandle, StreamLease,
    StreamPool,
};
use gpupool_mock::{CallKind, MockBackend};

use crate::TestGpu;

/// A pool of streams or of events over a backend `B`, seen through the calls
/// both have; and, for the mock-only tests, what the mock does with that
/// kind of handle.
pub trait AnyPool<B: StreamBackend + EventBackend> {
    /// A lease of the pool: `StreamLease` or `EventLease`.
    type Lease<'p>
    where
        Self: 'p;
    /// What a detached lease hands over: `OwnedStream` or `OwnedEvent`.
    type Owned: Debug;
    /// The raw handle: `StreamHandle` or `EventHandle`.
    type Handle: Copy + Eq + Hash + Debug + Send;
    /// "stream" or "event", for messages.
    const WHAT: &'static str;
    /// The backend calls the return of an idle lease makes: the stream pool
    /// queries the stream, the event pool calls nothing.
    const RETURN_CALLS: u64;
    /// The backend call that destroys a handle of this kind.
    const DESTROY: BackendOp;

    /// A pool over `backend`, with the default configuration.
    fn over(backend: B) -> Self;

    /// Leases a handle on `device`.
    fn lease(&self, device: DeviceId) -> Self::Lease<'_>;

    /// The handle a lease holds.
    fn handle_of(lease: &Self::Lease<'_>) -> Self::Handle;

    /// Leases a handle on `device` and ends the lease at once; its handle.
    fn lease_handle(&self, device: DeviceId) -> Self::Handle;

    /// As [`lease_handle`](Self::lease_handle), with the pool's `get_in` and
    /// `guard`.
    fn lease_handle_in(&self, device: DeviceId, guard: &Guard) -> Self::Handle;

    /// Leases a handle on `device` and detaches it from the pool.
    fn detached(&self, device: DeviceId) -> Self::Owned;

    /// The pool's `put`.
    fn put(
        &self,
        owned: Self::Owned,
        device: Option<DeviceId>,
    ) -> Result<(), Rejected<Self::Owned, B::Error>>;

    /// The pool's `purge`.
    fn purge(&self) -> Result<usize, Error<B::Error>>;

    /// The pool's `device_count`.
    fn device_count(&self) -> Option<usize>;

    /// The pool's `stats`.
    fn stats(&self, device: DeviceId) -> Option<PoolStats>;

    /// The pool's `total_stats`.
    fn total_stats(&self) -> PoolStats;

    /// The raw handle of an owned one.
    fn handle(owned: &Self::Owned) -> Self::Handle;

    /// The backend an owned handle belongs to.
    fn owner(owned: &Self::Owned) -> BackendId;

    /// The handles of this kind alive on `gpu`, where it can count them.
    fn live_on<G: TestGpu>(gpu: &G) -> Option<usize>;

    /// Whether `handle` is alive on the mock `gpu`.
    fn is_live_on_mock(gpu: &MockBackend, handle: Self::Handle) -> bool;

    /// Arms the mock `gpu` to fail the destroy of `handle`.
    fn fail_destroy_on_mock(gpu: &MockBackend, handle: Self::Handle);
}

/// Implements [`AnyPool`] for `$pool`: its leases are `$lease`s and its owned
/// handles `$owned`s holding `$handle`s, named `$what`; an idle return makes
/// `$return_calls` backend calls; `$destroy` destroys one. `TestGpu::$live`
/// counts them, the mock's `$is_live` tells one alive and `$fail` arms a
/// fault on one.
macro_rules! any_pool {
    (
        $pool:ident, $lease:ident, $owned:ident, $handle:ident, $what:literal;
        returns: $return_calls:literal, destroy: $destroy:ident;
        $live:ident, $is_live:ident, $fail:ident
    ) => {
        impl<B: StreamBackend + EventBackend> AnyPool<B> for $pool<B> {
            type Lease<'p>
                = $lease<'p, B>
            where
                Self: 'p;
            type Owned = $owned;
            type Handle = $handle;
            const WHAT: &'static str = $what;
            const RETURN_CALLS: u64 = $return_calls;
            const DESTROY: BackendOp = BackendOp::$destroy;

            fn over(backend: B) -> Self {
                $pool::new(backend)
            }

            fn lease(&self, device: DeviceId) -> $lease<'_, B> {
                self.get(device).unwrap()
            }

            fn handle_of(lease: &$lease<'_, B>) -> $handle {
                lease.handle()
            }

            fn lease_handle(&self, device: DeviceId) -> $handle {
                self.get(device).unwrap().handle()
            }

            fn lease_handle_in(&self, device: DeviceId, guard: &Guard) -> $handle {
                self.get_in(device, guard).unwrap().handle()
            }

            fn detached(&self, device: DeviceId) -> $owned {
                self.get(device).unwrap().detach()
            }

            fn put(
                &self,
                owned: $owned,
                device: Option<DeviceId>,
            ) -> Result<(), Rejected<$owned, B::Error>> {
                $pool::put(self, owned, device)
            }

            fn purge(&self) -> Result<usize, Error<B::Error>> {
                $pool::purge(self)
            }

            fn device_count(&self) -> Option<usize> {
                $pool::device_count(self)
            }

            fn stats(&self, device: DeviceId) -> Option<PoolStats> {
                $pool::stats(self, device)
            }

            fn total_stats(&self) -> PoolStats {
                $pool::total_stats(self)
            }

            fn handle(owned: &$owned) -> $handle {
                owned.handle()
            }

            fn owner(owned: &$owned) -> BackendId {
                owned.backend_id()
            }

            fn live_on<G: TestGpu>(gpu: &G) -> Option<usize> {
                gpu.$live()
            }

            fn is_live_on_mock(gpu: &MockBackend, handle: $handle) -> bool {
                gpu.$is_live(handle)
            }

            fn fail_destroy_on_mock(gpu: &MockBackend, handle: $handle) {
                gpu.$fail(CallKind::$destroy, handle);
            }
        }
    };
}

any_pool!(
    StreamPool, StreamLease, OwnedStream, StreamHandle, "stream";
    returns: 1, destroy: DestroyStream;
    live_streams, is_live_stream, fail_stream
);
any_pool!(
    EventPool, EventLease, OwnedEvent, EventHandle, "event";
    returns: 0, destroy: DestroyEvent;
    live_events, is_live_event, fail_event
);

/// Drops `pool`, which must destroy every handle it holds (where the machine
/// counts them), with no misuse.
#[track_caller]
pub fn assert_drop_destroys_the_rest<G: TestGpu, P: AnyPool<G::Backend>>(gpu: &G, pool: P) {
    drop(pool);
    let what = format!("dropping the {} pool destroys the rest", P::WHAT);
    crate::assert_count(P::live_on(gpu), 0, &what);
    crate::assert_no_misuse(gpu);
}
