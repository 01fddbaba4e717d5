//! The test harness of [`MockBackend`]: simulated work and memory use,
//! accounting, fault injection.

use gpupool_core::{DeviceId, EventFlags, EventHandle, MemoryKind, StreamHandle};

use crate::error::{Misuse, MockError};
use crate::memory::Hazard;
#[cfg(doc)]
use crate::memory::HazardKind;
use crate::quarantine;
#[cfg(doc)]
use crate::queue::CompletionPolicy;
use crate::queue::StreamKey;
use crate::{CallKind, MockBackend};

impl MockBackend {
    // ---- simulated work ----------------------------------------------------
    //
    // These are the test harness, not backend calls: they are not counted, fault
    // injection does not apply, and a bad handle is an error but not a misuse.
    // A special handle names the current device's implicit stream.

    /// Queues one work item on `stream`. Under [`CompletionPolicy::Immediate`]
    /// it completes at once unless the stream is blocked on a wait. On a
    /// stream in a graph capture the item is captured instead (see
    /// [Capture](crate#capture)): the queue does not change.
    pub fn enqueue_work(&self, stream: StreamHandle) -> Result<(), MockError> {
        let mut state = self.state();
        let key = state.harness_key(stream)?;
        state.enqueue_work(key);
        state.reclaim();
        Ok(())
    }

    /// Completes the work item at the front of `stream`, after resolving the
    /// waits that are satisfied. `Ok(false)` if there is nothing to complete or
    /// the stream is blocked on a wait that is not.
    pub fn complete_one(&self, stream: StreamHandle) -> Result<bool, MockError> {
        let mut state = self.state();
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
        let mut state = self.state();
        let key = state.harness_key(stream)?;
        state.streams.drain_stream(key);
        state.reclaim();
        Ok(())
    }

    /// Completes everything queued on every stream of every device (so every
    /// free-pending block is reclaimed).
    pub fn complete_everything(&self) {
        let mut state = self.state();
        state.streams.drain_everything();
        state.reclaim();
    }

    /// How many work items queued on `stream` have not completed. Waits are
    /// not counted: ask [`query_stream`](gpupool_core::StreamBackend::query_stream) whether
    /// the stream is idle.
    pub fn pending_work(&self, stream: StreamHandle) -> Result<usize, MockError> {
        let mut state = self.state();
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
    /// On a stream in a graph capture the item is captured instead (see
    /// [Capture](crate#capture)).
    ///
    /// Refused, with the hazard recorded and nothing queued (see
    /// [Refusals](crate#refusals)): a range of a reclaimed block
    /// ([`MockError::UseAfterFree`]), or of a graph's block when the stream
    /// is not in that graph's capture ([`MockError::HeldByGraph`]).
    pub fn use_memory(
        &self,
        stream: StreamHandle,
        ptr: *const u8,
        len: usize,
    ) -> Result<(), MockError> {
        let mut state = self.state();
        let key = state.harness_key(stream)?;
        state.use_memory(key, ptr.addr(), len)?;
        state.reclaim();
        Ok(())
    }

    /// Declares that the host reads or writes `[ptr, ptr + len)` now. Records a
    /// [`Hazard`] if pending work on any stream uses an overlapping range
    /// ([`HostAccessWhileInUse`](HazardKind::HostAccessWhileInUse)), if the
    /// range is not inside a live block ([`UsedAfterFree`](HazardKind::UsedAfterFree)
    /// or [`OutOfBounds`](HazardKind::OutOfBounds)), or if the block is
    /// [`MemoryKind::Device`] memory ([`HostAccessToDevice`](HazardKind::HostAccessToDevice)).
    /// An empty range is checked against nothing. The pointer is only
    /// compared, never read.
    ///
    /// Refused, with the hazard recorded (see [Refusals](crate#refusals)):
    /// a range of a reclaimed block ([`MockError::UseAfterFree`]), or of a
    /// block reserved for a graph ([`MockError::HeldByGraph`]).
    pub fn host_access(&self, ptr: *const u8, len: usize) -> Result<(), MockError> {
        let mut state = self.state();
        state.host_access(ptr.addr(), len)?;
        state.reclaim();
        Ok(())
    }

    /// Every hazard found so far, in order. A correct caller causes none;
    /// tests assert this is empty.
    pub fn hazards(&self) -> Vec<Hazard> {
        self.state().memory.hazards.clone()
    }

    /// Forgets the hazards found so far.
    pub fn clear_hazards(&self) {
        let mut state = self.state();
        state.memory.hazards.clear();
        state.hazards_reported = 0;
    }

    /// Bytes of `kind` allocated and not yet returned to `std::alloc`,
    /// free-pending blocks included (sizes as requested). Zero at the end of a
    /// test that leaked nothing (after the streams are drained or destroyed).
    pub fn live_bytes(&self, kind: MemoryKind) -> usize {
        let mut state = self.state();
        state.reclaim();
        state.memory.live_bytes(kind)
    }

    /// Bytes of `kind` freed in stream order whose stream has not passed the
    /// free yet.
    pub fn pending_free_bytes(&self, kind: MemoryKind) -> usize {
        let mut state = self.state();
        state.reclaim();
        state.memory.pending_free_bytes(kind)
    }

    /// The highest [`live_bytes`](Self::live_bytes) of `kind` has been.
    pub fn peak_live_bytes(&self, kind: MemoryKind) -> usize {
        self.state().memory.peak_live_bytes(kind)
    }

    /// Blocks of every kind not yet returned to `std::alloc`, free-pending
    /// ones included.
    pub fn live_blocks(&self) -> usize {
        let mut state = self.state();
        state.reclaim();
        state.memory.live_blocks()
    }

    /// At most this many reclaimed blocks are remembered (their memory kept
    /// allocated), so that a call naming one is refused as a use after free
    /// (see [Refusals](crate#refusals)): 256, or 64 under Miri.
    pub const QUARANTINE_BLOCKS: usize = quarantine::MAX_BLOCKS;

    /// At most this many bytes of reclaimed blocks are kept (see
    /// [`QUARANTINE_BLOCKS`](Self::QUARANTINE_BLOCKS)): 16 MiB, or 4 MiB
    /// under Miri. A larger block is freed at once and not remembered.
    pub const QUARANTINE_BYTES: usize = quarantine::MAX_BYTES;

    /// How many reclaimed blocks the mock remembers now, their memory still
    /// allocated (not counted by [`live_blocks`](Self::live_blocks)).
    pub fn quarantined_blocks(&self) -> usize {
        let mut state = self.state();
        state.reclaim();
        state.memory.quarantine.len()
    }

    /// How many bytes those blocks hold (not counted by
    /// [`live_bytes`](Self::live_bytes)).
    pub fn quarantined_bytes(&self) -> usize {
        let mut state = self.state();
        state.reclaim();
        state.memory.quarantine.bytes()
    }

    // ---- accounting --------------------------------------------------------

    /// How many backend calls of `kind` were made, failed ones included.
    pub fn calls(&self, kind: CallKind) -> u64 {
        self.state().calls.get(kind)
    }

    /// How many backend calls were made, of every kind.
    pub fn total_calls(&self) -> u64 {
        self.state().calls.total()
    }

    /// Streams created and not yet destroyed, on every device.
    pub fn live_streams(&self) -> usize {
        self.state().streams.created().count()
    }

    /// Events created and not yet destroyed, on every device.
    pub fn live_events(&self) -> usize {
        self.state().events.len()
    }

    /// Streams created on `device` and not yet destroyed.
    pub fn live_streams_on(&self, device: DeviceId) -> usize {
        let state = self.state();
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
        self.state().events.contains_key(&event.as_raw())
    }

    /// Every backend call so far that was handed a bad handle or device (a
    /// double destroy, an unknown or destroyed handle, a device out of range, a
    /// handle used with the wrong device, and the rest listed at [`Misuse`]),
    /// or that a graph capture refused, and every bad use of the capture
    /// harness, in order. Injected failures are not misuses.
    pub fn misuses(&self) -> Vec<Misuse> {
        self.state().misuses.clone()
    }

    /// The flags a live event was created with.
    pub fn event_flags(&self, event: EventHandle) -> Option<EventFlags> {
        self.state().events.get(&event.as_raw()).map(|e| e.flags)
    }

    /// The priority a live stream was created with (`Some(None)`: the device
    /// default); `None` if the stream is not live or is a special handle.
    pub fn stream_priority(&self, stream: StreamHandle) -> Option<Option<i32>> {
        if stream.is_special() {
            return None;
        }
        let state = self.state();
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
        self.state().arm(kind, n);
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
        self.state().armed_handles.push((kind, stream.as_raw()));
    }

    /// Arms a fault on one event: the next call of `kind` that names `event`
    /// fails with [`MockError::Injected`] and has no effect (see
    /// [`fail_stream`](Self::fail_stream)).
    pub fn fail_event(&self, kind: CallKind, event: EventHandle) {
        self.state().armed_handles.push((kind, event.as_raw()));
    }

    /// Disarms every fault not yet fired.
    pub fn clear_faults(&self) {
        let mut state = self.state();
        state.armed.clear();
        state.armed_handles.clear();
    }

    /// How many armed faults (per call count or per handle) have not fired yet.
    pub fn armed_faults(&self) -> usize {
        let state = self.state();
        state.armed.len() + state.armed_handles.len()
    }
}
