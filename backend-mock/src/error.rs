//! [`MockError`], what a mock call can fail with, and [`Misuse`], the record
//! the mock keeps of every call that handed it a bad handle or device.

use core::fmt;

use gpupool_core::{DeviceId, EventHandle, StreamHandle};

use crate::CallKind;

/// Why a call to the mock failed.
///
/// Every error except [`Injected`](MockError::Injected) means the caller
/// handed the mock something a real driver would reject; the mock also records
/// such calls as [`Misuse`]s (see [`MockBackend::misuses`](crate::MockBackend::misuses)).
/// A failed call has no effect on the simulated machine.
///
/// ```
/// use gpupool_core::{BackendOp, StreamBackend, StreamHandle, DeviceId};
/// use gpupool_mock::{MockBackend, MockError};
///
/// let mock = MockBackend::new(1);
/// let err = mock.destroy_stream(StreamHandle(0x9999), DeviceId(0)).unwrap_err();
/// assert_eq!(err, MockError::InvalidStream(StreamHandle(0x9999)));
/// assert_eq!(mock.misuses()[0].call, BackendOp::DestroyStream);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MockError {
    /// A fault armed with [`MockBackend::fail_nth`](crate::MockBackend::fail_nth)
    /// fired on this call of this kind.
    Injected(CallKind),
    /// The stream was never created by this mock, or has been destroyed (or is a
    /// special stream where only a created one is allowed, as in `destroy_stream`).
    InvalidStream(StreamHandle),
    /// The event was never created by this mock, or has been destroyed.
    InvalidEvent(EventHandle),
    /// The device is not below the device count.
    InvalidDevice(DeviceId),
    /// A handle was used with a device it does not belong to: a stream or event
    /// passed with another device than its own, or an event of one device
    /// recorded on a stream of another.
    CrossDevice {
        /// The device the call named.
        given: DeviceId,
        /// The device the handle belongs to.
        actual: DeviceId,
    },
}

impl MockError {
    /// Whether this error was injected by [`MockBackend::fail_nth`](crate::MockBackend::fail_nth)
    /// rather than caused by a bad argument.
    pub fn is_injected(&self) -> bool {
        matches!(self, MockError::Injected(_))
    }
}

impl fmt::Display for MockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MockError::Injected(kind) => write!(f, "injected failure of a {kind:?} call"),
            MockError::InvalidStream(s) => write!(f, "invalid stream handle {:#x}", s.0),
            MockError::InvalidEvent(e) => write!(f, "invalid event handle {:#x}", e.0),
            MockError::InvalidDevice(d) => write!(f, "{d} does not exist"),
            MockError::CrossDevice { given, actual } => {
                write!(f, "the handle belongs to {actual}, not to {given}")
            }
        }
    }
}

impl std::error::Error for MockError {}

/// A call that handed the mock a bad handle or device: a double destroy, an
/// unknown or destroyed handle, a device out of range, a handle used with the
/// wrong device.
///
/// The pools must never cause one; tests assert
/// [`MockBackend::misuses`](crate::MockBackend::misuses) is empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Misuse {
    /// The kind of call that was made.
    pub call: CallKind,
    /// What the mock answered.
    pub error: MockError,
}

impl fmt::Display for Misuse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.call, self.error)
    }
}
