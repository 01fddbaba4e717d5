//! The core's backend traits ([`Backend`], [`StreamBackend`], [`EventBackend`],
//! [`MemoryBackend`]) for [`MockBackend`].
//!
//! Every call goes through [`MockBackend::call`] under the write lock: it
//! counts itself, fires an armed fault (a failing call has no other effect),
//! then runs the operation on the state; an argument error is logged as a
//! [`Misuse`]. Afterwards the free-pending blocks whose stream
//! has passed the free are reclaimed.
//!
//! The read-only calls (`device_count`, `current_device`, `query_stream`,
//! `stream_device`, `capture_status`, `query_event`) first try a fast path under the read lock,
//! [`MockBackend::read_call_on`], so that threads querying at once do not wait
//! for each other: when the slow path would change nothing but the call
//! counter (nothing armed, settled, reclaimed; see `State::is_quiet`) and the
//! call succeeds, it counts itself in an atomic counter and returns the same
//! answer. Anything else (an armed fault, a wait to settle, a free-pending
//! block, an error to log as a misuse) goes to the write lock, which does it
//! all again from the start.

use core::cell::Cell;
use core::ptr::NonNull;

use gpupool_core::{
    Backend, BackendId, BackendOp as CallKind, CaptureBackend, CaptureMode, CaptureStatus,
    Completion, DeviceId, EventBackend, EventFlags, EventHandle, MemoryBackend, MemoryKind,
    StreamBackend, StreamHandle, StreamOptions,
};

use crate::error::{BlockLayout, Misuse, MockError};

use crate::state::State;
use crate::sync::read;
use crate::MockBackend;

/// What an open capture refuses of a read-only call (see
/// `MockBackend::read_call_on`).
type Refusal<'a> = dyn Fn(&mut State) -> Result<(), MockError> + 'a;

impl MockBackend {
    /// `Ok` if `stream` is a stream of `device` (a special one, or a live
    /// created one of it), for the calls that check it before a harness
    /// call.
    fn check_stream_device(&self, stream: StreamHandle, device: DeviceId) -> Result<(), MockError> {
        read(&self.inner.state)
            .stream_key(stream, device)
            .map(|_| ())
    }

    /// `deallocate_async` (`for_graph`: `keep_for_graph`), counted as a
    /// `DeallocateAsync` call.
    fn free_in_order(
        &self,
        given: BlockLayout,
        ptr: NonNull<u8>,
        stream: StreamHandle,
        for_graph: bool,
    ) -> Result<(), MockError> {
        self.call(CallKind::DeallocateAsync, |st| {
            st.deallocate_async(given, ptr, stream, for_graph)
        })
    }

    /// Runs one backend call of `kind` under the lock: count, faults, `op`.
    fn call<T>(
        &self,
        kind: CallKind,
        op: impl FnOnce(&mut State) -> Result<T, MockError>,
    ) -> Result<T, MockError> {
        self.call_on(kind, &[], op)
    }

    /// [`call`](Self::call) for a call that names `handles` (raw stream or
    /// event handles): per-handle faults armed on them fire too.
    fn call_on<T>(
        &self,
        kind: CallKind,
        handles: &[usize],
        op: impl FnOnce(&mut State) -> Result<T, MockError>,
    ) -> Result<T, MockError> {
        let mut state = self.state();
        state.begin_call_on(kind, handles)?;
        let result = op(&mut state);
        state.reclaim();
        result.inspect_err(|error| {
            if !matches!(error, MockError::OutOfMemory { .. }) {
                state.misuses.push(Misuse::backend(kind, error.clone()));
            }
        })
    }

    /// [`call_on`](Self::call_on) for a call that only reads, answered by
    /// `peek`: when the state is quiet (see `State::is_quiet`: the
    /// write-locked call would change nothing but its counter) and `peek`
    /// succeeds on it, the call is counted and answered under the read lock;
    /// otherwise (an armed fault, work to settle or reclaim, an error to log)
    /// it runs under the write lock, from the start. `kind` must have an
    /// atomic counter (else it always takes the write lock).
    ///
    /// With `settle` (a query), the write-locked path settles the streams
    /// before it answers, once `peek` has found the handles valid (an invalid
    /// one settles nothing); on a quiet state there is nothing to settle, so
    /// both paths give the same answer.
    ///
    /// With a `refuse` (a query an open capture may refuse, see
    /// `State::refuse_in_capture`), the call takes the write lock whenever a
    /// capture is open, and `refuse` runs there once `peek` has found the
    /// handles valid: a refusal changes the state (it invalidates captures).
    /// With no capture open, `refuse` would refuse nothing.
    ///
    /// The read lock keeps every writer out while it is held, so nothing the
    /// answer depends on (the handle's stream or event, the armed faults) can
    /// change between the checks and the count: the call takes effect at one
    /// point, as under the write lock.
    fn read_call_on<T>(
        &self,
        kind: CallKind,
        handles: &[usize],
        settle: bool,
        peek: impl Fn(&State) -> Result<T, MockError>,
        refuse: Option<&Refusal<'_>>,
    ) -> Result<T, MockError> {
        {
            let state = read(&self.inner.state);
            if state.is_quiet() && (refuse.is_none() || state.captures.none_open()) {
                if let Ok(value) = peek(&state) {
                    if state.calls.count_shared(kind) {
                        return Ok(value);
                    }
                }
            }
        }
        self.call_on(kind, handles, |st| {
            if settle || refuse.is_some() {
                peek(st)?;
            }
            if let Some(refuse) = refuse {
                refuse(st)?;
            }
            if settle {
                st.streams.settle(st.policy);
            }
            peek(st)
        })
    }
}

// SAFETY: `id` is the machine's own, made once by `BackendId::unique` and
// never changed; the handles and addresses the machine hands out are accepted
// by every clone of it (one shared state), the only backends with that id.
unsafe impl Backend for MockBackend {
    type Error = MockError;

    /// The machine's own id, made by [`MockBackend::new`] and shared by its
    /// clones: two machines never share one.
    fn id(&self) -> BackendId {
        self.inner.id
    }

    /// The device count given to [`MockBackend::new`].
    fn device_count(&self) -> Result<u32, MockError> {
        self.read_call_on(CallKind::DeviceCount, &[], false, |st| Ok(st.devices), None)
    }

    /// The mock-wide current device (see [`MockBackend::set_current_device`]),
    /// even when it is out of range: checking it is the caller's job.
    fn current_device(&self) -> Result<DeviceId, MockError> {
        self.read_call_on(
            CallKind::CurrentDevice,
            &[],
            false,
            |st| Ok(st.current),
            None,
        )
    }
}

/// Every method is sound for any argument: it validates handles and addresses
/// and reports a misuse or returns an error; the `unsafe` is the trait's, for
/// real drivers (see [`MockBackend`'s safety
/// section](MockBackend#safety-of-the-trait-methods)).
impl StreamBackend for MockBackend {
    fn create_stream(
        &self,
        device: DeviceId,
        options: StreamOptions,
    ) -> Result<StreamHandle, MockError> {
        self.call(CallKind::CreateStream, |st| {
            st.create_stream(device, options.priority)
        })
    }

    /// Destroys a created stream; its queued work counts as finished. The
    /// special handles cannot be destroyed.
    unsafe fn destroy_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        self.call_on(CallKind::DestroyStream, &[stream.as_raw()], |st| {
            st.destroy_stream(stream, device)
        })
    }

    unsafe fn query_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Completion, MockError> {
        self.read_call_on(
            CallKind::QueryStream,
            &[stream.as_raw()],
            true,
            |st| st.query_stream(stream, device),
            Some(&|st| st.refuse_query_stream(stream, device)),
        )
    }

    /// Completes everything the stream's queued items depend on, on other
    /// streams too, and then the stream's own items.
    unsafe fn synchronize_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        self.call_on(CallKind::SynchronizeStream, &[stream.as_raw()], |st| {
            st.synchronize_stream(stream, device)
        })
    }

    /// The event may belong to another device than the stream.
    unsafe fn stream_wait_event(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        event: EventHandle,
    ) -> Result<(), MockError> {
        self.call_on(
            CallKind::StreamWaitEvent,
            &[stream.as_raw(), event.as_raw()],
            |st| st.stream_wait_event(stream, device, event),
        )
    }

    /// For a special handle (0, 1, 2): the mock-wide current device.
    unsafe fn stream_device(&self, stream: StreamHandle) -> Result<DeviceId, MockError> {
        self.read_call_on(
            CallKind::StreamDevice,
            &[stream.as_raw()],
            false,
            |st| st.stream_device(stream),
            None,
        )
    }

    /// Whether the stream is in a graph capture of this mock (see
    /// [Capture](crate#capture)): never refused, never breaks a capture, and
    /// a misuse only for a bad handle, like any call.
    unsafe fn capture_status(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<CaptureStatus, MockError> {
        self.read_call_on(
            CallKind::CaptureStatus,
            &[stream.as_raw()],
            false,
            |st| st.capture_status(stream, device),
            None,
        )
    }

    /// The id of the capture the stream is in (the mock's capture ids, never
    /// reused), or `None`. A call of kind `CaptureStatus`, as
    /// [`capture_status`](StreamBackend::capture_status).
    unsafe fn capture_id(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Option<u64>, MockError> {
        self.read_call_on(
            CallKind::CaptureStatus,
            &[stream.as_raw()],
            false,
            |st| st.capture_id(stream, device),
            None,
        )
    }

    /// The stream's handle for a created stream (the mock never hands a
    /// handle out twice), `None` for a special one. Checks the stream like
    /// every call (an unknown one is an error and a misuse); counted as a
    /// [`CallKind::StreamDevice`] call.
    unsafe fn stream_id(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Option<u64>, MockError> {
        self.read_call_on(
            CallKind::StreamDevice,
            &[stream.as_raw()],
            false,
            |st| {
                st.stream_key(stream, device)
                    .map(|_| (!stream.is_special()).then_some(stream.as_raw() as u64))
            },
            None,
        )
    }
}

/// Graph capture through the trait: the harness calls
/// [`MockBackend::begin_capture`] and [`MockBackend::end_capture`] (a bad
/// handle is an error and a [`Misuse`], as there), after checking that
/// `stream` is a stream of `device`. While a capture begun this way in the
/// global or thread-local mode is open, the backend's own calls are
/// refused by no capture on the ground of its mode, as the CUDA backend's
/// are not (it relaxes its calling thread's interaction mode around them):
/// the mode restricts the caller's own calls only.
impl CaptureBackend for MockBackend {
    type Graph = crate::MockGraph;

    unsafe fn begin_capture(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        mode: CaptureMode,
    ) -> Result<(), MockError> {
        self.check_stream_device(stream, device)?;
        // Begun through gpupool, which notes it (`StreamLease::begin_capture`);
        // the backend's own calls run relaxed while it is open, as the CUDA
        // backend's do.
        self.begin_capture_as(stream, mode, true)
    }

    unsafe fn end_capture(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<crate::MockGraph, MockError> {
        self.check_stream_device(stream, device)?;
        MockBackend::end_capture(self, stream)
    }
}

/// Every method is sound for any argument: it validates handles and addresses
/// and reports a misuse or returns an error; the `unsafe` is the trait's, for
/// real drivers (see [`MockBackend`'s safety
/// section](MockBackend#safety-of-the-trait-methods)).
impl EventBackend for MockBackend {
    fn create_event(&self, device: DeviceId, flags: EventFlags) -> Result<EventHandle, MockError> {
        self.call(CallKind::CreateEvent, |st| st.create_event(device, flags))
    }

    unsafe fn destroy_event(&self, event: EventHandle, device: DeviceId) -> Result<(), MockError> {
        self.call_on(CallKind::DestroyEvent, &[event.as_raw()], |st| {
            st.destroy_event(event, device)
        })
    }

    /// The event and the stream must both belong to `device`.
    unsafe fn record_event(
        &self,
        event: EventHandle,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        self.call_on(
            CallKind::RecordEvent,
            &[event.as_raw(), stream.as_raw()],
            |st| st.record_event(event, stream, device),
        )
    }

    /// In checking mode (work completes only when the host waits), a query
    /// made on a thread that [`prepare_query_thread`](EventBackend::prepare_query_thread)
    /// marked (the completion engine's, which stands for an async program's
    /// `.await`) is a host wait: the work up to the event completes first,
    /// as for [`synchronize_event`](EventBackend::synchronize_event).
    unsafe fn query_event(
        &self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<Completion, MockError> {
        if QUERY_THREAD.with(Cell::get) && read(&self.inner.state).policy_before_checking.is_some()
        {
            return self.call_on(CallKind::QueryEvent, &[event.as_raw()], |st| {
                st.synchronize_event(event, device)?;
                st.query_event(event, device)
            });
        }
        self.read_call_on(
            CallKind::QueryEvent,
            &[event.as_raw()],
            true,
            |st| st.query_event(event, device),
            Some(&|st| st.refuse_query_event(event, device)),
        )
    }

    unsafe fn synchronize_event(
        &self,
        event: EventHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        self.call_on(CallKind::SynchronizeEvent, &[event.as_raw()], |st| {
            st.synchronize_event(event, device)
        })
    }

    /// Marks the calling thread as one whose event queries stand for host
    /// waits in checking mode (see [`query_event`](EventBackend::query_event)).
    fn prepare_query_thread(&self) {
        QUERY_THREAD.with(|q| q.set(true));
    }

    /// `queries` with the calling thread's capture interaction mode
    /// relaxed, then put back (also if it panics), as the CUDA backend does.
    fn relaxed_queries(&self, queries: &mut dyn FnMut()) {
        /// Puts the thread's mode back.
        struct Restore(bool);
        impl Drop for Restore {
            fn drop(&mut self) {
                crate::capture::relax_thread(self.0);
            }
        }
        let _restore = Restore(crate::capture::relax_thread(true));
        queries()
    }
}

crate::sync::thread_flag! {
    /// The calling thread asks about events in the background (the
    /// completion engine's thread).
    static QUERY_THREAD;
}

mod memory;
