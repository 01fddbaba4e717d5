//! The skeleton both pools are instances of: a [`Pool`] of one kind of handle
//! (streams or events), with a lazy per-device table of [`Slot`]s, the epoch
//! collector its stacks use, a parked error and (with `std`) per-thread
//! caches. What differs between the kinds is the [`PoolKind`]: what a slot
//! holds besides its ready list, how a handle is created and destroyed, and
//! where a handle flushed out of a thread's cell goes.
//!
//! Purge, statistics, the parked error, the checks of `put` and the pool's
//! drop are written here once. `StreamPool` and `EventPool` each wrap a
//! `Pool` and add their own `get`, return and `put` paths; the public
//! methods they share are expanded from [`shared_pool_methods`].

use crate::backend::{Backend, BackendId, DeviceId, DeviceSelector};
use crate::epoch::Pinning;
use crate::error::{BackendOp, Error};
use crate::lost;
use crate::stack::{Bag, Chain, Stack};
use crate::stats::{Counters, ParkedError, PoolStats};
use crate::sync::epoch::{self, Guard};
use crate::table::{DeviceSlot, DeviceTable};
use crate::thread_cache::ThreadCache;

/// The per-kind part of a pool over backend `B`.
pub(crate) trait PoolKind<B: Backend> {
    /// The handle the pool leases.
    type Handle: Copy;
    /// The list a device keeps besides its ready list and quarantine:
    /// streams returned with work pending (a [`Bag`]), or nothing (`()`).
    type Busy: BusyList<Self::Handle>;
    /// What the pool creates handles with.
    type Config;
    /// The backend call that creates a handle.
    const CREATE: BackendOp;
    /// The backend call that destroys a handle.
    const DESTROY: BackendOp;

    /// Creates a handle on `device`.
    fn create(
        backend: &B,
        device: DeviceId,
        config: &Self::Config,
    ) -> Result<Self::Handle, B::Error>;

    /// Destroys `handle`.
    ///
    /// # Safety
    /// `handle` is a live handle of `backend` (or of a backend of its id) on
    /// `device`, owned by the caller, which gives it up.
    unsafe fn destroy(backend: &B, handle: Self::Handle, device: DeviceId) -> Result<(), B::Error>;

    /// Puts the handle whose raw word (`as_raw`) is `raw`, taken out of a
    /// thread's cell (before a purge or the pool's drop), into `slot`'s
    /// shared lists.
    ///
    /// # Safety
    /// `raw` is the raw word of a live handle of this kind, of `slot`'s
    /// device, owned by the pool and in none of its lists.
    unsafe fn flushed(config: &Self::Config, slot: &Slot<Self::Handle, Self::Busy>, raw: usize);

    /// Whether a held handle ([`BusyList::take_held`]) may be destroyed
    /// now, at the pool's drop; `Err`: it may not, and is left alone (never
    /// destroyed: leaked, with the error reported). Default: yes.
    ///
    /// # Safety
    /// As for [`destroy`](Self::destroy).
    unsafe fn may_destroy_held(
        backend: &B,
        handle: Self::Handle,
        device: DeviceId,
    ) -> Result<(), Error<B::Error>> {
        let _ = (backend, handle, device);
        Ok(())
    }
}

/// A device's list of handles that are neither ready nor quarantined.
pub(crate) trait BusyList<H> {
    /// An empty list.
    fn new() -> Self;
    /// Takes every handle out.
    fn take_all(&self) -> Chain<H>;

    /// Takes out the handles a purge destroys: by default all of them.
    fn take_for_purge(&self) -> Chain<H> {
        self.take_all()
    }

    /// Takes out the handles a purge leaves (held because destroying them
    /// could break something: a stream still in a graph capture); the
    /// pool's drop destroys each only once its kind says it may. None by
    /// default.
    fn take_held(&self) -> Chain<H> {
        Chain::empty()
    }
}

impl<H> BusyList<H> for () {
    fn new() -> Self {}

    fn take_all(&self) -> Chain<H> {
        Chain::empty()
    }
}

impl<H> BusyList<H> for Bag<H> {
    fn new() -> Self {
        Bag::new()
    }

    fn take_all(&self) -> Chain<H> {
        Bag::take_all(self)
    }
}

/// One device's lists and tallies.
pub(crate) struct Slot<H, X> {
    /// Handles known idle, ready to lease. LIFO.
    pub(crate) ready: Stack<H>,
    /// The kind's other list ([`PoolKind::Busy`]).
    pub(crate) busy: X,
    /// Handles a backend call failed on (a query, a destroy): never leased
    /// again; purge and drop try to destroy them.
    pub(crate) quarantine: Bag<H>,
    pub(crate) counters: Counters,
}

impl<H, X: BusyList<H>> DeviceSlot for Slot<H, X> {
    fn new() -> Self {
        Slot {
            ready: Stack::new(),
            busy: X::new(),
            quarantine: Bag::new(),
            counters: Counters::default(),
        }
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// The slot type of kind `K` over `B`.
pub(crate) type SlotOf<B, K> = Slot<<K as PoolKind<B>>::Handle, <K as PoolKind<B>>::Busy>;

/// What [`Pool::slot`] finds: the device meant, and its slot.
type Found<'a, B, K> = Result<(DeviceId, &'a SlotOf<B, K>), Error<<B as Backend>::Error>>;

/// Per-device pools of one kind of handle.
pub(crate) struct Pool<B: Backend, K: PoolKind<B>> {
    pub(crate) backend: B,
    /// `backend.id()`, read once at construction (it never changes).
    pub(crate) id: BackendId,
    pub(crate) config: K::Config,
    pub(crate) pinning: Pinning,
    pub(crate) devices: DeviceTable<SlotOf<B, K>>,
    pub(crate) parked: ParkedError<Error<B::Error>>,
    /// Per-thread caches in front of the ready lists (empty without `std`).
    pub(crate) cache: ThreadCache,
}

impl<B: Backend, K: PoolKind<B>> Pool<B, K> {
    /// A pool that has not met its backend yet. `adopt_handles`: whether a
    /// thread that adopts an exited thread's cell may be served its handles.
    pub(crate) fn new(
        backend: B,
        config: K::Config,
        pinning: Pinning,
        adopt_handles: bool,
    ) -> Self {
        Pool {
            id: backend.id(),
            backend,
            config,
            pinning,
            devices: DeviceTable::new(),
            parked: ParkedError::new(),
            cache: ThreadCache::with_adoption(adopt_handles),
        }
    }

    /// The device a call is about, and its slot. Resolves "current" once, builds
    /// the table on first use, checks the range.
    #[inline]
    pub(crate) fn slot(&self, device: DeviceSelector) -> Found<'_, B, K> {
        self.devices.resolve(&self.backend, device)
    }

    /// [`slot`](Self::slot) for the `*_in` calls: first checks that `guard`
    /// is pinned in the pool's collector.
    #[inline]
    pub(crate) fn slot_in(&self, device: DeviceSelector, guard: &Guard) -> Found<'_, B, K> {
        if !self.pinning.owns(guard) {
            return Err(Error::ForeignGuard);
        }
        self.slot(device)
    }

    /// Pops `slot`'s ready list, else takes what `busy` finds, else creates a
    /// handle on `device`; counts how the handle was found.
    #[inline]
    pub(crate) fn pop_or_create(
        &self,
        device: DeviceId,
        slot: &SlotOf<B, K>,
        guard: &Guard,
        busy: impl FnOnce() -> Option<K::Handle>,
    ) -> Result<K::Handle, Error<B::Error>> {
        if let Some(h) = slot.ready.pop(guard) {
            Counters::bump(&slot.counters.reused);
            Ok(h)
        } else if let Some(h) = busy() {
            Counters::bump(&slot.counters.busy_hits);
            Ok(h)
        } else {
            let h = K::create(&self.backend, device, &self.config)
                .map_err(Error::backend(K::CREATE))?;
            Counters::bump(&slot.counters.created);
            Ok(h)
        }
    }

    /// The checks of `put`: a handle of this pool's backend (`owner`), on
    /// `device`, which is `given` if one is named, and in range. Returns the
    /// device's slot; nothing is changed.
    pub(crate) fn admit(
        &self,
        owner: BackendId,
        device: DeviceId,
        given: Option<DeviceId>,
    ) -> Result<&SlotOf<B, K>, Error<B::Error>> {
        if owner != self.id {
            return Err(Error::ForeignHandle);
        }
        if let Some(given) = given {
            if given != device {
                return Err(Error::WrongDevice {
                    given,
                    actual: device,
                });
            }
        }
        self.slot(DeviceSelector::Id(device)).map(|(_, slot)| slot)
    }

    /// Counts the end of a lease whose handle left the pool (`detach`);
    /// `returned`: whether the end is counted in the shared tallies (it is
    /// not for a lease served in place from a thread's cell).
    pub(crate) fn count_detached(&self, device: DeviceId, returned: bool) {
        if let Some(slot) = self.devices.slot_of(device) {
            if returned {
                Counters::bump(&slot.counters.returned);
            }
            Counters::bump(&slot.counters.detached);
        }
    }

    /// Tallies for one device (per-thread caches included), or `None` before
    /// the pool has met the backend or for a device out of range.
    pub(crate) fn stats(&self, device: DeviceId) -> Option<PoolStats> {
        self.devices
            .stats(device, || self.cache.counts(device.index()))
    }

    /// Tallies summed over all devices.
    pub(crate) fn total_stats(&self) -> PoolStats {
        self.devices.total_of(|d| self.stats(d))
    }

    /// Moves the handles `drained` from the per-thread cells to the shared
    /// lists ([`PoolKind::flushed`]), so that purge and drop reach them.
    fn flush_caches(&self, drained: alloc::vec::Vec<(usize, usize)>) {
        for (d, h) in drained {
            if let Some(slot) = self.devices.slot_of(DeviceId(d as u32)) {
                // SAFETY: cells hold only the raw words of live handles of
                // this pool, of device `d`; the drain took `h` out of its cell.
                unsafe { K::flushed(&self.config, slot, h) };
            }
        }
    }

    /// Destroys every handle in the lists: ready, busy (but the held ones,
    /// [`BusyList::take_held`]), quarantined. A failed destroy goes to
    /// `failed` with its slot and handle. Returns how many were destroyed.
    fn destroy_pooled(
        &self,
        guard: &Guard,
        mut failed: impl FnMut(&SlotOf<B, K>, K::Handle, Error<B::Error>),
    ) -> usize {
        let mut destroyed = 0;
        for (i, slot) in self.devices.get().unwrap_or(&[]).iter().enumerate() {
            let device = DeviceId(i as u32);
            // Held handles are left to the pool's drop (`destroy_held`).
            let mut busy = slot.busy.take_for_purge();
            let mut quarantined = slot.quarantine.take_all();
            let doomed = slot
                .ready
                .drain(guard)
                .into_iter()
                .chain(core::iter::from_fn(|| busy.pop_first()))
                .chain(core::iter::from_fn(|| quarantined.pop_first()));
            for h in doomed {
                // SAFETY: every handle in the lists was created by this pool's
                // backend on `device` (or put in with that promise) and is
                // owned by the pool alone; it was just taken out of the lists,
                // so nothing else can reach it.
                match unsafe { K::destroy(&self.backend, h, device) } {
                    Ok(()) => {
                        destroyed += 1;
                        Counters::bump(&slot.counters.destroyed);
                    }
                    Err(source) => failed(
                        slot,
                        h,
                        Error::Backend {
                            op: K::DESTROY,
                            source,
                        },
                    ),
                }
            }
        }
        destroyed
    }

    /// Purge with a guard pinned in the pool's collector (see the pools'
    /// `purge`): a handle whose destroy fails is quarantined, the first error
    /// returned after the others were tried, later ones parked.
    pub(crate) fn purge_in(&self, guard: &Guard) -> Result<usize, Error<B::Error>> {
        if !self.pinning.owns(guard) {
            return Err(Error::ForeignGuard);
        }
        self.flush_caches(self.cache.drain());
        let mut first_error = None;
        let destroyed = self.destroy_pooled(guard, |slot, h, e| {
            // Not destroyed: set aside (never leased again) for the next
            // purge or the pool's drop.
            slot.quarantine.push(h);
            Counters::bump(&slot.counters.quarantined);
            if first_error.is_none() {
                first_error = Some(e);
            } else {
                self.parked.park(e);
            }
        });
        match first_error {
            None => Ok(destroyed),
            Some(e) => Err(e),
        }
    }
}

impl<B: Backend, K: PoolKind<B>> Drop for Pool<B, K> {
    fn drop(&mut self) {
        let drained = self.cache.drain_all();
        self.flush_caches(drained);
        // An error parked and never taken has nobody left to take it now.
        if let Some(e) = self.parked.take() {
            lost::report(&e);
        }
        // No lease can be out (each borrows its pool), and no other thread can
        // be inside a method. Destroy everything; an error has no owner left
        // to park it with, so it goes to `lost_errors` and the hook.
        // SAFETY: `&mut self` excludes every concurrent reader of the stacks,
        // so their nodes may be freed at once, which the unprotected guard does.
        let guard = unsafe { epoch::unprotected() };
        self.destroy_pooled(guard, |_, _, e| lost::report(&e));
        self.destroy_held();
    }
}

impl<B: Backend, K: PoolKind<B>> Pool<B, K> {
    /// The pool's drop, for the handles a purge leaves: each is destroyed
    /// if its kind says it may be; otherwise it is leaked and the reason
    /// reported (a stream destroyed while its capture is open would break
    /// that capture, which its owner is still recording).
    fn destroy_held(&self) {
        for (i, slot) in self.devices.get().unwrap_or(&[]).iter().enumerate() {
            let device = DeviceId(i as u32);
            let mut held = slot.busy.take_held();
            while let Some(h) = held.pop_first() {
                // SAFETY: a handle of the pool's lists (as in
                // `destroy_pooled`), taken out of them here; it is
                // destroyed below or never used again.
                let outcome =
                    unsafe { K::may_destroy_held(&self.backend, h, device) }.and_then(|()| {
                        // SAFETY: as above; the kind said it may be destroyed.
                        unsafe { K::destroy(&self.backend, h, device) }
                            .map_err(Error::backend(K::DESTROY))
                    });
                match outcome {
                    Ok(()) => Counters::bump(&slot.counters.destroyed),
                    Err(e) => lost::report(&e),
                }
            }
        }
    }
}

/// The public methods every pool has, forwarded to its `inner` [`Pool`]:
/// written once, expanded in `StreamPool`'s and `EventPool`'s `impl` blocks,
/// each naming its lease type and what it holds (for the docs), and giving
/// the attributes of its `get` and `get_slow` and the doc comment of its
/// `purge`. Each pool has `take_memo` (a lease from the calling thread's
/// memoised cell), `take_cached` (`std`: from its cell found the slow way) and
/// `get_from` (the shared lists, or the backend).
macro_rules! shared_pool_methods {
    (
        $lease:ident, $what:literal;
        get: [$(#[$get_attr:meta])*], get_slow: [$(#[$slow_attr:meta])*];
        $(#[$purge_doc:meta])*
    ) => {
        #[doc = concat!("Leases a ", $what, " on `device`: the calling thread's own first, else a")]
        /// pooled one, else a new one (see the [module documentation](self)).
        $(#[$get_attr])*
        #[cfg(feature = "std")]
        pub fn get(
            &self,
            device: impl Into<$crate::backend::DeviceSelector>,
        ) -> Result<$lease<'_, B>, $crate::error::Error<B::Error>> {
            let device = device.into();
            // The calling thread's own cell first: no epoch, no shared line. A
            // cell in the memo was registered after its device was checked, so
            // a hit needs no table lookup.
            if let $crate::backend::DeviceSelector::Id(d) = device {
                let memo = self.inner.cache.memo(d.index());
                if let Some(lease) = memo.and_then(|c| self.take_memo(d, c)) {
                    return Ok(lease);
                }
            }
            self.get_slow(device)
        }

        /// `get` past the memo: resolves the device, then the thread's cell
        /// (found the slow way, registered if need be), then the shared lists
        /// or the backend.
        $(#[$slow_attr])*
        #[cfg(feature = "std")]
        fn get_slow(
            &self,
            device: $crate::backend::DeviceSelector,
        ) -> Result<$lease<'_, B>, $crate::error::Error<B::Error>> {
            let (device, slot) = self.inner.slot(device)?;
            if let Some(lease) = self.take_cached(device) {
                return Ok(lease);
            }
            self.inner.pinning.pin(|g| self.get_from(device, slot, g))
        }

        /// [`get`](Self::get) with a guard the caller pinned in
        /// [`collector`](Self::collector).
        ///
        #[doc = concat!("With `std`, like `get`, it takes the calling thread's kept ", $what)]
        /// first (the cell its returns fill), so `get_in`/drop cycles reuse
        #[doc = concat!("one ", $what, " instead of creating a new one while the cell fills.")]
        /// Without `std` there are no cells: it uses the shared lists.
        pub fn get_in(
            &self,
            device: impl Into<$crate::backend::DeviceSelector>,
            guard: &$crate::sync::epoch::Guard,
        ) -> Result<$lease<'_, B>, $crate::error::Error<B::Error>> {
            let (device, slot) = self.inner.slot_in(device.into(), guard)?;
            if let Some(lease) = self.take_cached(device) {
                return Ok(lease);
            }
            self.get_from(device, slot, guard)
        }

        /// The backend.
        pub fn backend(&self) -> &B {
            &self.inner.backend
        }

        /// The epoch collector the pool's stacks use; guards passed to the
        /// `*_in` calls must be pinned in it.
        pub fn collector(&self) -> &$crate::sync::epoch::Collector {
            self.inner.pinning.collector()
        }

        $(#[$purge_doc])*
        #[cfg(feature = "std")]
        pub fn purge(&self) -> Result<usize, $crate::error::Error<B::Error>> {
            self.inner.pinning.pin(|g| self.inner.purge_in(g))
        }

        /// [`purge`](Self::purge) with a guard the caller pinned in
        /// [`collector`](Self::collector).
        pub fn purge_in(
            &self,
            guard: &$crate::sync::epoch::Guard,
        ) -> Result<usize, $crate::error::Error<B::Error>> {
            self.inner.purge_in(guard)
        }

        /// Tallies for one device, or `None` before the pool has met the
        /// backend or for a device out of range.
        pub fn stats(&self, device: $crate::backend::DeviceId) -> Option<$crate::stats::PoolStats> {
            self.inner.stats(device)
        }

        /// Tallies summed over all devices.
        pub fn total_stats(&self) -> $crate::stats::PoolStats {
            self.inner.total_stats()
        }

        /// Leases out right now, over all devices.
        pub fn live_leases(&self) -> usize {
            self.inner.total_stats().live_leases
        }

        /// The number of devices, once the pool has asked the backend.
        pub fn device_count(&self) -> Option<usize> {
            self.inner.devices.len()
        }

        /// Takes the first error met where none could be returned (a lease's
        /// `Drop`, a failed query during a scan, a purge's second failure), if
        /// any.
        pub fn take_error(&self) -> Option<$crate::error::Error<B::Error>> {
            self.inner.parked.take()
        }

        /// How many errors were dropped because one was already parked.
        pub fn dropped_errors(&self) -> usize {
            self.inner.parked.dropped()
        }
    };
}
pub(crate) use shared_pool_methods;

impl<B: Backend, K: PoolKind<B>> Pool<B, K>
where
    K::Config: core::fmt::Debug,
{
    /// Formats the pool as `name { config_name: config, devices: count, .. }`.
    pub(crate) fn fmt_as(
        &self,
        f: &mut core::fmt::Formatter<'_>,
        name: &str,
        config_name: &str,
    ) -> core::fmt::Result {
        f.debug_struct(name)
            .field(config_name, &self.config)
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

/// Formats a lease as `name { field: handle, device: device }`.
pub(crate) fn fmt_lease(
    f: &mut core::fmt::Formatter<'_>,
    name: &str,
    field: &str,
    handle: &dyn core::fmt::Debug,
    device: DeviceId,
) -> core::fmt::Result {
    f.debug_struct(name)
        .field(field, handle)
        .field("device", &device)
        .finish()
}
