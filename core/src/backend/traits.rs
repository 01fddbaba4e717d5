//! The backend traits: [`Backend`] (identity, errors, devices) and the
//! stream, event and memory calls built on it (their forwarding impls for
//! references and smart pointers are in `forward.rs`).

use core::ptr::NonNull;

use super::{
    BackendId, CaptureMode, CaptureStatus, Completion, DeviceId, EventFlags, EventHandle,
    StreamHandle, StreamOptions,
};

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
/// 3. every `Some(id)` that [`StreamBackend::stream_id`] returns names one
///    stream for the whole process: no other stream of a backend with the
///    same [`id`](Backend::id) ever gets it (the completion engine takes an
///    event that passed as proof that every earlier event of the same thread
///    on the same stream id passed too).
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

    /// Whether `stream` is capturing work into a graph. The pools ask this
    /// before they query or synchronize a stream that may be in a capture (a
    /// returned lease whose order waited on another stream, a stream put into
    /// a pool, a stream the host waits for), because the driver refuses those
    /// calls on a capturing stream and the refusal can break the capture.
    ///
    /// It must be allowed on a capturing stream in every capture mode and must
    /// not break any capture (CUDA's `cuStreamIsCapturing` is and does not).
    /// Default: [`CaptureStatus::NotCapturing`], for a backend without graph
    /// capture.
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (see [`Backend`]).
    unsafe fn capture_status(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<CaptureStatus, Self::Error> {
        let _ = (stream, device);
        Ok(CaptureStatus::NotCapturing)
    }

    /// The capture `stream` is in (active or invalidated), by an id that no
    /// other capture of the process has (CUDA's `cuStreamGetCaptureInfo`),
    /// or `None` when it is not capturing. An id lets a caller that found
    /// the stream capturing tell, later, whether it is still the same
    /// capture ([`MemoryBackend::keep_for_graph`]). The same rules as
    /// [`capture_status`](Self::capture_status): allowed, and breaking no
    /// capture, in every mode. Default: from `capture_status`, with 0 for
    /// "some capture" (a backend that cannot tell captures apart).
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (see [`Backend`]).
    unsafe fn capture_id(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Option<u64>, Self::Error> {
        // SAFETY: the caller's contract.
        unsafe { self.capture_status(stream, device) }.map(|s| s.is_capturing().then_some(0))
    }

    /// An id of the stream *itself*, not its handle: one that no other
    /// stream of any backend with this [`id`](Backend::id) has had or will
    /// have in this process, also after `stream` is destroyed and its handle
    /// value reused (CUDA's `cuStreamGetId`), or `None` when the backend
    /// cannot tell (a special stream, an older driver). The completion
    /// engine of [`Completed`](crate::Completed) futures relies on it (see
    /// [`Backend`]'s guarantee 3): two events recorded, one after the other,
    /// by one thread on streams with the same id, were recorded on one
    /// stream in that order, so once the later one has passed so has the
    /// earlier. Default: `None` (each event asked about on its own).
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (see [`Backend`]).
    unsafe fn stream_id(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Option<u64>, Self::Error> {
        let _ = (stream, device);
        Ok(None)
    }
}

/// Graph capture: beginning and ending a capture on a stream. The pools call
/// these for [`StreamLease::begin_capture`](crate::StreamLease::begin_capture)
/// and [`end_capture`](crate::StreamLease::end_capture), so that they know
/// where a capture begins (see `docs/graph-capture.md`).
pub trait CaptureBackend: StreamBackend {
    /// What an ended capture gives: the captured graph, which keeps the
    /// memory its replays use (see [`MemoryBackend::keep_for_graph`]) until it
    /// and everything made from it are gone.
    type Graph: Send;

    /// Begins a graph capture on `stream` in `mode`: work issued on it from
    /// now on is recorded into a graph, not run, until
    /// [`end_capture`](Self::end_capture) on the same stream.
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (see [`Backend`]), not a
    /// special one, and not in a capture.
    unsafe fn begin_capture(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        mode: CaptureMode,
    ) -> Result<(), Self::Error>;

    /// Ends the capture `stream` began and returns its graph. Every stream
    /// that joined the capture leaves it. A capture that a refused call
    /// invalidated, or that a joined stream was not joined back from, fails;
    /// it has ended all the same.
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (see [`Backend`]).
    unsafe fn end_capture(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Self::Graph, Self::Error>;
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

    /// Prepares the calling thread, once, to ask about events in the
    /// background (the completion engine of [`Completed`](crate::Completed)
    /// futures calls it first on its thread; its queries run inside
    /// [`relaxed_queries`](Self::relaxed_queries)). The mock marks the
    /// thread so that, in its checking mode, those queries count as host
    /// waits. Default: nothing.
    fn prepare_query_thread(&self) {}

    /// Runs `queries` (calls of [`query_event`](Self::query_event) on the
    /// calling thread, any thread) so that a graph capture open anywhere in
    /// the process, begun by gpupool or not, in any mode, neither refuses
    /// them nor is broken by them: for CUDA, the thread's capture
    /// interaction mode is relaxed for the call and put back after (also if
    /// `queries` panics). A [`Completed`](crate::Completed) future's first
    /// poll and each pass of the completion engine ask inside it (the
    /// wakers run after, in the thread's own mode). Default: `queries()` as
    /// it is.
    fn relaxed_queries(&self, queries: &mut dyn FnMut()) {
        queries()
    }
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
    /// A host-visible block (host, pinned, managed) released while `stream`
    /// is capturing a graph goes to [`keep_for_graph`](Self::keep_for_graph)
    /// instead: a backend need not ask, and may fail here (CUDA cannot
    /// synchronize or query a capturing stream, and the capture breaks).
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

    /// Gives a block to the graph being captured on `stream` in capture
    /// `capture` (the id [`capture_id`](StreamBackend::capture_id) gave for
    /// `stream`): every replay of the graph may read or write it, whenever
    /// it runs, so it must not be handed out again while the graph (or
    /// anything made from it) can still run; a device block the capture
    /// itself allocated is freed by the graph instead (a free node). If
    /// `stream` is no longer in capture `capture` (it ended, or another
    /// began), the block is kept as by
    /// [`keep_for_ended_captures`](Self::keep_for_ended_captures). Called by
    /// [`Scratchpad`](crate::Scratchpad) for the memory of a round that a
    /// capture overlapped, instead of
    /// [`deallocate_async`](Self::deallocate_async).
    ///
    /// Default: nothing, so the block is never handed out again (a backend
    /// that cannot tell when graphs end keeps it for the life of the
    /// process).
    ///
    /// # Safety
    /// The contract of [`deallocate_async`](Self::deallocate_async) (1.);
    /// `stream` is a usable stream of `device`; gpupool does not use the
    /// block again.
    #[allow(clippy::too_many_arguments)]
    unsafe fn keep_for_graph(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        stream: StreamHandle,
        capture: u64,
    ) -> Result<(), Self::Error> {
        let _ = (kind, device, ptr, size, align, stream, capture);
        Ok(())
    }

    /// Takes back a block of any kind that graphs captured earlier may still
    /// use, whose captures have ended: a [`Scratchpad`] round that overlapped
    /// a graph capture and ended after the capture did (gpupool could not
    /// hand the block to that graph while it was being captured). It is
    /// never handed out again while any graph that may use it exists.
    ///
    /// Default: nothing, so the block is kept for the life of the process. A
    /// backend that can tell which graphs use a block (the mock) frees it
    /// once they are all gone.
    ///
    /// # Safety
    /// 1. of [`deallocate`](Self::deallocate): the block came from this
    ///    backend (by id) with these arguments and is not freed yet; gpupool
    ///    does not use it again.
    ///
    /// [`Scratchpad`]: crate::Scratchpad
    unsafe fn keep_for_ended_captures(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) -> Result<(), Self::Error> {
        let _ = (kind, device, ptr, size, align);
        Ok(())
    }

    /// Whether a stream-ordered free of host-visible memory
    /// ([`deallocate_async`](Self::deallocate_async) of pinned or managed
    /// memory) followed by an [`allocate`](Self::allocate) of the same size
    /// costs less than one [`query_stream`](StreamBackend::query_stream):
    /// true for a backend that keeps such blocks per thread and proves them
    /// free in batches (one query for many frees). A [`Scratchpad`] reset
    /// then gives its kept host-visible blocks back in stream order instead of
    /// asking whether the stream is idle, and its next round takes them (or
    /// others) from the backend again. Default: `false` (a reset asks the
    /// stream, and keeps its block if the stream is idle).
    ///
    /// [`Scratchpad`]: crate::Scratchpad
    fn batches_host_reuse(&self) -> bool {
        false
    }
}
