//! Errors: what a pool call can refuse, and the backend failure it can carry.

use core::fmt;

use crate::backend::DeviceId;

/// The backend operation that failed, carried by [`Error::Backend`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendOp {
    /// [`Backend::device_count`](crate::Backend::device_count).
    DeviceCount,
    /// [`Backend::current_device`](crate::Backend::current_device).
    CurrentDevice,
    /// Creating a stream.
    CreateStream,
    /// Destroying a stream.
    DestroyStream,
    /// Querying a stream.
    QueryStream,
    /// Synchronizing a stream.
    SynchronizeStream,
    /// Making a stream wait on an event.
    StreamWaitEvent,
    /// Asking which device a stream belongs to.
    StreamDevice,
    /// Asking whether a stream is capturing a graph.
    CaptureStatus,
    /// Creating an event.
    CreateEvent,
    /// Destroying an event.
    DestroyEvent,
    /// Recording an event.
    RecordEvent,
    /// Querying an event.
    QueryEvent,
    /// Synchronizing an event.
    SynchronizeEvent,
    /// Allocating memory synchronously.
    Allocate,
    /// Freeing memory synchronously.
    Deallocate,
    /// Allocating memory in stream order.
    AllocateAsync,
    /// Freeing memory in stream order.
    DeallocateAsync,
    /// Copying memory in stream order.
    CopyAsync,
    /// Beginning a graph capture.
    BeginCapture,
    /// Ending a graph capture.
    EndCapture,
    /// Keeping a block for the graphs that may use it.
    KeepForGraph,
}

/// Why a pool call failed. `E` is the backend's error type.
///
/// Every variant leaves the pool intact: nothing was taken from it or added to
/// it, and the next call works as if the failed one had not been made.
#[derive(Debug, PartialEq, Eq, Clone)]
#[non_exhaustive]
pub enum Error<E> {
    /// The backend failed.
    Backend {
        /// What the pool asked the backend to do.
        op: BackendOp,
        /// The backend's error.
        source: E,
    },
    /// The backend reports no device at all.
    NoDevice,
    /// The device id is not below the device count.
    DeviceOutOfRange {
        /// The id asked for.
        device: DeviceId,
        /// How many devices there are.
        count: u32,
    },
    /// A stream or event was put under a device it does not belong to, or
    /// memory of one device was handed to a scratchpad of another
    /// ([`Scratchpad::copy_to_host`](crate::Scratchpad::copy_to_host)).
    WrongDevice {
        /// The device named in the call (the scratchpad's, for memory).
        given: DeviceId,
        /// The device the handle or memory belongs to.
        actual: DeviceId,
    },
    /// The null handle was offered where a real stream or event is needed.
    NullHandle,
    /// One of CUDA's special streams (legacy default, per-thread default) was
    /// offered for pooling; they belong to no pool and cannot be destroyed.
    SpecialHandle,
    /// An alignment that is zero or not a power of two.
    InvalidAlignment {
        /// The alignment asked for.
        align: usize,
    },
    /// A size that overflows: `count * size_of::<T>()` past `usize`, a request
    /// past `isize::MAX` bytes, or a block size that cannot double any more.
    SizeOverflow,
    /// Host access was asked of memory the host cannot touch (device memory).
    NotHostAccessible,
    /// The backend reports more devices than a pool keeps a table for
    /// ([`MAX_DEVICES`](crate::MAX_DEVICES)).
    TooManyDevices {
        /// The device count the backend reported.
        count: u32,
    },
    /// A guard of another epoch collector was passed to a pool call
    /// (see [`StreamPool::collector`](crate::StreamPool::collector)).
    ForeignGuard,
    /// A stream, event, order or device slice made by another backend
    /// (another mock machine; a mock handle offered to CUDA) was offered: its
    /// [`BackendId`](crate::BackendId) is not the receiver's.
    ForeignHandle,
    /// The call would have to synchronize with, query or free host-visible
    /// memory in the order of a stream that is capturing a CUDA graph, make a
    /// special stream (null, legacy, per-thread) join a capture, or make a
    /// capturing stream wait on work outside its capture (another stream, or
    /// another capture), which the driver refuses (and a refused call can
    /// break the capture). Nothing was called that could break it, and
    /// nothing was changed. See `docs/graph-capture.md` for what works inside
    /// a capture.
    StreamCapturing,
    /// The calling thread's per-thread default stream
    /// ([`AccessOrder::per_thread_stream`](crate::AccessOrder::per_thread_stream))
    /// was given to something that keeps an order beyond one call (a
    /// [`Scratchpad`](crate::Scratchpad)): that order names another stream on
    /// every thread, and what keeps it may move between threads, so its
    /// memory could be released on a different stream than the one its work
    /// was queued on. Use a leased stream. Nothing was made.
    PerThreadStream,
    /// The event's last record was captured into a graph that may still be
    /// open: the host cannot wait for it, and it cannot go back to a pool
    /// (another user's wait on it would join the capture). Nothing was
    /// called.
    CapturedEvent,
    /// The device memory was allocated by a graph capture (a graph's own
    /// allocation) that has ended: it is valid only while that graph's work
    /// runs, never for the host or other work. Nothing was copied.
    GraphMemory,
    /// A capture was begun on a stream that is already in one, or ended on
    /// a lease that did not begin one. Nothing was called.
    CaptureState,
    /// The thread that watches pending events for [`Completed`](crate::Completed)
    /// futures could not be started (the operating system refused a new
    /// thread). The event went back to its pool; nothing else was changed.
    CompletionThread,
    /// The order's stream may begin or join a graph capture that gpupool
    /// cannot see (the per-thread default stream, an order made by
    /// [`AccessOrder::from_raw_capturable`](crate::AccessOrder::from_raw_capturable)),
    /// and the call must know that what it records will run (a
    /// [`Completed`](crate::Completed) future). Use a leased stream. Nothing
    /// was recorded.
    CapturesUnseen,
    /// Two lengths that must be equal are not: a host buffer for a copy from
    /// device memory ([`Scratchpad::copy_to_host`](crate::Scratchpad::copy_to_host))
    /// has another length than the device slice. Nothing was copied.
    LengthMismatch {
        /// The length required (the device slice's).
        expected: usize,
        /// The length given (the host buffer's).
        actual: usize,
    },
}

impl<E> Error<E> {
    /// Wraps a backend error with the operation that produced it.
    #[inline]
    pub fn backend(op: BackendOp) -> impl FnOnce(E) -> Self {
        move |source| Error::Backend { op, source }
    }

    /// The failed backend operation, if this is a backend error.
    pub fn backend_op(&self) -> Option<BackendOp> {
        match self {
            Error::Backend { op, .. } => Some(*op),
            _ => None,
        }
    }
}

/// Says what failed, not why: a backend failure's cause is its
/// [`source`](core::error::Error::source) (the backend's own error), which the
/// message does not repeat, so a report that walks the chain prints each cause
/// once: "backend call CopyAsync failed", caused by the backend's error.
///
/// The alternate form (`{:#}`) appends the cause, itself in alternate form,
/// after `": "`: the whole chain in one line, for a log that has only the
/// `Display` (the [lost-error hook](crate::set_lost_error_hook)).
///
/// ```
/// use gpupool_core::{BackendOp, Error};
/// use gpupool_mock::MockError;
///
/// let e = Error::Backend { op: BackendOp::CopyAsync, source: MockError::Injected(BackendOp::CopyAsync) };
/// assert_eq!(e.to_string(), "backend call CopyAsync failed");
/// let source = std::error::Error::source(&e).unwrap();
/// assert_eq!(source.to_string(), "injected failure of a CopyAsync call");
/// assert_eq!(format!("{e:#}"), "backend call CopyAsync failed: injected failure of a CopyAsync call");
/// ```
impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Backend { op, source } => {
                write!(f, "backend call {op:?} failed")?;
                if f.alternate() {
                    write!(f, ": {source:#}")?;
                }
                Ok(())
            }
            Error::NoDevice => f.write_str("no device is available"),
            Error::DeviceOutOfRange { device, count } => match count {
                1 => write!(f, "{device} is out of range: there is 1 device"),
                _ => write!(f, "{device} is out of range: there are {count} devices"),
            },
            Error::WrongDevice { given, actual } => {
                write!(
                    f,
                    "the handle or memory belongs to {actual}, not to {given}"
                )
            }
            Error::NullHandle => f.write_str("the null handle cannot be pooled"),
            Error::InvalidAlignment { align } => {
                write!(f, "alignment {align} is not a nonzero power of two")
            }
            Error::SizeOverflow => f.write_str("the requested size overflows"),
            Error::NotHostAccessible => f.write_str("device memory is not host-accessible"),
            Error::SpecialHandle => {
                f.write_str("a special stream (legacy, per-thread) cannot be pooled")
            }
            Error::TooManyDevices { count } => write!(
                f,
                "the backend reports {count} devices, more than the {} a pool supports",
                crate::backend::MAX_DEVICES
            ),
            Error::ForeignGuard => {
                f.write_str("the epoch guard belongs to another collector than the pool's")
            }
            Error::ForeignHandle => {
                f.write_str("the handle, order or memory was made by another backend than this one")
            }
            Error::StreamCapturing => f.write_str(
                "the stream is capturing a graph: it cannot be waited for, queried, \
                 or release host-visible memory",
            ),
            Error::PerThreadStream => f.write_str(
                "the per-thread default stream names another stream on each thread: \
                 a scratchpad needs one stream for its whole life (use a leased stream)",
            ),
            Error::CapturedEvent => f.write_str(
                "the event was recorded in a graph capture: it cannot be waited for by the \
                 host or pooled again",
            ),
            Error::GraphMemory => f.write_str(
                "the memory is a graph's allocation, valid only in that graph's replays",
            ),
            Error::CaptureState => f.write_str(
                "the stream is already capturing, or this lease did not begin the capture",
            ),
            Error::CapturesUnseen => f.write_str(
                "the stream may capture a graph where gpupool cannot see it: use a leased stream",
            ),
            Error::CompletionThread => {
                f.write_str("the thread that watches pending events could not be started")
            }
            Error::LengthMismatch { expected, actual } => {
                write!(
                    f,
                    "length mismatch: {actual} elements given, {expected} needed"
                )
            }
        }
    }
}

/// `source()` is the backend's error for [`Error::Backend`], `None` otherwise.
impl<E: core::error::Error + 'static> core::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Error::Backend { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A refused hand-over: the value offered (a stream or an event) comes back to
/// the caller, who still owns it, together with the reason.
#[derive(Debug)]
pub struct Rejected<T, E> {
    /// The value that was not taken.
    pub value: T,
    /// Why it was not taken.
    pub error: Error<E>,
}

/// Says what was refused ("OwnedStream refused"); why is the
/// [`source`](core::error::Error::source), [`error`](Rejected::error), which
/// the message does not repeat. The alternate form (`{:#}`) appends the
/// whole chain, as [`Error`]'s does.
impl<T, E: fmt::Display> fmt::Display for Rejected<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} refused", short_type_name::<T>())?;
        if f.alternate() {
            write!(f, ": {:#}", self.error)?;
        }
        Ok(())
    }
}

/// `source()` is [`error`](Rejected::error), always.
impl<T: fmt::Debug, E: core::error::Error + 'static> core::error::Error for Rejected<T, E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// `T`'s name without its path or generic arguments (`OwnedStream`).
fn short_type_name<T>() -> &'static str {
    let full = core::any::type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}
