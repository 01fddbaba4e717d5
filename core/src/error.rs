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
    /// A stream or event was put under a device it does not belong to.
    WrongDevice {
        /// The device named in the call.
        given: DeviceId,
        /// The device the handle belongs to.
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
    /// A stream, event or order made by another backend (another mock
    /// machine; a mock handle offered to CUDA) was offered: its
    /// [`BackendId`](crate::BackendId) is not the receiver's.
    ForeignHandle,
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

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Backend { op, source } => write!(f, "backend call {op:?} failed: {source}"),
            Error::NoDevice => f.write_str("no device is available"),
            Error::DeviceOutOfRange { device, count } => {
                write!(f, "{device} is out of range: there are {count} devices")
            }
            Error::WrongDevice { given, actual } => {
                write!(f, "the handle belongs to {actual}, not to {given}")
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
                crate::MAX_DEVICES
            ),
            Error::ForeignGuard => {
                f.write_str("the epoch guard belongs to another collector than the pool's")
            }
            Error::ForeignHandle => {
                f.write_str("the handle or order was made by another backend than this one")
            }
        }
    }
}

#[cfg(feature = "std")]
impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
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

impl<T, E: fmt::Display> fmt::Display for Rejected<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "refused: {}", self.error)
    }
}

#[cfg(feature = "std")]
impl<T: fmt::Debug, E: std::error::Error + 'static> std::error::Error for Rejected<T, E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
