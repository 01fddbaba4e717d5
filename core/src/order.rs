//! [`AccessOrder`]: the host, or a stream on a device — the order in which some
//! piece of memory or work is accessed — and how to make one order wait for
//! another.
//!
//! A stream lease's and an owned stream's `order()` are written here, so that
//! the pools below need nothing from this module.

use core::marker::PhantomData;

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
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AccessOrder<'s> {
    order: Order,
    /// The stream (its lease or owner) this order borrows.
    _stream: PhantomData<&'s ()>,
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
            _stream: PhantomData,
        }
    }
}

impl<'s> AccessOrder<'s> {
    /// Stream order on a raw `stream` of `device`, made by `backend`.
    ///
    /// # Safety
    /// For all of `'s`: `stream` is a usable stream of `device` for `backend`
    /// (see [`Backend`]'s handle contracts): created by a backend with
    /// `backend`'s [`id`](Backend::id), on `device`, and not destroyed. A
    /// special handle (0, 1, 2) is always fine.
    pub unsafe fn from_raw<B: Backend + ?Sized>(
        backend: &B,
        stream: StreamHandle,
        device: DeviceId,
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
            _stream: PhantomData,
        }
    }

    /// The order of a stream the caller holds for `'s` (a lease, an owned
    /// stream) and knows to be `owner`'s, on `device`.
    pub(crate) const fn of_held(stream: StreamHandle, device: DeviceId, owner: BackendId) -> Self {
        AccessOrder {
            order: Order::Stream {
                stream,
                device,
                owner: Some(owner),
            },
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
    /// - `self` is host order: synchronizes `other`'s stream.
    /// - both are streams: records a pooled event of `other`'s device on
    ///   `other`'s stream and makes `self`'s stream wait on it; the event goes
    ///   back to the pool (a failed call destroys it instead).
    ///
    /// Transitive: if `b.wait(a)` then `c.wait(b)`, `c` is ordered after `a`.
    ///
    /// Errors: [`Error::ForeignHandle`] when either order's stream is not of
    /// `events`' backend (nothing is called); a backend failure.
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
        Ok(())
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
                    .map_err(Error::backend(BackendOp::StreamWaitEvent))
            }
        }
    }
}

impl OwnedStream {
    /// The stream as an access order, borrowing it (so the stream cannot be
    /// put back or destroyed while the order is in use).
    pub fn order(&self) -> AccessOrder<'_> {
        AccessOrder::of_held(self.handle(), self.device(), self.backend_id())
    }
}

impl<B: StreamBackend> StreamLease<'_, B> {
    /// The stream as an access order, borrowing the lease: the order cannot
    /// be used after the lease ends.
    #[inline]
    pub fn order(&self) -> AccessOrder<'_> {
        AccessOrder::of_held(self.handle(), self.device(), self.backend_id())
    }
}

impl<'l, B: StreamBackend> From<&'l StreamLease<'_, B>> for AccessOrder<'l> {
    fn from(l: &'l StreamLease<'_, B>) -> AccessOrder<'l> {
        l.order()
    }
}

assert_impl_all!(AccessOrder<'static>: Copy, Send, Sync);
