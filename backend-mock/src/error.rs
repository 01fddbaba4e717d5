//! [`MockError`], what a mock call can fail with, and [`Misuse`], the record
//! the mock keeps of every call that handed it a bad handle, device, pointer
//! or range.

use core::fmt;

use gpupool_core::{DeviceId, EventHandle, MemoryKind, StreamHandle};

use gpupool_core::BackendOp as CallKind;

use gpupool_core::CaptureMode;

/// A call of the capture harness, named by the [`Misuse`](crate::Misuse)
/// it caused.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum HarnessCall {
    /// [`MockBackend::begin_capture`](crate::MockBackend::begin_capture).
    BeginCapture,
    /// [`MockBackend::end_capture`](crate::MockBackend::end_capture).
    EndCapture,
    /// [`MockBackend::launch_graph`](crate::MockBackend::launch_graph).
    LaunchGraph,
    /// [`MockBackend::destroy_graph`](crate::MockBackend::destroy_graph).
    DestroyGraph,
}

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
/// // SAFETY: a handle the mock never made, on purpose: the mock's trait
/// // methods are sound for any handle (see `MockBackend`).
/// let bogus = unsafe { StreamHandle::from_raw(0x9999) };
/// // SAFETY: as above.
/// let err = unsafe { mock.destroy_stream(bogus, DeviceId(0)) }.unwrap_err();
/// assert_eq!(err, MockError::InvalidStream(bogus));
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
    /// An allocation was asked with a size of zero, an alignment that is not a
    /// nonzero power of two, or a size that overflows `isize` once rounded up
    /// to the alignment.
    InvalidLayout {
        /// The size asked for.
        size: usize,
        /// The alignment asked for.
        align: usize,
    },
    /// The system allocator had no memory for the block. Not a misuse (it is
    /// not logged), since the caller did nothing wrong.
    OutOfMemory {
        /// The size asked for.
        size: usize,
        /// The alignment asked for.
        align: usize,
    },
    /// A free named an address where no block of this mock starts: never
    /// allocated, inside a block rather than at its start, or reclaimed so
    /// long ago that the mock has forgotten it (a double free it can no
    /// longer tell from a wild pointer, since the address may have been
    /// reused by then; see [Refusals](crate#refusals)).
    InvalidPointer(usize),
    /// A free named a block that is already freed: in stream order and not
    /// yet reclaimed, reserved for a graph, or reclaimed and still
    /// remembered (see [Refusals](crate#refusals)).
    DoubleFree(usize),
    /// A free named a block with another kind, device, size or alignment than
    /// it was allocated with.
    BlockMismatch {
        /// The start of the block.
        addr: usize,
        /// What the block was allocated with.
        allocated: BlockLayout,
        /// What the free said.
        given: BlockLayout,
    },
    /// A copy named a range that overlaps memory of this mock without lying
    /// inside one live block (it straddles a block's end, or the block is
    /// free-pending), or a range that wraps around the address space.
    InvalidRange {
        /// The start of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// A copy whose destination is no memory of this mock (a `Vec`, say).
    ///
    /// The mock copies at once but lets the copy's work item use its ranges
    /// until the stream completes it, checking them for hazards meanwhile; it
    /// can do that only for its own blocks, so it writes only into them. (A
    /// source outside its blocks is read at once and not tracked.) To read
    /// device memory back into host memory of the caller's, copy into a
    /// pinned block, wait, and copy from there, as
    /// [`Scratchpad::to_host`](gpupool_core::Scratchpad::to_host) does.
    UntrackedDestination {
        /// The destination's start.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// A call named a range that reaches memory this mock has reclaimed (a
    /// block whose stream passed its free, freed synchronously, or freed with
    /// the graph that owned it) and lies inside no live block: a use after
    /// free. Refused: nothing is read, written or queued. The mock remembers
    /// only the last blocks it reclaimed (see [Refusals](crate#refusals));
    /// a range freed longer ago is foreign memory to it.
    UseAfterFree {
        /// The start of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// Work that is not a graph's (not an item of its capture, not a launch
    /// of it) named a range inside a block of that graph: a graph allocation
    /// (made in stream order in its capture, which exists for the graph's
    /// launches only), before or after the capture ended, or a block
    /// reserved for the graph's replays; or the host named a block reserved
    /// for a graph. Refused: nothing is read, written or queued (see
    /// [Refusals](crate#refusals) and [Capture](crate#capture)).
    HeldByGraph {
        /// The start of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// A copy whose source and destination overlap.
    OverlappingCopy {
        /// The destination's start.
        dst: usize,
        /// The source's start.
        src: usize,
        /// The length of both.
        len: usize,
    },
    /// [`MockBackend::launch_map`](crate::MockBackend::launch_map) was given
    /// host order: a simulated kernel runs on a stream.
    HostOrder,
    /// [`MockBackend::launch_map`](crate::MockBackend::launch_map) was given
    /// the order of a stream of another backend (another mock machine).
    ForeignOrder,
    /// [`MockBackend::launch_map`](crate::MockBackend::launch_map) was given a
    /// source and a destination of different lengths.
    LengthMismatch {
        /// The source's length, in elements.
        src: usize,
        /// The destination's length, in elements.
        dst: usize,
    },
    /// [`MockBackend::launch_map`](crate::MockBackend::launch_map) was given a
    /// slice that is not inside one live block of device memory of this mock
    /// (another machine's slice, or another kind of memory).
    NotDeviceMemory {
        /// The slice's start.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// A call the driver refuses on a stream in a graph capture, or on an
    /// event last recorded in a capture still open: querying or
    /// synchronizing it, destroying a capturing stream, launching a graph
    /// into one. The capture is invalidated (see [Capture](crate#capture)).
    CaptureUnsupported,
    /// A "potentially unsafe" call (see [Capture](crate#capture): a
    /// synchronous allocation or free of device-visible memory, a query or a
    /// synchronization of any stream or event) while a capture of this mode
    /// is open that forbids it to the calling thread: a
    /// [`Global`](crate::CaptureMode::Global) capture of any thread or a
    /// [`ThreadLocal`](crate::CaptureMode::ThreadLocal) capture of this one.
    /// Those captures are invalidated.
    CaptureProhibited(CaptureMode),
    /// The legacy default stream (`stream`: [`StreamHandle::LEGACY`], or
    /// [`StreamHandle::NULL`], which names it) waited on an event recorded
    /// in an open capture: the wait would make it join the capture, and CUDA
    /// does not let the legacy stream be part of one (its
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` names this dependency). The
    /// capture is invalidated. The per-thread default stream
    /// ([`StreamHandle::PER_THREAD`]) may join a capture.
    CaptureImplicit(StreamHandle),
    /// A dependency across the boundary of a capture: a stream of one capture
    /// waiting on an event of another, or a capturing stream waiting on an
    /// event recorded outside any capture. The captures concerned are
    /// invalidated.
    CaptureIsolation,
    /// [`begin_capture`](crate::MockBackend::begin_capture) on a stream that
    /// is already in a capture.
    AlreadyCapturing(StreamHandle),
    /// [`end_capture`](crate::MockBackend::end_capture) on a stream that is
    /// not the origin of a capture (a stream that only joined one: that
    /// capture is invalidated; or a stream in none).
    NotCaptureOrigin(StreamHandle),
    /// [`end_capture`](crate::MockBackend::end_capture) of a capture that a
    /// refused call invalidated: no graph. Every stream has left the capture.
    CaptureInvalidated,
    /// [`end_capture`](crate::MockBackend::end_capture) of a capture with a
    /// stream (this one) whose last captured work is not joined back into the
    /// origin: the origin never waited, directly or through other streams of
    /// the capture, on an event recorded on it after that work. No graph;
    /// every stream has left the capture.
    CaptureUnjoined(StreamHandle),
    /// A stream-ordered free, on a capturing stream, of device memory that
    /// was not allocated in stream order in that capture (a graph allocation
    /// is the only device memory a graph can free), or of any block another
    /// capture allocated. Nothing is freed and the capture is invalidated.
    NotGraphAllocation(usize),
    /// A [`MockGraph`](crate::MockGraph) of another machine was launched or
    /// destroyed on this one.
    ForeignGraph,
}

/// What a block was allocated with, or what a free claims it was: carried by
/// [`MockError::BlockMismatch`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockLayout {
    /// The kind of memory.
    pub kind: MemoryKind,
    /// The device it was allocated for.
    pub device: DeviceId,
    /// Its size in bytes.
    pub size: usize,
    /// Its alignment.
    pub align: usize,
}

impl BlockLayout {
    pub(crate) const fn new(kind: MemoryKind, device: DeviceId, size: usize, align: usize) -> Self {
        BlockLayout {
            kind,
            device,
            size,
            align,
        }
    }
}

impl fmt::Display for BlockLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} on {}, {} bytes aligned to {}",
            self.kind, self.device, self.size, self.align
        )
    }
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
            MockError::InvalidStream(s) => write!(f, "invalid stream handle {:#x}", s.as_raw()),
            MockError::InvalidEvent(e) => write!(f, "invalid event handle {:#x}", e.as_raw()),
            MockError::InvalidDevice(d) => write!(f, "{d} does not exist"),
            MockError::CrossDevice { given, actual } => {
                write!(f, "the handle belongs to {actual}, not to {given}")
            }
            MockError::InvalidLayout { size, align } => {
                write!(f, "invalid layout: {size} bytes aligned to {align}")
            }
            MockError::OutOfMemory { size, align } => {
                write!(f, "out of memory for {size} bytes aligned to {align}")
            }
            MockError::InvalidPointer(addr) => {
                write!(f, "no block of this mock starts at {addr:#x}")
            }
            MockError::DoubleFree(addr) => {
                write!(f, "the block at {addr:#x} is already freed")
            }
            MockError::BlockMismatch {
                addr,
                allocated,
                given,
            } => write!(
                f,
                "the block at {addr:#x} is {allocated}, but was freed as {given}"
            ),
            MockError::InvalidRange { addr, len } => write!(
                f,
                "the {len} bytes at {addr:#x} do not lie inside one live block"
            ),
            MockError::UntrackedDestination { addr, len } => write!(
                f,
                "the copy's destination ({len} bytes at {addr:#x}) is no memory of this mock: \
                 it writes only into its own blocks, whose use by the copy it can track \
                 (stage through a pinned block)"
            ),
            MockError::UseAfterFree { addr, len } => write!(
                f,
                "the {len} bytes at {addr:#x} reach memory this mock has freed (use after free)"
            ),
            MockError::HeldByGraph { addr, len } => write!(
                f,
                "the {len} bytes at {addr:#x} belong to a graph, and only its own work may use them"
            ),
            MockError::OverlappingCopy { dst, src, len } => write!(
                f,
                "copy of {len} bytes from {src:#x} to {dst:#x}: the ranges overlap"
            ),
            MockError::HostOrder => f.write_str("a simulated kernel needs a stream, not host order"),
            MockError::ForeignOrder => {
                f.write_str("the order's stream belongs to another backend than this mock")
            }
            MockError::LengthMismatch { src, dst } => write!(
                f,
                "the source has {src} elements and the destination {dst}"
            ),
            MockError::NotDeviceMemory { addr, len } => write!(
                f,
                "the {len} bytes at {addr:#x} are not inside one live block of device memory of this mock"
            ),
            MockError::CaptureUnsupported => f.write_str(
                "not allowed on a stream in a graph capture or an event recorded in one \
                 (the capture is invalidated)",
            ),
            MockError::CaptureProhibited(mode) => write!(
                f,
                "a potentially unsafe call while a {mode:?} graph capture is open \
                 (the capture is invalidated)"
            ),
            MockError::CaptureImplicit(s) => write!(
                f,
                "stream {:#x} (the legacy default stream) cannot join a graph capture \
                 (the capture is invalidated)",
                s.as_raw()
            ),
            MockError::CaptureIsolation => f.write_str(
                "the wait would cross the boundary of a graph capture (the capture is invalidated)",
            ),
            MockError::AlreadyCapturing(s) => {
                write!(f, "stream {:#x} is already in a graph capture", s.as_raw())
            }
            MockError::NotCaptureOrigin(s) => {
                write!(f, "stream {:#x} did not begin a graph capture", s.as_raw())
            }
            MockError::CaptureInvalidated => f.write_str("the graph capture was invalidated"),
            MockError::CaptureUnjoined(s) => write!(
                f,
                "the work captured on stream {:#x} is not joined back into the capture's origin",
                s.as_raw()
            ),
            MockError::NotGraphAllocation(addr) => write!(
                f,
                "the device block at {addr:#x} was not allocated in this graph capture, \
                 so the graph cannot free it (the capture is invalidated)"
            ),
            MockError::ForeignGraph => f.write_str("the graph was captured on another machine"),
        }
    }
}

/// No source: every variant is the mock's own finding, with no cause below it.
impl std::error::Error for MockError {}

/// A call that handed the mock a bad handle, device, pointer or range: a
/// double destroy, an unknown or destroyed handle, a device out of range, a
/// handle used with the wrong device, a bad layout, a double free or a free of
/// an unknown pointer, a free that misnames its block, a copy of a bad range
/// (freed memory and a graph's memory included: see
/// [Refusals](crate#refusals)); or a call that a graph capture refuses (see
/// [Capture](crate#capture)).
/// Injected failures and [`MockError::OutOfMemory`] are not misuses.
///
/// The pools must never cause one; tests assert
/// [`MockBackend::misuses`](crate::MockBackend::misuses) is empty.
///
/// A misuse of the capture harness ([`begin_capture`](crate::MockBackend::begin_capture),
/// [`end_capture`](crate::MockBackend::end_capture),
/// [`launch_graph`](crate::MockBackend::launch_graph),
/// [`destroy_graph`](crate::MockBackend::destroy_graph)) names its call in
/// `harness`; its `call` is then [`CallKind::CaptureStatus`], the capture
/// model's one backend operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Misuse {
    /// The kind of call that was made.
    pub call: CallKind,
    /// What the mock answered.
    pub error: MockError,
    /// The capture-harness call, if it was one (then `call` is
    /// [`CallKind::CaptureStatus`]); `None` for a backend call.
    pub harness: Option<HarnessCall>,
}

impl Misuse {
    /// The misuse of a backend call of `call`.
    pub(crate) fn backend(call: CallKind, error: MockError) -> Self {
        Misuse {
            call,
            error,
            harness: None,
        }
    }

    /// The misuse of a capture-harness call.
    pub(crate) fn harness(call: HarnessCall, error: MockError) -> Self {
        Misuse {
            call: CallKind::CaptureStatus,
            error,
            harness: Some(call),
        }
    }
}

impl fmt::Display for Misuse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.harness {
            Some(h) => write!(f, "{h:?}: {}", self.error),
            None => write!(f, "{:?}: {}", self.call, self.error),
        }
    }
}
