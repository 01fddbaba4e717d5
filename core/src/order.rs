//! [`AccessOrder`]: the host, or a stream on a device — the order in which some
//! piece of memory or work is accessed — and how to make one order wait for
//! another.
//!
//! A stream lease's and an owned stream's `order()` are written here, so that
//! the pools below need nothing from this module.

use core::hash::{Hash, Hasher};
use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::backend::{Backend, BackendId, DeviceId, EventBackend, StreamBackend, StreamHandle};
use crate::error::{BackendOp, Error};
use crate::event_pool::{EventLease, EventPool};
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
    /// What is known of the stream's graph captures (see [`Captures`]).
    captures: Captures<'s>,
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
    /// The lease's note (a wait issued in this order sets it).
    Lease(&'s CaptureNote),
    /// Nothing: a special stream, an owned stream, or
    /// [`AccessOrder::from_raw_capturable`]; asked wherever it matters.
    Unknown,
    /// None while the order is in use ([`AccessOrder::from_raw`]'s contract),
    /// or host order.
    Excluded,
}

/// A stream lease's note that its stream may have joined a graph capture.
///
/// A stream joins a capture when it waits on an event recorded on a capturing
/// stream. The only waits gpupool issues are those of
/// [`AccessOrder::wait`] and [`AccessOrder::wait_event`], and each sets the
/// note of the lease its waiting order came from; so does
/// [`StreamLease::note_capture`] for waits (or captures) made through the raw
/// handle or cudarc. A lease whose note is set asks the backend's
/// [`capture_status`](StreamBackend::capture_status) when it ends, before
/// anything that the driver refuses on a capturing stream; one whose note is
/// not set cannot be capturing and skips the question.
#[derive(Debug, Default)]
pub(crate) struct CaptureNote(AtomicBool);

impl CaptureNote {
    pub(crate) const fn new() -> Self {
        CaptureNote(AtomicBool::new(false))
    }

    /// Notes that the stream may have joined a capture.
    #[inline]
    pub(crate) fn set(&self) {
        // Relaxed: read only when the lease ends, by the thread that ends it;
        // every order borrowing the lease is gone by then, and a thread that
        // used one through a shared borrow was joined (or its scope ended)
        // before, which orders its store before that read.
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the note was set.
    #[inline]
    pub(crate) fn is_set(&self) -> bool {
        // Relaxed: see `set`.
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
enum Order {
    Host,
    Stream {
        stream: StreamHandle,
        device: DeviceId,
        /// The backend the stream came from; `None` for CUDA's special
        /// streams, which every backend accepts.
        owner: Option<BackendId>,
    },
}

impl AccessOrder<'static> {
    /// Host order.
    pub const fn host() -> Self {
        AccessOrder {
            order: Order::Host,
            captures: Captures::Excluded,
            _stream: PhantomData,
        }
    }

    /// The null (default) stream of `device`'s context (CUDA's stream 0).
    pub const fn null_stream(device: DeviceId) -> Self {
        Self::special(StreamHandle::NULL, device)
    }

    /// The legacy default stream of `device` (`CU_STREAM_LEGACY`).
    pub const fn legacy_stream(device: DeviceId) -> Self {
        Self::special(StreamHandle::LEGACY, device)
    }

    /// The calling thread's per-thread default stream of `device`
    /// (`CU_STREAM_PER_THREAD`).
    pub const fn per_thread_stream(device: DeviceId) -> Self {
        Self::special(StreamHandle::PER_THREAD, device)
    }

    const fn special(stream: StreamHandle, device: DeviceId) -> Self {
        AccessOrder {
            order: Order::Stream {
                stream,
                device,
                owner: None,
            },
            captures: Captures::Unknown,
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
        unsafe { Self::raw(backend, stream, device, Captures::Excluded) }
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
        unsafe { Self::raw(backend, stream, device, Captures::Unknown) }
    }

    /// # Safety
    /// 1. of [`from_raw`](Self::from_raw), and 2. where `captures` is `Excluded`.
    unsafe fn raw<B: Backend + ?Sized>(
        backend: &B,
        stream: StreamHandle,
        device: DeviceId,
        captures: Captures<'s>,
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
            },
            captures,
            _stream: PhantomData,
        }
    }

    /// The order of a stream the caller holds for `'s` (a lease, an owned
    /// stream) and knows to be `owner`'s, on `device`; `note`: the lease's
    /// capture note, if it is a lease.
    pub(crate) const fn of_held(
        stream: StreamHandle,
        device: DeviceId,
        owner: BackendId,
        note: Option<&'s CaptureNote>,
    ) -> Self {
        let captures = match note {
            Some(n) => Captures::Lease(n),
            None => Captures::Unknown,
        };
        AccessOrder {
            order: Order::Stream {
                stream,
                device,
                owner: Some(owner),
            },
            captures,
            _stream: PhantomData,
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
    /// [`Error::ForeignHandle`] otherwise.
    pub fn is_usable_with<B: Backend + ?Sized>(&self, backend: &B) -> bool {
        self.check_backend::<B, ()>(backend).is_ok()
    }

    /// Whether this order's stream may be capturing a graph: a lease's whose
    /// capture note is set, or a stream whose captures gpupool cannot see
    /// (special, owned, [`from_raw_capturable`](Self::from_raw_capturable)).
    /// A lease's order whose note is not set cannot be (see `CaptureNote`),
    /// nor can a [`from_raw`](Self::from_raw) order (its contract) or host
    /// order.
    #[inline]
    pub(crate) fn may_capture(&self) -> bool {
        match self.captures {
            Captures::Lease(n) => n.is_set(),
            Captures::Unknown => true,
            Captures::Excluded => false,
        }
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
    pub(crate) unsafe fn capturing<B: StreamBackend + ?Sized>(
        &self,
        backend: &B,
    ) -> Result<bool, Error<B::Error>> {
        let Some((stream, device)) = self.stream_and_device() else {
            return Ok(false);
        };
        if !self.may_capture() {
            return Ok(false);
        }
        // SAFETY: the caller's contract: a usable stream of `device` for
        // `backend`.
        unsafe { backend.capture_status(stream, device) }
            .map(|status| status.is_capturing())
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
    /// order has an owner.
    #[inline]
    pub(crate) fn check_backend<B: Backend + ?Sized, E>(
        &self,
        backend: &B,
    ) -> Result<(), Error<E>> {
        match self.order {
            Order::Stream {
                owner: Some(owner), ..
            } if owner != backend.id() => Err(Error::ForeignHandle),
            _ => Ok(()),
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
    ///   capture has ended.
    ///
    /// Transitive: if `b.wait(a)` then `c.wait(b)`, `c` is ordered after `a`.
    ///
    /// Errors: [`Error::ForeignHandle`] when either order's stream is not of
    /// `events`' backend (nothing is called); [`Error::StreamCapturing`] (see
    /// above); a backend failure.
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
        let event = lease(other_device)?;
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
        if let Err((op, source)) = waited {
            if let Err(e) = event.destroy() {
                events.park(e);
            }
            return Err(Error::Backend { op, source });
        }
        self.note_wait();
        Ok(())
    }

    /// Notes, on the lease this order came from (if any), that its stream
    /// waited on an event and so may have joined a graph capture.
    #[inline]
    fn note_wait(&self) {
        if let Captures::Lease(note) = self.captures {
            note.set();
        }
    }

    /// Makes `self` wait for the work `event` has captured: a stream waits on
    /// it in stream order, the host synchronizes it.
    ///
    /// Errors: [`Error::ForeignHandle`] when `self`'s stream is not of the
    /// event's backend; a backend failure.
    pub fn wait_event<B>(&self, event: &EventLease<'_, B>) -> Result<(), Error<B::Error>>
    where
        B: StreamBackend + EventBackend,
    {
        let backend = event.pool().backend();
        self.check_backend(backend)?;
        match self.stream_and_device() {
            // SAFETY: the event is leased (live, created by `backend` on
            // `event.device()`).
            None => unsafe { backend.synchronize_event(event.handle(), event.device()) }
                .map_err(Error::backend(BackendOp::SynchronizeEvent)),
            Some((stream, device)) => {
                // SAFETY: the event as above; the stream is usable for
                // `backend` (borrowed by this order, owner checked).
                unsafe { backend.stream_wait_event(stream, device, event.handle()) }
                    .map_err(Error::backend(BackendOp::StreamWaitEvent))?;
                self.note_wait();
                Ok(())
            }
        }
    }
}

impl OwnedStream {
    /// The stream as an access order, borrowing it (so the stream cannot be
    /// put back or destroyed while the order is in use).
    pub fn order(&self) -> AccessOrder<'_> {
        AccessOrder::of_held(self.handle(), self.device(), self.backend_id(), None)
    }
}

impl<B: StreamBackend> StreamLease<'_, B> {
    /// The stream as an access order, borrowing the lease: the order cannot
    /// be used after the lease ends.
    #[inline]
    pub fn order(&self) -> AccessOrder<'_> {
        AccessOrder::of_held(
            self.handle(),
            self.device(),
            self.backend_id(),
            Some(self.capture_note()),
        )
    }
}

impl<'l, B: StreamBackend> From<&'l StreamLease<'_, B>> for AccessOrder<'l> {
    fn from(l: &'l StreamLease<'_, B>) -> AccessOrder<'l> {
        l.order()
    }
}

assert_impl_all!(AccessOrder<'static>: Copy, Send, Sync);
