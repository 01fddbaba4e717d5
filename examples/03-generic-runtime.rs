//! 03-generic-runtime: a small runtime written once, generic over the backend,
//! run on whichever backend gpupool's features select.
//!
//! Every worker thread, every iteration:
//!
//! 1. leases an `upload` and a `compute` stream from the process-wide pool;
//! 2. copies its input to device scratch memory in `upload`'s order;
//! 3. orders `compute` after `upload` with a pooled event
//!    (`AccessOrder::wait`), and runs a kernel on `compute` that reads the
//!    input and writes `y[i] = 2 * x[i] + 1` into scratch memory of its own;
//! 4. orders `upload` after `compute` (the input's memory is released in
//!    `upload`'s order, and the kernel still reads it);
//! 5. reads the result back (stream-ordered, typed, no `unsafe`) and checks
//!    every element.
//!
//! The runtime (`run`) names no backend. What a runtime must bring per
//! backend is its kernels (`Kernels`): the mock runs them on the host at
//! once, the CUDA backend launches PTX through cudarc on the leased stream.
//!
//! ```sh
//! cargo run --release --example 03-generic-runtime                        # the mock
//! cargo run --release --example 03-generic-runtime --features cuda,nvrtc,cuda-12080  # an NVIDIA GPU
//! ```
//!
//! Prints a line `OK` and exits 0 when every element of every iteration is right,
//! exits 1 with the reason otherwise. With `cuda` on a machine without a
//! CUDA driver it says so and exits 0 (nothing to check there).

use std::process::ExitCode;

use gpupool::{
    DefaultBackend, DeviceId, DeviceSlice, EventPool, ScratchBackend, Scratchpad, StreamLease,
    StreamPool,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WORKERS: u32 = 4;
/// Elements per iteration: several thread blocks on a GPU, and not a multiple
/// of the block size, so the kernel's bounds check matters.
const ELEMENTS: usize = 100_003;

/// The kernels a runtime brings for one backend.
trait Kernels: ScratchBackend + Sized {
    /// Kernels loaded for one device.
    type Program: Send + Sync;

    /// Loads the kernels for `device`.
    fn load(&self, device: DeviceId) -> Result<Self::Program, BoxError>;

    /// `y[i] = 2 * x[i] + 1` for every `i`, queued on `stream`.
    fn affine(
        &self,
        program: &Self::Program,
        stream: &StreamLease<'_, Self>,
        y: &DeviceSlice<'_, f32>,
        x: &DeviceSlice<'_, f32>,
    ) -> Result<(), BoxError>;
}

/// The runtime: `WORKERS` threads, `iterations` each, on device 0. Returns the
/// number of elements checked.
fn run<B: Kernels>(
    backend: &B,
    streams: &StreamPool<B>,
    events: &EventPool<B>,
    iterations: usize,
) -> Result<usize, BoxError> {
    let device = DeviceId(0);
    let program = backend.load(device)?;
    let checked: Result<Vec<usize>, BoxError> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|worker| {
                let program = &program;
                scope.spawn(move || -> Result<usize, BoxError> {
                    let mut checked = 0;
                    for iteration in 0..iterations {
                        let upload = streams.get(device)?;
                        let compute = streams.get(device)?;
                        // Memory in each stream's order: the input is released
                        // in `upload`'s order, the output in `compute`'s.
                        let input_scratch = Scratchpad::new(backend, upload.order())?;
                        let output_scratch = Scratchpad::new(backend, compute.order())?;

                        let seed = (worker as usize * iterations + iteration) as f32;
                        let input: Vec<f32> =
                            (0..ELEMENTS).map(|i| seed + (i % 1000) as f32).collect();
                        let x = input_scratch.to_device(&input)?;
                        let y = output_scratch.device_slice::<f32>(ELEMENTS)?;

                        compute.order().wait(&upload.order(), events)?;
                        backend.affine(program, &compute, &y, &x)?;
                        // `x` is released in `upload`'s order: make `upload`
                        // wait for the kernel first, then release it (the
                        // kernel may still be running).
                        upload.order().wait(&compute.order(), events)?;
                        drop(input_scratch);

                        let result = output_scratch.to_host(&y)?;
                        for (i, (&got, &x)) in result.iter().zip(&input).enumerate() {
                            let want = 2.0 * x + 1.0;
                            if got != want {
                                return Err(format!(
                                    "worker {worker}, iteration {iteration}, element {i}: \
                                     {got} != 2 * {x} + 1"
                                )
                                .into());
                            }
                        }
                        checked += result.len();
                        // Drops: the output scratchpad releases its block in
                        // `compute`'s order, then the leases return the streams
                        // (busy ones to the pool's busy list).
                    }
                    Ok(checked)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker panicked"))
            .collect()
    });
    Ok(checked?.into_iter().sum())
}

fn main() -> ExitCode {
    let iterations: usize = std::env::var("GPUPOOL_EXAMPLE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    let backend: &DefaultBackend = gpupool::backend();
    let outcome = run(backend, gpupool::streams(), gpupool::events(), iterations)
        .and_then(|checked| check_ordering(iterations).map(|()| checked));
    match outcome {
        Ok(checked) => {
            let s = gpupool::streams().total_stats();
            println!(
                "{checked} elements checked ({WORKERS} workers x {iterations} iterations x {ELEMENTS}) on {}",
                backend_name()
            );
            println!(
                "streams: {} leases, {} created; events: {} leases, {} created",
                s.leases,
                s.created,
                gpupool::events().total_stats().leases,
                gpupool::events().total_stats().created
            );
            println!("OK");
            ExitCode::SUCCESS
        }
        Err(e) if no_driver(&*e) => {
            println!("no CUDA driver or GPU here: nothing to check ({e})");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("FAILED: {e}");
            let mut source = e.source();
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

// ---- the mock's kernels ------------------------------------------------------

#[cfg(all(feature = "mock", not(feature = "cuda")))]
fn backend_name() -> &'static str {
    "the mock backend"
}

#[cfg(all(feature = "mock", not(feature = "cuda")))]
fn no_driver(_: &(dyn std::error::Error + 'static)) -> bool {
    false
}

/// The same runtime once more, on a mock machine of its own whose work
/// completes only when something waits for it, so that work is still queued
/// when memory is released and streams are returned: the mock's hazard
/// detector then finds any release or reuse not ordered after the work that
/// uses the memory (drop the `upload.order().wait(..)` in `run` to see one).
#[cfg(all(feature = "mock", not(feature = "cuda")))]
fn check_ordering(iterations: usize) -> Result<(), BoxError> {
    use gpupool::mock::MockBackend;
    let gpu = MockBackend::new(1);
    let (streams, events) = (StreamPool::new(gpu.clone()), EventPool::new(gpu.clone()));
    run(&gpu, &streams, &events, iterations.min(5))?;
    drop((streams, events));
    gpu.complete_everything();
    match gpu.hazards().first() {
        None => Ok(()),
        Some(h) => Err(format!(
            "{} hazards on the mock; the first: {h}",
            gpu.hazards().len()
        )
        .into()),
    }
}

/// On a GPU, compute-sanitizer checks the ordering (`scripts/gpu-check.sh`).
#[cfg(feature = "cuda")]
fn check_ordering(_: usize) -> Result<(), BoxError> {
    Ok(())
}

#[cfg(feature = "mock")]
impl Kernels for gpupool::mock::MockBackend {
    type Program = ();

    fn load(&self, _: DeviceId) -> Result<(), BoxError> {
        Ok(())
    }

    fn affine(
        &self,
        _: &(),
        stream: &StreamLease<'_, Self>,
        y: &DeviceSlice<'_, f32>,
        x: &DeviceSlice<'_, f32>,
    ) -> Result<(), BoxError> {
        // Runs on the host at once; queued as one work item on the stream that
        // reads `x` and writes `y`, so the mock checks its ordering.
        self.launch_map(&stream.order(), x, y, |v| 2.0 * v + 1.0)?;
        Ok(())
    }
}

// ---- the CUDA backend's kernels ----------------------------------------------

#[cfg(all(feature = "cuda", not(feature = "nvrtc")))]
compile_error!(
    "with `cuda`, this example needs `nvrtc` too (cudarc's `Ptx`): --features cuda,nvrtc"
);

#[cfg(feature = "cuda")]
fn backend_name() -> &'static str {
    "the CUDA backend"
}

/// Whether the run failed only because there is no driver or no GPU.
#[cfg(feature = "cuda")]
fn no_driver(e: &(dyn std::error::Error + 'static)) -> bool {
    use gpupool::cuda::CudaError;
    match e.downcast_ref::<gpupool::DefaultError>() {
        Some(gpupool::Error::NoDevice) => true,
        Some(gpupool::Error::Backend { source, .. }) => matches!(source, CudaError::NoDriver),
        _ => matches!(e.downcast_ref::<CudaError>(), Some(CudaError::NoDriver)),
    }
}

#[cfg(all(feature = "cuda", feature = "nvrtc"))]
impl Kernels for gpupool::cuda::CudaBackend {
    type Program = gpupool::cuda::cudarc::driver::CudaFunction;

    fn load(&self, device: DeviceId) -> Result<Self::Program, BoxError> {
        use gpupool::cuda::cudarc::nvrtc::Ptx;
        let module = self
            .context(device)?
            .load_module(Ptx::from_src(gpupool::cuda::testing::AFFINE_PTX))?;
        Ok(module.load_function("affine")?)
    }

    fn affine(
        &self,
        program: &Self::Program,
        stream: &StreamLease<'_, Self>,
        y: &DeviceSlice<'_, f32>,
        x: &DeviceSlice<'_, f32>,
    ) -> Result<(), BoxError> {
        use gpupool::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
        use gpupool::cuda::DeviceSliceExt;
        let n = u32::try_from(x.len().min(y.len()))?;
        let (y, x) = (y.kernel_arg(), x.kernel_arg());
        gpupool::cuda::with_cudarc_stream(stream, |cuda_stream| {
            let mut launch = cuda_stream.launch_builder(program);
            launch.arg(&y).arg(&x).arg(&n);
            // SAFETY: `affine` takes (float *y, const float *x, unsigned n),
            // which the three arguments are, in order; it touches elements
            // below `n` only, and both slices hold at least `n` elements. Both
            // are scratch memory of this device that stays allocated until
            // their scratchpads release it in stream order after this launch:
            // `y` in this stream's order, `x` in an order that waits for this
            // stream before its scratchpad drops.
            unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.map(|_| ())
        })??;
        Ok(())
    }
}
