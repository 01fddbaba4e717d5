//! [`AccessOrder`]: the host, or a stream on a device — the order in which some
//! piece of memory or work is accessed — and how to make one order wait for
//! another.
//!
//! A stream lease's and an owned stream's `order()` are written here, so that
//! the pools below need nothing from this module.

use core::hash::{Hash, Hasher};
use core::marker::PhantomData;

use crate::backend::{Backend, BackendId, DeviceId, EventBackend, StreamBackend, StreamHandle};
use crate::capture::CaptureNote;
use crate::error::{BackendOp, Error};
use crate::event_pool::{EventLease, EventPool, LastRecord};
use crate::owned::OwnedStream;
use crate::stream_pool::StreamLease;
use crate::sync::epoch::Guard;
use static_assertions::assert_impl_all;

/// The order in which work happens: on the host (synchronously), or on a
/// stream of a device (in stream order).
///
/// DALI's null order is `Option<AccessOrder>::None` here.
///
/// An order borrows its stream for `'s`, so it cannot outlive it: one taken
/// from a lease ([`StreamLease::order`](crate::StreamLease::order)) or an owned
/// stream ([`OwnedStream::order`](crate::OwnedStream::order)) ends before the
/// lease or the stream does. Host order and CUDA's special streams
/// ([`null_stream`](Self::null_stream), [`legacy_stream`](Self::legacy_stream),
/// [`per_thread_stream`](Self::per_thread_stream)) live forever; an order of any
/// other raw handle comes only from [`from_raw`](Self::from_raw), which is
/// `unsafe`. A stream order also remembers the backend its stream came from
/// ([`BackendId`]): waiting with another backend's event pool, or building a
/// scratchpad of another backend on it, is refused with
/// [`Error::ForeignHandle`].
///
/// ```
/// use gpupool_core::{AccessOrder, DeviceId, StreamPool};
/// use gpupool_mock::MockBackend;
///
/// let gpu = MockBackend::new(2);
/// let streams = StreamPool::new(gpu.clone());
/// let lease = streams.get(0).unwrap();
/// let s = lease.order();
/// assert!(s.is_device() && !s.is_host());
/// assert_eq!(s.stream_handle(), Some(lease.handle()));
/// assert_eq!(AccessOrder::host().stream_handle(), None);
/// // Equality compares the stream *and* the device.
/// assert_ne!(AccessOrder::null_stream(DeviceId(0)), AccessOrder::null_stream(DeviceId(1)));
/// ```
#[derive(Copy, Clone, Debug)]
pub struct AccessOrder<'s> {
    order: Order,
    /// The capture note of the lease or owned stream the order borrows, if
    /// it is one's (see [`Captures`]; with `Order::Stream::unseen`, what is
    /// known of the stream's captures, in 8 bytes: an order is copied
    /// around a lot).
    note: Option<&'s CaptureNote>,
    /// The stream (its lease or owner) this order borrows.
    _stream: PhantomData<&'s ()>,
}

/// Two orders are equal when they name the same host or the same stream of
/// the same device and backend.
impl PartialEq for AccessOrder<'_> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.order == other.order
    }
}

impl Eq for AccessOrder<'_> {}

impl Hash for AccessOrder<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.order.hash(state);
    }
}

/// What an order knows of its stream's graph captures.
#[derive(Copy, Clone, Debug)]
enum Captures<'s> {
    /// The capture note of the lease or owned stream the order borrows:
    /// bumped by every way gpupool lets a stream begin or join a capture.
    Note(&'s CaptureNote),
    /// Nothing: the per-thread default stream (cudarc can capture it behind
    /// gpupool's back) or [`AccessOrder::from_raw_capturable`]; asked
    /// wherever it matters.
    Unknown,
    /// None can happen: host order, the null and legacy default streams
    /// (CUDA captures neither), or [`AccessOrder::from_raw`] (its contract).
    Excluded,
}

#[derive(Copy, Clone, Debug)]
enum Order {
    Host,
    Stream {
        stream: StreamHandle,
        device: DeviceId,
        /// The backend the stream came from; `None` for CUDA's special
        /// streams, which every backend accepts.
        owner: Option<BackendId>,
        /// With no note: gpupool cannot see the stream's captures
        /// ([`Captures::Unknown`]). Not part of what the order names.
        unseen: bool,
    },
}

/// The same host, or the same stream of the same device and backend.
impl PartialEq for Order {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.named() == other.named()
    }
}

impl Eq for Order {}

impl Hash for Order {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.named().hash(state);
    }
}

impl Order {
    /// What the order names: nothing for host order, else the stream, its
    /// device and its backend.
    #[inline]
    fn named(&self) -> Option<(StreamHandle, DeviceId, Option<BackendId>)> {
        match *self {
            Order::Host => None,
            Order::Stream {
                stream,
                device,
                owner,
                ..
            } => Some((stream, device, owner)),
        }
    }
}

impl AccessOrder<'static> {
    /// Host order.
    pub const fn host() -> Self {
        AccessOrder {
            order: Order::Host,
            note: None,
            _stream: PhantomData,
        }
    }

    /// The null (default) stream of `device`'s context (CUDA's stream 0,
    /// which the driver API takes for the legacy default stream). Every
    /// gpupool call that takes an order checks that `device` exists
    /// ([`Error::DeviceOutOfRange`]).
    pub const fn null_stream(device: DeviceId) -> Self {
        Self::special(StreamHandle::NULL, device, false)
    }

    /// The legacy default stream of `device` (`CU_STREAM_LEGACY`). CUDA
    /// never captures it into a graph.
    pub const fn legacy_stream(device: DeviceId) -> Self {
        Self::special(StreamHandle::LEGACY, device, false)
    }

    /// The per-thread default stream of `device` (`CU_STREAM_PER_THREAD`)
    /// of whichever thread *uses* the order: a different stream on each
    /// thread. Fine for a wait made on one thread; refused
    /// ([`Error::PerThreadStream`]) by what keeps an order for longer (a
    /// [`Scratchpad`](crate::Scratchpad), which may move between threads).
    /// gpupool cannot see its graph captures (cudarc can begin one on it),
    /// so it asks the backend wherever one matters.
    pub const fn per_thread_stream(device: DeviceId) -> Self {
        Self::special(StreamHandle::PER_THREAD, device, true)
    }

    /// `unseen`: gpupool cannot see the stream's captures.
    const fn special(stream: StreamHandle, device: DeviceId, unseen: bool) -> Self {
        AccessOrder {
            order: Order::Stream {
                stream,
                device,
                owner: None,
                unseen,
            },
            note: None,
            _stream: PhantomData,
        }
    }
}

impl<'s> AccessOrder<'s> {
    /// Stream order on a raw `stream` of `device`, made by `backend`, for a
    /// stream that captures no graph while the order is in use.
    ///
    /// # Safety
    /// For all of `'s`:
    /// 1. `stream` is a usable stream of `device` for `backend` (see
    ///    [`Backend`]'s handle contracts): created by a backend with
    ///    `backend`'s [`id`](Backend::id), on `device`, and not destroyed. A
    ///    special handle (0, 1, 2) is always fine;
    /// 2. `stream` neither begins nor joins a graph capture (gpupool does not
    ///    ask, and would hand out again host-visible scratch memory released
    ///    in its order while a replay of the graph may still use it). For a
    ///    stream that may capture, use
    ///    [`from_raw_capturable`](Self::from_raw_capturable).
    pub unsafe fn from_raw<B: Backend + ?Sized>(
        backend: &B,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Self {
        // SAFETY: the caller's contract, 2. included.
        unsafe { Self::raw(backend, stream, device, false) }
    }

    /// [`from_raw`](Self::from_raw) for a stream that may capture a graph
    /// while the order is in use: gpupool asks the backend whether it is
    /// capturing before it would query or synchronize it, or release
    /// host-visible scratch memory in its order (one
    /// [`capture_status`](StreamBackend::capture_status) call each time).
    ///
    /// # Safety
    /// 1. of [`from_raw`](Self::from_raw).
    pub unsafe fn from_raw_capturable<B: Backend + ?Sized>(
        backend: &B,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Self {
        // SAFETY: the caller's contract.
        unsafe { Self::raw(backend, stream, device, true) }
    }

    /// `unseen`: gpupool cannot see the stream's captures.
    ///
    /// # Safety
    /// 1. of [`from_raw`](Self::from_raw), and 2. unless `unseen`.
    unsafe fn raw<B: Backend + ?Sized>(
        backend: &B,
        stream: StreamHandle,
        device: DeviceId,
        unseen: bool,
    ) -> Self {
        let owner = if stream.is_special() {
            None
        } else {
            Some(backend.id())
        };
        AccessOrder {
            order: Order::Stream {
                stream,
                device,
                owner,
                unseen,
            },
            note: None,
            _stream: PhantomData,
        }
    }

    /// The order of a stream the caller holds for `'s` (a lease, an owned
    /// stream) and knows to be `owner`'s, on `device`, with its capture
    /// note.
    pub(crate) const fn of_held(
        stream: StreamHandle,
        device: DeviceId,
        owner: BackendId,
        note: &'s CaptureNote,
    ) -> Self {
        AccessOrder {
            order: Order::Stream {
                stream,
                device,
                owner: Some(owner),
                unseen: false,
            },
            note: Some(note),
            _stream: PhantomData,
        }
    }

    /// What is known of the stream's graph captures.
    #[inline]
    fn captures(&self) -> Captures<'s> {
        match (self.note, self.order) {
            (Some(n), _) => Captures::Note(n),
            (None, Order::Stream { unseen: true, .. }) => Captures::Unknown,
            _ => Captures::Excluded,
        }
    }

    /// Whether this is host order.
    pub const fn is_host(&self) -> bool {
        matches!(self.order, Order::Host)
    }

    /// Whether this is a stream order.
    pub const fn is_device(&self) -> bool {
        matches!(self.order, Order::Stream { .. })
    }

    /// The stream, for a stream order.
    pub const fn stream_handle(&self) -> Option<StreamHandle> {
        match self.order {
            Order::Stream { stream, .. } => Some(stream),
            Order::Host => None,
        }
    }

    /// The device, for a stream order.
    pub const fn device(&self) -> Option<DeviceId> {
        match self.order {
            Order::Stream { device, .. } => Some(device),
            Order::Host => None,
        }
    }

    /// Whether `backend` may be handed this order's stream: host order and
    /// CUDA's special streams with any backend, any other stream only with a
    /// backend of the [`BackendId`] it came from. Every gpupool call that takes
    /// an order and a backend checks this and refuses with
    /// [`Error::ForeignHandle`] otherwise (and, for a special stream, checks
    /// that its device exists: [`Error::DeviceOutOfRange`]).
    pub fn is_usable_with<B: Backend + ?Sized>(&self, backend: &B) -> bool {
        match self.order {
            Order::Stream {
                owner: Some(owner), ..
            } => owner == backend.id(),
            _ => true,
        }
    }

    /// Whether this order's stream may be capturing a graph: one of a lease
    /// or owned stream whose capture note was ever bumped, or one whose
    /// captures gpupool cannot see (the per-thread default stream,
    /// [`from_raw_capturable`](Self::from_raw_capturable)). Another lease's
    /// or owned stream's cannot be (see `capture.rs`), nor can host order,
    /// the null and legacy streams or a [`from_raw`](Self::from_raw) order
    /// (its contract).
    #[inline]
    pub(crate) fn may_capture(&self) -> bool {
        match self.captures() {
            Captures::Note(n) => n.ever(),
            Captures::Unknown => true,
            Captures::Excluded => false,
        }
    }

    /// The capture note this order reads, if its stream has one (a lease's
    /// or an owned stream's).
    #[inline]
    pub(crate) fn capture_note(&self) -> Option<&'s CaptureNote> {
        self.note
    }

    /// Whether gpupool cannot see this order's stream's captures, so that
    /// only asking the backend tells (the per-thread default stream,
    /// [`from_raw_capturable`](Self::from_raw_capturable)).
    #[inline]
    pub(crate) fn captures_unseen(&self) -> bool {
        matches!(self.order, Order::Stream { unseen: true, .. })
    }

    /// Whether this is the per-thread default stream.
    #[inline]
    pub(crate) fn is_per_thread(&self) -> bool {
        self.stream_handle() == Some(StreamHandle::PER_THREAD)
    }

    /// Whether this order's stream is capturing a graph now: asked of
    /// `backend` only where it may be ([`may_capture`](Self::may_capture));
    /// `false` for host order.
    ///
    /// # Safety
    /// `backend` may be handed this order's stream: its id was checked
    /// against the order's owner ([`check_backend`](Self::check_backend)),
    /// and the order is in use (it borrows its stream, or `from_raw`'s caller
    /// vouched for it).
    #[inline]
    pub(crate) unsafe fn capturing<B: StreamBackend + ?Sized>(
        &self,
        backend: &B,
    ) -> Result<bool, Error<B::Error>> {
        // SAFETY: the caller's contract.
        unsafe { self.capture(backend) }.map(|c| c.is_some())
    }

    /// The capture this order's stream is in now, by its id
    /// ([`capture_id`](StreamBackend::capture_id)), or `None`: asked of
    /// `backend` only where the stream may be capturing; `None` for host
    /// order.
    ///
    /// # Safety
    /// As for [`capturing`](Self::capturing).
    pub(crate) unsafe fn capture<B: StreamBackend + ?Sized>(
        &self,
        backend: &B,
    ) -> Result<Option<u64>, Error<B::Error>> {
        let Some((stream, device)) = self.stream_and_device() else {
            return Ok(None);
        };
        if !self.may_capture() {
            return Ok(None);
        }
        // SAFETY: the caller's contract: a usable stream of `device` for
        // `backend`.
        unsafe { backend.capture_id(stream, device) }
            .map_err(Error::backend(BackendOp::CaptureStatus))
    }

    /// The stream and its device, for a stream order.
    pub(crate) const fn stream_and_device(&self) -> Option<(StreamHandle, DeviceId)> {
        match self.order {
            Order::Stream { stream, device, .. } => Some((stream, device)),
            Order::Host => None,
        }
    }

    /// `Ok` if `backend` may be handed this order's stream (see
    /// [`is_usable_with`](Self::is_usable_with)), else
    /// [`Error::ForeignHandle`]; asks `backend` for its id only when the
    /// order has an owner. A special stream names the default stream of a
    /// device the caller chose: [`Error::DeviceOutOfRange`] unless that
    /// device exists (the backend's contracts need a device that exists).
    #[inline]
    pub(crate) fn check_backend<B: Backend + ?Sized>(
        &self,
        backend: &B,
    ) -> Result<(), Error<B::Error>> {
        match self.order {
            Order::Stream {
                owner: None,
                device,
                ..
            } => check_special_device(backend, device),
            _ if self.is_usable_with(backend) => Ok(()),
            _ => Err(Error::ForeignHandle),
        }
    }

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

impl OwnedStream {
    /// The stream as an access order, borrowing it (so the stream cannot be
    /// put back or destroyed while the order is in use).
    pub fn order(&self) -> AccessOrder<'_> {
        AccessOrder::of_held(
            self.handle(),
            self.device(),
            self.backend_id(),
            &self.capture,
        )
    }
}

impl<B: StreamBackend> StreamLease<'_, B> {
    /// The stream as an access order, borrowing the lease: the order cannot
    /// be used after the lease ends.
    ///
    /// ```
    /// use gpupool_core::{AccessOrder, StreamPool};
    /// use gpupool_mock::MockBackend;
    ///
    /// let streams = StreamPool::new(MockBackend::new(1));
    /// let lease = streams.get(0)?;
    /// let order: AccessOrder<'_> = lease.order(); // Copy; borrows `lease`
    /// assert_eq!(order.stream_handle(), Some(lease.handle()));
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    #[inline]
    pub fn order(&self) -> AccessOrder<'_> {
        AccessOrder::of_held(
            self.handle(),
            self.device(),
            self.backend_id(),
            self.capture_note(),
        )
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

impl<'l, B: StreamBackend> From<&'l StreamLease<'_, B>> for AccessOrder<'l> {
    fn from(l: &'l StreamLease<'_, B>) -> AccessOrder<'l> {
        l.order()
    }
}

/// `Ok` if `device` exists for `backend` (a special stream's device is the
/// caller's word).
fn check_special_device<B: Backend + ?Sized>(
    backend: &B,
    device: DeviceId,
) -> Result<(), Error<B::Error>> {
    let count = backend
        .device_count()
        .map_err(Error::backend(BackendOp::DeviceCount))?;
    if device.0 < count {
        Ok(())
    } else {
        Err(Error::DeviceOutOfRange { device, count })
    }
}

assert_impl_all!(AccessOrder<'static>: Copy, Send, Sync);
