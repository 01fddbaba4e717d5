//! Soak: the demo runtime's workload on a real GPU for a fixed time, every
//! result checked, GPU memory sampled throughout and required to stay flat.
//!
//! ```sh
//! GPUPOOL_SOAK_SECONDS=300 cargo run --release -p gpupool-bench --bin soak
//! ```
//!
//! Each worker thread, every iteration: leases a stream from the process-wide
//! pool, fills pinned scratch with a pattern, copies it to device scratch on
//! its upload stream, orders the leased stream after the upload stream with
//! `AccessOrder::wait` (a pooled event), copies device → device → pinned on
//! the leased stream, synchronizes it, checks every element, and resets its
//! scratchpad (stream-ordered reuse). The driver's free-memory figure is
//! sampled every few seconds after a warm-up; the run fails if it moves by
//! more than a small tolerance, or if any element is wrong. Prints `OK` at the
//! end. Without a driver or a GPU it says so and exits 0. Runs 30 s unless
//! `GPUPOOL_SOAK_SECONDS` says otherwise (the GPU check runs the default).

use std::process::ExitCode;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpupool_core::{Backend, DeviceId, MemoryBackend, Scratchpad, StreamBackend};
use gpupool_cuda::CudaBackend;

const WORKERS: usize = 8;
const ELEMS: usize = 64 * 1024;
/// Allowed drift of the driver's free-memory figure after warm-up.
const TOLERANCE: usize = 64 << 20;

fn free_bytes(gpu: &CudaBackend, d: DeviceId) -> usize {
    gpu.context(d).unwrap().bind_to_thread().unwrap();
    gpupool_cuda::cudarc::driver::result::mem_get_info()
        .unwrap()
        .0
}

fn main() -> ExitCode {
    let gpu = CudaBackend::new();
    match gpu.device_count() {
        Ok(0) => {
            println!("skipped: no GPU");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!("skipped: {e}");
            return ExitCode::SUCCESS;
        }
        Ok(_) => {}
    }
    let seconds: u64 = std::env::var("GPUPOOL_SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let d = DeviceId(0);
    let streams = gpupool_cuda::streams();
    let events = gpupool_cuda::events();
    let stop = AtomicBool::new(false);
    let iterations = AtomicU64::new(0);
    let bad = AtomicU64::new(0);
    let start = Instant::now();
    let mut samples = Vec::new();
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (stop, iterations, bad) = (&stop, &iterations, &bad);
            s.spawn(move || {
                let upload = streams.get(d).expect("upload stream");
                // The scratchpad's device order is the upload stream: its
                // `to_device` copies run there.
                let mut scratch = Scratchpad::new(&gpu, upload.order()).expect("scratchpad");
                let mut i: u32 = 0;
                while !stop.load(Ordering::Relaxed) {
                    let work = streams.get(d).expect("stream");
                    let seed = (w as u32) << 24 | i;
                    let src = scratch.pinned::<u32>(ELEMS).expect("pinned");
                    for (k, x) in src.iter_mut().enumerate() {
                        x.write(seed ^ k as u32);
                    }
                    // SAFETY: every element was just written.
                    let src: &[u32] = unsafe { &*(src as *const _ as *const [u32]) };
                    let a = scratch.to_device(src).expect("to device");
                    let b = scratch.device::<u32>(ELEMS).expect("device");
                    let out = scratch.pinned::<u32>(ELEMS).expect("pinned out");
                    let out_ptr = NonNull::new(out.as_mut_ptr().cast::<u8>()).unwrap();
                    work.order().wait(&upload.order(), events).expect("wait");
                    let bytes = ELEMS * 4;
                    // SAFETY: `work` holds this live stream of `d`; live scratch
                    // blocks of `bytes`, ordered after the upload by the wait;
                    // `src` is not touched again until the round ends (the
                    // scratchpad resets after the sync below).
                    unsafe {
                        gpu.copy_async(
                            NonNull::new(b.as_ptr().cast()).unwrap(),
                            NonNull::new(a.as_ptr().cast()).unwrap(),
                            bytes,
                            work.handle(),
                            d,
                        )
                        .expect("d2d");
                        gpu.copy_async(
                            out_ptr,
                            NonNull::new(b.as_ptr().cast()).unwrap(),
                            bytes,
                            work.handle(),
                            d,
                        )
                        .expect("d2h");
                    }
                    // SAFETY: `work` holds this live stream of `d`.
                    unsafe { gpu.synchronize_stream(work.handle(), d) }.expect("sync");
                    // SAFETY: the copy into `out` has completed (synchronized).
                    let out: &[u32] = unsafe { &*(out as *const _ as *const [u32]) };
                    if out.iter().enumerate().any(|(k, &x)| x != seed ^ k as u32) {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(work);
                    scratch.reset().expect("reset");
                    i = i.wrapping_add(1);
                    iterations.fetch_add(1, Ordering::Relaxed);
                }
                drop(scratch);
            });
        }
        // Sampler: after a 10 s warm-up, every 5 s.
        let warm = Duration::from_secs(10.min(seconds / 3));
        while start.elapsed() < Duration::from_secs(seconds) {
            std::thread::sleep(Duration::from_millis(500));
            if start.elapsed() >= warm
                && samples.len() as u64 * 5 <= (start.elapsed() - warm).as_secs()
            {
                samples.push(free_bytes(&gpu, d));
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let n = iterations.load(Ordering::Relaxed);
    let wrong = bad.load(Ordering::Relaxed);
    let (lo, hi) = (
        *samples.iter().min().unwrap_or(&0),
        *samples.iter().max().unwrap_or(&0),
    );
    let s = streams.total_stats();
    println!(
        "soak: {seconds} s, {WORKERS} workers, {n} iterations ({} elements checked), {wrong} wrong",
        n * ELEMS as u64
    );
    println!(
        "stream pool: {} leases, {} created; event pool: {} leases, {} created",
        s.leases,
        s.created,
        events.total_stats().leases,
        events.total_stats().created
    );
    println!(
        "free GPU memory over {} samples after warm-up: min {} MiB, max {} MiB, drift {} MiB (tolerance {} MiB)",
        samples.len(),
        lo >> 20,
        hi >> 20,
        (hi - lo) >> 20,
        TOLERANCE >> 20
    );
    if wrong == 0 && n > 0 && samples.len() >= 2 && hi - lo <= TOLERANCE {
        println!("OK");
        ExitCode::SUCCESS
    } else {
        println!("FAILED");
        ExitCode::FAILURE
    }
}
