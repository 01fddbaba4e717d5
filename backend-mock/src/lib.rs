//! # gpupool-mock
//!
//! A deterministic simulated GPU for `gpupool`: a [`MockBackend`] implements the
//! core's [`Backend`], [`StreamBackend`], [`EventBackend`] and [`MemoryBackend`]
//! traits with no GPU at all, and models what matters for a pool's (and a
//! scratchpad's) correctness. It is usable from many threads, under loom
//! (`--cfg loom`, create it inside `loom::model`) and under Miri with strict
//! provenance. Its only `unsafe` operations are the allocator calls behind
//! each block, the memcpy of `copy_async`, the reads and writes of its
//! simulated kernel ([`launch_map`](MockBackend::launch_map)) and the minting
//! of its own handles
//! ([`StreamHandle::from_raw`](gpupool_core::StreamHandle::from_raw)).
//!
//! The backend traits' handle-taking methods are `unsafe fn`s, for real
//! drivers; the mock's are sound for any handle: it checks every handle and
//! address it is given and reports a misuse (see [the safety section of
//! `MockBackend`](MockBackend#safety-of-the-trait-methods); two memory
//! obligations stay with the caller), so tests call them in `unsafe` blocks
//! whose justification is just that.
//!
//! ## The model
//!
//! - **Streams** are in-order queues. Tests put simulated work on them with
//!   [`enqueue_work`](MockBackend::enqueue_work) and finish it explicitly
//!   ([`complete_one`](MockBackend::complete_one),
//!   [`complete_all`](MockBackend::complete_all),
//!   [`complete_everything`](MockBackend::complete_everything)), or let
//!   [`CompletionPolicy::Immediate`] finish it at once.
//! - **Events** capture a stream's position when recorded and complete when the
//!   stream passes it; an event never recorded is complete.
//!   [`stream_wait_event`](gpupool_core::StreamBackend::stream_wait_event) queues a wait that
//!   blocks the stream until then (across devices too); waits resolve by
//!   themselves as soon as they can. Synchronizing a stream or an event completes
//!   whatever it depends on, on every stream, as a blocked host would observe.
//! - A destroyed stream's queued work counts as finished (CUDA lets it finish).
//! - **Special streams** (handles 0, 1 and 2) are one implicit, always existing
//!   stream per device: all three handles name the same one. Backend calls take
//!   its device from their `device` argument; the test-harness calls
//!   (`enqueue_work`, …) and `stream_device` use the mock-wide current device.
//!   They cannot be destroyed and are not counted as live streams.
//! - **Handles** come from monotonic counters and are never reused: streams from
//!   `0x1000` up, events from `usize::MAX / 2 + 1` up.
//! - **Accounting**: every backend call is counted by kind ([`calls`](MockBackend::calls)),
//!   failed ones included; live streams and events are counted; every call with a
//!   bad handle, device, layout, pointer or range is logged as a [`Misuse`].
//! - **Fault injection**: [`fail_nth`](MockBackend::fail_nth) makes the n-th call
//!   of a kind fail with [`MockError::Injected`], with no effect (an injected
//!   allocation allocates nothing; an injected free frees nothing);
//!   [`fail_stream`](MockBackend::fail_stream) and
//!   [`fail_event`](MockBackend::fail_event) make the next call of a kind on
//!   one handle fail.
//!
//! The order of checks in every backend call: count it, fire an armed fault,
//! check the device, then the handles, then pointers and sizes. Nothing panics
//! on bad input.
//!
//! ## Locking
//!
//! All state sits behind one reader-writer lock, held only for the length of
//! a call. Every call takes it for writing, so calls take effect one at a
//! time, in one order, as if under a mutex, with one exception that changes
//! nothing observable: the read-only backend calls
//! ([`query_stream`](gpupool_core::StreamBackend::query_stream),
//! [`query_event`](gpupool_core::EventBackend::query_event),
//! [`stream_device`](gpupool_core::StreamBackend::stream_device),
//! [`current_device`](gpupool_core::Backend::current_device),
//! [`device_count`](gpupool_core::Backend::device_count)) run under the read
//! lock, side by side, when no fault is armed, no wait is queued, no block is
//! free-pending and the call succeeds: then the write-locked call would
//! change nothing but its call count, which they keep in an atomic counter.
//! Otherwise (a fault to fire, a wait to resolve, a block to reclaim, a
//! misuse to log) they take the write lock like any call. So a benchmark's
//! threads querying their own streams do not queue behind each other on the
//! mock. Every other method (the test harness, the accessors) takes the write
//! lock, so it sees every call made before it and none half done.
//!
//! ## Memory
//!
//! - **Every kind** (host, pinned, device, managed) is real host memory from
//!   `std::alloc` with the requested size and alignment, tagged with its kind
//!   and device. Pointers keep the allocator's provenance; device memory is
//!   dereferenceable here, but [`host_access`](MockBackend::host_access) flags
//!   a host access to it.
//! - **Blocks start zeroed** (`alloc_zeroed`): real device memory has no
//!   "uninitialised" state visible to Rust, and scratch device memory may be
//!   read back as any `AnyBitPattern` type
//!   ([`Scratchpad::to_host`](gpupool_core::Scratchpad::to_host)), bytes
//!   never written included, which uninitialised host memory would make
//!   undefined behaviour.
//! - **A simulated kernel** ([`launch_map`](MockBackend::launch_map)) computes
//!   `dst[i] = f(src[i])` over scratch device slices on a stream, at once,
//!   and leaves a work item using both ranges, like a copy.
//! - **Synchronous free**: the block goes back to `std::alloc` at once.
//! - **Bad frees** (synchronous or stream-ordered) are errors and [`Misuse`]s
//!   with no effect: an address where no block starts, or whose block was
//!   already reclaimed ([`MockError::InvalidPointer`]), a free-pending block
//!   ([`MockError::DoubleFree`]), or a kind, device, size or alignment other
//!   than the allocation's ([`MockError::BlockMismatch`]).
//! - **Stream-ordered free**: the block becomes *free-pending* at the stream's
//!   current position and goes back to `std::alloc` only once the stream has
//!   completed everything queued before the free; this is checked after every
//!   call, and happens as soon as the stream drains or is destroyed. Until then
//!   the memory is not handed out again, so a reuse cannot alias it.
//! - **Uses**: a simulated kernel ([`use_memory`](MockBackend::use_memory)) or a
//!   `copy_async` queues a work item that *uses* its ranges until it completes.
//!   A use on stream `U` is *ordered before* a later item or free on stream `S`
//!   if `U == S`, or if `S` has a pending wait queued before it on an event
//!   recorded on `U` after the use (followed transitively through the waits of
//!   the awaited streams). A resolved wait needs no tracking: its work is done.
//! - **Hazards** ([`hazards`](MockBackend::hazards), see [`HazardKind`]) are
//!   recorded, never returned as errors: a synchronous free of a block in use;
//!   a stream-ordered free while another stream's use is not ordered before it;
//!   work on a range not inside a live block (used after free, free-pending
//!   included) or overlapping another stream's unordered use (one of the two
//!   writing; a copy's source is only read); a host access to a range in use,
//!   freed, or device memory.
//! - **Copies run at enqueue time**: `copy_async` copies the bytes during the
//!   call, so a host → device → host round trip is observable as soon as the
//!   calls return. Callers must still synchronize before the host reads the
//!   result, as on a GPU; `host_access` flags a read that did not. A source
//!   outside every mock block is foreign host memory (a caller's pageable
//!   slice) and is not tracked; a destination must lie inside a live block
//!   (one outside every block, a `Vec` say, is
//!   [`MockError::UntrackedDestination`]: the mock could not track the copy's
//!   use of it; stage through a pinned block, as `Scratchpad::to_host` does).
//! - **Accounting**: live, free-pending and peak bytes per kind, live blocks.
//!   Dropping the last clone of the mock returns every block still allocated
//!   to `std::alloc`, so a test that leaks simulated memory leaks no real memory.
//!
//! ```
//! use gpupool_core::{DeviceId, EventBackend, MemoryBackend, MemoryKind, StreamBackend};
//! use gpupool_mock::{HazardKind, MockBackend};
//!
//! let gpu = MockBackend::new(1);
//! let d = DeviceId(0);
//! let (a, b) = (gpu.create_stream(d, Default::default()).unwrap(),
//!               gpu.create_stream(d, Default::default()).unwrap());
//! let p = gpu.allocate(MemoryKind::Device, d, 1024, 256).unwrap();
//! gpu.use_memory(b, p.as_ptr(), 1024).unwrap(); // a kernel on b
//!
//! // Freeing on a without waiting for b's kernel is a hazard...
//! // SAFETY: deliberately wrong stream order; the mock only records it.
//! unsafe { gpu.deallocate_async(MemoryKind::Device, d, p, 1024, 256, a) }.unwrap();
//! assert_eq!(gpu.hazards()[0].kind, HazardKind::FreedWhileInUse);
//! // ...since a is idle, the memory went back at once, under b's kernel.
//! assert_eq!(gpu.live_bytes(MemoryKind::Device), 0);
//!
//! // The right way: a waits for an event recorded on b after the kernel.
//! gpu.clear_hazards();
//! let e = gpu.create_event(d, Default::default()).unwrap();
//! let q = gpu.allocate(MemoryKind::Device, d, 1024, 256).unwrap();
//! gpu.use_memory(b, q.as_ptr(), 1024).unwrap();
//! // SAFETY: live handles of this mock, of device 0 (and the mock checks
//! // every handle anyway).
//! unsafe {
//!     gpu.record_event(e, b, d).unwrap();
//!     gpu.stream_wait_event(a, d, e).unwrap();
//! }
//! // SAFETY: b's use is ordered before the free through the event.
//! unsafe { gpu.deallocate_async(MemoryKind::Device, d, q, 1024, 256, a) }.unwrap();
//! assert!(gpu.hazards().is_empty());
//! assert_eq!(gpu.pending_free_bytes(MemoryKind::Device), 1024);
//! gpu.complete_all(b).unwrap(); // b's kernel ends; a's wait resolves
//! assert_eq!(gpu.live_bytes(MemoryKind::Device), 0);
//! ```
//!
//! [`Backend`]: gpupool_core::Backend
//! [`StreamBackend`]: gpupool_core::StreamBackend
//! [`EventBackend`]: gpupool_core::EventBackend
//! [`MemoryBackend`]: gpupool_core::MemoryBackend
//!
//! ## Example
//!
//! The trait methods that take a handle are `unsafe fn`s; the mock's are
//! sound for any handle (see [`MockBackend`]), so each `unsafe` block below
//! needs no more than that.
//!
//! ```
//! use gpupool_core::{Completion, DeviceId, EventBackend, EventFlags, StreamBackend};
//! use gpupool_mock::{CallKind, MockBackend};
//!
//! let gpu = MockBackend::new(1);
//! let d = DeviceId(0);
//! let a = gpu.create_stream(d, Default::default()).unwrap();
//! let b = gpu.create_stream(d, Default::default()).unwrap();
//! let e = gpu.create_event(d, EventFlags::DISABLE_TIMING).unwrap();
//!
//! gpu.enqueue_work(a).unwrap();
//! // SAFETY: live handles of this mock, of device 0.
//! unsafe {
//!     gpu.record_event(e, a, d).unwrap();
//!     gpu.stream_wait_event(b, d, e).unwrap(); // b waits for a's work so far
//! }
//! gpu.enqueue_work(b).unwrap();
//! // SAFETY: as above.
//! assert_eq!(unsafe { gpu.query_event(e, d) }.unwrap(), Completion::Pending);
//! assert!(!gpu.complete_one(b).unwrap()); // blocked on the wait
//!
//! gpu.complete_one(a).unwrap();
//! // SAFETY: as above.
//! assert_eq!(unsafe { gpu.query_event(e, d) }.unwrap(), Completion::Complete);
//! assert!(gpu.complete_one(b).unwrap()); // the wait resolved by itself
//! // SAFETY: as above.
//! assert_eq!(unsafe { gpu.query_stream(b, d) }.unwrap(), Completion::Complete);
//!
//! // SAFETY: as above; each is destroyed once and not used after.
//! unsafe {
//!     gpu.destroy_event(e, d).unwrap();
//!     gpu.destroy_stream(a, d).unwrap();
//!     gpu.destroy_stream(b, d).unwrap();
//! }
//! assert_eq!((gpu.live_streams(), gpu.live_events()), (0, 0));
//! assert_eq!(gpu.calls(CallKind::CreateStream), 2);
//! assert!(gpu.misuses().is_empty());
//! ```

mod backend;
mod error;
mod heap;
mod kernel;
mod memory;
mod memory_calls;
mod queue;
mod state;
mod sync;

use core::fmt;

pub use gpupool_core::BackendOp as CallKind;
use gpupool_core::{BackendId, DeviceId, EventFlags, EventHandle, MemoryKind, StreamHandle};

pub use error::{BlockLayout, Misuse, MockError};
pub use memory::{Hazard, HazardKind};
pub use queue::CompletionPolicy;

use queue::StreamKey;
use state::State;
use sync::{write, Arc, RwLock};

/// A simulated machine with a fixed number of devices. See the
/// [crate documentation](crate) for the model.
///
/// Clones share one machine, so a test can keep a clone while a pool owns
/// another. All state sits behind one reader-writer lock, held only for the
/// length of a call (see [Locking](crate#locking)).
///
/// Each machine made by [`new`](Self::new) has its own
/// [`BackendId`] ([`id`](gpupool_core::Backend::id));
/// its clones share it, being the same simulated device. Two machines have
/// different ids, so a stream or event of one put into a pool of another (or
/// an order of one given to a scratchpad of another) is refused with
/// [`Error::ForeignHandle`](gpupool_core::Error::ForeignHandle), as handles of
/// two real drivers would be.
///
/// ```
/// use gpupool_core::{Backend, DeviceId, Error, OwnedStream, StreamBackend};
/// use gpupool_mock::MockBackend;
///
/// let (one, two) = (MockBackend::new(1), MockBackend::new(1));
/// assert_ne!(one.id(), two.id());
/// assert_eq!(one.clone().id(), one.id());
///
/// // A stream of `one` is refused by `two` (as it would be by a pool of `two`)...
/// let h = one.create_stream(DeviceId(0), Default::default()).unwrap();
/// // SAFETY: a live stream `one` just made on device 0, handed over.
/// let stream = unsafe { OwnedStream::from_raw_parts(&one, h, DeviceId(0)) }.unwrap();
/// let refused = stream.destroy(&two).unwrap_err();
/// assert!(matches!(refused.error, Error::ForeignHandle));
/// // ...and comes back, still the caller's, for its own machine.
/// refused.value.destroy(&one).unwrap();
/// assert!(one.misuses().is_empty() && two.misuses().is_empty());
/// assert_eq!(one.live_streams(), 0);
/// ```
///
/// # Safety of the trait methods
///
/// Every trait method of the mock is sound for any argument, but for the two
/// memory obligations below: it validates handles and addresses and reports a
/// misuse or returns an error; the `unsafe` is the trait's, for real drivers.
/// A stream or event this machine never made, a destroyed one, a device out
/// of range or a handle of another device is an error and a [`Misuse`], with
/// no effect; so is an address where no live block of this machine starts, or
/// a layout other than the block's. (Every machine counts its handles from the
/// same start, so a handle of another machine names this machine's handle of
/// that number, if there is one: still sound, but not caught here; the pools
/// catch it by [`id`](gpupool_core::Backend::id).) Tests may hand the mock bad
/// handles on purpose, made with [`StreamHandle::from_raw`] or
/// [`EventHandle::from_raw`], to check that a caller's misuse is caught.
///
/// What the mock cannot check is memory it does not own, so two obligations
/// of [`MemoryBackend`](gpupool_core::MemoryBackend) stay with the caller:
/// - a successful `deallocate` or `deallocate_async` returns the block to
///   `std::alloc` (at once, or when the stream passes the free): nothing may
///   use it afterwards, as on a GPU (a stream use is recorded as a
///   [`Hazard`], but a host read through a pointer is a read of freed memory);
/// - `copy_async` copies the bytes during the call: `dst` is checked to lie
///   inside a live block of this mock, but a `src` outside every block is
///   foreign host memory and is read as it is, so it must be valid for
///   `size` bytes; the source's bytes are initialised (as the trait asks:
///   device memory is read back as any bit pattern); and neither range may
///   be accessed by another thread meanwhile.
#[derive(Clone)]
pub struct MockBackend {
    inner: Arc<Machine>,
}

/// What the clones of one [`MockBackend`] share: the machine's id and its
/// state.
struct Machine {
    /// Made once by [`MockBackend::new`]; never changes.
    id: BackendId,
    state: RwLock<State>,
}

impl fmt::Debug for MockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = write(&self.inner.state);
        f.debug_struct("MockBackend")
            .field("id", &self.inner.id)
            .field("devices", &state.devices)
            .field("current", &state.current)
            .field("policy", &state.policy)
            .field("live_streams", &state.streams.created().count())
            .field("live_events", &state.events.len())
            .field("live_blocks", &state.memory.live_blocks())
            .field("hazards", &state.memory.hazards.len())
            .field("misuses", &state.misuses.len())
            .finish_non_exhaustive()
    }
}

impl MockBackend {
    /// A machine with `devices` devices (zero is allowed: no GPU), policy
    /// [`CompletionPolicy::Manual`], current device 0.
    pub fn new(devices: u32) -> Self {
        MockBackend {
            inner: Arc::new(Machine {
                id: BackendId::unique(),
                state: RwLock::new(State::new(devices)),
            }),
        }
    }

    /// Sets the device [`current_device`](gpupool_core::Backend::current_device) reports.
    ///
    /// It is **mock-wide**, not per thread as in CUDA: every thread and clone
    /// sees the change. An out-of-range device is accepted, so tests can check
    /// how callers handle one.
    pub fn set_current_device(&self, device: DeviceId) {
        write(&self.inner.state).current = device;
    }

    /// Sets when simulated work completes.
    pub fn set_policy(&self, policy: CompletionPolicy) {
        let mut state = write(&self.inner.state);
        state.policy = policy;
        if policy == CompletionPolicy::Immediate {
            state.streams.settle_all(policy);
            state.reclaim();
        }
    }

    // ---- simulated work ----------------------------------------------------
    //
    // These are the test harness, not backend calls: they are not counted, fault
    // injection does not apply, and a bad handle is an error but not a misuse.
    // A special handle names the current device's implicit stream.

    /// Queues one work item on `stream`. Under [`CompletionPolicy::Immediate`]
    /// it completes at once unless the stream is blocked on a wait.
    pub fn enqueue_work(&self, stream: StreamHandle) -> Result<(), MockError> {
        let mut state = write(&self.inner.state);
        let key = state.harness_key(stream)?;
        let policy = state.policy;
        state.streams.settle(policy);
        state.streams.push_work(key, policy);
        state.reclaim();
        Ok(())
    }

    /// Completes the work item at the front of `stream`, after resolving the
    /// waits that are satisfied. `Ok(false)` if there is nothing to complete or
    /// the stream is blocked on a wait that is not.
    pub fn complete_one(&self, stream: StreamHandle) -> Result<bool, MockError> {
        let mut state = write(&self.inner.state);
        let key = state.harness_key(stream)?;
        let policy = state.policy;
        state.streams.settle(policy);
        let done = state.streams.complete_front_work(key);
        state.reclaim();
        Ok(done)
    }

    /// Completes everything queued on `stream`, as a host synchronize would:
    /// the work that its waits depend on, on other streams, is completed first
    /// (up to the points awaited, not beyond).
    pub fn complete_all(&self, stream: StreamHandle) -> Result<(), MockError> {
        let mut state = write(&self.inner.state);
        let key = state.harness_key(stream)?;
        state.streams.drain_stream(key);
        state.reclaim();
        Ok(())
    }

    /// Completes everything queued on every stream of every device (so every
    /// free-pending block is reclaimed).
    pub fn complete_everything(&self) {
        let mut state = write(&self.inner.state);
        state.streams.drain_everything();
        state.reclaim();
    }

    /// How many work items queued on `stream` have not completed. Waits are
    /// not counted: ask [`query_stream`](gpupool_core::StreamBackend::query_stream) whether
    /// the stream is idle.
    pub fn pending_work(&self, stream: StreamHandle) -> Result<usize, MockError> {
        let mut state = write(&self.inner.state);
        let key = state.harness_key(stream)?;
        let policy = state.policy;
        state.streams.settle(policy);
        Ok(state.streams.get(key).map_or(0, |s| s.pending_work()))
    }

    // ---- simulated memory use ----------------------------------------------
    //
    // Test harness too: not counted, no faults; a bad stream is an error, not a
    // misuse. What they find is recorded as a `Hazard`, and they go ahead.

    /// Simulates a kernel on `stream` that reads and writes `[ptr, ptr + len)`:
    /// queues one work item that uses the range until it completes (as
    /// [`enqueue_work`](Self::enqueue_work) does, policy included). Records a
    /// [`Hazard`] if the range is not inside a live block
    /// ([`UsedAfterFree`](HazardKind::UsedAfterFree), or
    /// [`OutOfBounds`](HazardKind::OutOfBounds) if it overlaps one), or if it
    /// overlaps a range that pending work on another stream uses and that
    /// stream's use is not ordered before this item by a pending wait
    /// ([`ConcurrentUse`](HazardKind::ConcurrentUse)). An empty range is
    /// checked against nothing. The pointer is only compared, never read.
    pub fn use_memory(
        &self,
        stream: StreamHandle,
        ptr: *const u8,
        len: usize,
    ) -> Result<(), MockError> {
        let mut state = write(&self.inner.state);
        let key = state.harness_key(stream)?;
        state.use_memory(key, ptr.addr(), len);
        state.reclaim();
        Ok(())
    }

    /// Declares that the host reads or writes `[ptr, ptr + len)` now. Records a
    /// [`Hazard`] if pending work on any stream uses an overlapping range
    /// ([`HostAccessWhileInUse`](HazardKind::HostAccessWhileInUse)), if the
    /// range is not inside a live block ([`UsedAfterFree`](HazardKind::UsedAfterFree)
    /// or [`OutOfBounds`](HazardKind::OutOfBounds)), or if the block is
    /// [`MemoryKind::Device`] memory ([`HostAccessToDevice`](HazardKind::HostAccessToDevice)).
    /// An empty range is checked against nothing. Never fails today; the
    /// `Result` leaves room for checks to come.
    pub fn host_access(&self, ptr: *const u8, len: usize) -> Result<(), MockError> {
        let mut state = write(&self.inner.state);
        state.host_access(ptr.addr(), len);
        state.reclaim();
        Ok(())
    }

    /// Every hazard found so far, in order. A correct caller causes none;
    /// tests assert this is empty.
    pub fn hazards(&self) -> Vec<Hazard> {
        write(&self.inner.state).memory.hazards.clone()
    }

    /// Forgets the hazards found so far.
    pub fn clear_hazards(&self) {
        write(&self.inner.state).memory.hazards.clear();
    }

    /// Bytes of `kind` allocated and not yet returned to `std::alloc`,
    /// free-pending blocks included (sizes as requested). Zero at the end of a
    /// test that leaked nothing (after the streams are drained or destroyed).
    pub fn live_bytes(&self, kind: MemoryKind) -> usize {
        let mut state = write(&self.inner.state);
        state.reclaim();
        state.memory.live_bytes(kind)
    }

    /// Bytes of `kind` freed in stream order whose stream has not passed the
    /// free yet.
    pub fn pending_free_bytes(&self, kind: MemoryKind) -> usize {
        let mut state = write(&self.inner.state);
        state.reclaim();
        state.memory.pending_free_bytes(kind)
    }

    /// The highest [`live_bytes`](Self::live_bytes) of `kind` has been.
    pub fn peak_live_bytes(&self, kind: MemoryKind) -> usize {
        write(&self.inner.state).memory.peak_live_bytes(kind)
    }

    /// Blocks of every kind not yet returned to `std::alloc`, free-pending
    /// ones included.
    pub fn live_blocks(&self) -> usize {
        let mut state = write(&self.inner.state);
        state.reclaim();
        state.memory.live_blocks()
    }

    // ---- accounting --------------------------------------------------------

    /// How many backend calls of `kind` were made, failed ones included.
    pub fn calls(&self, kind: CallKind) -> u64 {
        write(&self.inner.state).calls.get(kind)
    }

    /// How many backend calls were made, of every kind.
    pub fn total_calls(&self) -> u64 {
        write(&self.inner.state).calls.total()
    }

    /// Streams created and not yet destroyed, on every device.
    pub fn live_streams(&self) -> usize {
        write(&self.inner.state).streams.created().count()
    }

    /// Events created and not yet destroyed, on every device.
    pub fn live_events(&self) -> usize {
        write(&self.inner.state).events.len()
    }

    /// Streams created on `device` and not yet destroyed.
    pub fn live_streams_on(&self, device: DeviceId) -> usize {
        let state = write(&self.inner.state);
        state
            .streams
            .created()
            .filter(|s| s.device == device)
            .count()
    }

    /// Whether `stream` was created and not yet destroyed (false for the
    /// special handles).
    pub fn is_live_stream(&self, stream: StreamHandle) -> bool {
        !stream.is_special() && self.stream_priority(stream).is_some()
    }

    /// Whether `event` was created and not yet destroyed.
    pub fn is_live_event(&self, event: EventHandle) -> bool {
        write(&self.inner.state)
            .events
            .contains_key(&event.as_raw())
    }

    /// Every backend call so far that was handed a bad handle or device (a
    /// double destroy, an unknown or destroyed handle, a device out of range, a
    /// handle used with the wrong device), in order. Injected failures are not
    /// misuses.
    pub fn misuses(&self) -> Vec<Misuse> {
        write(&self.inner.state).misuses.clone()
    }

    /// The flags a live event was created with.
    pub fn event_flags(&self, event: EventHandle) -> Option<EventFlags> {
        write(&self.inner.state)
            .events
            .get(&event.as_raw())
            .map(|e| e.flags)
    }

    /// The priority a live stream was created with (`Some(None)`: the device
    /// default); `None` if the stream is not live or is a special handle.
    pub fn stream_priority(&self, stream: StreamHandle) -> Option<Option<i32>> {
        if stream.is_special() {
            return None;
        }
        let state = write(&self.inner.state);
        state
            .streams
            .get(StreamKey::Created(stream.as_raw()))
            .map(|s| s.priority)
    }

    // ---- fault injection ---------------------------------------------------

    /// Arms a fault: the `n`-th call of `kind` counted from now (`n == 1`: the
    /// next one) fails with [`MockError::Injected`] and has no effect (it is
    /// still counted by [`calls`](Self::calls)). Several faults may be armed at
    /// once; `n == 0` arms nothing.
    pub fn fail_nth(&self, kind: CallKind, n: u64) {
        write(&self.inner.state).arm(kind, n);
    }

    /// Arms a fault on one stream: the next call of `kind` that names `stream`
    /// fails with [`MockError::Injected`] and has no effect, whatever the
    /// order in which the caller reaches its streams (a pool's drop, say).
    /// Calls of `kind` on other streams are unaffected. Counted by
    /// [`calls`](Self::calls) like any call.
    ///
    /// ```
    /// use gpupool_core::{DeviceId, StreamBackend};
    /// use gpupool_mock::{CallKind, MockBackend, MockError};
    ///
    /// let gpu = MockBackend::new(1);
    /// let (a, b) = (gpu.create_stream(DeviceId(0), Default::default()).unwrap(),
    ///               gpu.create_stream(DeviceId(0), Default::default()).unwrap());
    /// gpu.fail_stream(CallKind::DestroyStream, b);
    /// // SAFETY: live streams of this mock, of device 0; a failed destroy has
    /// // no effect, so `b` is destroyed once.
    /// unsafe {
    ///     assert!(gpu.destroy_stream(a, DeviceId(0)).is_ok());
    ///     assert_eq!(gpu.destroy_stream(b, DeviceId(0)),
    ///                Err(MockError::Injected(CallKind::DestroyStream)));
    ///     assert!(gpu.destroy_stream(b, DeviceId(0)).is_ok()); // fired once
    /// }
    /// ```
    pub fn fail_stream(&self, kind: CallKind, stream: StreamHandle) {
        write(&self.inner.state)
            .armed_handles
            .push((kind, stream.as_raw()));
    }

    /// Arms a fault on one event: the next call of `kind` that names `event`
    /// fails with [`MockError::Injected`] and has no effect (see
    /// [`fail_stream`](Self::fail_stream)).
    pub fn fail_event(&self, kind: CallKind, event: EventHandle) {
        write(&self.inner.state)
            .armed_handles
            .push((kind, event.as_raw()));
    }

    /// Disarms every fault not yet fired.
    pub fn clear_faults(&self) {
        let mut state = write(&self.inner.state);
        state.armed.clear();
        state.armed_handles.clear();
    }

    /// How many armed faults (per call count or per handle) have not fired yet.
    pub fn armed_faults(&self) -> usize {
        let state = write(&self.inner.state);
        state.armed.len() + state.armed_handles.len()
    }
}
