//! [`EventLease`] and [`SharedEvent`]: leases of a pooled event, its
//! records (and whether one was made in a capture), and its return.

use core::fmt;
use core::mem::ManuallyDrop;
use core::ops::Deref;

use super::EventPool;
use crate::backend::{DeviceId, EventBackend, EventHandle, StreamBackend};
use crate::error::{BackendOp, Error};
use crate::owned::OwnedEvent;
use crate::pool::fmt_lease;
use crate::stats::Counters;
use crate::sync::Arc;
#[cfg(any(loom, target_has_atomic = "64"))]
use crate::sync::AtomicU64;
use crate::sync::{AtomicUsize, Ordering};
use crate::thread_cache::InPlace;

/// An exclusive lease of a pooled event; returns it to its pool when dropped.
#[must_use = "dropping a lease returns the event at once"]
pub struct EventLease<'p, B: EventBackend> {
    pub(super) pool: &'p EventPool<B>,
    pub(super) event: EventHandle,
    pub(super) device: DeviceId,
    /// The cell slot the event is leased in place from (`std`): the lease
    /// owns it until it ends, and ends by writing the slot once.
    pub(super) in_place: Option<InPlace<'p>>,
    /// What [`record`](EventLease::record) did with the event: bit
    /// [`CAPTURED`] once a record was made on a capturing stream (for the
    /// rest of the lease: it is destroyed when the lease ends instead of
    /// going back to the pool, and the host cannot wait on it), and below it
    /// how many records are under way now (a wait that may have joined a
    /// capture through one is told before the record can be seen). A word,
    /// not a `u32`: `get` builds the lease and its caller moves it out of
    /// the `Result` in 8-byte pieces; a 4-byte counter beside the 4-byte
    /// device was one such piece written by two 4-byte stores, which the CPU
    /// cannot forward to the load (a stall of a quarter of a get+put).
    pub(super) records: AtomicUsize,
    /// The capture the latest record was made in ([`LastRecord`]'s
    /// encoding: 0 outside any capture or none yet, `id + 1` in capture `id`,
    /// `u64::MAX` in a capture gpupool could not name). Kept where the
    /// target has 64-bit atomics (every target CUDA runs on); elsewhere
    /// every record counts as one in a capture it cannot name.
    #[cfg(any(loom, target_has_atomic = "64"))]
    pub(super) last_capture: AtomicU64,
}

/// Where the latest record of a leased event was made, as a wait on it from
/// a capturing stream needs to know (the driver refuses, breaking the
/// capture, a capturing stream's wait on work outside its capture).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) enum LastRecord {
    /// Outside any capture, or never recorded.
    Outside,
    /// In the capture with this id.
    In(u64),
    /// In a capture gpupool cannot name, or a record is under way.
    Unknown,
}

/// [`EventLease::records`]' bit: a record was made in a capture.
const CAPTURED: usize = 1 << 31;

impl<B: EventBackend> fmt::Debug for EventLease<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_lease(f, "EventLease", "event", &self.event, self.device)
    }
}

impl<'p, B: EventBackend> EventLease<'p, B> {
    /// A lease of an event taken out of every list.
    pub(super) fn new(pool: &'p EventPool<B>, event: EventHandle, device: DeviceId) -> Self {
        EventLease {
            pool,
            event,
            device,
            in_place: None,
            records: AtomicUsize::new(0),
            #[cfg(any(loom, target_has_atomic = "64"))]
            last_capture: AtomicU64::new(0),
        }
    }

    /// Whether a record of the event may have been made in a capture: one
    /// was, or one is under way.
    #[inline]
    pub(crate) fn may_be_captured(&self) -> bool {
        // Acquire, with the Release of `record`'s increments: a wait made
        // after a record the caller saw reads that record's marks (see
        // `record`).
        self.records.load(Ordering::Acquire) != 0
    }

    /// Where the latest record was made ([`LastRecord`]); `Unknown` while
    /// a record is under way.
    pub(crate) fn last_record(&self) -> LastRecord {
        // Acquire (both): as in `may_be_captured`; the count first, so that
        // a count read with no record under way comes with the capture the
        // latest finished record stored before its decrement.
        if self.records.load(Ordering::Acquire) & !CAPTURED != 0 {
            return LastRecord::Unknown;
        }
        #[cfg(any(loom, target_has_atomic = "64"))]
        {
            match self.last_capture.load(Ordering::Acquire) {
                0 => LastRecord::Outside,
                u64::MAX => LastRecord::Unknown,
                n => LastRecord::In(n - 1),
            }
        }
        #[cfg(not(any(loom, target_has_atomic = "64")))]
        {
            if self.is_captured() {
                LastRecord::Unknown
            } else {
                LastRecord::Outside
            }
        }
    }

    /// Whether a record of the event was made in a capture.
    #[inline]
    fn is_captured(&self) -> bool {
        // Acquire: as in `may_be_captured`.
        self.records.load(Ordering::Acquire) & CAPTURED != 0
    }

    /// Ends an in-place lease, leaving its cell slot empty; false if the
    /// lease was not in place (its end is counted in the shared tallies).
    fn vacate(&self) -> bool {
        if let Some(s) = self.in_place {
            s.vacate();
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
        // The event leaves the pool (`PoolStats::pooled`); a lease served in
        // place ends uncounted in the shared tallies.
        let returned = !this.vacate();
        this.pool.inner.count_detached(this.device, returned);
        OwnedEvent {
            handle: this.event,
            device: this.device,
            owner: this.pool.inner.id,
            captured: this.may_be_captured(),
        }
    }

    /// Destroys the event instead of returning it (after a failed record, say).
    /// If the destroy fails, the pool quarantines the event (keeps it for the
    /// next purge, never leases it again), so it is not lost, and the error is
    /// returned.
    pub fn destroy(self) -> Result<(), Error<B::Error>> {
        ManuallyDrop::new(self).destroy_event()
    }

    /// Ends the lease by destroying its event (`destroy`, and the end of a
    /// lease whose event was recorded in a capture): a failed destroy
    /// quarantines the event and returns the error. The caller forgets the
    /// lease.
    fn destroy_event(&self) -> Result<(), Error<B::Error>> {
        let slot = self.pool.leased_slot(self.device);
        if !self.vacate() {
            if let Some(slot) = slot {
                Counters::bump(&slot.counters.returned);
            }
        }
        // SAFETY: the lease held this event of the pool's backend on its
        // device alone; it ends here without going back to any list.
        match unsafe {
            self.pool
                .inner
                .backend
                .destroy_event(self.event, self.device)
        } {
            Ok(()) => {
                if let Some(slot) = slot {
                    Counters::bump(&slot.counters.destroyed);
                }
                Ok(())
            }
            Err(source) => {
                if let Some(slot) = slot {
                    slot.quarantine.push(self.event);
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

impl<B: StreamBackend + EventBackend> EventLease<'_, B> {
    /// Records the event on `stream` of the event's device (checked by the
    /// caller, [`record`](Self::record)), then marks it captured if
    /// `capture` says the record was (asked after it: a capture begun on
    /// the stream before the record is seen, as `begin_capture` notes the
    /// capture before it begins): `None` outside a capture, `Some(id)` in
    /// capture `id`, `Some(u64::MAX)` in one it cannot name.
    ///
    /// # Safety
    /// `stream` is a usable stream of the event's device for its backend.
    pub(crate) unsafe fn record_on(
        &self,
        stream: crate::backend::StreamHandle,
        capture: impl FnOnce() -> Option<u64>,
    ) -> Result<(), Error<B::Error>> {
        let backend = self.pool.backend();
        // Marked as under way first (AcqRel: before the record, which a
        // wait on another thread may see through the driver: that wait then
        // reads the mark), cleared after, with the captured bit set if the
        // stream was capturing.
        self.records.fetch_add(1, Ordering::AcqRel);
        // SAFETY: the event is leased (live, of `backend`, on its device);
        // the stream is usable there (the caller's contract).
        let recorded = unsafe { backend.record_event(self.event, stream, self.device) }
            .map_err(Error::backend(BackendOp::RecordEvent));
        if recorded.is_ok() {
            let capture = capture();
            if capture.is_some() {
                self.records.fetch_or(CAPTURED, Ordering::AcqRel);
            }
            // Release: read with Acquire by `last_record` after it saw the
            // count below go down.
            #[cfg(any(loom, target_has_atomic = "64"))]
            self.last_capture.store(
                capture.map_or(0, |id| id.saturating_add(1)),
                Ordering::Release,
            );
        }
        self.records.fetch_sub(1, Ordering::AcqRel);
        recorded
    }
}

impl<B: EventBackend> Drop for EventLease<'_, B> {
    #[inline]
    fn drop(&mut self) {
        if self.is_captured() {
            self.end_captured();
            return;
        }
        // Leased in place: back into its slot, whichever thread this is.
        if let Some(s) = self.in_place {
            s.unlease(self.event.as_raw());
            return;
        }
        self.give_back();
    }
}

impl<B: EventBackend> EventLease<'_, B> {
    /// Ends a lease whose event was recorded in a capture: destroyed, not
    /// returned (see [`record`](EventLease::record)); a failed destroy
    /// quarantines it and parks the error.
    #[cold]
    fn end_captured(&mut self) {
        if let Err(e) = self.destroy_event() {
            self.pool.park(e);
        }
    }

    /// Returns an event not leased in place.
    #[inline(never)]
    fn give_back(&mut self) {
        // The returning thread's cache next (no epoch, no shared line).
        if self
            .pool
            .inner
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
