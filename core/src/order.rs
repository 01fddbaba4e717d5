//! [`AccessOrder`]: the host, or a stream on a device — the order in which some
//! piece of memory or work is accessed — and how to make one order wait for
//! another.

use crate::backend::{DeviceId, EventBackend, EventHandle, StreamBackend, StreamHandle};
use crate::error::{BackendOp, Error};
use crate::event_pool::{EventLease, EventPool};
use crate::sync::epoch::Guard;

/// The order in which work happens: on the host (synchronously), or on a
/// stream of a device (in stream order).
///
/// DALI's null order is `Option<AccessOrder>::None` here.
///
/// An order holds a raw handle and does not keep its stream alive: an order
/// taken from a lease ([`StreamLease::order`](crate::StreamLease::order)) must
/// not be used after the lease ended, or the backend gets a handle that may
/// have been destroyed.
///
/// ```
/// use gpupool_core::{AccessOrder, DeviceId, StreamHandle};
/// let s = AccessOrder::stream(StreamHandle(0x1000), DeviceId(0));
/// assert!(s.is_device() && !s.is_host());
/// assert_eq!(s.stream_handle(), Some(StreamHandle(0x1000)));
/// assert_eq!(AccessOrder::host().stream_handle(), None);
/// // Equality compares the stream *and* the device.
/// assert_ne!(s, AccessOrder::stream(StreamHandle(0x1000), DeviceId(1)));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum AccessOrder {
    /// Host order: accesses happen in program order on the calling thread.
    Host,
    /// Stream order on a device. Any handle is allowed, including CUDA's special
    /// streams 0, 1 and 2, which belong to `device`'s context when used.
    Stream {
        /// The stream.
        stream: StreamHandle,
        /// The device whose stream it is.
        device: DeviceId,
    },
}

impl AccessOrder {
    /// Host order.
    pub const fn host() -> Self {
        AccessOrder::Host
    }

    /// Stream order on `stream` of `device`.
    pub const fn stream(stream: StreamHandle, device: DeviceId) -> Self {
        AccessOrder::Stream { stream, device }
    }

    /// Whether this is host order.
    pub const fn is_host(&self) -> bool {
        matches!(self, AccessOrder::Host)
    }

    /// Whether this is a stream order.
    pub const fn is_device(&self) -> bool {
        matches!(self, AccessOrder::Stream { .. })
    }

    /// The stream, for a stream order.
    pub const fn stream_handle(&self) -> Option<StreamHandle> {
        match self {
            AccessOrder::Stream { stream, .. } => Some(*stream),
            AccessOrder::Host => None,
        }
    }

    /// The device, for a stream order.
    pub const fn device(&self) -> Option<DeviceId> {
        match self {
            AccessOrder::Stream { device, .. } => Some(*device),
            AccessOrder::Host => None,
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
    #[cfg(feature = "std")]
    pub fn wait<B>(&self, other: &AccessOrder, events: &EventPool<B>) -> Result<(), Error<B::Error>>
    where
        B: StreamBackend + EventBackend,
    {
        self.wait_using(other, events, |d| events.get(d))
    }

    /// [`wait`](Self::wait) with a guard pinned in the event pool's collector.
    pub fn wait_in<B>(
        &self,
        other: &AccessOrder,
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
        other: &AccessOrder,
        events: &'p EventPool<B>,
        lease: impl FnOnce(DeviceId) -> Result<EventLease<'p, B>, Error<B::Error>>,
    ) -> Result<(), Error<B::Error>>
    where
        B: StreamBackend + EventBackend,
    {
        let (this_stream, this_device, other_stream, other_device) = match (self, other) {
            (
                AccessOrder::Stream {
                    stream: ts,
                    device: td,
                },
                AccessOrder::Stream {
                    stream: os,
                    device: od,
                },
            ) if self != other => (*ts, *td, *os, *od),
            _ => return self.wait_without_event(other, events),
        };
        let backend = events.backend();
        let event = lease(other_device)?;
        if let Err(source) = backend.record_event(event.get(), other_stream, other_device) {
            if let Err(e) = event.discard() {
                events.park(e);
            }
            return Err(Error::Backend {
                op: BackendOp::RecordEvent,
                source,
            });
        }
        if let Err(source) = backend.stream_wait_event(this_stream, this_device, event.get()) {
            if let Err(e) = event.discard() {
                events.park(e);
            }
            return Err(Error::Backend {
                op: BackendOp::StreamWaitEvent,
                source,
            });
        }
        Ok(())
    }

    /// The cases of `wait` that need no pooled event.
    fn wait_without_event<B>(
        &self,
        other: &AccessOrder,
        events: &EventPool<B>,
    ) -> Result<(), Error<B::Error>>
    where
        B: StreamBackend + EventBackend,
    {
        match (self, other) {
            _ if self == other => Ok(()),
            (_, AccessOrder::Host) => Ok(()),
            (AccessOrder::Host, AccessOrder::Stream { stream, device }) => events
                .backend()
                .synchronize_stream(*stream, *device)
                .map_err(Error::backend(BackendOp::SynchronizeStream)),
            // Two distinct streams: handled by `wait_in`.
            (AccessOrder::Stream { .. }, AccessOrder::Stream { .. }) => Ok(()),
        }
    }

    /// Makes `self` wait for `event` (of `device`): a stream waits on it in
    /// stream order, the host synchronizes it.
    pub fn wait_event<B>(
        &self,
        event: EventHandle,
        device: DeviceId,
        backend: &B,
    ) -> Result<(), Error<B::Error>>
    where
        B: StreamBackend + EventBackend,
    {
        if event.is_null() {
            return Err(Error::NullHandle);
        }
        match self {
            AccessOrder::Host => backend
                .synchronize_event(event, device)
                .map_err(Error::backend(BackendOp::SynchronizeEvent)),
            AccessOrder::Stream { stream, device: d } => backend
                .stream_wait_event(*stream, *d, event)
                .map_err(Error::backend(BackendOp::StreamWaitEvent)),
        }
    }
}
