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

#[cfg(feature = "std")]
use crate::backend::DeviceSelector;
use crate::backend::{DeviceId, EventBackend, EventFlags, EventHandle};
use crate::epoch::Pinning;
use crate::error::{BackendOp, Error, Rejected};
pub use crate::owned::OwnedEvent;
use crate::pool::{shared_pool_methods, Pool, PoolKind, Slot};
use crate::stats::Counters;
use crate::sync::epoch::{Collector, Guard};
#[cfg(all(feature = "std", any(loom, target_has_atomic = "64")))]
use crate::sync::AtomicU64;
#[cfg(feature = "std")]
use crate::sync::AtomicUsize;

mod lease;
pub(crate) use lease::LastRecord;
pub use lease::{EventLease, SharedEvent};

/// The event kind of [`Pool`]: a device keeps only a ready list (and the
/// quarantine); a returned event goes back with no backend call.
pub(crate) struct Events;

impl<B: EventBackend> PoolKind<B> for Events {
    type Handle = EventHandle;
    type Busy = ();
    type Config = EventFlags;
    const CREATE: BackendOp = BackendOp::CreateEvent;
    const DESTROY: BackendOp = BackendOp::DestroyEvent;

    #[inline]
    fn create(backend: &B, device: DeviceId, flags: &EventFlags) -> Result<EventHandle, B::Error> {
        backend.create_event(device, *flags)
    }

    #[inline]
    unsafe fn destroy(backend: &B, handle: EventHandle, device: DeviceId) -> Result<(), B::Error> {
        // SAFETY: the caller's guarantee (`PoolKind::destroy`).
        unsafe { backend.destroy_event(handle, device) }
    }

    unsafe fn flushed(_: &EventFlags, slot: &EventSlot, raw: usize) {
        // SAFETY: the caller's guarantee: the raw word of a live event.
        slot.ready.push(unsafe { EventHandle::from_raw(raw) });
    }
}

/// One device's lists: ready and quarantine.
type EventSlot = Slot<EventHandle, ()>;

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
    /// The lists, tallies, parked error and (`std`) the per-thread cells in
    /// front of the ready lists.
    inner: Pool<B, Events>,
    /// The thread that watches the events of [`Completed`](crate::Completed)
    /// futures, started by the first one.
    #[cfg(feature = "std")]
    completion: crate::completion_engine::EngineSlot<B>,
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
            // Every cached event is idle: an adopted cell's may be served.
            inner: Pool::new(backend, flags, pinning, true),
            #[cfg(feature = "std")]
            completion: crate::completion_engine::EngineSlot::new(),
        }
    }

    /// The completion engine, started by the first call.
    #[cfg(feature = "std")]
    pub(crate) fn completion_engine(
        &self,
    ) -> Result<&crate::completion_engine::Engine<B>, Error<B::Error>>
    where
        B: Clone + 'static,
    {
        self.completion
            .get(&self.inner.backend)
            .map_err(|_| Error::CompletionThread)
    }

    /// How long the first poll of a [`Completed`](crate::Completed) future
    /// of this pool asks about its event itself before the completion
    /// engine watches it
    /// ([`DEFAULT_COMPLETION_SPIN`](crate::DEFAULT_COMPLETION_SPIN) unless
    /// set).
    #[cfg(feature = "std")]
    pub fn completion_spin(&self) -> core::time::Duration {
        self.completion.spin()
    }

    /// Sets how long the first poll of each later
    /// [`Completed`](crate::Completed) future of this pool asks about its
    /// event itself (one backend query, for CUDA `cuEventQuery`, about every
    /// microsecond) before it hands the event to the completion engine. Work
    /// that finishes within the budget resolves in that poll, with no other
    /// thread involved and microseconds of latency; the polling thread (an
    /// async runtime's worker) is busy for up to the budget. `ZERO` turns
    /// it off: every pending future goes to the engine at once (for work
    /// that runs long, or runtimes whose threads must not wait at all).
    /// Budgets above `u32::MAX` ns (about 4.3 s) are clamped.
    ///
    /// ```
    /// use core::time::Duration;
    /// use gpupool_core::EventPool;
    /// use gpupool_mock::MockBackend;
    ///
    /// let events = EventPool::new(MockBackend::new(1));
    /// assert_eq!(events.completion_spin(), gpupool_core::DEFAULT_COMPLETION_SPIN);
    /// events.set_completion_spin(Duration::ZERO); // long kernels: never spin
    /// assert_eq!(events.completion_spin(), Duration::ZERO);
    /// ```
    #[cfg(feature = "std")]
    pub fn set_completion_spin(&self, budget: core::time::Duration) {
        self.completion.set_spin(budget);
    }

    shared_pool_methods! {
        EventLease, "event";
        // The memo hit inline, the rest out of line.
        get: [
            ///
            /// ```
            /// use gpupool_core::EventPool;
            /// use gpupool_mock::MockBackend;
            ///
            /// let events = EventPool::new(MockBackend::new(1));
            /// let event = events.get(0)?;
            /// assert_eq!(event.device().0, 0);
            /// drop(event); // back to the pool: no backend call
            /// assert_eq!(events.get(0)?.pool().total_stats().created, 1); // reused
            /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
            /// ```
            #[inline]
        ], get_slow: [#[inline(never)]];
        /// Destroys every pooled event. Leases that are out come back normally
        /// later. Returns how many were destroyed. An event whose destroy fails
        /// stays pooled for the next purge; the first failure is returned after the
        /// others were tried, later ones are parked. (On Linux a purge runs one
        /// `membarrier` call to take the events other threads keep; where the
        /// kernel refuses it, those stay pooled for a later purge or the drop.)
    }

    /// The flags every event of this pool is created with.
    pub fn flags(&self) -> EventFlags {
        self.inner.config
    }

    /// A lease of an event in the calling thread's memoised `cell` of
    /// `device`, if it holds one. The event is leased in place: it stays in
    /// the cell, marked, and the lease's drop puts it back with one plain
    /// store.
    #[cfg(feature = "std")] // only `get` (std) reads the memo
    #[inline]
    fn take_memo<'p>(
        &'p self,
        device: DeviceId,
        cell: &'p crate::thread_cache::Cell,
    ) -> Option<EventLease<'p, B>> {
        let (h, cell_slot) = cell.lease()?;
        Some(EventLease {
            pool: self,
            // SAFETY: cells hold only events this pool created on the cell's
            // device and owns.
            event: unsafe { EventHandle::from_raw(h) },
            device,
            in_place: Some(cell_slot),
            records: AtomicUsize::new(0),
            #[cfg(any(loom, target_has_atomic = "64"))]
            last_capture: AtomicU64::new(0),
        })
    }

    /// An event from the calling thread's cell of `device` (found the slow
    /// way, registered if need be), if it holds one.
    #[inline]
    fn take_cached(&self, device: DeviceId) -> Option<EventLease<'_, B>> {
        let h = self.inner.cache.with_cell(device.index(), |c| c.take())??;
        // SAFETY: cells hold only events this pool created on the cell's
        // device (`device`) and owns.
        Some(EventLease::new(
            self,
            unsafe { EventHandle::from_raw(h) },
            device,
        ))
    }

    /// Pops `device`'s ready list, or creates an event.
    fn get_from<'p>(
        &'p self,
        device: DeviceId,
        slot: &EventSlot,
        guard: &Guard,
    ) -> Result<EventLease<'p, B>, Error<B::Error>> {
        let event = self.inner.pop_or_create(device, slot, guard, || None)?;
        Ok(EventLease::new(self, event, device))
    }

    /// Leases an event as a [`SharedEvent`], returned when the last clone drops.
    ///
    /// ```
    /// use gpupool_core::EventPool;
    /// use gpupool_mock::MockBackend;
    ///
    /// let events = EventPool::new(MockBackend::new(1));
    /// let shared = events.get_shared(0)?;
    /// let other = shared.clone();        // the same event
    /// assert_eq!(other.handle(), shared.handle());
    /// drop(shared);                      // still leased through `other`
    /// assert_eq!(events.total_stats().live_leases, 1);
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
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
    /// event of another backend ([`Error::ForeignHandle`]) and one whose last
    /// record was captured into a graph ([`Error::CapturedEvent`]). Makes no
    /// backend call once the pool knows the device count.
    pub fn put(
        &self,
        event: OwnedEvent,
        device: Option<DeviceId>,
    ) -> Result<(), Rejected<OwnedEvent, B::Error>> {
        if event.captured {
            return Err(Rejected {
                value: event,
                error: Error::CapturedEvent,
            });
        }
        match self.inner.admit(event.owner, event.device, device) {
            Ok(slot) => {
                // Taken in, wherever it goes below.
                Counters::bump(&slot.counters.put);
                // The calling thread's cell first, so that its next `get` takes
                // the event put last (no lease ends here: not counted).
                if self
                    .inner
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

    /// Parks an error met where it could not be returned.
    pub(crate) fn park(&self, e: Error<B::Error>) {
        self.inner.parked.park(e)
    }

    /// The slot of a leased event's device: always there, since a lease exists
    /// only after its slot was found and borrows the pool that owns the table.
    /// (No assertion: this runs in a lease's drop, which never panics.)
    fn leased_slot(&self, device: DeviceId) -> Option<&EventSlot> {
        self.inner.devices.slot_of(device)
    }
}

/// Stops the completion engine (if one started) before the lists are
/// emptied: the events it still held for dropped futures go back to the
/// pool first (pending or not: destroying a pending event is allowed; the
/// driver frees it once it passes).
#[cfg(feature = "std")]
impl<B: EventBackend> Drop for EventPool<B> {
    fn drop(&mut self) {
        let mut left = alloc::vec::Vec::new();
        self.completion.stop(|e| left.push(e));
        let pool = &*self;
        for e in left {
            if let Err(r) = pool.put(e, None) {
                pool.park(r.error);
            }
        }
    }
}

impl<B: EventBackend> fmt::Debug for EventPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt_as(f, "EventPool", "flags")
    }
}
