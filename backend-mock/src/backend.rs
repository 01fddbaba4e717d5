//! The core's backend traits ([`Backend`], [`StreamBackend`], [`EventBackend`])
//! for [`MockBackend`].
//!
//! Every call goes through [`MockBackend::call`]: it counts itself, fires an
//! armed fault (a failing call has no other effect), then runs the operation on
//! the state; an argument error is logged as a [`Misuse`](crate::Misuse).

use gpupool_core::{
    Backend, Completion, DeviceId, EventBackend, EventFlags, EventHandle, StreamBackend,
    StreamHandle, StreamOptions,
};

use crate::state::State;
use crate::sync::lock;
use crate::{CallKind, Misuse, MockBackend, MockError};

impl MockBackend {
    /// Runs one backend call of `kind` under the lock: count, faults, `op`.
    fn call<T>(
        &self,
        kind: CallKind,
        op: impl FnOnce(&mut State) -> Result<T, MockError>,
    ) -> Result<T, MockError> {
        let mut state = lock(&self.inner);
        state.begin_call(kind)?;
        op(&mut state).inspect_err(|error| {
            state.misuses.push(Misuse {
                call: kind,
                error: error.clone(),
            });
        })
    }
}

impl Backend for MockBackend {
    type Error = MockError;

    /// The device count given to [`MockBackend::new`].
    fn device_count(&self) -> Result<u32, MockError> {
        self.call(CallKind::DeviceCount, |st| Ok(st.devices))
    }

    /// The mock-wide current device (see [`MockBackend::set_current_device`]),
    /// even when it is out of range: checking it is the caller's job.
    fn current_device(&self) -> Result<DeviceId, MockError> {
        self.call(CallKind::CurrentDevice, |st| Ok(st.current))
    }
}

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
    fn destroy_stream(&self, stream: StreamHandle, device: DeviceId) -> Result<(), MockError> {
        self.call(CallKind::DestroyStream, |st| {
            st.destroy_stream(stream, device)
        })
    }

    fn query_stream(
        &self,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Completion, MockError> {
        self.call(CallKind::QueryStream, |st| st.query_stream(stream, device))
    }

    /// Completes everything the stream's queued items depend on, on other
    /// streams too, and then the stream's own items.
    fn synchronize_stream(&self, stream: StreamHandle, device: DeviceId) -> Result<(), MockError> {
        self.call(CallKind::SynchronizeStream, |st| {
            st.synchronize_stream(stream, device)
        })
    }

    /// The event may belong to another device than the stream.
    fn stream_wait_event(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        event: EventHandle,
    ) -> Result<(), MockError> {
        self.call(CallKind::StreamWaitEvent, |st| {
            st.stream_wait_event(stream, device, event)
        })
    }

    /// For a special handle (0, 1, 2): the mock-wide current device.
    fn stream_device(&self, stream: StreamHandle) -> Result<DeviceId, MockError> {
        self.call(CallKind::StreamDevice, |st| st.stream_device(stream))
    }
}

impl EventBackend for MockBackend {
    fn create_event(&self, device: DeviceId, flags: EventFlags) -> Result<EventHandle, MockError> {
        self.call(CallKind::CreateEvent, |st| st.create_event(device, flags))
    }

    fn destroy_event(&self, event: EventHandle, device: DeviceId) -> Result<(), MockError> {
        self.call(CallKind::DestroyEvent, |st| st.destroy_event(event, device))
    }

    /// The event and the stream must both belong to `device`.
    fn record_event(
        &self,
        event: EventHandle,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        self.call(CallKind::RecordEvent, |st| {
            st.record_event(event, stream, device)
        })
    }

    fn query_event(&self, event: EventHandle, device: DeviceId) -> Result<Completion, MockError> {
        self.call(CallKind::QueryEvent, |st| st.query_event(event, device))
    }

    fn synchronize_event(&self, event: EventHandle, device: DeviceId) -> Result<(), MockError> {
        self.call(CallKind::SynchronizeEvent, |st| {
            st.synchronize_event(event, device)
        })
    }
}
