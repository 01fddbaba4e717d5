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
//!   They cannot be destroyed and are not counted as live streams. Only the
//!   per-thread handle (2) may join a graph capture (see
//!   [Capture](#capture)).
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
//! [`capture_status`](gpupool_core::StreamBackend::capture_status),
//! [`current_device`](gpupool_core::Backend::current_device),
//! [`device_count`](gpupool_core::Backend::device_count)) run under the read
//! lock, side by side, when no fault is armed, no wait is queued, no block is
//! free-pending (and, for the two queries, no graph capture is open) and the
//! call succeeds: then the write-locked call would change nothing but its
//! call count, which they keep in an atomic counter. Otherwise (a fault to
//! fire, a wait to resolve, a block to reclaim, a misuse to log, a query a
//! capture may refuse) they take the write lock like any call. So a benchmark's
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
//! - **Synchronous free**: the block is reclaimed at once.
//! - **Bad frees** (synchronous or stream-ordered) are errors and [`Misuse`]s
//!   with no effect: an address where no block starts, or whose block was
//!   already reclaimed ([`MockError::InvalidPointer`]), a free-pending block
//!   ([`MockError::DoubleFree`]), or a kind, device, size or alignment other
//!   than the allocation's ([`MockError::BlockMismatch`]).
//! - **Stream-ordered free**: the block becomes *free-pending* at the stream's
//!   current position and is reclaimed only once the stream has
//!   completed everything queued before the free; this is checked after every
//!   call, and happens as soon as the stream drains or is destroyed. Until then
//!   the memory is not handed out again, so a reuse cannot alias it.
//! - **Reclaimed blocks are remembered**: a reclaimed block is no live
//!   memory any more, but its memory stays allocated in a *quarantine*, its
//!   range remembered, so that a call naming the range is refused as a use
//!   after free (see [Refusals](#refusals)) instead of reading or writing
//!   freed memory. The quarantine keeps the last
//!   [`QUARANTINE_BLOCKS`](MockBackend::QUARANTINE_BLOCKS) blocks, at most
//!   [`QUARANTINE_BYTES`](MockBackend::QUARANTINE_BYTES) in all, first in,
//!   first out; the oldest then goes back to `std::alloc` and is forgotten
//!   (a larger block goes back at once). Once a range is forgotten the
//!   allocator may hand it to anything, so it is foreign memory to the mock
//!   again; one it hands to a new mock block is that block's.
//! - **Uses**: a simulated kernel ([`use_memory`](MockBackend::use_memory)) or a
//!   `copy_async` queues a work item that *uses* its ranges until it completes.
//!   A use on stream `U` is *ordered before* a later item or free on stream `S`
//!   if `U == S`, or if `S` has a pending wait queued before it on an event
//!   recorded on `U` after the use (followed transitively through the waits of
//!   the awaited streams). A resolved wait needs no tracking: its work is done.
//! - **Hazards** ([`hazards`](MockBackend::hazards), see [`HazardKind`]) are
//!   recorded, and the operation goes ahead (but for the
//!   [refusals](#refusals) of the harness calls, recorded here too): a
//!   synchronous free of a block in use;
//!   a stream-ordered free while another stream's use is not ordered before it;
//!   work on a range not inside a live block (used after free, free-pending
//!   included) or overlapping another stream's unordered use (one of the two
//!   writing; a copy's source is only read); a host access to a range in use,
//!   freed, or device memory; work outside a graph, or a host access, on a
//!   block reserved for a graph (see [Capture](#capture)).
//! - **Copies run at enqueue time**: `copy_async` copies the bytes during the
//!   call (unless it is captured: see [Capture](#capture)), so a host → device → host round trip is observable as soon as the
//!   calls return. Callers must still synchronize before the host reads the
//!   result, as on a GPU; `host_access` flags a read that did not. A source
//!   outside every mock block, live or remembered, is foreign host memory (a
//!   caller's pageable slice) and is not tracked; a destination must lie
//!   inside a live block (one outside every block, a `Vec` say, is
//!   [`MockError::UntrackedDestination`]: the mock could not track the copy's
//!   use of it; stage through a pinned block, as `Scratchpad::to_host` does).
//!   Freed memory and a graph's memory are refused (see [Refusals](#refusals)).
//! - **Accounting**: live, free-pending and peak bytes per kind, live blocks.
//!   Dropping the last clone of the mock returns every block still allocated
//!   (the quarantine's too) to `std::alloc`, so a test that leaks simulated
//!   memory leaks no real memory.
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
//! ## Capture
//!
//! The mock models CUDA's stream capture (`cuStreamBeginCapture` to
//! `cuStreamEndCapture`), so that what the pools and the scratchpad do
//! inside a capture is tested without a GPU.
//!
//! - **Begin and end.** [`begin_capture`](MockBackend::begin_capture) makes
//!   a live created stream in no capture the *origin* of a new capture, of a
//!   [`CaptureMode`], begun by the calling thread. It is `unsafe` like
//!   CUDA's raw call, with gpupool's contract; a stream of a gpupool lease
//!   begins a capture with the safe
//!   [`StreamLease::begin_capture`](gpupool_core::StreamLease::begin_capture)
//!   (through [`CaptureBackend`](gpupool_core::CaptureBackend), which the
//!   mock implements with these calls).
//!   [`end_capture`](MockBackend::end_capture) on the origin takes every
//!   stream out of the capture whatever the outcome, and returns its
//!   [`MockGraph`], or fails: the capture was invalidated
//!   ([`MockError::CaptureInvalidated`]), a stream's captured work is not
//!   joined back into the origin ([`MockError::CaptureUnjoined`]), the stream
//!   is not an origin ([`MockError::NotCaptureOrigin`]).
//!   [`capture_status`](gpupool_core::StreamBackend::capture_status) (a call
//!   of kind `CaptureStatus`, never refused) tells `Active`, `Invalidated` or
//!   `NotCapturing`.
//! - **Forks and joins.** An event recorded on a capturing stream is a
//!   *captured event* of its capture. A stream that waits on one joins that
//!   capture (a fork), its next items ordered after what the event captured.
//!   The origin joins a stream back by waiting on an event recorded on it
//!   after its last captured item (directly, or through other streams of the
//!   capture). A wait across two captures, or by a capturing stream on an
//!   event recorded outside any capture, is [`MockError::CaptureIsolation`].
//!   The legacy default stream ([`StreamHandle::LEGACY`], and
//!   [`StreamHandle::NULL`], which names it) cannot be part of a capture: its
//!   wait on a captured event is [`MockError::CaptureImplicit`], a misuse
//!   that invalidates the capture. The per-thread default stream
//!   ([`StreamHandle::PER_THREAD`]) joins like a created stream (it cannot
//!   begin a capture: [`begin_capture`](MockBackend::begin_capture) takes a
//!   created stream); as the three handles name one implicit stream, the
//!   others then name a capturing stream too.
//!   Once the capture has ended its events are events never recorded.
//! - **Captured, not queued.** Work issued on a capturing stream
//!   ([`enqueue_work`](MockBackend::enqueue_work),
//!   [`use_memory`](MockBackend::use_memory),
//!   [`launch_map`](MockBackend::launch_map), `copy_async`, `allocate_async`,
//!   `deallocate_async`) is an *item* of the capture: nothing runs (a copy
//!   copies nothing, a kernel's function is not called), the stream's queue
//!   does not change and no use is pending. Event records and waits are
//!   orderings, not items. An item's uses are checked against the capture's
//!   earlier items as work is against queued work (a use after the capture
//!   freed the block, a use or a free unordered with another stream's use of
//!   the capture), and again at each launch.
//! - **Refused calls**, each an error and a [`Misuse`] that *invalidates* the
//!   capture (it stays open, `Invalidated`, until its origin ends it):
//!   querying, synchronizing or destroying a capturing stream, querying or
//!   synchronizing a captured event ([`MockError::CaptureUnsupported`]); and
//!   the *potentially unsafe* calls, wherever they are aimed
//!   ([`MockError::CaptureProhibited`]): today the synchronous allocation
//!   and free of device, pinned and managed memory and every query and
//!   synchronization of a stream or an event (one function lists them, to
//!   follow what the H200 measures). A [`Global`](CaptureMode::Global)
//!   capture refuses those to every thread, and a refusal invalidates every
//!   open `Global` capture; a [`ThreadLocal`](CaptureMode::ThreadLocal) one
//!   only to the thread that began it (and a refusal invalidates it alone);
//!   a [`Relaxed`](CaptureMode::Relaxed) one to nobody.
//! - **Graphs.** [`launch_graph`](MockBackend::launch_graph) queues each item
//!   of a [`MockGraph`] as one work item on the launch stream, with the
//!   item's uses: [`complete_one`](MockBackend::complete_one) and the others
//!   finish them, and the hazard detector sees the uses as the launch
//!   stream's. A launch replays no data.
//! - **Memory.** `allocate_async` on a capturing stream makes a *graph
//!   allocation*: a real block, owned by the capture and then its graph.
//!   `deallocate_async` of it on a stream of the same capture is the graph's
//!   free: the block stays allocated, *reserved* for the graph's replays, and
//!   is handed to nobody else. `deallocate_async` on a capturing stream of
//!   device memory not allocated in that capture is
//!   [`MockError::NotGraphAllocation`] (a graph can free only its own
//!   allocations); of a host block it is accepted, and the block is reserved
//!   for the graph too; of a pinned or managed block it is refused and breaks
//!   the capture ([`MockError::CaptureUnsupported`]: on the H200 the CUDA
//!   backend's stream-ordered reuse of such blocks asks the stream), and
//!   [`keep_for_graph`](gpupool_core::MemoryBackend::keep_for_graph) is the
//!   call that reserves it for the graph. Dropping the graph (or
//!   [`destroy_graph`](MockBackend::destroy_graph)) frees what it owns (its
//!   graph allocations, freed by the graph or not, if nobody freed them, and
//!   the blocks reserved for it), each once the work of the graph's launches
//!   no longer uses it; a failed capture frees them when it ends. A graph
//!   allocation, and a block reserved for a graph, is the graph's: only the
//!   items of its capture and the launches of its graph may use it. Work
//!   that is not the graph's (on a stream outside the capture, in another
//!   capture, or after the capture ended, the graph alive or not) and the
//!   host touching a reserved block are refused (see [Refusals](#refusals));
//!   freeing a reserved block again is a [`MockError::DoubleFree`] (an
//!   unfreed graph allocation may be freed outside the graph).
//!
//! ```
//! use gpupool_core::{CaptureStatus, DeviceId, EventBackend, MemoryBackend, MemoryKind,
//!                    StreamBackend};
//! use gpupool_mock::{CaptureMode, MockBackend};
//!
//! let gpu = MockBackend::new(1);
//! let d = DeviceId(0);
//! let (origin, side) = (gpu.create_stream(d, Default::default()).unwrap(),
//!                       gpu.create_stream(d, Default::default()).unwrap());
//! let (fork, join) = (gpu.create_event(d, Default::default()).unwrap(),
//!                     gpu.create_event(d, Default::default()).unwrap());
//! // SAFETY: live handles of this mock, of device 0, which no gpupool object
//! // holds (and the mock checks every handle anyway); the block is freed
//! // once, in the capture.
//! unsafe {
//!     gpu.begin_capture(origin, CaptureMode::Global).unwrap();
//!     gpu.record_event(fork, origin, d).unwrap();
//!     gpu.stream_wait_event(side, d, fork).unwrap(); // side joins the capture
//!     let p = gpu.allocate_async(MemoryKind::Device, d, 256, 256, side).unwrap();
//!     gpu.use_memory(side, p.as_ptr(), 256).unwrap(); // captured, not queued
//!     gpu.deallocate_async(MemoryKind::Device, d, p, 256, 256, side).unwrap();
//!     gpu.record_event(join, side, d).unwrap();
//!     gpu.stream_wait_event(origin, d, join).unwrap(); // joined back
//!     assert_eq!(gpu.capture_status(side, d), Ok(CaptureStatus::Active));
//! }
//! assert_eq!(gpu.pending_work(side), Ok(0));
//!
//! let graph = gpu.end_capture(origin).unwrap();
//! assert_eq!(graph.node_count(), 3); // allocation, kernel, free
//! assert_eq!(gpu.live_bytes(MemoryKind::Device), 256); // the graph's
//! gpu.launch_graph(&graph, origin).unwrap();
//! assert_eq!(gpu.pending_work(origin), Ok(3));
//! gpu.complete_all(origin).unwrap();
//! drop(graph);
//! assert_eq!(gpu.live_bytes(MemoryKind::Device), 0);
//! assert!(gpu.misuses().is_empty() && gpu.hazards().is_empty());
//! ```
//!
//! ## Refusals
//!
//! Some memory is not the caller's to touch at all, and every call that
//! takes an address refuses it with an error, reading, writing and queueing
//! nothing:
//!
//! - **freed memory** ([`MockError::UseAfterFree`]): a range that reaches a
//!   block the mock has reclaimed and still remembers (see
//!   [Memory](#memory): its stream passed a stream-ordered free, it was freed
//!   synchronously, or the graph that owned it was dropped), and lies inside
//!   no live block. A free of such a block is a [`MockError::DoubleFree`];
//! - **a graph's memory** ([`MockError::HeldByGraph`]): for work (a copy, a
//!   simulated kernel, [`use_memory`](MockBackend::use_memory)), a range in
//!   a graph allocation or a block reserved for a graph, when the work is
//!   not an item of that graph's capture; for the host
//!   ([`host_access`](MockBackend::host_access)), a range in a block
//!   reserved for a graph (the host may fill a host-visible block a capture
//!   allocated, as `to_device` fills its staging in a capture).
//!
//! How a refusal is recorded follows the crate's split between backend calls
//! and the test harness. `copy_async`, a backend call, logs it as a
//! [`Misuse`], as every bad range, and records no hazard (a refused backend
//! call has no effect). The harness calls
//! ([`use_memory`](MockBackend::use_memory),
//! [`launch_map`](MockBackend::launch_map),
//! [`host_access`](MockBackend::host_access)), whose errors are not
//! misuses, record it as a hazard instead:
//! [`UsedAfterFree`](HazardKind::UsedAfterFree) or
//! [`HeldByGraph`](HazardKind::HeldByGraph), naming the stream (`None` for
//! the host). A graph launch is not refused (it reads and writes nothing):
//! each of its items that uses such a range is recorded as that hazard, as
//! any hazard of a launch. A block that is free-pending, or released by its
//! graph's end under a launch still running, is still allocated: using it
//! is a hazard as before, and a copy of it [`MockError::InvalidRange`].
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
mod capture;
mod capture_calls;
mod error;
mod graph;
mod harness;
mod heap;
mod kernel;
mod machine;
mod memory;
mod memory_calls;
mod quarantine;
mod queue;
mod state;
mod sync;

pub use gpupool_core::BackendOp as CallKind;
#[cfg(doc)]
use gpupool_core::{DeviceId, EventHandle, StreamHandle};

pub use capture::CaptureMode;
pub use error::{BlockLayout, HarnessCall, Misuse, MockError};
pub use graph::MockGraph;
pub use machine::MockBackend;
pub use memory::{Hazard, HazardKind};
pub use queue::CompletionPolicy;
