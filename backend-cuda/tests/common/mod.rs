//! Shared by the GPU test files: device checks, the kernels the tests launch
//! through cudarc, and small waiting helpers.
//!
//! Every GPU test is `#[ignore = "needs a CUDA GPU"]`; run them on the GPU
//! machine with `--include-ignored` (`scripts/gpu-check.sh` does). Run there
//! without a driver or a GPU, they fail with a message saying so.

#![allow(dead_code)] // each test file uses a different part

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpupool_core::{
    AccessOrder, Backend, Completion, DeviceId, EventPool, StreamBackend, StreamHandle, StreamPool,
};
use gpupool_cuda::cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use gpupool_cuda::cudarc::nvrtc::Ptx;
use gpupool_cuda::testing::Gate;
use gpupool_cuda::CudaBackend;

/// How long a gate kernel may run before it lets itself out: far longer than
/// any test needs, short enough that a failing test does not hang the run.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(10);

/// The device count; fails the test when there is no driver or no GPU.
pub fn device_count() -> u32 {
    let n = CudaBackend::new()
        .device_count()
        .unwrap_or_else(|e| panic!("this test needs a CUDA driver and GPU: {e}"));
    assert!(n > 0, "this test needs a CUDA GPU; the driver reports none");
    n
}

/// Whether there are at least `n` devices; prints why the test is skipped if
/// not.
pub fn has_devices(n: u32, test: &str) -> bool {
    let count = device_count();
    if count < n {
        eprintln!("{test}: skipped: needs {n} GPUs, the driver reports {count}");
    }
    count >= n
}

/// Checks that there is a GPU ([`device_count`]), then a backend and a
/// stream pool over it.
pub fn gpu_and_streams() -> (CudaBackend, StreamPool<CudaBackend>) {
    device_count();
    let gpu = CudaBackend::new();
    (gpu, StreamPool::new(gpu))
}

/// [`gpu_and_streams`] and an event pool over the backend as well.
pub fn gpu_and_pools() -> (CudaBackend, StreamPool<CudaBackend>, EventPool<CudaBackend>) {
    let (gpu, streams) = gpu_and_streams();
    (gpu, streams, EventPool::new(gpu))
}

/// A backend with a stream pool and an event pool over it (no device check:
/// for the tests that checked the device count themselves).
pub fn pools() -> (CudaBackend, StreamPool<CudaBackend>, EventPool<CudaBackend>) {
    let gpu = CudaBackend::new();
    (gpu, StreamPool::new(gpu), EventPool::new(gpu))
}

/// Checks that there is a GPU ([`device_count`]), makes device 0's primary
/// context current, then a backend and a stream pool over it.
pub fn device0_streams() -> (CudaBackend, StreamPool<CudaBackend>) {
    device_count();
    make_current(DeviceId(0));
    let gpu = CudaBackend::new();
    (gpu, StreamPool::new(gpu))
}

/// [`device0_streams`] and an event pool over the backend as well.
pub fn device0_pools() -> (CudaBackend, StreamPool<CudaBackend>, EventPool<CudaBackend>) {
    let (gpu, streams) = device0_streams();
    (gpu, streams, EventPool::new(gpu))
}

/// Makes `device`'s primary context current on the calling thread.
pub fn make_current(device: DeviceId) {
    CudaBackend::new()
        .context(device)
        .expect("retain the primary context")
        .bind_to_thread()
        .expect("bind the primary context");
}

/// The stream and device of `order`, checked to be a stream order of a CUDA
/// backend, for the helpers that hand it to the backend or to a raw driver
/// call. (`wait` refuses an order of another backend with `ForeignHandle`
/// and, waiting for host order, calls nothing else.)
///
/// The order borrows its stream (a lease's or an owned stream's order), names
/// a special stream, or came from `AccessOrder::from_raw`, whose caller
/// vouched for it: either way the stream is a usable stream of the device
/// while the order lives.
pub fn stream_of(order: AccessOrder<'_>) -> (StreamHandle, DeviceId) {
    order
        .wait(&AccessOrder::host(), gpupool_cuda::events())
        .expect("a stream order of a CUDA backend");
    let stream = order
        .stream_handle()
        .expect("a stream order, not host order");
    (stream, order.device().expect("a stream order has a device"))
}

/// Polls the stream of `order` until it is idle, failing the test after
/// `GATE_TIMEOUT`.
pub fn wait_idle(order: AccessOrder<'_>) {
    let gpu = CudaBackend::new();
    let (stream, device) = stream_of(order);
    let deadline = Instant::now() + GATE_TIMEOUT;
    // SAFETY: a usable stream of `device` (`stream_of`).
    while unsafe { gpu.query_stream(stream, device) }.expect("query") == Completion::Pending {
        assert!(
            Instant::now() < deadline,
            "stream still busy after {GATE_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until a gate's kernel has finished.
pub fn wait_gate(gate: &Gate) {
    let deadline = Instant::now() + GATE_TIMEOUT + Duration::from_secs(1);
    while !gate.is_done() {
        assert!(Instant::now() < deadline, "gate kernel never finished");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `fill(unsigned *x, unsigned n)`: `x[i] = i + 1`.
/// `twice_plus_one(unsigned *y, const unsigned *x, unsigned n)`: `y[i] = 2 * x[i] + 1`.
const KERNELS_PTX: &str = include_str!("../ptx/kernels.ptx");

/// The test kernels, loaded into one device's primary context.
pub struct Kernels {
    pub fill: CudaFunction,
    pub twice_plus_one: CudaFunction,
}

impl Kernels {
    /// Loads the kernels on `device`.
    pub fn load(device: DeviceId) -> Kernels {
        let ctx = CudaBackend::new().context(device).expect("context");
        let module = ctx
            .load_module(Ptx::from_src(KERNELS_PTX))
            .expect("load the test kernels");
        Kernels {
            fill: module.load_function("fill").expect("fill"),
            twice_plus_one: module
                .load_function("twice_plus_one")
                .expect("twice_plus_one"),
        }
    }

    /// Queues `x[i] = i + 1` on `stream`.
    pub fn fill(
        &self,
        stream: &Arc<CudaStream>,
        x: &mut gpupool_cuda::cudarc::driver::CudaSlice<u32>,
    ) {
        let n = x.len() as u32;
        let mut launch = stream.launch_builder(&self.fill);
        launch.arg(x).arg(&n);
        // SAFETY: `fill(unsigned *x, unsigned n)` with `x` holding `n` elements.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.expect("launch fill");
    }

    /// Queues `y[i] = 2 * x[i] + 1` on `stream`.
    pub fn twice_plus_one(
        &self,
        stream: &Arc<CudaStream>,
        y: &mut gpupool_cuda::cudarc::driver::CudaSlice<u32>,
        x: &gpupool_cuda::cudarc::driver::CudaSlice<u32>,
    ) {
        assert_eq!(x.len(), y.len());
        let n = x.len() as u32;
        let mut launch = stream.launch_builder(&self.twice_plus_one);
        launch.arg(y).arg(x).arg(&n);
        // SAFETY: `twice_plus_one(unsigned *y, const unsigned *x, unsigned n)`
        // with `x` and `y` holding `n` elements each.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.expect("launch twice_plus_one");
    }
}
