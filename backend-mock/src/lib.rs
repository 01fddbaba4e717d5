//! # gpupool-mock
//!
//! A deterministic simulated GPU for `gpupool`: a [`MockBackend`] implements the
//! core's [`Backend`], [`StreamBackend`] and [`EventBackend`] traits with no GPU
//! at all, and models what matters for a pool's correctness. It is usable from
//! many threads, under loom (`--cfg loom`, create it inside `loom::model`) and
//! under Miri (it contains no `unsafe`).
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
//!   bad handle or device is logged as a [`Misuse`].
//! - **Fault injection**: [`fail_nth`](MockBackend::fail_nth) makes the n-th call
//!   of a kind fail with [`MockError::Injected`], with no effect.
//!
//! The order of checks in every backend call: count it, fire an armed fault,
//! check the device, then the handles. Nothing panics on bad input.
//!
//! [`Backend`]: gpupool_core::Backend
//! [`StreamBackend`]: gpupool_core::StreamBackend
//! [`EventBackend`]: gpupool_core::EventBackend
//!
//! ## Example
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
//! gpu.record_event(e, a, d).unwrap();
//! gpu.stream_wait_event(b, d, e).unwrap(); // b waits for a's work so far
//! gpu.enqueue_work(b).unwrap();
//! assert_eq!(gpu.query_event(e, d).unwrap(), Completion::Pending);
//! assert!(!gpu.complete_one(b).unwrap()); // blocked on the wait
//!
//! gpu.complete_one(a).unwrap();
//! assert_eq!(gpu.query_event(e, d).unwrap(), Completion::Complete);
//! assert!(gpu.complete_one(b).unwrap()); // the wait resolved by itself
//! assert_eq!(gpu.query_stream(b, d).unwrap(), Completion::Complete);
//!
//! gpu.destroy_event(e, d).unwrap();
//! gpu.destroy_stream(a, d).unwrap();
//! gpu.destroy_stream(b, d).unwrap();
//! assert_eq!((gpu.live_streams(), gpu.live_events()), (0, 0));
//! assert_eq!(gpu.calls(CallKind::CreateStream), 2);
//! assert!(gpu.misuses().is_empty());
//! ```

mod backend;
mod error;
mod queue;
mod state;
mod sync;

use core::fmt;

pub use gpupool_core::BackendOp as CallKind;
use gpupool_core::{DeviceId, EventFlags, EventHandle, StreamHandle};

pub use error::{Misuse, MockError};

use queue::StreamKey;
use state::State;
use sync::{lock, Arc, Mutex};

/// When simulated work completes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CompletionPolicy {
    /// Only when a test completes it (or a synchronize needs it). The default.
    Manual,
    /// As soon as nothing is queued before it: streams look idle unless blocked
    /// on a wait, and a wait resolves as soon as the work it waits for is done.
    /// Since that work completes at once too, every stream is idle after every
    /// call. Switching to it completes the work already queued.
    Immediate,
}

/// A simulated machine with a fixed number of devices. See the
/// [crate documentation](crate) for the model.
///
/// Clones share one machine, so a test can keep a clone while a pool owns
/// another. All state sits behind one mutex, held only for the length of a call.
#[derive(Clone)]
pub struct MockBackend {
    inner: Arc<Mutex<State>>,
}

impl fmt::Debug for MockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.inner);
        f.debug_struct("MockBackend")
            .field("devices", &state.devices)
            .field("current", &state.current)
            .field("policy", &state.policy)
            .field("live_streams", &state.streams.created().count())
            .field("live_events", &state.events.len())
            .field("misuses", &state.misuses.len())
            .finish_non_exhaustive()
    }
}

impl MockBackend {
    /// A machine with `devices` devices (zero is allowed: no GPU), policy
    /// [`CompletionPolicy::Manual`], current device 0.
    pub fn new(devices: u32) -> Self {
        MockBackend {
            inner: Arc::new(Mutex::new(State::new(devices))),
        }
    }

    /// Sets the device [`current_device`](gpupool_core::Backend::current_device) reports.
    ///
    /// It is **mock-wide**, not per thread as in CUDA: every thread and clone
    /// sees the change. An out-of-range device is accepted, so tests can check
    /// how callers handle one.
    pub fn set_current_device(&self, device: DeviceId) {
        lock(&self.inner).current = device;
    }

    /// Sets when simulated work completes.
    pub fn set_policy(&self, policy: CompletionPolicy) {
        let mut state = lock(&self.inner);
        state.policy = policy;
        if policy == CompletionPolicy::Immediate {
            state.streams.settle_all(policy);
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
        let mut state = lock(&self.inner);
        let key = state.harness_key(stream)?;
        let policy = state.policy;
        state.streams.settle(policy);
        state.streams.push_work(key, policy);
        Ok(())
    }

    /// Completes the work item at the front of `stream`, after resolving the
    /// waits that are satisfied. `Ok(false)` if there is nothing to complete or
    /// the stream is blocked on a wait that is not.
    pub fn complete_one(&self, stream: StreamHandle) -> Result<bool, MockError> {
        let mut state = lock(&self.inner);
        let key = state.harness_key(stream)?;
        let policy = state.policy;
        state.streams.settle(policy);
        Ok(state.streams.complete_front_work(key))
    }

    /// Completes everything queued on `stream`, as a host synchronize would:
    /// the work that its waits depend on, on other streams, is completed first
    /// (up to the points awaited, not beyond).
    pub fn complete_all(&self, stream: StreamHandle) -> Result<(), MockError> {
        let mut state = lock(&self.inner);
        let key = state.harness_key(stream)?;
        state.streams.drain_stream(key);
        Ok(())
    }

    /// Completes everything queued on every stream of every device.
    pub fn complete_everything(&self) {
        lock(&self.inner).streams.drain_everything();
    }

    /// How many work items queued on `stream` have not completed. Waits are
    /// not counted: ask [`query_stream`](gpupool_core::StreamBackend::query_stream) whether
    /// the stream is idle.
    pub fn pending_work(&self, stream: StreamHandle) -> Result<usize, MockError> {
        let mut state = lock(&self.inner);
        let key = state.harness_key(stream)?;
        let policy = state.policy;
        state.streams.settle(policy);
        Ok(state.streams.get(key).map_or(0, |s| s.pending_work()))
    }

    // ---- accounting --------------------------------------------------------

    /// How many backend calls of `kind` were made, failed ones included.
    pub fn calls(&self, kind: CallKind) -> u64 {
        lock(&self.inner).calls.get(&kind).copied().unwrap_or(0)
    }

    /// How many backend calls were made, of every kind.
    pub fn total_calls(&self) -> u64 {
        lock(&self.inner).calls.values().sum()
    }

    /// Streams created and not yet destroyed, on every device.
    pub fn live_streams(&self) -> usize {
        lock(&self.inner).streams.created().count()
    }

    /// Events created and not yet destroyed, on every device.
    pub fn live_events(&self) -> usize {
        lock(&self.inner).events.len()
    }

    /// Streams created on `device` and not yet destroyed.
    pub fn live_streams_on(&self, device: DeviceId) -> usize {
        let state = lock(&self.inner);
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
        lock(&self.inner).events.contains_key(&event.0)
    }

    /// Every backend call so far that was handed a bad handle or device (a
    /// double destroy, an unknown or destroyed handle, a device out of range, a
    /// handle used with the wrong device), in order. Injected failures are not
    /// misuses.
    pub fn misuses(&self) -> Vec<Misuse> {
        lock(&self.inner).misuses.clone()
    }

    /// The flags a live event was created with.
    pub fn event_flags(&self, event: EventHandle) -> Option<EventFlags> {
        lock(&self.inner).events.get(&event.0).map(|e| e.flags)
    }

    /// The priority a live stream was created with (`Some(None)`: the device
    /// default); `None` if the stream is not live or is a special handle.
    pub fn stream_priority(&self, stream: StreamHandle) -> Option<Option<i32>> {
        if stream.is_special() {
            return None;
        }
        let state = lock(&self.inner);
        state
            .streams
            .get(StreamKey::Created(stream.0))
            .map(|s| s.priority)
    }

    // ---- fault injection ---------------------------------------------------

    /// Arms a fault: the `n`-th call of `kind` counted from now (`n == 1`: the
    /// next one) fails with [`MockError::Injected`] and has no effect (it is
    /// still counted by [`calls`](Self::calls)). Several faults may be armed at
    /// once; `n == 0` arms nothing.
    pub fn fail_nth(&self, kind: CallKind, n: u64) {
        lock(&self.inner).arm(kind, n);
    }

    /// Disarms every fault not yet fired.
    pub fn clear_faults(&self) {
        lock(&self.inner).armed.clear();
    }

    /// How many armed faults have not fired yet.
    pub fn armed_faults(&self) -> usize {
        lock(&self.inner).armed.len()
    }
}
