//! What the driver calls on the scratch paths cost per thread when 1 to 16
//! threads make them at once, each thread on its own stream and event (no
//! gpupool code in the timed loops): the figures behind the design of the
//! per-thread scratch caches (`docs/scratch-scaling.md`).
//!
//! For each call and thread count: every thread makes the call `CALLS`
//! times in a loop, started together; the figure is the median over threads
//! of ns per call, median of `REPEATS` runs. Prints a table and "OK".
//! Without a driver or a GPU it says "skipped" and exits 0.
//!
//! `cargo run --release -p gpupool-bench --bin driver-scaling`

use std::ffi::c_ulonglong;
use std::sync::Barrier;
use std::time::Instant;

use gpupool_bench::sys_stats::upper_median as median;
use gpupool_cuda::cudarc::driver::{result, sys};

const CALLS: usize = 20_000;
const REPEATS: usize = 3;
const THREADS: [usize; 3] = [1, 4, 16];

/// The calls measured.
#[derive(Copy, Clone, Debug)]
enum Call {
    StreamQuery,
    EventQuery,
    EventRecord,
    EventRecordQuery,
    StreamGetId,
    StreamIsCapturing,
    CtxGetCurrent,
}

const CALLS_MEASURED: [Call; 7] = [
    Call::StreamQuery,
    Call::EventQuery,
    Call::EventRecord,
    Call::EventRecordQuery,
    Call::StreamGetId,
    Call::StreamIsCapturing,
    Call::CtxGetCurrent,
];

fn ok(r: sys::CUresult, what: &str) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

/// One thread's run: ns per call.
fn run_thread(ctx: sys::CUcontext, call: Call, start: &Barrier) -> f64 {
    // SAFETY: (every call below) the context is the primary context of
    // device 0, retained by `main` for the whole run; the stream and event are
    // created here, used only by this thread, and destroyed at the end.
    unsafe {
        ok(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
        let non_blocking = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        let no_timing = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        let mut stream = std::ptr::null_mut();
        ok(
            sys::cuStreamCreate(&mut stream, non_blocking),
            "cuStreamCreate",
        );
        let mut event = std::ptr::null_mut();
        ok(sys::cuEventCreate(&mut event, no_timing), "cuEventCreate");
        ok(sys::cuEventRecord(event, stream), "cuEventRecord");
        ok(sys::cuEventSynchronize(event), "cuEventSynchronize");
        start.wait();
        let t = Instant::now();
        for _ in 0..CALLS {
            match call {
                Call::StreamQuery => ok(sys::cuStreamQuery(stream), "cuStreamQuery"),
                Call::EventQuery => ok(sys::cuEventQuery(event), "cuEventQuery"),
                Call::EventRecord => ok(sys::cuEventRecord(event, stream), "cuEventRecord"),
                Call::EventRecordQuery => {
                    ok(sys::cuEventRecord(event, stream), "cuEventRecord");
                    let _ = sys::cuEventQuery(event);
                }
                Call::StreamGetId => {
                    let mut id: c_ulonglong = 0;
                    ok(sys::cuStreamGetId(stream, &mut id), "cuStreamGetId");
                }
                Call::StreamIsCapturing => {
                    let mut s = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
                    ok(
                        sys::cuStreamIsCapturing(stream, &mut s),
                        "cuStreamIsCapturing",
                    );
                }
                Call::CtxGetCurrent => {
                    let mut c = std::ptr::null_mut();
                    ok(sys::cuCtxGetCurrent(&mut c), "cuCtxGetCurrent");
                }
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / CALLS as f64;
        ok(sys::cuStreamSynchronize(stream), "cuStreamSynchronize");
        ok(sys::cuEventDestroy_v2(event), "cuEventDestroy");
        ok(sys::cuStreamDestroy_v2(stream), "cuStreamDestroy");
        ns
    }
}

fn main() {
    // Asked through the backend first: cudarc's own calls panic where no
    // driver library loads.
    if gpupool_bench::gpu::cuda_or_skip().is_none() {
        return;
    }
    result::init().expect("cuInit");
    let dev = result::device::get(0).expect("device 0");
    // SAFETY: device 0 exists; the primary context is released at the end.
    let ctx = unsafe { result::primary_ctx::retain(dev) }.expect("primary context");
    let ctx_addr = ctx as usize;
    println!(
        "| call | {} |",
        THREADS.map(|t| format!("{t} thr ns/call")).join(" | ")
    );
    println!("|---|{}", "---|".repeat(THREADS.len()));
    for call in CALLS_MEASURED {
        let mut row = Vec::new();
        for threads in THREADS {
            let mut runs = Vec::new();
            for _ in 0..REPEATS {
                let start = Barrier::new(threads);
                let per_thread: Vec<f64> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..threads)
                        .map(|_| {
                            let start = &start;
                            s.spawn(move || run_thread(ctx_addr as sys::CUcontext, call, start))
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                runs.push(median(per_thread));
            }
            row.push(format!("{:.0}", median(runs)));
        }
        println!("| {call:?} | {} |", row.join(" | "));
    }
    // SAFETY: retained above; nothing uses it any more.
    unsafe { result::primary_ctx::release(dev) }.expect("release");
    println!("OK");
}
