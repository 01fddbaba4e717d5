//! [`BusyStreams`]: the stream pool's lists of streams returned with work
//! pending and of streams returned while capturing a graph, and the pool's
//! scan of them (finished streams promoted, failed ones quarantined).

use super::{StreamPool, StreamSlot};
use crate::backend::{Completion, DeviceId, StreamBackend, StreamHandle};
use crate::error::{BackendOp, Error};
use crate::pool::BusyList;
use crate::stack::{Bag, Chain};
use crate::stats::Counters;

/// The stream kind's other lists: streams returned with work pending, which
/// `get` scans (queries) for a finished one, and streams returned while they
/// were capturing a graph, held unqueried until their capture has ended
/// (a query would break the capture, and work issued on them would go into
/// its graph).
pub(crate) struct BusyStreams {
    pending: Bag<StreamHandle>,
    pub(super) capturing: Bag<StreamHandle>,
}

impl BusyStreams {
    /// Adds a stream returned with work pending.
    #[inline]
    pub(super) fn push(&self, stream: StreamHandle) {
        self.pending.push(stream);
    }

    /// Adds a stream returned while capturing.
    pub(super) fn hold_for_capture(&self, stream: StreamHandle) {
        self.capturing.push(stream);
    }

    /// Whether no stream with pending work looked present (a hint).
    pub(super) fn no_pending(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes the streams with pending work (not the held ones).
    pub(super) fn take_pending(&self) -> Chain<StreamHandle> {
        self.pending.take_all()
    }

    /// Puts streams back among those with pending work.
    pub(super) fn put_back_pending(&self, chain: Chain<StreamHandle>) {
        self.pending.put_back(chain);
    }
}

impl BusyList<StreamHandle> for BusyStreams {
    fn new() -> Self {
        BusyStreams {
            pending: Bag::new(),
            capturing: Bag::new(),
        }
    }

    /// Everything, held streams included.
    fn take_all(&self) -> Chain<StreamHandle> {
        self.pending.put_back(self.capturing.take_all());
        self.pending.take_all()
    }

    /// The pending streams: a purge leaves the streams held for a capture
    /// (destroying one would break the capture it is in), as it leaves
    /// leases that are out; the next purge after the capture has ended and
    /// a `get` has found it ended takes them.
    fn take_for_purge(&self) -> Chain<StreamHandle> {
        self.take_pending()
    }

    /// The streams held for a capture (the pool's drop asks each).
    fn take_held(&self) -> Chain<StreamHandle> {
        self.capturing.take_all()
    }
}

/// The pool's work on its busy and capturing lists.
impl<B: StreamBackend> StreamPool<B> {
    /// Looks for a finished stream in the busy list (module documentation).
    /// Everything not leased goes back where it belongs. A stream whose query
    /// fails is quarantined and the error parked; the scan goes on, so one
    /// broken stream cannot stop `get` from serving the device.
    pub(super) fn scan_busy(&self, device: DeviceId, slot: &StreamSlot) -> Option<StreamHandle> {
        self.release_ended_captures(device, slot);
        if slot.busy.no_pending() {
            return None;
        }
        let mut rest = slot.busy.take_pending();
        rest.reverse(); // oldest first
        let mut pending = Chain::empty();
        let mut found = None;
        let mut queried = 0;
        while let Some(&s) = rest.first() {
            if queried == self.inner.config.scan_limit {
                break;
            }
            queried += 1;
            // SAFETY: a stream of the busy list: created by this pool's backend
            // on `device`, owned by the pool, taken out of the list by this
            // scan (so no purge can destroy it meanwhile).
            match unsafe { self.inner.backend.query_stream(s, device) } {
                Ok(Completion::Complete) => {
                    found = rest.pop_first();
                    break;
                }
                Ok(Completion::Pending) => {
                    rest.move_first_to(&mut pending);
                }
                Err(e) => self.quarantine_first(&mut rest, slot, BackendOp::QueryStream, e),
            }
        }
        if found.is_some() {
            let mut promoted = 0;
            while promoted < self.inner.config.promote_limit {
                let Some(&s) = rest.first() else { break };
                // SAFETY: as above.
                match unsafe { self.inner.backend.query_stream(s, device) } {
                    Ok(Completion::Complete) => {
                        slot.ready.push_from(&mut rest);
                        promoted += 1;
                    }
                    Ok(Completion::Pending) => {
                        rest.move_first_to(&mut pending);
                        break;
                    }
                    Err(e) => {
                        // The lease is served; the error is reported later.
                        self.quarantine_first(&mut rest, slot, BackendOp::QueryStream, e);
                        break;
                    }
                }
            }
            Counters::add(&slot.counters.promoted, promoted);
        }
        // Unqueried streams go back below the pending ones, so the next scan
        // (oldest first) reaches them before re-querying these. Streams other
        // threads returned meanwhile end up below both and are scanned first
        // next time, although they are the newest: a bag only grows on top.
        rest.reverse();
        slot.busy.put_back_pending(rest);
        slot.busy.put_back_pending(pending);
        found
    }

    /// Moves the streams held for a capture whose capture has ended to the
    /// pending list, where the scan queries them; the others stay held. A
    /// stream whose status cannot be asked stays held too (it may still be
    /// capturing: destroying or querying it could break the capture), and
    /// the error is parked.
    pub(super) fn release_ended_captures(&self, device: DeviceId, slot: &StreamSlot) {
        if slot.busy.capturing.is_empty() {
            return;
        }
        let mut held = slot.busy.capturing.take_all();
        let mut still = Chain::empty();
        while let Some(&s) = held.first() {
            // SAFETY: a stream of the held list: created by this pool's
            // backend on `device`, owned by the pool, taken out of the list by
            // this call (so no purge can destroy it meanwhile).
            match unsafe { self.inner.backend.capture_status(s, device) } {
                Ok(status) if !status.is_capturing() => {
                    if let Some(s) = held.pop_first() {
                        slot.busy.push(s);
                    }
                }
                Ok(_) => {
                    held.move_first_to(&mut still);
                }
                Err(e) => {
                    held.move_first_to(&mut still);
                    self.inner.parked.park(Error::Backend {
                        op: BackendOp::CaptureStatus,
                        source: e,
                    });
                }
            }
        }
        slot.busy.capturing.put_back(still);
    }

    /// Moves the first stream of `chain` to the quarantine and parks the
    /// failure `e` of `op` on it.
    pub(super) fn quarantine_first(
        &self,
        chain: &mut Chain<StreamHandle>,
        slot: &StreamSlot,
        op: BackendOp,
        e: B::Error,
    ) {
        if let Some(s) = chain.pop_first() {
            slot.quarantine.push(s);
            Counters::bump(&slot.counters.quarantined);
        }
        self.inner.parked.park(Error::Backend { op, source: e });
    }

    /// Quarantines a returned stream whose `op` failed with `e` (counted as
    /// returned, never leased again) and gives the error back.
    pub(super) fn quarantine_returned(
        &self,
        slot: &StreamSlot,
        stream: StreamHandle,
        op: BackendOp,
        e: B::Error,
    ) -> Error<B::Error> {
        Counters::bump(&slot.counters.returned);
        slot.quarantine.push(stream);
        Counters::bump(&slot.counters.quarantined);
        Error::Backend { op, source: e }
    }
}
