//! [`EventPool`]: per-device pools of events, handed out as [`EventLease`]s or
//! as reference-counted [`SharedEvent`]s.
//!
//! One ready list per device (a lock-free LIFO stack). `get` pops it, or creates an
//! event with the pool's flags; returning pushes it back with no backend call at
//! all. A returned event may still be pending (recorded, not yet complete):
//! recording it again is legal, and waits already issued on it keep the point
//! they captured.
//!
//! Differences from DALI's `CUDAEventPool`, on purpose: lazy (the constructor
//! makes no backend call; DALI's counts devices and throws without a GPU); RAII
//! leases; an event is returned to *its own* device's list (DALI's `Put`
//! without a device uses the current device); any out-of-range device is an
//! error (DALI maps only -1 to "current" and indexes out of bounds for others).

use core::fmt;
use core::mem::ManuallyDrop;
use core::ops::Deref;

use crate::backend::{BackendId, DeviceId, DeviceSelector, EventBackend, EventFlags, EventHandle};
use crate::epoch::Pinning;
use crate::error::{BackendOp, Error, Rejected};
use crate::stack::{Bag, Stack};
use crate::stats::{Counters, ParkedError, PoolStats};
use crate::sync::epoch::{self, Collector, Guard};
use crate::sync::Arc;
use crate::table::{DeviceSlot, DeviceTable};
#[cfg(all(feature = "std", not(loom)))]
use crate::thread_cache::ThreadCache;

/// An event owned by the caller, outside any pool: what [`EventLease::detach`]
/// hands out and [`EventPool::put`] takes back. Not `Clone`; dropping it
/// neither destroys nor returns the event. It knows the backend that made it:
/// a pool or backend of another [`BackendId`] refuses it with
/// [`Error::ForeignHandle`].
#[must_use = "dropping an OwnedEvent leaks the event: put it back or destroy it"]
#[derive(Debug, PartialEq, Eq)]
pub struct OwnedEvent {
    /// A live event of `owner` on `device`, never null (checked by every
    /// constructor), owned by this value alone.
    handle: EventHandle,
    device: DeviceId,
    owner: BackendId,
}

impl OwnedEvent {
    /// Takes ownership of a raw event of `backend` created on `device` (CUDA
    /// cannot tell an event's device, so the caller says it). The null handle
    /// is refused.
    ///
    /// # Safety
    /// The caller hands the event over, as with `File::from_raw_fd`:
    /// 1. `handle` is a live event created on `device` by a backend with
    ///    `backend`'s [`id`](crate::Backend::id);
    /// 2. nothing else owns it or will use it as its own from now on (a pool
    ///    that took it twice would lease one event to two users).
    pub unsafe fn from_raw_parts<B: EventBackend>(
        backend: &B,
        handle: EventHandle,
        device: DeviceId,
    ) -> Result<Self, Error<B::Error>> {
        if handle.is_null() {
            return Err(Error::NullHandle);
        }
        Ok(OwnedEvent {
            handle,
            device,
            owner: backend.id(),
        })
    }

    /// The backend the event belongs to.
    pub fn backend_id(&self) -> BackendId {
        self.owner
    }

    /// The raw handle.
    pub fn handle(&self) -> EventHandle {
        self.handle
    }

    /// The device the event was created on.
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// Gives up ownership and returns the raw handle; the caller destroys it.
    pub fn into_raw(self) -> EventHandle {
        self.handle
    }

    /// Destroys the event. On failure (a backend of another [`BackendId`]:
    /// [`Error::ForeignHandle`], nothing called; a failed destroy) the event
    /// comes back with the error.
    pub fn destroy<B: EventBackend>(
        self,
        backend: &B,
    ) -> Result<(), Rejected<OwnedEvent, B::Error>> {
        if backend.id() != self.owner {
            return Err(Rejected {
                value: self,
                error: Error::ForeignHandle,
            });
        }
        // SAFETY: `self` owns a live event of `device`, made by a backend of
        // this id (checked above), and is consumed here.
        match unsafe { backend.destroy_event(self.handle, self.device) } {
            Ok(()) => Ok(()),
            Err(e) => Err(Rejected {
                value: self,
                error: Error::Backend {
                    op: BackendOp::DestroyEvent,
                    source: e,
                },
            }),
        }
    }
}

struct EventSlot {
    ready: Stack<EventHandle>,
    /// Events whose destroy failed: never leased again; purge and drop try
    /// again.
    quarantine: Bag<EventHandle>,
    counters: Counters,
}

impl DeviceSlot for EventSlot {
    fn new() -> Self {
        EventSlot {
            ready: Stack::new(),
            quarantine: Bag::new(),
            counters: Counters::default(),
        }
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// Per-device pools of events. See the [module documentation](self).
///
/// ```
/// use gpupool_core::{EventFlags, EventPool};
/// use gpupool_mock::MockBackend;
///
/// let mock = MockBackend::new(1);
/// let pool = EventPool::new(mock.clone());                 // timing disabled
/// assert_eq!(pool.flags(), EventFlags::DISABLE_TIMING);
/// let e = pool.get(0).unwrap().handle();                      // created, then returned
/// assert_eq!(pool.get(0).unwrap().handle(), e);               // reused
/// let shared = pool.get_shared(0).unwrap();
/// let again = shared.clone();
/// drop(shared);
/// drop(again);                                             // the last clone returns it
/// assert_eq!(pool.live_leases(), 0);
/// ```
pub struct EventPool<B: EventBackend> {
    backend: B,
    /// `backend.id()`, read once at construction (it never changes).
    id: BackendId,
    flags: EventFlags,
    pinning: Pinning,
    devices: DeviceTable<EventSlot>,
    parked: ParkedError<Error<B::Error>>,
    /// Per-thread caches in front of the ready lists (`std` only; the loom
    /// models check the cache on its own, see `internals::CacheModel`).
    #[cfg(all(feature = "std", not(loom)))]
    cache: ThreadCache,
}

impl<B: EventBackend> fmt::Debug for EventPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventPool")
            .field("flags", &self.flags)
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

impl<B: EventBackend> EventPool<B> {
    /// A pool of events with timing disabled, using crossbeam-epoch's global
    /// collector. Makes no backend call.
    #[cfg(feature = "std")]
    pub fn new(backend: B) -> Self {
        Self::with_flags(backend, EventFlags::default())
    }

    /// A pool of events created with `flags`.
    #[cfg(feature = "std")]
    pub fn with_flags(backend: B, flags: EventFlags) -> Self {
        Self::build(backend, flags, Pinning::global())
    }

    /// A pool whose stacks use `collector` (for `no_std`; see
    /// [`StreamPool::with_collector`](crate::StreamPool::with_collector)).
    pub fn with_collector(backend: B, flags: EventFlags, collector: Collector) -> Self {
        Self::build(backend, flags, Pinning::with(collector))
    }

    fn build(backend: B, flags: EventFlags, pinning: Pinning) -> Self {
        EventPool {
            id: backend.id(),
            backend,
            flags,
            pinning,
            devices: DeviceTable::new(),
            parked: ParkedError::new(),
            #[cfg(all(feature = "std", not(loom)))]
            cache: ThreadCache::new(),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The flags every event of this pool is created with.
    pub fn flags(&self) -> EventFlags {
        self.flags
    }

    /// The epoch collector the pool's stacks use.
    pub fn collector(&self) -> &Collector {
        self.pinning.collector()
    }

    /// Leases an event on `device`: a pooled one, or a new one.
    #[cfg(feature = "std")]
    #[inline]
    pub fn get(
        &self,
        device: impl Into<DeviceSelector>,
    ) -> Result<EventLease<'_, B>, Error<B::Error>> {
        let device = device.into();
        // The calling thread's own cache first: no epoch, no shared line. A cell
        // in the memo was registered after its device was checked, so a hit
        // needs no table lookup.
        // The event is leased in place: it stays in the cell, marked, and the
        // lease's drop puts it back with one plain store.
        #[cfg(not(loom))]
        if let DeviceSelector::Id(d) = device {
            if let Some((h, cell_slot)) = self.cache.memo(d.index()).and_then(|c| c.lease()) {
                return Ok(EventLease {
                    pool: self,
                    // SAFETY: cells hold only events this pool created on the
                    // cell's device and owns.
                    event: unsafe { EventHandle::from_raw(h) },
                    device: d,
                    in_place: Some(cell_slot),
                });
            }
        }
        self.get_slow(device)
    }

    /// `get` past the memo: resolves the device, then the thread's cell (found
    /// the slow way, registered if need be), then the shared list or the backend.
    #[cfg(feature = "std")]
    #[inline(never)]
    fn get_slow(&self, device: DeviceSelector) -> Result<EventLease<'_, B>, Error<B::Error>> {
        let (device, slot) = self.slot(device)?;
        #[cfg(not(loom))]
        if let Some(Some(h)) = self.cache.with_cell(device.index(), |c| c.take()) {
            // SAFETY: as in `get`.
            return Ok(EventLease::new(
                self,
                unsafe { EventHandle::from_raw(h) },
                device,
            ));
        }
        self.pinning.pin(|g| self.get_from(device, slot, g))
    }

    /// [`get`](Self::get) with a guard the caller pinned in [`collector`](Self::collector).
    ///
    /// With `std`, like `get`, it takes an event from the calling thread's
    /// cache first (the cell its returns fill), so `get_in`/drop cycles reuse
    /// one event. Without `std` there are no cells: it uses the shared lists.
    pub fn get_in(
        &self,
        device: impl Into<DeviceSelector>,
        guard: &Guard,
    ) -> Result<EventLease<'_, B>, Error<B::Error>> {
        if !self.pinning.owns(guard) {
            return Err(Error::ForeignGuard);
        }
        let (device, slot) = self.slot(device.into())?;
        #[cfg(all(feature = "std", not(loom)))]
        if let Some(Some(h)) = self.cache.with_cell(device.index(), |c| c.take()) {
            // SAFETY: cells hold only events this pool created on the cell's
            // device (`device`) and owns.
            return Ok(EventLease::new(
                self,
                unsafe { EventHandle::from_raw(h) },
                device,
            ));
        }
        self.get_from(device, slot, guard)
    }

    /// Pops `device`'s ready list, or creates an event.
    fn get_from<'p>(
        &'p self,
        device: DeviceId,
        slot: &EventSlot,
        guard: &Guard,
    ) -> Result<EventLease<'p, B>, Error<B::Error>> {
        let event = match slot.ready.pop(guard) {
            Some(e) => {
                Counters::bump(&slot.counters.reused);
                e
            }
            None => {
                let e = self
                    .backend
                    .create_event(device, self.flags)
                    .map_err(Error::backend(BackendOp::CreateEvent))?;
                Counters::bump(&slot.counters.created);
                e
            }
        };
        Ok(EventLease::new(self, event, device))
    }

    /// Leases an event as a [`SharedEvent`], returned when the last clone drops.
    #[cfg(feature = "std")]
    pub fn get_shared(
        &self,
        device: impl Into<DeviceSelector>,
    ) -> Result<SharedEvent<'_, B>, Error<B::Error>> {
        self.get(device).map(EventLease::share)
    }

    /// Takes an event into the pool. `device` names the device it belongs to, or
    /// `None` for the event's own. On a wrong or out-of-range device the event
    /// comes back in the error and the pool is unchanged, as it does for an
    /// event of another backend ([`Error::ForeignHandle`]). Makes no backend
    /// call once the pool knows the device count.
    pub fn put(
        &self,
        event: OwnedEvent,
        device: Option<DeviceId>,
    ) -> Result<(), Rejected<OwnedEvent, B::Error>> {
        if event.owner != self.id {
            return Err(Rejected {
                value: event,
                error: Error::ForeignHandle,
            });
        }
        if let Some(given) = device {
            if given != event.device {
                let actual = event.device;
                return Err(Rejected {
                    value: event,
                    error: Error::WrongDevice { given, actual },
                });
            }
        }
        match self.slot(DeviceSelector::Id(event.device)) {
            Ok((_, slot)) => {
                // Taken in, wherever it goes below.
                Counters::bump(&slot.counters.put);
                // The calling thread's cell first, so that its next `get` takes
                // the event put last (no lease ends here: not counted).
                #[cfg(all(feature = "std", not(loom)))]
                if self
                    .cache
                    .with_cell(event.device.index(), |c| c.keep(event.handle.as_raw()))
                    == Some(true)
                {
                    return Ok(());
                }
                slot.ready.push(event.handle);
                Ok(())
            }
            Err(error) => Err(Rejected {
                value: event,
                error,
            }),
        }
    }

    /// Destroys every pooled event. Leases that are out come back normally
    /// later. Returns how many were destroyed. An event whose destroy fails
    /// stays pooled for the next purge; the first failure is returned after the
    /// others were tried, later ones are parked.
    #[cfg(feature = "std")]
    pub fn purge(&self) -> Result<usize, Error<B::Error>> {
        self.pinning.pin(|g| self.purge_in(g))
    }

    /// [`purge`](Self::purge) with a guard the caller pinned in [`collector`](Self::collector).
    pub fn purge_in(&self, guard: &Guard) -> Result<usize, Error<B::Error>> {
        if !self.pinning.owns(guard) {
            return Err(Error::ForeignGuard);
        }
        self.flush_caches();
        let mut first_error = None;
        let mut destroyed = 0;
        for (i, slot) in self.devices.get().unwrap_or(&[]).iter().enumerate() {
            let device = DeviceId(i as u32);
            let mut quarantined = slot.quarantine.take_all();
            let doomed = slot
                .ready
                .drain(guard)
                .into_iter()
                .chain(core::iter::from_fn(|| quarantined.pop_first()));
            for e in doomed {
                // SAFETY: events of the lists: created by this pool's backend
                // on `device`, owned by the pool alone, just taken out.
                match unsafe { self.backend.destroy_event(e, device) } {
                    Ok(()) => {
                        destroyed += 1;
                        Counters::bump(&slot.counters.destroyed);
                    }
                    Err(source) => {
                        // Not destroyed: set aside for the next purge, never
                        // leased again.
                        slot.quarantine.push(e);
                        Counters::bump(&slot.counters.quarantined);
                        let e = Error::Backend {
                            op: BackendOp::DestroyEvent,
                            source,
                        };
                        if first_error.is_none() {
                            first_error = Some(e);
                        } else {
                            self.parked.park(e);
                        }
                    }
                }
            }
        }
        match first_error {
            None => Ok(destroyed),
            Some(e) => Err(e),
        }
    }

    /// Moves every handle the per-thread caches hold to the shared ready lists,
    /// so that purge and drop reach them.
    fn flush_caches(&self) {
        #[cfg(all(feature = "std", not(loom)))]
        for (d, h) in self.cache.drain() {
            if let Some(slot) = self.devices.slot_of(DeviceId(d as u32)) {
                // SAFETY: cells hold only events of this pool, of device `d`.
                slot.ready.push(unsafe { EventHandle::from_raw(h) });
            }
        }
    }

    /// Tallies for one device, or `None` before first use or out of range.
    pub fn stats(&self, device: DeviceId) -> Option<PoolStats> {
        self.devices.stats(device, || {
            #[cfg(all(feature = "std", not(loom)))]
            return self.cache.counts(device.index());
            #[cfg(not(all(feature = "std", not(loom))))]
            (0, 0)
        })
    }

    /// Tallies summed over all devices.
    pub fn total_stats(&self) -> PoolStats {
        self.devices.total_of(|d| self.stats(d))
    }

    /// Leases out right now, over all devices.
    pub fn live_leases(&self) -> usize {
        self.total_stats().live_leases
    }

    /// The number of devices, once the pool has asked the backend.
    pub fn device_count(&self) -> Option<usize> {
        self.devices.len()
    }

    /// Takes the first error met where none could be returned, if any.
    pub fn take_error(&self) -> Option<Error<B::Error>> {
        self.parked.take()
    }

    /// How many errors were dropped because one was already parked.
    pub fn dropped_errors(&self) -> usize {
        self.parked.dropped()
    }

    /// Parks an error met where it could not be returned.
    pub(crate) fn park(&self, e: Error<B::Error>) {
        self.parked.park(e)
    }

    fn slot(&self, device: DeviceSelector) -> Result<(DeviceId, &EventSlot), Error<B::Error>> {
        self.devices.resolve(&self.backend, device)
    }

    /// The slot of a leased event's device: always there, since a lease exists
    /// only after its slot was found and borrows the pool that owns the table.
    /// (No assertion: this runs in a lease's drop, which never panics.)
    fn leased_slot(&self, device: DeviceId) -> Option<&EventSlot> {
        self.devices.slot_of(device)
    }
}

impl<B: EventBackend> Drop for EventPool<B> {
    fn drop(&mut self) {
        self.flush_caches();
        // An error parked and never taken has nobody left to take it now.
        if let Some(e) = self.parked.take() {
            crate::lost::report(&e);
        }
        if let Some(table) = self.devices.take() {
            // SAFETY: `&mut self` excludes every concurrent reader of the stacks,
            // so their nodes may be freed at once.
            let guard = unsafe { epoch::unprotected() };
            for (i, slot) in table.iter().enumerate() {
                let mut quarantined = slot.quarantine.take_all();
                let doomed = slot
                    .ready
                    .drain(guard)
                    .into_iter()
                    .chain(core::iter::from_fn(|| quarantined.pop_first()));
                for e in doomed {
                    // No owner is left to park an error with: `lost_errors`.
                    // SAFETY: events of the lists: this backend's, of device
                    // `i`, owned by the pool alone (no lease is out).
                    let destroyed = unsafe { self.backend.destroy_event(e, DeviceId(i as u32)) };
                    if let Err(source) = destroyed {
                        crate::lost::report(&Error::<B::Error>::Backend {
                            op: BackendOp::DestroyEvent,
                            source,
                        });
                    }
                }
            }
        }
    }
}

/// An exclusive lease of a pooled event; returns it to its pool when dropped.
#[must_use = "dropping a lease returns the event at once"]
pub struct EventLease<'p, B: EventBackend> {
    pool: &'p EventPool<B>,
    event: EventHandle,
    device: DeviceId,
    /// The cell slot the event is leased in place from (`std`): the lease
    /// owns it until it ends, and ends by writing the slot once.
    #[cfg(all(feature = "std", not(loom)))]
    in_place: Option<&'p crate::sync::AtomicUsize>,
}

impl<B: EventBackend> fmt::Debug for EventLease<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventLease")
            .field("event", &self.event)
            .field("device", &self.device)
            .finish()
    }
}

impl<'p, B: EventBackend> EventLease<'p, B> {
    /// A lease of an event taken out of every list.
    fn new(pool: &'p EventPool<B>, event: EventHandle, device: DeviceId) -> Self {
        EventLease {
            pool,
            event,
            device,
            #[cfg(all(feature = "std", not(loom)))]
            in_place: None,
        }
    }

    /// Ends an in-place lease, leaving its cell slot empty; false if the
    /// lease was not in place (its end is counted in the shared tallies).
    fn vacate(&self) -> bool {
        #[cfg(all(feature = "std", not(loom)))]
        if let Some(s) = self.in_place {
            crate::thread_cache::vacate(s);
            return true;
        }
        false
    }

    /// The raw event handle, for the backend's own calls (valid while the
    /// lease lives).
    #[inline]
    pub fn handle(&self) -> EventHandle {
        self.event
    }

    /// The device the event belongs to.
    #[inline]
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// The pool the event returns to.
    #[inline]
    pub fn pool(&self) -> &'p EventPool<B> {
        self.pool
    }

    /// Ends the lease without returning the event: the caller owns it now.
    pub fn detach(self) -> OwnedEvent {
        let this = ManuallyDrop::new(self);
        let slot = this.pool.leased_slot(this.device);
        if !this.vacate() {
            if let Some(slot) = slot {
                Counters::bump(&slot.counters.returned);
            }
        }
        if let Some(slot) = slot {
            // The event leaves the pool (`PoolStats::pooled`).
            Counters::bump(&slot.counters.detached);
        }
        OwnedEvent {
            handle: this.event,
            device: this.device,
            owner: this.pool.id,
        }
    }

    /// Destroys the event instead of returning it (after a failed record, say).
    /// If the destroy fails, the pool quarantines the event (keeps it for the
    /// next purge, never leases it again), so it is not lost, and the error is
    /// returned.
    pub fn destroy(self) -> Result<(), Error<B::Error>> {
        let this = ManuallyDrop::new(self);
        let slot = this.pool.leased_slot(this.device);
        if !this.vacate() {
            if let Some(slot) = slot {
                Counters::bump(&slot.counters.returned);
            }
        }
        // SAFETY: the lease held this event of the pool's backend on its
        // device alone; it ends here without going back to any list.
        match unsafe { this.pool.backend.destroy_event(this.event, this.device) } {
            Ok(()) => {
                if let Some(slot) = slot {
                    Counters::bump(&slot.counters.destroyed);
                }
                Ok(())
            }
            Err(source) => {
                if let Some(slot) = slot {
                    slot.quarantine.push(this.event);
                    Counters::bump(&slot.counters.quarantined);
                }
                Err(Error::Backend {
                    op: BackendOp::DestroyEvent,
                    source,
                })
            }
        }
    }

    /// Turns the lease into a reference-counted [`SharedEvent`].
    pub fn share(self) -> SharedEvent<'p, B> {
        SharedEvent {
            lease: Arc::new(self),
        }
    }
}

impl<B: EventBackend> Drop for EventLease<'_, B> {
    #[inline]
    fn drop(&mut self) {
        // Leased in place: back into its slot, whichever thread this is.
        #[cfg(all(feature = "std", not(loom)))]
        if let Some(s) = self.in_place {
            crate::thread_cache::unlease(s, self.event.as_raw());
            return;
        }
        self.give_back();
    }
}

impl<B: EventBackend> EventLease<'_, B> {
    /// Returns an event not leased in place.
    #[inline(never)]
    fn give_back(&mut self) {
        // The returning thread's cache next (no epoch, no shared line).
        #[cfg(all(feature = "std", not(loom)))]
        if self
            .pool
            .cache
            .with_cell(self.device.index(), |c| c.give(self.event.as_raw()))
            == Some(true)
        {
            return;
        }
        if let Some(slot) = self.pool.leased_slot(self.device) {
            Counters::bump(&slot.counters.returned);
            slot.ready.push(self.event);
        }
    }
}

/// A reference-counted event lease: clones share one event, which returns to
/// its pool when the last clone drops (DALI's `CUDASharedEvent`).
pub struct SharedEvent<'p, B: EventBackend> {
    lease: Arc<EventLease<'p, B>>,
}

impl<B: EventBackend> Clone for SharedEvent<'_, B> {
    fn clone(&self) -> Self {
        SharedEvent {
            lease: self.lease.clone(),
        }
    }
}

impl<B: EventBackend> fmt::Debug for SharedEvent<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedEvent").field(&*self.lease).finish()
    }
}

impl<'p, B: EventBackend> Deref for SharedEvent<'p, B> {
    type Target = EventLease<'p, B>;
    fn deref(&self) -> &EventLease<'p, B> {
        &self.lease
    }
}
