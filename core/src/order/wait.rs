//! How one order waits for another ([`AccessOrder::wait`],
//! [`AccessOrder::wait_event`]) and how an event records an order's work
//! ([`EventLease::record`]), captures included.

use super::{AccessOrder, Order};
use crate::backend::{DeviceId, EventBackend, StreamBackend, StreamHandle};
use crate::capture::CaptureNote;
use crate::error::{BackendOp, Error};
use crate::event_pool::{EventLease, EventPool, LastRecord};
use crate::sync::epoch::Guard;

impl<'s> AccessOrder<'s> {
    /// Makes everything issued in `self` from now on happen after everything
    /// issued in `other` so far.
    ///
    /// - `self == other`, or `other` is host order: nothing to do.
    /// - `self` is host order: synchronizes `other`'s stream, unless it is
    ///   capturing a graph ([`Error::StreamCapturing`]: the host cannot wait
    ///   for work that is recorded, not run; the capture is left intact).
    /// - both are streams: records a pooled event of `other`'s device on
    ///   `other`'s stream and makes `self`'s stream wait on it; the event goes
    ///   back to the pool (a failed call destroys it instead). Inside a graph
    ///   capture this is a dependency of the graph: a wait on a capturing
    ///   stream makes `self`'s stream join the capture (the fork of a
    ///   fork/join), and a capturing stream's wait on a joined one is the
    ///   join. A lease whose order waited asks whether its stream is still
    ///   capturing when it is returned, and is not leased again until that
    ///   capture has ended. Refused ([`Error::StreamCapturing`], nothing
    ///   called, the captures intact): a special stream (null, legacy,
    ///   per-thread) waiting on a capturing one; a capturing stream waiting
    ///   on one outside its capture, or in another capture.
    ///
    /// Transitive: if `b.wait(a)` then `c.wait(b)`, `c` is ordered after `a`.
    ///
    /// Errors: [`Error::ForeignHandle`] when either order's stream is not of
    /// `events`' backend (nothing is called); [`Error::StreamCapturing`] (see
    /// above); a backend failure.
    ///
    /// ```
    /// use gpupool_core::{EventPool, StreamPool};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let (streams, events) = (StreamPool::new(gpu.clone()), EventPool::new(gpu.clone()));
    /// let (upload, compute) = (streams.get(0)?, streams.get(0)?);
    /// gpu.enqueue_work(upload.handle()).unwrap();       // e.g. a copy
    /// compute.order().wait(&upload.order(), &events)?; // a pooled event between them
    /// gpu.enqueue_work(compute.handle()).unwrap();      // runs after the copy
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    #[cfg(feature = "std")]
    pub fn wait<B>(
        &self,
        other: &AccessOrder<'_>,
        events: &EventPool<B>,
    ) -> Result<(), Error<B::Error>>
    where
        B: StreamBackend + EventBackend,
    {
        self.wait_using(other, events, |d| events.get(d))
    }

    /// [`wait`](Self::wait) with a guard pinned in the event pool's collector.
    pub fn wait_in<B>(
        &self,
        other: &AccessOrder<'_>,
        events: &EventPool<B>,
        guard: &Guard,
    ) -> Result<(), Error<B::Error>>
    where
        B: StreamBackend + EventBackend,
    {
        self.wait_using(other, events, |d| events.get_in(d, guard))
    }

    /// `wait`, with `lease` to lease the event (of the awaited device).
    fn wait_using<'p, B>(
        &self,
        other: &AccessOrder<'_>,
        events: &'p EventPool<B>,
        lease: impl FnOnce(DeviceId) -> Result<EventLease<'p, B>, Error<B::Error>>,
    ) -> Result<(), Error<B::Error>>
    where
        B: StreamBackend + EventBackend,
    {
        let backend = events.backend();
        self.check_backend(backend)?;
        other.check_backend(backend)?;
        if self.order == other.order {
            return Ok(());
        }
        let (other_stream, other_device) = match other.stream_and_device() {
            None => return Ok(()), // other is host order: nothing to wait for
            Some(s) => s,
        };
        let (this_stream, this_device) = match self.stream_and_device() {
            Some(s) => s,
            None => {
                // SAFETY: `other`'s stream is usable for `backend`: the order
                // borrows the lease or owned stream it came from (or is a
                // special stream, or came from `from_raw`, whose caller
                // vouched for it), and its owner is `backend`'s id (checked).
                let status = unsafe { backend.capture_status(other_stream, other_device) }
                    .map_err(Error::backend(BackendOp::CaptureStatus))?;
                if status.is_capturing() {
                    return Err(Error::StreamCapturing);
                }
                // SAFETY: as above.
                return unsafe { backend.synchronize_stream(other_stream, other_device) }
                    .map_err(Error::backend(BackendOp::SynchronizeStream));
            }
        };
        // The capture `self` is in already (as the origin that joins a side
        // stream back is: then it joins nothing new), and `other`'s. Asked
        // only where they may be capturing.
        // SAFETY: both orders' streams are usable for `backend` (see above).
        let already = unsafe { self.capture(backend) }?;
        // `other`'s capture matters before the record only where `self` may
        // not join it: `self` is special, or capturing already.
        let theirs = if already.is_some() || self.is_special() {
            // SAFETY: as above.
            unsafe { other.capture(backend) }?
        } else {
            None
        };
        match (already, theirs) {
            // A special stream joins no capture: the driver refuses the null
            // and legacy streams (breaking the capture), and the per-thread
            // stream, a blocking stream, would make every later use of the
            // legacy stream break it.
            (None, Some(_)) if self.is_special() => return Err(Error::StreamCapturing),
            // A capturing stream cannot wait on work outside its capture, nor
            // on another capture: the driver refuses and breaks the captures.
            (Some(_), None) => return Err(Error::StreamCapturing),
            (Some(mine), Some(other_capture)) if mine != other_capture => {
                return Err(Error::StreamCapturing)
            }
            _ => {}
        }
        let event = lease(other_device)?;
        // Counted as a wait that may join a capture from before the record
        // until the note has moved for the join (see `CaptureNote::joining`).
        let joining = self.note.map(CaptureNote::joining);
        // SAFETY: the event is leased from `events` (created by `backend` on
        // `other_device`, live while the lease is); both streams are usable
        // for `backend` (see above: borrowed by their orders, owners checked).
        let recorded = unsafe { backend.record_event(event.handle(), other_stream, other_device) }
            .map_err(|source| (BackendOp::RecordEvent, source));
        let waited = recorded.and_then(|()| {
            // SAFETY: as above.
            unsafe { backend.stream_wait_event(this_stream, this_device, event.handle()) }
                .map_err(|source| (BackendOp::StreamWaitEvent, source))
        });
        // Whether the record was captured (and so the wait joined `other`'s
        // capture), and into which: asked after the record, so that a
        // capture begun on `other` before it is seen (`begin_capture` bumps
        // the note before it begins the capture; one begun after the record
        // captured nothing of it). Where it cannot be asked, taken as
        // captured into a capture `self` was not in. The note is bumped
        // unless `self` was in that same capture already (a join back): also
        // when the capture it was in ended meanwhile and `other` is in
        // another one now.
        // SAFETY: as above.
        let after = unsafe { other.capture(backend) }.unwrap_or(Some(u64::MAX));
        let captured = after.is_some();
        if let (true, Some(joining)) = (captured && after != already, &joining) {
            joining.joined();
        }
        drop(joining);
        match waited {
            // An event recorded in a capture stays the capture's: back in
            // the pool, another user's wait on it would join the capture.
            // Destroyed instead (events are cheap to make again, and a
            // capture is recorded once).
            Ok(()) if !captured => Ok(()),
            Ok(()) => {
                if let Err(e) = event.destroy() {
                    events.park(e);
                }
                Ok(())
            }
            Err((op, source)) => {
                if let Err(e) = event.destroy() {
                    events.park(e);
                }
                Err(Error::Backend { op, source })
            }
        }
    }

    /// Whether this is a special stream (null, legacy or per-thread), which
    /// gpupool never lets join a capture.
    #[inline]
    fn is_special(&self) -> bool {
        matches!(self.order, Order::Stream { owner: None, .. })
    }

    /// Makes `self` wait for the work `event` has captured: a stream waits on
    /// it in stream order, the host synchronizes it.
    ///
    /// An event recorded on a capturing stream
    /// ([`EventLease::record`](crate::EventLease::record)) makes a stream that
    /// waits on it join the capture (the fork of a fork/join, as with
    /// [`wait`](Self::wait)); the host cannot wait for it
    /// ([`Error::CapturedEvent`]).
    ///
    /// Errors: [`Error::ForeignHandle`] when `self`'s stream is not of the
    /// event's backend; [`Error::CapturedEvent`] (above); a backend failure.
    ///
    /// ```
    /// use gpupool_core::{EventPool, StreamPool};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let (streams, events) = (StreamPool::new(gpu.clone()), EventPool::new(gpu.clone()));
    /// let producer = streams.get(0)?;
    /// let done = events.get(0)?;
    /// done.record(&producer.order())?;       // once
    /// for _ in 0..3 {
    ///     let consumer = streams.get(0)?;
    ///     consumer.order().wait_event(&done)?; // from any number of orders
    /// }
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn wait_event<B>(&self, event: &EventLease<'_, B>) -> Result<(), Error<B::Error>>
    where
        B: StreamBackend + EventBackend,
    {
        let backend = event.pool().backend();
        self.check_backend(backend)?;
        let Some((stream, device)) = self.stream_and_device() else {
            if event.may_be_captured() {
                return Err(Error::CapturedEvent);
            }
            // SAFETY: the event is leased (live, created by `backend` on
            // `event.device()`).
            return unsafe { backend.synchronize_event(event.handle(), event.device()) }
                .map_err(Error::backend(BackendOp::SynchronizeEvent));
        };
        // Whether this stream is in a capture already (it joins nothing
        // new then). Asked only where it may be.
        // SAFETY: this order's stream is usable for `backend` (owner checked
        // above; the order borrows its stream).
        let already = unsafe { self.capture(backend) }?;
        if self.is_special() && event.may_be_captured() {
            // A special stream joins no capture (see `wait`).
            return Err(Error::CapturedEvent);
        }
        // A capturing stream may wait only on a record made in its own
        // capture: the driver refuses a wait on work outside it or in
        // another capture, and breaks the captures (as `wait` refuses).
        if let Some(mine) = already {
            if event.last_record() != LastRecord::In(mine) {
                return Err(Error::StreamCapturing);
            }
        }
        // Counted as a wait that may join a capture until the note has
        // moved for the join (see `CaptureNote::joining`).
        let joining = self.note.map(CaptureNote::joining);
        // SAFETY: the event as above; the stream is usable for `backend`
        // (borrowed by this order, owner checked).
        unsafe { backend.stream_wait_event(stream, device, event.handle()) }
            .map_err(Error::backend(BackendOp::StreamWaitEvent))?;
        // Read after the wait: a record made in a capture before it (which
        // the wait joined) is seen, even one made on another thread at the
        // same time (`EventLease::record` marks itself first).
        // The capture the wait joined, if any, asked of the stream itself:
        // the note is bumped unless it is the one the stream was in already
        // (also when that one ended meanwhile and the event's record is
        // another's). Where it cannot be asked, taken as a new one.
        if event.may_be_captured() {
            // SAFETY: as above.
            let now = unsafe { self.capture(backend) }.unwrap_or(Some(u64::MAX));
            if let (true, Some(joining)) = (already.is_none() || now != already, &joining) {
                joining.joined();
            }
        }
        drop(joining);
        Ok(())
    }
}

impl<B: StreamBackend + EventBackend> EventLease<'_, B> {
    /// Records, in the event, the work issued in `order` so far: a stream
    /// order's stream is where the event is recorded; host order has nothing
    /// queued, so the event is recorded on `order`'s device's null stream
    /// (the host's waits on it return at once once that has run).
    /// Record once, wait many: any number of orders may then
    /// [`wait_event`](AccessOrder::wait_event) on it, each in its own
    /// stream order.
    ///
    /// Recorded on a stream that is capturing a graph, the event marks a
    /// point of the capture: a stream that waits on it joins the capture
    /// (as with [`AccessOrder::wait`]), the host cannot wait on it
    /// ([`Error::CapturedEvent`]), and it is destroyed when the lease ends
    /// instead of going back to the pool.
    ///
    /// Errors, with nothing recorded: [`Error::ForeignHandle`] for an order
    /// of another backend; [`Error::WrongDevice`] for a stream of another
    /// device than the event's (CUDA records an event only on its own
    /// device's streams); a backend failure.
    ///
    /// ```
    /// use gpupool_core::{EventPool, StreamPool};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let (streams, events) = (StreamPool::new(gpu.clone()), EventPool::new(gpu.clone()));
    /// let producer = streams.get(0)?;
    /// let consumers: Vec<_> = (0..3).map(|_| streams.get(0)).collect::<Result<_, _>>()?;
    /// let ready = events.get(0)?;
    /// ready.record(&producer.order())?;
    /// for c in &consumers {
    ///     c.order().wait_event(&ready)?; // each consumer's later work waits for the producer's
    /// }
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn record(&self, order: &AccessOrder<'_>) -> Result<(), Error<B::Error>> {
        let backend = self.pool().backend();
        order.check_backend(backend)?;
        let (stream, device) = order
            .stream_and_device()
            .unwrap_or((StreamHandle::NULL, self.device()));
        if device != self.device() {
            return Err(Error::WrongDevice {
                given: self.device(),
                actual: device,
            });
        }
        // The capture the record was made in, asked after it; where it
        // cannot be asked, taken as made in one gpupool cannot name. A
        // capture open when the record was made may have ended before that
        // question: for an order with a note (a lease's or owned stream's),
        // the note is read before, the stream asked before too if it was
        // ever in a capture, and the note read again after: a capture open
        // before, or begun or joined meanwhile (the note moved), makes the
        // record one made in a capture gpupool cannot name.
        let note = order.capture_note();
        let before = note.map(CaptureNote::watched);
        let open_before = match note {
            // SAFETY: as below.
            Some(n) if n.ever() => unsafe { order.capture(backend) }.unwrap_or(Some(u64::MAX)),
            _ => None,
        };
        let capture = || {
            // SAFETY: `order`'s stream is usable for `backend` (the order
            // borrows it, owner checked above).
            let asked = unsafe { order.capture(backend) }.unwrap_or(Some(u64::MAX));
            match (note, before) {
                (Some(n), Some(b))
                    if asked.is_none()
                        && (open_before.is_some() || !CaptureNote::unmoved(b, n.watched())) =>
                {
                    Some(u64::MAX)
                }
                _ => asked,
            }
        };
        // SAFETY: the stream is `order`'s (as above, device checked), or the
        // null stream of the event's device.
        unsafe { self.record_on(stream, capture) }
    }
}
