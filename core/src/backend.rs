//! The traits a backend implements, and the small handle and id types they
//! exchange with the pools.
//!
//! A backend is a device driver seen through a narrow window: devices, streams,
//! events. Every operation is fallible and returns the backend's own error type;
//! nothing here panics. Handles are plain `Copy` values (a raw `CUstream` or
//! `CUevent` on CUDA, an id on the mock); ownership of the object behind a handle
//! is tracked by the pools and leases, not by the handle.
//!
//! Safe code cannot make a handle ([`StreamHandle::from_raw`] and
//! [`EventHandle::from_raw`] are `unsafe`), and every trait method that takes
//! a handle or an address is an `unsafe fn` whose `# Safety` list says what the
//! caller guarantees: the handle is live, was created by a backend with the same
//! [`BackendId`], and belongs to the device named. The pools, leases and
//! scratchpads are the safe layer above: each call they make is justified by
//! what they own (see `docs/safety.md`).

use core::fmt;

use static_assertions::assert_impl_all;

mod forward;
mod traits;

pub use traits::{Backend, CaptureBackend, EventBackend, MemoryBackend, MemoryKind, StreamBackend};

/// The most devices a pool keeps a table for; a backend reporting more gets
/// [`Error::TooManyDevices`](crate::Error::TooManyDevices) instead of a huge
/// allocation.
pub const MAX_DEVICES: u32 = 1024;

/// The ordinal of a device, as the driver counts them (`0..device_count`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId(pub u32);

impl DeviceId {
    /// The ordinal as an index into per-device tables.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}", self.0)
    }
}

/// Which device a pool call is about: one named explicitly, or the calling
/// thread's current device (resolved once per call through
/// [`Backend::current_device`]).
///
/// The pools' `get` takes `impl Into<DeviceSelector>`, so it accepts:
/// - a [`DeviceId`], or a `u32` ordinal: `get(0)` with an integer literal
///   works, the literal being a `u32`;
/// - an `Option<DeviceId>`: `None` is the current device (DALI's `-1`);
/// - a `DeviceSelector` itself.
///
/// There is no `From<usize>` (nor `From<i32>`): a second integer type would
/// make `get(0)` ambiguous, and both conversions can lose the value. An
/// index held as a `usize` converts with [`TryFrom`], which refuses one past
/// `u32::MAX` instead of truncating it (an ordinal past the device count is
/// then refused by the pool with `Error::DeviceOutOfRange`).
///
/// ```
/// use gpupool_core::{DeviceId, DeviceSelector};
/// assert_eq!(DeviceSelector::from(1), DeviceSelector::Id(DeviceId(1)));
/// assert_eq!(DeviceSelector::default(), DeviceSelector::Current);
/// assert_eq!(DeviceSelector::from(None), DeviceSelector::Current);
/// assert_eq!(DeviceSelector::from(Some(DeviceId(2))), DeviceSelector::Id(DeviceId(2)));
/// let index: usize = 3;
/// assert_eq!(DeviceSelector::try_from(index), Ok(DeviceSelector::Id(DeviceId(3))));
/// if usize::BITS > 32 {
///     assert!(DeviceSelector::try_from(usize::MAX).is_err()); // not truncated
/// }
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum DeviceSelector {
    /// The calling thread's current device, as [`Backend::current_device`]
    /// reports it when the call is made: on CUDA the device of the context
    /// current on the calling thread (device 0 when none is, as in the CUDA
    /// runtime API); on the mock the machine-wide device set by
    /// `set_current_device`. It is
    /// resolved once per call, so a lease's [`device`](crate::StreamLease::device)
    /// says which device it was.
    #[default]
    Current,
    /// This device.
    Id(DeviceId),
}

impl From<DeviceId> for DeviceSelector {
    fn from(d: DeviceId) -> Self {
        DeviceSelector::Id(d)
    }
}

impl From<u32> for DeviceSelector {
    fn from(d: u32) -> Self {
        DeviceSelector::Id(DeviceId(d))
    }
}

impl From<Option<DeviceId>> for DeviceSelector {
    /// `None` is the current device.
    fn from(d: Option<DeviceId>) -> Self {
        d.map_or(DeviceSelector::Current, DeviceSelector::Id)
    }
}

impl TryFrom<usize> for DeviceSelector {
    type Error = core::num::TryFromIntError;

    /// The device of ordinal `d`; an error past `u32::MAX` (no truncation).
    fn try_from(d: usize) -> Result<Self, Self::Error> {
        DeviceId::try_from(d).map(DeviceSelector::Id)
    }
}

impl TryFrom<usize> for DeviceId {
    type Error = core::num::TryFromIntError;

    /// The device of ordinal `d`; an error past `u32::MAX` (no truncation).
    fn try_from(d: usize) -> Result<Self, Self::Error> {
        u32::try_from(d).map(DeviceId)
    }
}

/// Which driver instance a backend value speaks to: handles and addresses
/// created through one backend are valid with every backend of the same id,
/// and with no other.
///
/// Every CUDA backend value in a process shares one id (they share the
/// driver); each mock machine has its own. Owned handles
/// ([`OwnedStream`](crate::OwnedStream), [`OwnedEvent`](crate::OwnedEvent)) and
/// stream orders ([`AccessOrder`](crate::AccessOrder)) carry the id of the
/// backend that made them, so a pool or scratchpad refuses a foreign one with
/// [`Error::ForeignHandle`](crate::Error::ForeignHandle) instead of passing it
/// to the driver.
///
/// ```
/// use gpupool_core::BackendId;
/// assert_ne!(BackendId::unique(), BackendId::unique());
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BackendId(core::num::NonZeroUsize);

impl BackendId {
    /// A new id, different from every other id this process has made.
    pub fn unique() -> BackendId {
        BackendId(next_backend_id())
    }

    /// The id as a number (for logs).
    pub const fn get(self) -> usize {
        self.0.get()
    }
}

/// `as_raw` and `is_null`, the same for both handle types; `$c_type` is the
/// CUDA type the raw value stands for.
macro_rules! raw_value {
    ($handle:ident, $c_type:literal) => {
        impl $handle {
            #[doc = concat!("The raw value (a `", $c_type, "` as an integer on CUDA).")]
            #[inline]
            pub const fn as_raw(self) -> usize {
                self.0
            }

            /// Whether this is the null handle.
            #[inline]
            pub const fn is_null(self) -> bool {
                self.0 == 0
            }
        }
    };
}

raw_value!(StreamHandle, "CUstream");
raw_value!(EventHandle, "CUevent");

/// A raw stream handle (a `CUstream` on CUDA).
///
/// Safe code cannot make one from a number: handles come from a backend
/// ([`StreamBackend::create_stream`]), from a lease
/// ([`StreamLease::handle`](crate::StreamLease::handle)), or from
/// [`from_raw`](Self::from_raw), which is `unsafe`. Reading the number
/// ([`as_raw`](Self::as_raw)) is safe.
///
/// The value 0 is the null handle. As in CUDA, 0, 1 and 2 also name the special
/// streams (legacy default, legacy, per-thread default); they may appear in an
/// [`AccessOrder`](crate::AccessOrder) but are never pooled.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamHandle(usize);

impl StreamHandle {
    /// The null handle (CUDA's default stream, 0).
    pub const NULL: StreamHandle = StreamHandle(0);
    /// CUDA's legacy default stream (`CU_STREAM_LEGACY`, 1).
    pub const LEGACY: StreamHandle = StreamHandle(1);
    /// CUDA's per-thread default stream (`CU_STREAM_PER_THREAD`, 2).
    pub const PER_THREAD: StreamHandle = StreamHandle(2);

    /// A handle from its raw value (a `CUstream` as an integer on CUDA).
    ///
    /// # Safety
    /// Making the value is harmless; what it allows is not: safe code treats
    /// every `StreamHandle` as one a backend gave out. So `raw` is a stream
    /// handle that a backend created (or one of the special values 0, 1, 2),
    /// and it is passed to a backend only while that stream is live, with a
    /// backend of the same [`BackendId`] — the same guarantees the backend
    /// traits' `unsafe fn`s ask for.
    #[inline]
    pub const unsafe fn from_raw(raw: usize) -> StreamHandle {
        StreamHandle(raw)
    }

    /// Whether this is one of CUDA's special streams (0, 1 or 2), which belong to
    /// whichever context is current when they are used.
    #[inline]
    pub const fn is_special(self) -> bool {
        self.0 <= 2
    }
}

/// A raw event handle (a `CUevent` on CUDA). The value 0 is the null handle.
///
/// As for [`StreamHandle`], safe code cannot make one from a number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventHandle(usize);

impl EventHandle {
    /// The null handle.
    pub const NULL: EventHandle = EventHandle(0);

    /// A handle from its raw value (a `CUevent` as an integer on CUDA).
    ///
    /// # Safety
    /// As for [`StreamHandle::from_raw`]: `raw` is an event a backend created,
    /// passed to a backend only while it is live, with a backend of the same
    /// [`BackendId`].
    #[inline]
    pub const unsafe fn from_raw(raw: usize) -> EventHandle {
        EventHandle(raw)
    }
}

/// Whether the work submitted to a stream, or captured by an event, has finished.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Completion {
    /// Everything has finished (`CUDA_SUCCESS` from a query).
    Complete,
    /// Something is still running or queued (`CUDA_ERROR_NOT_READY`).
    Pending,
}

/// Whether a stream is capturing work into a CUDA graph
/// ([`StreamBackend::capture_status`]). Work issued on a capturing stream is
/// recorded into the graph, not run; the driver refuses to query or
/// synchronize such a stream (and, in its default capture mode, a refused call
/// breaks the capture), so the pools ask this first wherever a stream may be
/// capturing (see `docs/graph-capture.md`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// Not capturing: work issued on the stream runs.
    NotCapturing,
    /// Capturing: work issued on the stream goes into a graph.
    Active,
    /// A capture that a refused call broke and that nobody has ended yet: the
    /// stream is still in it (its work still goes nowhere) until the capture's
    /// origin stream ends it.
    Invalidated,
}

impl CaptureStatus {
    /// Whether the stream is in a capture (active or invalidated): work issued
    /// on it does not run, and it may not be queried or synchronized.
    #[inline]
    pub const fn is_capturing(self) -> bool {
        !matches!(self, CaptureStatus::NotCapturing)
    }
}

/// How a graph capture restricts the calls of the process's threads while it
/// is open (CUDA's `CUstreamCaptureMode`), for
/// [`StreamLease::begin_capture`](crate::StreamLease::begin_capture).
///
/// "Potentially unsafe" calls are those that may synchronize with captured
/// work implicitly: queries and synchronizations of streams and events, and
/// synchronous allocations of device-visible memory. A refused call fails and
/// invalidates the capture.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum CaptureMode {
    /// CUDA's default: while the capture is open, every thread is refused
    /// the potentially unsafe calls (unless it set its own mode otherwise).
    #[default]
    Global,
    /// Only the thread that began the capture is refused them.
    ThreadLocal,
    /// Nobody is refused them; calls on the capturing streams themselves and
    /// on events recorded in the capture are still refused.
    Relaxed,
}

/// Event creation flags. The bit values are CUDA's `CU_EVENT_*` flags, so a CUDA
/// backend passes them through unchanged.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventFlags(pub u32);

impl EventFlags {
    /// No flag: timing enabled, spin on synchronize.
    pub const DEFAULT: EventFlags = EventFlags(0);
    /// Synchronize blocks the host thread instead of spinning.
    pub const BLOCKING_SYNC: EventFlags = EventFlags(1);
    /// No timing data: the cheapest event to record and wait on.
    pub const DISABLE_TIMING: EventFlags = EventFlags(2);
    /// Usable across processes (requires `DISABLE_TIMING`).
    pub const INTERPROCESS: EventFlags = EventFlags(4);

    /// Whether every bit of `other` is set in `self`.
    #[inline]
    pub const fn contains(self, other: EventFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl Default for EventFlags {
    /// Timing disabled, as in DALI's event pool.
    fn default() -> Self {
        EventFlags::DISABLE_TIMING
    }
}

impl core::ops::BitOr for EventFlags {
    type Output = EventFlags;
    fn bitor(self, rhs: EventFlags) -> EventFlags {
        EventFlags(self.0 | rhs.0)
    }
}

/// Options for creating a pooled stream. Pooled streams are always
/// non-blocking with respect to the legacy default stream.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct StreamOptions {
    /// Scheduling priority; `None` is the device default. On CUDA a lower number is
    /// a higher priority; the backend clamps it to the device's range.
    pub priority: Option<i32>,
}

/// The next [`BackendId`]: a process-wide counter that
/// starts at 1 and never repeats (a wrap would need 2^32 or more backends).
///
/// A plain `core` atomic even under loom: a loom atomic cannot live in a
/// `static`, and the counter is not part of any interleaving a model checks
/// (it only makes numbers unique).
fn next_backend_id() -> core::num::NonZeroUsize {
    static NEXT: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(1);
    // Relaxed: only uniqueness matters, which the read-modify-write gives in
    // any ordering; no other memory is published through the counter.
    let id = NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    // 0 only after a wrap; skip it rather than panic.
    core::num::NonZeroUsize::new(id).unwrap_or(core::num::NonZeroUsize::MIN)
}

assert_impl_all!(StreamHandle: Copy, Send, Sync);
assert_impl_all!(EventHandle: Copy, Send, Sync);
assert_impl_all!(BackendId: Copy, Send, Sync);
