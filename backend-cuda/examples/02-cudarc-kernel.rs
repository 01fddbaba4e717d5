//! A pooled stream used through cudarc's safe API, without `unsafe` for the
//! stream: lease a stream from the process-wide pool, copy the input into
//! scratch device memory in the lease's order, load a hand-written PTX kernel
//! (`y[i] = 2 * x[i] + 1` over `f32`), launch it on the leased stream through
//! `with_cudarc_stream` with the scratch memory as kernel arguments
//! (`kernel_arg`), read the result back and check every element.
//!
//! ```sh
//! cargo run --release -p gpupool-cuda --example 02-cudarc-kernel
//! ```
//!
//! Prints `OK` and exits 0 when every element is right; exits 1 with the
//! reason on any failure. On a machine without a CUDA driver (or without a
//! GPU) it says so and exits 0: there is nothing to check there, and CI runs
//! it to show that the backend degrades to an error instead of a panic.

use std::error::Error;
use std::process::ExitCode;

use gpupool_core::{Error as PoolError, Scratchpad};
use gpupool_cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use gpupool_cuda::cudarc::nvrtc::Ptx;
use gpupool_cuda::{with_cudarc_stream, CudaBackend, CudaError, DeviceSliceExt};

/// Elements in the test vector: several blocks, the last one partly full.
const N: u32 = 100_003;

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("OK");
            ExitCode::SUCCESS
        }
        Err(Skip(why)) => {
            println!("skipped: {why}");
            ExitCode::SUCCESS
        }
        Err(Fail(e)) => {
            eprintln!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

use Outcome::{Fail, Skip};

/// Why `run` did not print OK.
enum Outcome {
    /// Nothing to run on (no driver, no GPU).
    Skip(String),
    /// Something went wrong.
    Fail(Box<dyn Error>),
}

impl<E: Into<Box<dyn Error>>> From<E> for Outcome {
    fn from(e: E) -> Self {
        Fail(e.into())
    }
}

fn run() -> Result<(), Outcome> {
    let pool = gpupool_cuda::streams();
    let lease = match pool.get(0) {
        Ok(lease) => lease,
        Err(PoolError::Backend {
            source: CudaError::NoDriver,
            ..
        }) => {
            return Err(Skip(
                "no CUDA driver on this machine (libcuda not found)".into(),
            ))
        }
        Err(PoolError::NoDevice) => return Err(Skip("the CUDA driver reports no GPU".into())),
        Err(e) => return Err(e.into()),
    };
    println!(
        "leased stream {:#x} on {} from the process-wide pool",
        lease.handle().as_raw(),
        lease.device()
    );

    let gpu = CudaBackend::new();
    let module = gpu
        .context(lease.device())?
        .load_module(Ptx::from_src(gpupool_cuda::testing::AFFINE_PTX))?;
    let affine = module.load_function("affine")?;

    let host_x: Vec<f32> = (0..N).map(|i| i as f32).collect();
    // Scratch memory in the lease's order: the copy in, the kernel and the
    // copy back all run on the leased stream, one after the other.
    let scratch = Scratchpad::new(&gpu, lease.order())?;
    let x = scratch.to_device(&host_x)?;
    let y = scratch.device::<f32>(N as usize)?;
    let n = N;
    with_cudarc_stream(&lease, |stream| {
        let (y_arg, x_arg) = (y.kernel_arg(), x.kernel_arg());
        let mut launch = stream.launch_builder(&affine);
        launch.arg(&y_arg).arg(&x_arg).arg(&n);
        // SAFETY: `affine` takes (float *y, const float *x, unsigned n): `y`
        // and `x` hold `n` elements each of scratch memory in this stream's
        // order, and the grid covers `n` threads.
        unsafe { launch.launch(LaunchConfig::for_num_elems(N)) }
    })??;
    let host_y = scratch.to_host(&y)?;
    drop(scratch);

    // Element by element against its input (zipped: a result of the wrong
    // length is reported below, not indexed past `host_x`'s end).
    let wrong: Vec<(usize, f32)> = host_y
        .iter()
        .zip(&host_x)
        .enumerate()
        .filter(|&(_, (&y, &x))| y != 2.0 * x + 1.0)
        .map(|(i, (&y, _))| (i, y))
        .take(5)
        .collect();
    if host_y.len() != N as usize || !wrong.is_empty() {
        return Err(Fail(
            format!(
                "{} elements back, first wrong (index, value): {wrong:?}",
                host_y.len()
            )
            .into(),
        ));
    }
    drop(lease);
    let stats = pool.total_stats();
    println!(
        "checked {N} elements; pool: {} stream(s) created, {} live lease(s)",
        stats.created, stats.live_leases
    );
    Ok(())
}
