//! The acceptance suite's machine on a real GPU: [`CudaGpu`] implements
//! [`TestGpu`] over the CUDA backend (`--features cuda`).
//!
//! [`make_busy`](TestGpu::make_busy) queues a gate kernel
//! ([`gpupool_cuda::testing::Gate`]) that runs until the test calls
//! [`finish`](TestGpu::finish) on that stream, so a stream stays pending
//! exactly as long as on the mock, not for a fixed time that a slow run could
//! outlast. `finish` opens the stream's gates and synchronizes the stream. The
//! driver cannot count live streams or events, so those answers are `None`.
//!
//! One difference from the mock remains: if a stream waits (through an event)
//! on *another* stream's gated work, `finish` on it opens every gate after a
//! short grace period, which also finishes the other stream's work (the mock
//! completes only up to the point waited for).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpupool_core::{Completion, DeviceId, StreamBackend, StreamHandle};
use gpupool_cuda::testing::Gate;
use gpupool_cuda::CudaBackend;

use crate::TestGpu;

/// How long a gate kernel runs when nobody opens it: far longer than any test
/// step, short enough that a test that forgot to finish a stream ends.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `finish` waits for a stream after opening its own gates before it
/// opens everyone's (the stream then waits on another stream's gated work).
const GRACE: Duration = Duration::from_millis(200);

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

impl TestGpu for CudaGpu {
    type Backend = CudaBackend;

    fn backend(&self) -> CudaBackend {
        CudaBackend::new()
    }

    fn make_busy(&self, stream: StreamHandle, device: DeviceId) {
        let gate = Gate::hold(stream, device, GATE_TIMEOUT).expect("launch a gate kernel");
        self.gates().push((stream, gate));
    }

    fn finish(&self, stream: StreamHandle, device: DeviceId) {
        let gpu = CudaBackend::new();
        let mine: Vec<Gate> = {
            let mut gates = self.gates();
            let (mine, others) = gates.drain(..).partition(|(s, _)| *s == stream);
            *gates = others;
            mine.into_iter().map(|(_, g)| g).collect()
        };
        mine.iter().for_each(Gate::open);
        let deadline = Instant::now() + GRACE;
        while gpu
            .query_stream(stream, device)
            .expect("query a live stream")
            == Completion::Pending
        {
            if Instant::now() > deadline {
                // Waiting on another stream's gated work: let everything run.
                self.gates().iter().for_each(|(_, g)| g.open());
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        gpu.synchronize_stream(stream, device)
            .expect("synchronize a live stream");
        drop(mine); // done: their slots are free again
    }

    fn live_streams(&self) -> Option<usize> {
        None
    }

    fn live_events(&self) -> Option<usize> {
        None
    }
}

/// The machine for the CUDA run of the suite.
pub fn cuda() -> CudaGpu {
    CudaGpu::new()
}
