//! The acceptance suite's machine on a real GPU: [`CudaGpu`] implements
//! [`TestGpu`] over the CUDA backend (`--features cuda`).
//!
//! [`make_busy`](TestGpu::make_busy) queues a gate kernel
//! ([`gpupool_cuda::testing::Gate`]) that runs until the test calls
//! [`finish`](TestGpu::finish) on that stream, so a stream stays pending
//! exactly as long as on the mock, not for a fixed time that a slow run could
//! outlast. `finish` opens the stream's gates and synchronizes the stream.
//! [`submit`](TestGpu::submit) queues a short spin kernel
//! ([`gpupool_cuda::testing::spin`]) that ends by itself, and
//! [`is_held`](TestGpu::is_held) polls the stream for up to [`PATIENCE`]: a
//! stream still pending after that is waiting for held work. The driver
//! cannot count calls, live streams or events, so those answers are `None`;
//! [`event_timing`](TestGpu::event_timing) asks `cuEventElapsedTime`.
//!
//! One difference from the mock remains: if a stream waits (through an event)
//! on *another* stream's gated work, `finish` on it opens every gate after a
//! short grace period, which also finishes the other stream's work (the mock
//! completes only up to the point waited for).
//!
//! Gates still closed when the last clone of a machine drops are opened then
//! (each [`Gate`] waits for its kernel), so a test may destroy a stream with
//! held work, as CUDA allows.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpupool_core::{
    AccessOrder, Backend, Completion, DeviceId, EventBackend, EventHandle, StreamBackend,
    StreamHandle, StreamOptions,
};
use gpupool_cuda::cudarc::driver::{result, sys, DriverError};
use gpupool_cuda::testing::{spin, Gate};
use gpupool_cuda::CudaBackend;

use crate::TestGpu;

/// How long a gate kernel runs when nobody opens it: far longer than any test
/// step, short enough that a test that forgot to finish a stream ends.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `finish` waits for a stream after opening its own gates before it
/// opens everyone's (the stream then waits on another stream's gated work).
const GRACE: Duration = Duration::from_millis(200);

/// How long [`is_held`](TestGpu::is_held) lets free work run before it calls a
/// stream still pending held: the free work is a kernel of
/// [`SUBMITTED_WORK`], so anything that is not waiting ends far sooner.
pub const PATIENCE: Duration = Duration::from_millis(200);

/// How long the kernel of [`submit`](TestGpu::submit) runs.
pub const SUBMITTED_WORK: Duration = Duration::from_micros(20);

/// A real GPU as the acceptance suite's machine. Clones share the gates.
#[derive(Clone, Debug, Default)]
pub struct CudaGpu {
    /// The gates not yet finished, with the stream each holds.
    gates: Arc<Mutex<Vec<(StreamHandle, Gate)>>>,
}

impl CudaGpu {
    /// A machine over the process's CUDA driver.
    pub fn new() -> Self {
        CudaGpu::default()
    }

    fn gates(&self) -> MutexGuard<'_, Vec<(StreamHandle, Gate)>> {
        self.gates.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The driver's device count, or why there is none to ask (no `libcuda`, a
/// failed `cuInit`).
pub fn driver_device_count() -> Result<u32, String> {
    CudaBackend::new().device_count().map_err(|e| e.to_string())
}

/// Runs `f` with `device`'s primary context current on the calling thread,
/// then makes the thread's previous context (or none) current again.
fn with_device<T>(device: DeviceId, f: impl FnOnce() -> T) -> T {
    let previous = result::ctx::get_current().expect("cuCtxGetCurrent");
    CudaBackend::new()
        .context(device)
        .expect("retain the primary context")
        .bind_to_thread()
        .expect("make the primary context current");
    let out = f();
    // SAFETY: `previous` was current on this thread a moment ago and its owner
    // still holds it (the suite only uses retained primary contexts); null
    // makes no context current, as before.
    unsafe { result::ctx::set_current(previous.unwrap_or(std::ptr::null_mut())) }
        .expect("restore the current context");
    out
}

impl TestGpu for CudaGpu {
    type Backend = CudaBackend;

    fn backend(&self) -> CudaBackend {
        CudaBackend::new()
    }

    fn device_count(&self) -> u32 {
        driver_device_count().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Binds the device's primary context to the calling thread.
    fn set_current_device(&self, device: DeviceId) {
        CudaBackend::new()
            .context(device)
            .expect("retain the primary context")
            .bind_to_thread()
            .expect("make the primary context current");
    }

    unsafe fn make_busy(&self, stream: StreamHandle, device: DeviceId) {
        // SAFETY: `stream` is a usable stream of `device` for a CUDA backend
        // (all of which share one id) until this call returns (the caller's
        // contract, `TestGpu::make_busy`'s `# Safety`), and the order ends
        // with this call (the gate does not keep it).
        let order = unsafe { AccessOrder::from_raw(&CudaBackend::new(), stream, device) };
        let gate = Gate::hold(order, GATE_TIMEOUT).expect("launch a gate kernel");
        self.gates().push((stream, gate));
    }

    unsafe fn finish(&self, stream: StreamHandle, device: DeviceId) {
        let gpu = CudaBackend::new();
        let mine: Vec<Gate> = {
            let mut gates = self.gates();
            let (mine, others) = gates.drain(..).partition(|(s, _)| *s == stream);
            *gates = others;
            mine.into_iter().map(|(_, g)| g).collect()
        };
        mine.iter().for_each(Gate::open);
        let deadline = Instant::now() + GRACE;
        // SAFETY: (both calls) `stream` is a usable stream of `device` for a
        // CUDA backend until this call returns (the caller's contract,
        // `TestGpu::finish`'s `# Safety`).
        while unsafe { gpu.query_stream(stream, device) }.expect("query a live stream")
            == Completion::Pending
        {
            if Instant::now() > deadline {
                // Waiting on another stream's gated work: let everything run.
                self.gates().iter().for_each(|(_, g)| g.open());
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // SAFETY: as above.
        unsafe { gpu.synchronize_stream(stream, device) }.expect("synchronize a live stream");
        drop(mine); // done: their slots are free again
    }

    unsafe fn submit(&self, stream: StreamHandle, device: DeviceId) {
        // SAFETY: as in `make_busy` (the caller's contract, `TestGpu::submit`'s
        // `# Safety`).
        let order = unsafe { AccessOrder::from_raw(&CudaBackend::new(), stream, device) };
        spin(order, SUBMITTED_WORK).expect("launch a spin kernel");
    }

    unsafe fn is_held(&self, stream: StreamHandle, device: DeviceId) -> bool {
        let gpu = CudaBackend::new();
        let deadline = Instant::now() + PATIENCE;
        loop {
            // SAFETY: `stream` is a usable stream of `device` for a CUDA
            // backend until this call returns (the caller's contract,
            // `TestGpu::is_held`'s `# Safety`).
            let state = unsafe { gpu.query_stream(stream, device) }.expect("query a live stream");
            if state == Completion::Complete {
                return false;
            }
            if Instant::now() > deadline {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Opens every gate of this machine, then synchronizes every device's
    /// primary context.
    fn quiesce(&self) {
        let gates = std::mem::take(&mut *self.gates());
        gates.iter().for_each(|(_, g)| g.open());
        for d in 0..self.device_count() {
            with_device(DeviceId(d), || {
                result::ctx::synchronize().expect("synchronize the device")
            });
        }
        drop(gates); // every kernel has ended: their slots are free again
    }

    fn live_streams(&self) -> Option<usize> {
        None
    }

    fn live_events(&self) -> Option<usize> {
        None
    }

    /// Records the event on a stream of its own, waits for it, and asks for
    /// the time between the event and itself: `CUDA_ERROR_INVALID_HANDLE`
    /// means timing is disabled.
    unsafe fn event_timing(&self, event: EventHandle, device: DeviceId) -> Option<bool> {
        let gpu = CudaBackend::new();
        let s = gpu
            .create_stream(device, StreamOptions::default())
            .expect("create a stream");
        // SAFETY: `event` is a usable event of `device` for a CUDA backend,
        // used by nothing else during this call (the caller's contract,
        // `TestGpu::event_timing`'s `# Safety`); `s` was created just above on
        // `device` by a CUDA backend and is destroyed only at the end.
        unsafe { gpu.record_event(event, s, device) }.expect("record the event");
        // SAFETY: as above.
        unsafe { gpu.synchronize_event(event, device) }.expect("synchronize the event");
        let raw = event.as_raw() as sys::CUevent;
        // SAFETY: a live event of `device`, recorded and complete, whose
        // context is current for the call.
        let timed = match with_device(device, || unsafe { result::event::elapsed(raw, raw) }) {
            Ok(_) => true,
            Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_HANDLE)) => false,
            Err(DriverError(other)) => panic!("cuEventElapsedTime failed: {other:?}"),
        };
        // SAFETY: `s` was created above on `device` by this backend and nothing
        // else has it.
        unsafe { gpu.destroy_stream(s, device) }.expect("destroy the stream");
        Some(timed)
    }
}

/// The machine for the CUDA run of the suite.
pub fn cuda() -> CudaGpu {
    CudaGpu::new()
}
