//! 05-async-service: thousands of concurrent requests on a few async runtime
//! threads, each leasing a stream, running a small kernel on scratch memory
//! and awaiting the GPU without blocking a thread.
//!
//! Each request (a tokio task) leases a stream from the process-wide pool,
//! uploads its input into scratch device memory, launches `y = 2x + 1` on it,
//! and `.await`s `order.completed(events)`: a pooled event recorded after
//! the kernel, watched by the event pool's completion engine (one thread),
//! which wakes the task when the GPU has passed it. Only then does the task
//! read the result back (the stream is idle by then: the read does not wait)
//! and check every element. [`REQUESTS`] tasks run on [`WORKERS`] runtime
//! threads; at most [`STREAMS`] hold a stream at once (a semaphore), so the
//! pool's streams are reused.
//!
//! On the mock (`cargo run --release --example 05-async-service`) a thread
//! plays the GPU: it runs whatever was queued every 50 µs. On a GPU:
//! `cargo run --release --example 05-async-service --features cuda,cuda-12080`
//! (the kernel is a hand-written PTX function launched through cudarc).

use std::sync::Arc;
use std::time::Instant;

use gpupool::Scratchpad;
use tokio::sync::Semaphore;

/// Any error of a request.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Requests in flight at once.
const REQUESTS: usize = 4096;
/// Elements per request.
const ELEMENTS: usize = 1024;
/// Runtime threads.
const WORKERS: usize = 4;
/// Requests that hold a stream at once.
const STREAMS: usize = 256;

fn main() -> Result<(), BoxError> {
    let gpu = gpu::start()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .build()?;
    let started = Instant::now();
    let checked = runtime.block_on(serve())?;
    let took = started.elapsed();
    gpu.stop();
    println!(
        "{REQUESTS} requests ({checked} elements checked) on {WORKERS} runtime threads in {:.1} ms; \
         streams created: {}, events created: {}",
        took.as_secs_f64() * 1e3,
        gpupool::streams().total_stats().created,
        gpupool::events().total_stats().created,
    );
    let found = gpupool::take_errors();
    assert!(found.is_clean(), "{found:?}");
    println!("OK");
    Ok(())
}

/// Spawns every request at once and waits for all of them.
async fn serve() -> Result<usize, BoxError> {
    let streams = Arc::new(Semaphore::new(STREAMS));
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|r| {
            let streams = Arc::clone(&streams);
            tokio::spawn(async move {
                let _held = streams.acquire().await.expect("never closed");
                request(r as u32).await
            })
        })
        .collect();
    let mut checked = 0;
    for t in tasks {
        checked += t.await.expect("a request panicked")?;
    }
    Ok(checked)
}

/// One request: upload, kernel, await the GPU, read back, check.
async fn request(r: u32) -> Result<usize, BoxError> {
    let lease = gpupool::streams().get(0)?;
    let scratch = Scratchpad::new(gpupool::backend(), lease.order())?;
    let input: Vec<f32> = (0..ELEMENTS as u32).map(|i| (r ^ i) as f32).collect();
    let x = scratch.to_device(&input)?;
    let y = scratch.device::<f32>(ELEMENTS)?;
    gpu::affine(&lease, &x, &y)?;
    // The task sleeps here until the GPU has run the kernel; the runtime
    // thread serves other requests meanwhile.
    lease.order().completed(gpupool::events())?.await?;
    let output = scratch.to_host(&y)?;
    for (i, (&x, &y)) in input.iter().zip(&output).enumerate() {
        assert_eq!(y, 2.0 * x + 1.0, "request {r}, element {i}");
    }
    Ok(output.len())
}

/// The mock: a thread that runs the queued work, and the kernel as a
/// simulated one.
#[cfg(not(feature = "cuda"))]
mod gpu {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;
    use std::time::Duration;

    use gpupool::{DeviceSlice, StreamLease};

    use super::BoxError;

    /// Runs the mock's queued work every 50 µs until dropped.
    pub struct Gpu(Arc<AtomicBool>, Option<JoinHandle<()>>);

    pub fn start() -> Result<Gpu, std::io::Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let theirs = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("mock-gpu".into())
            .spawn(move || {
                while !theirs.load(Ordering::Relaxed) {
                    gpupool::backend().complete_everything();
                    std::thread::sleep(Duration::from_micros(50));
                }
            })?;
        Ok(Gpu(stop, Some(thread)))
    }

    impl Gpu {
        /// Stops the thread (it runs what is queued once more on its way).
        pub fn stop(self) {}
    }

    impl Drop for Gpu {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
            if let Some(t) = self.1.take() {
                let _ = t.join();
            }
        }
    }

    /// `y = 2x + 1` on the lease's stream.
    pub fn affine(
        lease: &StreamLease<'_, gpupool::DefaultBackend>,
        x: &DeviceSlice<'_, f32>,
        y: &DeviceSlice<'_, f32>,
    ) -> Result<(), BoxError> {
        gpupool::backend().launch_map(&lease.order(), x, y, |v: f32| 2.0 * v + 1.0)?;
        Ok(())
    }
}

/// CUDA: the GPU is real; the kernel is PTX launched through cudarc.
#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::OnceLock;

    use gpupool::cuda::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
    use gpupool::cuda::cudarc::nvrtc::Ptx;
    use gpupool::cuda::{with_cudarc_stream, CudaError, DeviceSliceExt};
    use gpupool::{DeviceSlice, StreamLease};

    use super::{BoxError, ELEMENTS};

    /// The real GPU needs no thread to run its work.
    pub struct Gpu;

    impl Gpu {
        pub fn stop(self) {}
    }

    pub fn start() -> Result<Gpu, CudaError> {
        Ok(Gpu)
    }

    fn kernel() -> Result<&'static CudaFunction, CudaError> {
        static AFFINE: OnceLock<CudaFunction> = OnceLock::new();
        if let Some(f) = AFFINE.get() {
            return Ok(f);
        }
        let module = gpupool::backend()
            .context(gpupool::DeviceId(0))?
            .load_module(Ptx::from_src(gpupool::cuda::testing::AFFINE_PTX))?;
        let f = module.load_function("affine")?;
        Ok(AFFINE.get_or_init(|| f))
    }

    /// `y = 2x + 1` on the lease's stream.
    pub fn affine(
        lease: &StreamLease<'_, gpupool::DefaultBackend>,
        x: &DeviceSlice<'_, f32>,
        y: &DeviceSlice<'_, f32>,
    ) -> Result<(), BoxError> {
        let f = kernel()?;
        let n = ELEMENTS as u32;
        with_cudarc_stream(lease, |stream| {
            let (y_arg, x_arg) = (y.kernel_arg(), x.kernel_arg());
            let mut launch = stream.launch_builder(f);
            launch.arg(&y_arg).arg(&x_arg).arg(&n);
            // SAFETY: `affine` takes (float *y, const float *x, unsigned n):
            // `y` and `x` hold `n` elements each of scratch memory in this
            // stream's order, and the grid covers `n` threads.
            unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }
        })??;
        Ok(())
    }
}
