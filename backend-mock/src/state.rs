//! The whole simulated machine as plain data: devices, streams, events,
//! memory, call counters, armed faults and the misuse log, with the checks
//! every backend call goes through. (The memory operations are in `memory.rs`.) [`MockBackend`](crate::MockBackend) keeps one [`State`]
//! behind its reader-writer lock; nothing here locks or calls out. Everything
//! here changes only under the write lock, except the counters of the calls
//! that may run under the read lock ([`Calls`]).

use std::collections::BTreeMap;

use gpupool_core::BackendOp as CallKind;
use gpupool_core::{CaptureStatus, Completion, DeviceId, EventFlags, EventHandle, StreamHandle};

use crate::capture::Captures;
use crate::error::{Misuse, MockError};
use crate::memory::Memory;
use crate::queue::{CompletionPolicy, Point, Stream, StreamKey, Streams};

mod calls;
pub(crate) use calls::Calls;

/// The first handle `create_stream` returns; later ones count up by one.
pub(crate) const FIRST_STREAM: usize = 0x1000;
/// The first handle `create_event` returns; later ones count up by one. Half
/// the address space away from the streams (on 32-bit targets too), so a
/// stream handle is never mistaken for an event handle or the reverse.
pub(crate) const FIRST_EVENT: usize = usize::MAX / 2 + 1;

/// One simulated event.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) device: DeviceId,
    pub(crate) flags: EventFlags,
    /// The point captured by the last record; `None` if never recorded (an
    /// event never recorded is complete, as in CUDA).
    target: Option<Point>,
}

impl Event {
    /// Makes the event one never recorded (complete): what an event last
    /// recorded in a capture is once the capture has ended.
    pub(crate) fn forget_target(&mut self) {
        self.target = None;
    }
}

/// The simulated machine.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) devices: u32,
    /// Mock-wide (not per thread) current device; may be out of range.
    pub(crate) current: DeviceId,
    pub(crate) policy: CompletionPolicy,
    /// What [`MemoryBackend::batches_host_reuse`](gpupool_core::MemoryBackend::batches_host_reuse)
    /// answers ([`MockBackend::set_batches_host_reuse`](crate::MockBackend::set_batches_host_reuse)).
    pub(crate) batches_host_reuse: bool,
    pub(crate) streams: Streams,
    pub(crate) events: BTreeMap<usize, Event>,
    /// Blocks, uses, byte counters and hazards. Dropping it returns every
    /// block still allocated to `std::alloc`.
    pub(crate) memory: Memory,
    /// The open graph captures (see [Capture](crate#capture)).
    pub(crate) captures: Captures,
    /// The memory the launches of each live graph use (its nodes' ranges),
    /// by graph id: what keeps a block kept for graphs
    /// (`keep_for_ended_captures`) from being freed.
    pub(crate) graph_ranges:
        std::collections::BTreeMap<crate::capture::CaptureId, Vec<crate::capture::NodeUse>>,
    /// The next handle to hand out: monotonic, never reused.
    next_stream: usize,
    next_event: usize,
    /// Calls made, per kind, failed ones included.
    pub(crate) calls: Calls,
    /// Armed faults: (kind, the value of that kind's counter at which it fires).
    pub(crate) armed: Vec<(CallKind, u64)>,
    /// Armed per-handle faults: (kind, the raw handle whose next call of that
    /// kind fails). Stream and event handles never collide (see
    /// [`FIRST_EVENT`]), so one raw value names one object.
    pub(crate) armed_handles: Vec<(CallKind, usize)>,
    /// Whether a hazard panics, once the call that found it releases the
    /// machine ([`MockBackend::set_fail_on_hazard`](crate::MockBackend::set_fail_on_hazard)).
    pub(crate) fail_on_hazard: bool,
    /// How many of `memory.hazards` have been reported that way.
    pub(crate) hazards_reported: usize,
    /// While checking mode is on, the completion policy from before it
    /// ([`MockBackend::set_checking`](crate::MockBackend::set_checking)
    /// puts it back when turned off).
    pub(crate) policy_before_checking: Option<CompletionPolicy>,
    pub(crate) misuses: Vec<Misuse>,
}

impl State {
    pub(crate) fn new(devices: u32) -> Self {
        State {
            devices,
            current: DeviceId(0),
            policy: CompletionPolicy::Manual,
            batches_host_reuse: false,
            streams: Streams::default(),
            events: BTreeMap::new(),
            memory: Memory::default(),
            captures: Captures::default(),
            graph_ranges: Default::default(),
            next_stream: FIRST_STREAM,
            next_event: FIRST_EVENT,
            calls: Calls::new(),
            armed: Vec::new(),
            armed_handles: Vec::new(),
            fail_on_hazard: false,
            hazards_reported: 0,
            policy_before_checking: None,
            misuses: Vec::new(),
        }
    }

    /// With [`fail_on_hazard`](Self::fail_on_hazard), what to panic with for
    /// the hazards found since the last report (marked reported); else
    /// `None`.
    pub(crate) fn unreported_hazards(&mut self) -> Option<String> {
        let found = &self.memory.hazards;
        if !self.fail_on_hazard || found.len() <= self.hazards_reported {
            self.hazards_reported = self.hazards_reported.min(found.len());
            return None;
        }
        let mut message = String::from("gpupool mock: the GPU would use memory unordered:");
        for h in &found[self.hazards_reported..] {
            message.push_str("\n  ");
            message.push_str(&h.to_string());
        }
        self.hazards_reported = found.len();
        Some(message)
    }

    // ---- accounting -------------------------------------------------------

    /// Counts a call of `kind`, then fires the faults armed for it: an
    /// `Err(Injected)` means the call must have no other effect.
    pub(crate) fn begin_call(&mut self, kind: CallKind) -> Result<(), MockError> {
        let now = self.calls.count(kind);
        let before = self.armed.len();
        self.armed.retain(|&(k, at)| !(k == kind && at == now));
        if self.armed.len() == before {
            Ok(())
        } else {
            Err(MockError::Injected(kind))
        }
    }

    /// [`begin_call`](Self::begin_call) for a call that names `handles`: then
    /// fires the first per-handle fault armed for `kind` and one of them. The
    /// call is counted once, and one call fires at most one fault.
    pub(crate) fn begin_call_on(
        &mut self,
        kind: CallKind,
        handles: &[usize],
    ) -> Result<(), MockError> {
        self.begin_call(kind)?;
        match self
            .armed_handles
            .iter()
            .position(|&(k, h)| k == kind && handles.contains(&h))
        {
            Some(i) => {
                self.armed_handles.remove(i);
                Err(MockError::Injected(kind))
            }
            None => Ok(()),
        }
    }

    /// Whether a backend call that only reads would change nothing but its
    /// call counter: no fault is armed (none can fire), no wait is queued
    /// (settling moves nothing) and no block is free-pending (reclaiming
    /// frees nothing). Then such a call may run under the read lock.
    pub(crate) fn is_quiet(&self) -> bool {
        self.armed.is_empty()
            && self.armed_handles.is_empty()
            && self.streams.nothing_to_settle()
            && self.memory.nothing_to_reclaim()
    }

    /// Arms a fault on the `n`-th call of `kind` from now; `n == 0` arms nothing.
    pub(crate) fn arm(&mut self, kind: CallKind, n: u64) {
        if n == 0 {
            return;
        }
        let now = self.calls.get(kind);
        self.armed.push((kind, now.saturating_add(n)));
    }

    // ---- validation -------------------------------------------------------

    /// `Ok` if `device` exists.
    pub(crate) fn check_device(&self, device: DeviceId) -> Result<(), MockError> {
        if device.0 < self.devices {
            Ok(())
        } else {
            Err(MockError::InvalidDevice(device))
        }
    }

    /// The stream a backend call names: a special handle is `device`'s
    /// implicit stream; a created one must exist and belong to `device`.
    pub(crate) fn stream_key(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<StreamKey, MockError> {
        self.check_device(device)?;
        if stream == StreamHandle::PER_THREAD {
            return Ok(StreamKey::PerThread(device.0));
        }
        if stream.is_special() {
            return Ok(StreamKey::Implicit(device.0));
        }
        let key = StreamKey::Created(stream.as_raw());
        let actual = self
            .streams
            .get(key)
            .ok_or(MockError::InvalidStream(stream))?
            .device;
        if actual == device {
            Ok(key)
        } else {
            Err(MockError::CrossDevice {
                given: device,
                actual,
            })
        }
    }

    /// The stream a test-harness call names: a special handle is the current
    /// device's implicit stream.
    pub(crate) fn harness_key(&self, stream: StreamHandle) -> Result<StreamKey, MockError> {
        if stream.is_special() {
            self.check_device(self.current)?;
            if stream == StreamHandle::PER_THREAD {
                return Ok(StreamKey::PerThread(self.current.0));
            }
            return Ok(StreamKey::Implicit(self.current.0));
        }
        let key = StreamKey::Created(stream.as_raw());
        match self.streams.get(key) {
            Some(_) => Ok(key),
            None => Err(MockError::InvalidStream(stream)),
        }
    }

    /// The event a backend call names: it must exist and, if `device` is given,
    /// belong to it.
    fn event(&self, event: EventHandle, device: Option<DeviceId>) -> Result<&Event, MockError> {
        if let Some(device) = device {
            self.check_device(device)?;
        }
        let found = self
            .events
            .get(&event.as_raw())
            .ok_or(MockError::InvalidEvent(event))?;
        match device {
            Some(given) if given != found.device => Err(MockError::CrossDevice {
                given,
                actual: found.device,
            }),
            _ => Ok(found),
        }
    }

    // ---- backend operations (arguments not yet checked) -------------------

    pub(crate) fn create_stream(
        &mut self,
        device: DeviceId,
        priority: Option<i32>,
    ) -> Result<StreamHandle, MockError> {
        self.check_device(device)?;
        let handle = self.next_stream;
        self.next_stream += 1;
        self.streams.insert(handle, Stream::new(device, priority));
        // SAFETY: `handle` is this mock's own fresh stream id, just entered in
        // its stream table; the mock checks every handle it is given anyway.
        Ok(unsafe { StreamHandle::from_raw(handle) })
    }

    pub(crate) fn destroy_stream(
        &mut self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        self.check_device(device)?;
        if stream.is_special() {
            return Err(MockError::InvalidStream(stream));
        }
        let key = self.stream_key(stream, device)?;
        if let Some(id) = self.captures.of_stream(key) {
            // A capturing stream cannot go before its capture ends.
            self.captures.invalidate(id);
            return Err(MockError::CaptureUnsupported);
        }
        self.streams.remove(stream.as_raw());
        Ok(())
    }

    /// Whether the stream's work has finished, as far as it has been settled
    /// (the caller settles first when there is anything to settle, see
    /// [`is_quiet`](Self::is_quiet)): it only reads.
    pub(crate) fn query_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Completion, MockError> {
        let key = self.stream_key(stream, device)?;
        Ok(completion(
            self.streams.get(key).is_none_or(Stream::is_idle),
        ))
    }

    /// Whether `stream` is in a graph capture (never refused, never a
    /// misuse for a live stream): it only reads.
    pub(crate) fn capture_status(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<CaptureStatus, MockError> {
        let key = self.stream_key(stream, device)?;
        Ok(self.captures.status(key))
    }

    pub(crate) fn capture_id(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Option<u64>, MockError> {
        let key = self.stream_key(stream, device)?;
        Ok(self.captures.of_stream(key))
    }

    /// What an open capture refuses of `query_stream` (see
    /// `State::refuse_in_capture`), once the handles are checked.
    pub(crate) fn refuse_query_stream(
        &mut self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        let key = self.stream_key(stream, device)?;
        self.refuse_in_capture(CallKind::QueryStream, None, Some(key), None)
    }

    pub(crate) fn synchronize_stream(
        &mut self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        let key = self.stream_key(stream, device)?;
        self.refuse_in_capture(CallKind::SynchronizeStream, None, Some(key), None)?;
        self.streams.drain_stream(key);
        Ok(())
    }

    pub(crate) fn stream_wait_event(
        &mut self,
        stream: StreamHandle,
        device: DeviceId,
        event: EventHandle,
    ) -> Result<(), MockError> {
        let key = self.stream_key(stream, device)?;
        // Waiting on another device's event is allowed, as in CUDA.
        let target = self.event(event, None)?.target;
        let raw = event.as_raw();
        match (self.captures.of_event(raw), self.captures.of_stream(key)) {
            // The legacy default stream cannot be part of a capture, so it
            // cannot wait on a captured event (the per-thread default stream
            // can: it joins like a created stream).
            (Some(theirs), mine)
                if stream == StreamHandle::NULL || stream == StreamHandle::LEGACY =>
            {
                self.captures.invalidate(theirs);
                if let Some(mine) = mine {
                    self.captures.invalidate(mine);
                }
                return Err(MockError::CaptureImplicit(stream));
            }
            // A fork (the stream joins the capture) or a wait inside it: an
            // ordering of the graph, nothing queued.
            (Some(theirs), mine) if mine.is_none_or(|m| m == theirs) => {
                self.captures.wait(theirs, key, raw);
                return Ok(());
            }
            // A dependency across two captures.
            (Some(theirs), Some(mine)) => {
                self.captures.invalidate(theirs);
                self.captures.invalidate(mine);
                return Err(MockError::CaptureIsolation);
            }
            // A capturing stream may not wait for work outside its capture
            // (an event never recorded waits for nothing).
            (None, Some(mine)) => {
                if target.is_none() {
                    return Ok(());
                }
                self.captures.invalidate(mine);
                return Err(MockError::CaptureIsolation);
            }
            (_, None) => {}
        }
        self.streams.settle(self.policy);
        if let Some(point) = target {
            self.streams.push_wait(key, point);
        }
        Ok(())
    }

    pub(crate) fn stream_device(&self, stream: StreamHandle) -> Result<DeviceId, MockError> {
        if stream.is_special() {
            self.check_device(self.current)?;
            return Ok(self.current);
        }
        self.streams
            .get(StreamKey::Created(stream.as_raw()))
            .map(|s| s.device)
            .ok_or(MockError::InvalidStream(stream))
    }

    pub(crate) fn create_event(
        &mut self,
        device: DeviceId,
        flags: EventFlags,
    ) -> Result<EventHandle, MockError> {
        self.check_device(device)?;
        let handle = self.next_event;
        self.next_event += 1;
        let event = Event {
            device,
            flags,
            target: None,
        };
        self.events.insert(handle, event);
        // SAFETY: `handle` is this mock's own fresh event id, just entered in
        // its event table; the mock checks every handle it is given anyway.
        Ok(unsafe { EventHandle::from_raw(handle) })
    }

    pub(crate) fn destroy_event(
        &mut self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        self.event(event, Some(device))?;
        self.events.remove(&event.as_raw());
        self.captures.forget_event(event.as_raw());
        Ok(())
    }

    pub(crate) fn record_event(
        &mut self,
        event: EventHandle,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        let key = self.stream_key(stream, device)?;
        self.event(event, Some(device))?;
        let raw = event.as_raw();
        if let Some(id) = self.captures.of_stream(key) {
            // A captured event: what it captured is a position in the graph.
            self.captures.record_event(id, key, raw);
            if let Some(found) = self.events.get_mut(&raw) {
                found.target = None;
            }
            return Ok(());
        }
        self.captures.forget_event(raw);
        let point = self.streams.head(key);
        if let Some(found) = self.events.get_mut(&raw) {
            found.target = Some(point);
        }
        Ok(())
    }

    /// Whether the work the event captured has finished, as far as it has
    /// been settled (as [`query_stream`](Self::query_stream)): it only reads.
    pub(crate) fn query_event(
        &self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<Completion, MockError> {
        let target = self.event(event, Some(device))?.target;
        Ok(completion(target.is_none_or(|p| self.streams.reached(p))))
    }

    /// What an open capture refuses of `query_event` (see
    /// `State::refuse_in_capture`), once the handles are checked.
    pub(crate) fn refuse_query_event(
        &mut self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        self.event(event, Some(device))?;
        self.refuse_in_capture(CallKind::QueryEvent, None, None, Some(event.as_raw()))
    }

    pub(crate) fn synchronize_event(
        &mut self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        let target = self.event(event, Some(device))?.target;
        let raw = Some(event.as_raw());
        self.refuse_in_capture(CallKind::SynchronizeEvent, None, None, raw)?;
        if let Some(point) = target {
            self.streams.drain(point);
        }
        Ok(())
    }
}

fn completion(done: bool) -> Completion {
    if done {
        Completion::Complete
    } else {
        Completion::Pending
    }
}
