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
use core::ptr::NonNull;

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
        BackendId(crate::sync::next_backend_id())
    }

    /// The id as a number (for logs).
    pub const fn get(self) -> usize {
        self.0.get()
    }
}

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

    /// The raw value (a `CUstream` as an integer on CUDA).
    #[inline]
    pub const fn as_raw(self) -> usize {
        self.0
    }

    /// Whether this is the null handle.
    #[inline]
    pub const fn is_null(self) -> bool {
        self.0 == 0
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

    /// The raw value (a `CUevent` as an integer on CUDA).
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

/// Whether the work submitted to a stream, or captured by an event, has finished.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Completion {
    /// Everything has finished (`CUDA_SUCCESS` from a query).
    Complete,
    /// Something is still running or queued (`CUDA_ERROR_NOT_READY`).
    Pending,
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

/// The device part of a backend: its identity, its error type and how devices
/// are counted.
///
/// Implementations must be cheap to share between threads; the pools call them
/// from every thread that uses the pool.
///
/// # Handle contracts
///
/// The `unsafe fn`s of [`StreamBackend`], [`EventBackend`] and
/// [`MemoryBackend`] use these terms in their `# Safety` lists:
/// - a **usable stream of `device`** is a stream created by
///   [`create_stream`](StreamBackend::create_stream) of a backend whose
///   [`id`](Backend::id) equals this one's, on `device`, and not destroyed
///   before the call returns; or one of the special streams
///   ([`StreamHandle::NULL`], [`LEGACY`](StreamHandle::LEGACY),
///   [`PER_THREAD`](StreamHandle::PER_THREAD)), which name `device`'s default
///   streams;
/// - a **usable event of `device`** is an event created by
///   [`create_event`](EventBackend::create_event) of a backend with the same
///   id, on `device`, and not destroyed before the call returns.
///
/// # Safety
///
/// The pools trust [`id`](Backend::id): a stream or event that one backend
/// created is handed, by safe code, to every backend of the same id (a lease
/// detached from one pool and put into another, an order waited on with
/// another pool's events). So an implementation guarantees that
/// 1. `id` returns the same value every time, and
/// 2. every handle or address its safe methods hand out (`create_stream`,
///    `create_event`, `allocate`) is one the `unsafe fn`s of every backend with
///    that id accept as described in their contracts — in practice: make a
///    fresh id with [`BackendId::unique`] per driver instance, and never return
///    another backend's id.
pub unsafe trait Backend: Send + Sync {
    /// The backend's error. Pools wrap it in [`Error::Backend`](crate::Error)
    /// together with the operation that failed, as that error's
    /// [`source`](core::error::Error::source).
    ///
    /// Its `Display` says what went wrong in the backend's terms without
    /// repeating its own `source()`, if it has one (the convention of
    /// `core::error::Error`: a report walks the chain and prints each level
    /// once).
    type Error: core::error::Error + Send + Sync + 'static;

    /// Which driver instance this backend speaks to (see [`BackendId`]). Must
    /// return the same id every time, and the same id as every other backend
    /// value whose handles it accepts.
    fn id(&self) -> BackendId;

    /// How many devices there are. Zero is a valid answer (no GPU).
    fn device_count(&self) -> Result<u32, Self::Error>;

    /// The calling thread's current device.
    fn current_device(&self) -> Result<DeviceId, Self::Error>;
}

/// Stream operations.
pub trait StreamBackend: Backend {
    /// Creates a non-blocking stream on `device`.
    fn create_stream(
        &self,
        device: DeviceId,
        options: StreamOptions,
    ) -> Result<StreamHandle, Self::Error>;

    /// Destroys a stream. Work still queued on it completes; CUDA allows this.
    ///
    /// # Safety
    /// 1. `stream` is a usable stream of `device` (see [`Backend`]), not a
    ///    special one;
    /// 2. the caller owns it: nothing uses the handle after this call.
    unsafe fn destroy_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), Self::Error>;

    /// Whether all work submitted to the stream has finished. Never blocks.
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (see [`Backend`]).
    unsafe fn query_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Completion, Self::Error>;

    /// Blocks the calling thread until all work submitted to the stream has finished.
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (see [`Backend`]).
    unsafe fn synchronize_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), Self::Error>;

    /// Makes all work submitted to `stream` after this call wait for `event`.
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` and `event` a usable event of
    /// its own device (see [`Backend`]).
    unsafe fn stream_wait_event(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        event: EventHandle,
    ) -> Result<(), Self::Error>;

    /// The device a (non-special) stream belongs to.
    ///
    /// # Safety
    /// `stream` was created by a backend with this one's [`id`](Backend::id)
    /// and is not destroyed before the call returns.
    unsafe fn stream_device(&self, stream: StreamHandle) -> Result<DeviceId, Self::Error>;
}

/// Event operations.
pub trait EventBackend: Backend {
    /// Creates an event on `device` with `flags`.
    fn create_event(&self, device: DeviceId, flags: EventFlags)
        -> Result<EventHandle, Self::Error>;

    /// Destroys an event.
    ///
    /// # Safety
    /// 1. `event` is a usable event of `device` (see [`Backend`]);
    /// 2. the caller owns it: nothing uses the handle after this call.
    unsafe fn destroy_event(&self, event: EventHandle, device: DeviceId)
        -> Result<(), Self::Error>;

    /// Captures, in `event`, the work submitted to `stream` (on `device`) so far.
    ///
    /// # Safety
    /// `event` is a usable event of `device` and `stream` a usable stream of
    /// `device` (see [`Backend`]).
    unsafe fn record_event(
        &self,
        event: EventHandle,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), Self::Error>;

    /// Whether the work captured by the event's last record has finished.
    ///
    /// # Safety
    /// `event` is a usable event of `device` (see [`Backend`]).
    unsafe fn query_event(
        &self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<Completion, Self::Error>;

    /// Blocks the calling thread until the work captured by the event has finished.
    ///
    /// # Safety
    /// `event` is a usable event of `device` (see [`Backend`]).
    unsafe fn synchronize_event(
        &self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<(), Self::Error>;
}

/// The four kinds of memory a backend provides.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryKind {
    /// Ordinary pageable host memory.
    Host,
    /// Page-locked host memory, reachable by the device's copy engines.
    Pinned,
    /// Device memory: not dereferenceable on the host.
    Device,
    /// Managed (unified) memory, migrated between host and device on demand.
    Managed,
}

impl MemoryKind {
    /// The four kinds, in index order.
    pub const ALL: [MemoryKind; 4] = [
        MemoryKind::Host,
        MemoryKind::Pinned,
        MemoryKind::Device,
        MemoryKind::Managed,
    ];

    /// The kind's index into per-kind tables (`0..4`).
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether host code may read and write memory of this kind.
    #[inline]
    pub const fn is_host_accessible(self) -> bool {
        !matches!(self, MemoryKind::Device)
    }
}

/// Memory operations.
///
/// A block is named by its address: a host pointer for host-accessible kinds,
/// a device address (as a pointer without provenance) for device memory.
/// [`allocate`](Self::allocate) is safe to call with any arguments: a zero
/// size or an alignment that is not a nonzero power of two gets an error.
///
/// Stream-ordered calls take the stream the memory is used on: an allocation is
/// usable by work issued on `stream` after the call (and by the host at once,
/// for host-accessible kinds); a free takes effect when `stream` reaches it, so
/// work issued on `stream` before the free may still use the block, and the
/// backend must not hand the memory out again before then.
///
/// A block is allocated for one device and freed naming that same device (a
/// backend may keep per-device tables of its blocks); the stream of a
/// stream-ordered call belongs to that device.
pub trait MemoryBackend: Backend {
    /// Allocates `size` bytes of `kind` memory for `device`, aligned to
    /// `align`, synchronously.
    fn allocate(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, Self::Error>;

    /// Frees a block synchronously.
    ///
    /// # Safety
    /// 1. `ptr` was returned by [`allocate`](Self::allocate) or
    ///    [`allocate_async`](Self::allocate_async) of a backend with this one's
    ///    [`id`](Backend::id), with the same `kind`, `device`, `size` and
    ///    `align`, and is not freed yet;
    /// 2. no work that may still use it is pending on any stream, and nothing
    ///    uses it afterwards.
    unsafe fn deallocate(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) -> Result<(), Self::Error>;

    /// Allocates a block in stream order on `stream` (of `device`).
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (see [`Backend`]).
    unsafe fn allocate_async(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        size: usize,
        align: usize,
        stream: StreamHandle,
    ) -> Result<NonNull<u8>, Self::Error>;

    /// Frees a block in stream order on `stream` (of `device`).
    ///
    /// # Safety
    /// 1. as 1. of [`deallocate`](Self::deallocate);
    /// 2. `stream` is a usable stream of `device` (see [`Backend`]);
    /// 3. work already issued on `stream` may still use the block; work on
    ///    other streams that uses it is ordered before this point of `stream`,
    ///    and nothing uses it after that point.
    unsafe fn deallocate_async(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        stream: StreamHandle,
    ) -> Result<(), Self::Error>;

    /// Copies `size` bytes from `src` to `dst` in stream order on `stream` (of
    /// `device`). Either side may be any kind.
    ///
    /// # Safety
    /// 1. `stream` is a usable stream of `device` (see [`Backend`]);
    /// 2. `src` and `dst` are valid for `size` bytes of their kinds (device
    ///    memory of `device`, or host memory) until the copy has run on
    ///    `stream`, do not overlap, and nothing else writes `dst` or `src`
    ///    meanwhile. (CUDA stages a *pageable* host source before the call
    ///    returns, but a pinned or managed source is read when the copy runs.)
    /// 3. the `size` bytes at `src` are initialised: device memory may be
    ///    read back as any bit pattern
    ///    ([`Scratchpad::to_host`](crate::Scratchpad::to_host)), so no
    ///    uninitialised byte may reach it (a backend that copies with host
    ///    code, like the mock, would carry it over).
    unsafe fn copy_async(
        &self,
        dst: NonNull<u8>,
        src: NonNull<u8>,
        size: usize,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), Self::Error>;
}

macro_rules! forward_backend {
    ($($ptr:ty),*) => {$(
        // SAFETY: the pointee's id and handles, unchanged.
        unsafe impl<B: Backend + ?Sized> Backend for $ptr {
            type Error = B::Error;
            fn id(&self) -> BackendId { (**self).id() }
            fn device_count(&self) -> Result<u32, Self::Error> { (**self).device_count() }
            fn current_device(&self) -> Result<DeviceId, Self::Error> { (**self).current_device() }
        }
        // SAFETY (every forwarded `unsafe fn` below): the caller's guarantees
        // are about the handles and the backend's id, which the pointee shares.
        impl<B: StreamBackend + ?Sized> StreamBackend for $ptr {
            fn create_stream(&self, d: DeviceId, o: StreamOptions) -> Result<StreamHandle, Self::Error> {
                (**self).create_stream(d, o)
            }
            unsafe fn destroy_stream(&self, s: StreamHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).destroy_stream(s, d) }
            }
            unsafe fn query_stream(&self, s: StreamHandle, d: DeviceId) -> Result<Completion, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).query_stream(s, d) }
            }
            unsafe fn synchronize_stream(&self, s: StreamHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).synchronize_stream(s, d) }
            }
            unsafe fn stream_wait_event(&self, s: StreamHandle, d: DeviceId, e: EventHandle) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).stream_wait_event(s, d, e) }
            }
            unsafe fn stream_device(&self, s: StreamHandle) -> Result<DeviceId, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).stream_device(s) }
            }
        }
        impl<B: EventBackend + ?Sized> EventBackend for $ptr {
            fn create_event(&self, d: DeviceId, f: EventFlags) -> Result<EventHandle, Self::Error> {
                (**self).create_event(d, f)
            }
            unsafe fn destroy_event(&self, e: EventHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).destroy_event(e, d) }
            }
            unsafe fn record_event(&self, e: EventHandle, s: StreamHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).record_event(e, s, d) }
            }
            unsafe fn query_event(&self, e: EventHandle, d: DeviceId) -> Result<Completion, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).query_event(e, d) }
            }
            unsafe fn synchronize_event(&self, e: EventHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).synchronize_event(e, d) }
            }
        }
    )*};
}

forward_backend!(&B, alloc::sync::Arc<B>, alloc::boxed::Box<B>);

macro_rules! forward_memory {
    ($($ptr:ty),*) => {$(
        impl<B: MemoryBackend + ?Sized> MemoryBackend for $ptr {
            fn allocate(&self, k: MemoryKind, d: DeviceId, size: usize, align: usize) -> Result<NonNull<u8>, Self::Error> {
                (**self).allocate(k, d, size, align)
            }
            unsafe fn deallocate(&self, k: MemoryKind, d: DeviceId, p: NonNull<u8>, size: usize, align: usize) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).deallocate(k, d, p, size, align) }
            }
            unsafe fn allocate_async(&self, k: MemoryKind, d: DeviceId, size: usize, align: usize, s: StreamHandle) -> Result<NonNull<u8>, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).allocate_async(k, d, size, align, s) }
            }
            unsafe fn deallocate_async(&self, k: MemoryKind, d: DeviceId, p: NonNull<u8>, size: usize, align: usize, s: StreamHandle) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).deallocate_async(k, d, p, size, align, s) }
            }
            unsafe fn copy_async(&self, dst: NonNull<u8>, src: NonNull<u8>, size: usize, s: StreamHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).copy_async(dst, src, size, s, d) }
            }
        }
    )*};
}

forward_memory!(&B, alloc::sync::Arc<B>, alloc::boxed::Box<B>);
