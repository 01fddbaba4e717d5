//! The capture harness of [`MockBackend`]: beginning and ending a graph
//! capture, and the graph it ends in ([`MockGraph`]), which can be launched
//! (its captured items queued as work) and owns the memory the capture left
//! to it. The bookkeeping of an open capture is in `capture.rs`; the model is
//! in the crate documentation ([Capture](crate#capture)).

use core::fmt;

use gpupool_core::{Backend, CaptureStatus, DeviceId, StreamHandle};

use crate::capture::{CaptureId, CaptureMode, Node};
use crate::error::HarnessCall;
use crate::error::{Misuse, MockError};
use crate::queue::StreamKey;
use crate::state::State;
use crate::sync::write;
use crate::MockBackend;

/// The graph a successful [`end_capture`](MockBackend::end_capture) returns:
/// the items captured (each a work item with the memory uses it was
/// captured with), ready to be [launched](MockBackend::launch_graph) any
/// number of times, and the memory of the capture (its graph allocations,
/// the host-visible blocks freed in it), which stays allocated, and is
/// handed to nobody else, until the graph is dropped (or
/// [destroyed](MockBackend::destroy_graph)). `Send`, so a test can drop it
/// on another thread.
///
/// The graph keeps its machine alive (it holds a clone of the
/// [`MockBackend`]).
pub struct MockGraph {
    machine: MockBackend,
    /// The id of the capture it came from.
    id: CaptureId,
    /// The device of the capture's origin stream.
    device: DeviceId,
    nodes: Vec<Node>,
    /// The blocks it owns (start addresses; see `State::release_graph`).
    blocks: Vec<usize>,
}

// The graph may be dropped on any thread.
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<MockGraph>();
};

impl MockGraph {
    /// How many items were captured: simulated work, copies, kernels,
    /// stream-ordered allocations and frees (event records and waits are
    /// orderings, not items). A launch queues this many work items.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The device of the stream that began the capture.
    pub fn device(&self) -> DeviceId {
        self.device
    }
}

impl fmt::Debug for MockGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockGraph")
            .field("id", &self.id)
            .field("device", &self.device)
            .field("nodes", &self.nodes.len())
            .field("blocks", &self.blocks.len())
            .finish_non_exhaustive()
    }
}

/// Frees the memory the graph owns: at once, or, for a block that work of
/// the graph's launches still uses, once that work has completed.
impl Drop for MockGraph {
    fn drop(&mut self) {
        let mut state = write(&self.machine.inner.state);
        state.release_graph(self.id, &self.blocks);
        state.reclaim();
    }
}

impl MockBackend {
    /// Runs one capture-harness call under the lock; an error is logged as
    /// a [`Misuse`] naming `call`.
    fn harness_call<T>(
        &self,
        call: HarnessCall,
        op: impl FnOnce(&mut State) -> Result<T, MockError>,
    ) -> Result<T, MockError> {
        let mut state = self.state();
        let result = op(&mut state);
        state.reclaim();
        result.inspect_err(|error| state.misuses.push(Misuse::harness(call, error.clone())))
    }

    /// Begins a graph capture on `stream` (CUDA's `cuStreamBeginCapture`),
    /// which becomes the capture's *origin*; `mode` says which calls the
    /// capture refuses to other threads (see [Capture](crate#capture)). The
    /// calling thread is the capture's thread. Work issued on the stream from
    /// now on is captured, not queued, until [`end_capture`](Self::end_capture).
    ///
    /// A test-harness call: not counted, no fault injection; a bad use is an
    /// error and a [`Misuse`] (naming [`HarnessCall::BeginCapture`]), with no
    /// effect: [`MockError::InvalidStream`] for a stream that is not a live
    /// created stream of this machine (a special stream cannot be captured),
    /// [`MockError::AlreadyCapturing`] for one already in a capture.
    ///
    /// A stream that a gpupool lease or owned stream holds begins its
    /// captures with [`StreamLease::begin_capture`](gpupool_core::StreamLease::begin_capture),
    /// which needs no `unsafe`.
    ///
    /// # Safety
    /// This is CUDA's `cuStreamBeginCapture` on a raw handle, with its
    /// contract towards gpupool: if `stream` is held by a gpupool lease or
    /// owned stream, the caller calls its
    /// [`note_capture`](gpupool_core::StreamLease::note_capture) right
    /// after, before any other gpupool call on it, its orders or a
    /// scratchpad on them (gpupool would otherwise reuse scratch memory that
    /// the graph's replays use). The mock itself checks everything and is
    /// sound for any argument.
    ///
    /// ```
    /// use gpupool_core::{CaptureStatus, DeviceId, StreamBackend};
    /// use gpupool_mock::{CaptureMode, MockBackend};
    ///
    /// let gpu = MockBackend::new(1);
    /// let s = gpu.create_stream(DeviceId(0), Default::default()).unwrap();
    /// // SAFETY: a stream of this test's own, which no gpupool object holds.
    /// unsafe { gpu.begin_capture(s, CaptureMode::Global) }.unwrap();
    /// gpu.enqueue_work(s).unwrap(); // captured: nothing queued
    /// assert_eq!(gpu.pending_work(s), Ok(0));
    /// assert_eq!(gpu.capture_status_of(s), Ok(CaptureStatus::Active));
    ///
    /// let graph = gpu.end_capture(s).unwrap();
    /// assert_eq!(graph.node_count(), 1);
    /// gpu.launch_graph(&graph, s).unwrap(); // now it is queued
    /// gpu.launch_graph(&graph, s).unwrap();
    /// assert_eq!(gpu.pending_work(s), Ok(2));
    /// assert!(gpu.misuses().is_empty());
    /// ```
    pub unsafe fn begin_capture(
        &self,
        stream: StreamHandle,
        mode: CaptureMode,
    ) -> Result<(), MockError> {
        self.begin_capture_as(stream, mode, false)
    }

    /// `begin_capture`; `through_gpupool`: begun by
    /// `CaptureBackend::begin_capture` (see `Capture::through_gpupool`).
    pub(crate) fn begin_capture_as(
        &self,
        stream: StreamHandle,
        mode: CaptureMode,
        through_gpupool: bool,
    ) -> Result<(), MockError> {
        self.harness_call(HarnessCall::BeginCapture, |st| {
            let key = StreamKey::Created(stream.as_raw());
            let device = match st.streams.get(key) {
                Some(s) if !stream.is_special() => s.device,
                _ => return Err(MockError::InvalidStream(stream)),
            };
            if st.captures.of_stream(key).is_some() {
                return Err(MockError::AlreadyCapturing(stream));
            }
            st.captures.begin(key, device, mode, through_gpupool);
            Ok(())
        })
    }

    /// Ends the capture `stream` began (CUDA's `cuStreamEndCapture`): every
    /// stream of the capture leaves it, whatever the outcome, and the events
    /// recorded in it become events never recorded (complete). On success,
    /// the graph of what was captured.
    ///
    /// Errors (each a [`Misuse`] naming [`HarnessCall::EndCapture`]):
    /// [`MockError::InvalidStream`] for a stream this machine does not know;
    /// [`MockError::NotCaptureOrigin`] for a stream that did not begin a
    /// capture (one that only joined a capture invalidates it, which stays
    /// open); [`MockError::CaptureInvalidated`] if a refused call broke the
    /// capture; [`MockError::CaptureUnjoined`] if a stream of the capture
    /// has captured work that the origin is not ordered after (it never
    /// waited, directly or through other streams of the capture, on an event
    /// recorded on that stream after that work). A failed capture frees the
    /// memory it owned then (its graph allocations, the blocks it held).
    pub fn end_capture(&self, stream: StreamHandle) -> Result<MockGraph, MockError> {
        let ended = self.harness_call(HarnessCall::EndCapture, |st| {
            let key = st.harness_key(stream)?;
            st.end_capture(key)
        })?;
        Ok(MockGraph {
            machine: self.clone(),
            id: ended.id,
            device: ended.device,
            nodes: ended.nodes,
            blocks: ended.blocks,
        })
    }

    /// Launches `graph` on `stream` (CUDA's `cuGraphLaunch`): queues each of
    /// its items, in capture order, as one work item on `stream` that uses
    /// the ranges the item was captured with (as
    /// [`use_memory`](Self::use_memory) does, policy included), so that
    /// [`complete_one`](Self::complete_one) and the others finish them and
    /// the hazard detector checks them as work of `stream`. The blocks the
    /// graph holds are its own to use; a block freed since the capture is a
    /// [`UsedAfterFree`](crate::HazardKind::UsedAfterFree). Data is not
    /// replayed: a launch moves no bytes and runs no kernel function.
    ///
    /// Errors (each a [`Misuse`] naming [`HarnessCall::LaunchGraph`]), with
    /// nothing queued: [`MockError::ForeignGraph`] for a graph of another
    /// machine; [`MockError::InvalidStream`] for a stream this machine does
    /// not know; [`MockError::CrossDevice`] for a stream of another device
    /// than the graph's (`given`: the stream's, `actual`: the graph's);
    /// [`MockError::CaptureUnsupported`] for a stream in a capture (which is
    /// invalidated: the mock does not nest graphs).
    pub fn launch_graph(&self, graph: &MockGraph, stream: StreamHandle) -> Result<(), MockError> {
        self.harness_call(HarnessCall::LaunchGraph, |st| {
            if graph.machine.id() != self.id() {
                return Err(MockError::ForeignGraph);
            }
            let key = st.harness_key(stream)?;
            let device = match key {
                StreamKey::Implicit(d) | StreamKey::PerThread(d) => DeviceId(d),
                StreamKey::Created(_) => st.streams.get(key).map_or(graph.device, |s| s.device),
            };
            if device != graph.device {
                return Err(MockError::CrossDevice {
                    given: device,
                    actual: graph.device,
                });
            }
            if let Some(id) = st.captures.of_stream(key) {
                st.captures.invalidate(id);
                return Err(MockError::CaptureUnsupported);
            }
            st.launch_nodes(key, graph.id, &graph.nodes);
            Ok(())
        })
    }

    /// Drops `graph`, freeing the memory it owns (see [`MockGraph`]'s
    /// `Drop`). [`MockError::ForeignGraph`] (and a [`Misuse`] of this
    /// machine naming [`HarnessCall::DestroyGraph`]) if it is another
    /// machine's graph; it is dropped all the same, on its own machine.
    pub fn destroy_graph(&self, graph: MockGraph) -> Result<(), MockError> {
        let foreign = graph.machine.id() != self.id();
        drop(graph);
        if foreign {
            let misuse = Misuse::harness(HarnessCall::DestroyGraph, MockError::ForeignGraph);
            self.state().misuses.push(misuse);
            return Err(MockError::ForeignGraph);
        }
        Ok(())
    }

    /// Whether `stream` is in a graph capture: what
    /// [`capture_status`](gpupool_core::StreamBackend::capture_status)
    /// answers, as a safe test-harness call (not counted, no fault
    /// injection; a bad handle is an error, not a misuse). A special handle
    /// names the current device's implicit stream.
    pub fn capture_status_of(&self, stream: StreamHandle) -> Result<CaptureStatus, MockError> {
        let state = self.state();
        let key = state.harness_key(stream)?;
        Ok(state.captures.status(key))
    }

    /// How many graph captures are open (begun and not yet ended).
    pub fn open_captures(&self) -> usize {
        self.state().captures.open_count()
    }
}
