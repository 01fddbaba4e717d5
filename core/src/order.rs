//! [`AccessOrder`]: the host, or a stream on a device — the order in which some
//! piece of memory or work is accessed — and how to make one order wait for
//! another.
//!
//! A stream lease's and an owned stream's `order()` are written here, so that
//! the pools below need nothing from this module.

use core::hash::{Hash, Hasher};
use core::marker::PhantomData;

use crate::backend::{Backend, BackendId, DeviceId, StreamBackend, StreamHandle};
use crate::capture::CaptureNote;
use crate::error::{BackendOp, Error};
use crate::owned::OwnedStream;
use crate::stream_pool::StreamLease;
use static_assertions::assert_impl_all;

mod wait;

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
