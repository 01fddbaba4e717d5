//! What each gpupool pool and scratchpad operation does today while a CUDA
//! graph capture is open (issue 14, step 1: measure), in each capture mode.
//!
//! Columns: the capture mode of a capture begun on the thread that runs the
//! operation (`global`, `thread-local`, `relaxed`), and `other thread`:
//! thread A begins a GLOBAL capture on its stream and waits while thread B
//! runs the operation on streams and events that are not in the capture.
//!
//! Every cell starts afresh: a new thread (new per-thread caches), new
//! stream and event pools, a capture origin leased from a pool of its own,
//! the gpupool memory pools trimmed. The capture is begun with a little
//! captured work (a memset on the origin), the operation runs, then the
//! capture's status is read on the origin (`cuStreamIsCapturing`), the
//! capture is ended, and a graph that came out is instantiated, launched
//! once and synchronized. Whatever the operation leaves to drop (leases,
//! raw allocations) is dropped only after the capture has ended, so only
//! the operation itself runs inside the capture. A cell is
//! `op result · status · end [· launch]`; the full error messages, parked
//! and lost errors, notes and memory counters follow the table.
//!
//! Row 10c runs in a fresh process (the first device allocation of the
//! process, which creates gpupool's memory pool, made inside the capture).
//!
//! Then the cost of the capture queries, one thread, 200k calls, median of
//! 5 runs. Prints everything (and writes `$OUT/capture-probe.md` when `OUT`
//! is set), then "OK". Without a driver or a GPU it says "skipped" and exits 0.
//!
//! `cargo run --release -p gpupool-bench --bin capture-probe`
//!
//! The files: `ops.rs` the operations (the rows), `env.rs` what an operation
//! sees, `cells.rs` and `threads.rs` how a cell runs (on the capturing
//! thread, on another thread, in a fresh process), `driver.rs` the raw
//! driver calls, `errors.rs` the errors, `timings.rs` the warm-up and the
//! query timings; this file the columns and the report.

mod cells;
mod driver;
mod env;
mod errors;
mod ops;
mod threads;
mod timings;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use gpupool_core::{set_lost_error_hook, Backend, DeviceId, StreamLease};
use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::{CudaBackend, CudaError};

use cells::CellOut;
use driver::bind_context;
use errors::lost_hook;
use ops::rows;
use threads::{child_main, run_cell, run_cell_in_child};
use timings::{timings, warm_up};

type GpuError = gpupool_core::Error<CudaError>;
type Lease = StreamLease<'static, CudaBackend>;

static GPU: CudaBackend = CudaBackend::new();
const D0: DeviceId = DeviceId(0);
/// How long any step of a cell may take before the cell is given up.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a whole cell may take.
const CELL_TIMEOUT: Duration = Duration::from_secs(25);
/// Cells not started by then are skipped (the run must stay well inside
/// the device lease).
const RUN_BUDGET: Duration = Duration::from_secs(180);
/// 32-bit words of the device buffer the captured memsets write.
const BUF_WORDS: usize = 1024;
const CALLS: usize = 200_000;
const REPEATS: usize = 5;

const SUCCESS: sys::CUresult = sys::CUresult::CUDA_SUCCESS;

// ---------------------------------------------------------------------------
// Columns

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Col {
    Global,
    ThreadLocal,
    Relaxed,
    OtherThread,
}

const COLS: [Col; 4] = [
    Col::Global,
    Col::ThreadLocal,
    Col::Relaxed,
    Col::OtherThread,
];

impl Col {
    fn title(self) -> &'static str {
        match self {
            Col::Global => "global",
            Col::ThreadLocal => "thread-local",
            Col::Relaxed => "relaxed",
            Col::OtherThread => "other thread",
        }
    }

    fn arg(self) -> &'static str {
        match self {
            Col::Global => "global",
            Col::ThreadLocal => "thread-local",
            Col::Relaxed => "relaxed",
            Col::OtherThread => "other",
        }
    }

    fn from_arg(s: &str) -> Option<Col> {
        COLS.into_iter().find(|c| c.arg() == s)
    }

    /// The mode of the capture thread A begins (GLOBAL for "other thread").
    fn mode(self) -> sys::CUstreamCaptureMode {
        use sys::CUstreamCaptureMode as M;
        match self {
            Col::Global | Col::OtherThread => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
            Col::ThreadLocal => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            Col::Relaxed => M::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

// ---------------------------------------------------------------------------

fn device_info() -> String {
    let mut v: i32 = 0;
    let mut name = [0 as std::ffi::c_char; 128];
    let mut dev: sys::CUdevice = 0;
    // SAFETY: out-pointers; the driver is initialised (device_count).
    unsafe {
        sys::cuDriverGetVersion(&mut v);
        sys::cuDeviceGet(&mut dev, 0);
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev);
    }
    // SAFETY: cuDeviceGetName writes a NUL-terminated string (the buffer
    // starts zeroed, so it is terminated even if the call failed).
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy();
    format!("{name}, driver API {}.{}", v / 1000, (v % 1000) / 10)
}

fn main() {
    match GPU.device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => {
            println!("skipped: the CUDA driver reports no GPU");
            return;
        }
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    }
    set_lost_error_hook(Some(lost_hook));
    if let Err(e) = bind_context() {
        println!("skipped: cannot make device 0's primary context current: {e}");
        return;
    }
    // The device buffer the captured memsets write, and the stream graphs
    // are launched on: raw driver objects, so that gpupool's memory state
    // is untouched by them.
    let mut buf: sys::CUdeviceptr = 0;
    let mut launch: sys::CUstream = std::ptr::null_mut();
    // SAFETY: out-pointers; the context is current.
    let (a, b) = unsafe {
        (
            sys::cuMemAlloc_v2(&mut buf, BUF_WORDS * 4),
            sys::cuStreamCreate(
                &mut launch,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ),
        )
    };
    assert_eq!((a, b), (SUCCESS, SUCCESS), "buffer and launch stream");
    let launch = launch as usize;

    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--cell" {
        child_main(&args[2], &args[3], buf, launch);
        return;
    }

    let mut md = String::new();
    let _ = writeln!(md, "# gpupool under CUDA graph capture: probe\n");
    let _ = writeln!(md, "Device: {}\n", device_info());
    let _ = writeln!(
        md,
        "Cell: `op result · capture status right after (cuStreamIsCapturing on the origin) · cuStreamEndCapture · graph launch`. \
         `+parked(..)`: an error a lease's drop parked in its pool; `+lost(..)`: an error a drop reported to the lost-error hook.\n"
    );
    if let Err(e) = warm_up() {
        let _ = writeln!(md, "!! warm-up failed: {e}\n");
    }
    let rows = rows();
    let mut results: Vec<Vec<CellOut>> = Vec::new();
    let started = Instant::now();
    for (i, row) in rows.iter().enumerate() {
        let mut line = Vec::new();
        for col in COLS {
            if started.elapsed() > RUN_BUDGET {
                line.push(CellOut {
                    op: "not run (time budget)".into(),
                    status: "-".into(),
                    end: "-".into(),
                    ..CellOut::default()
                });
                continue;
            }
            let mut out = if row.fresh_process {
                run_cell_in_child(&row.id, col)
            } else {
                run_cell(i, col, buf, launch, true)
            };
            if let Err(e) = GPU.trim_memory(D0) {
                out.details.push(format!("trim after the cell: {e}"));
            }
            line.push(out);
        }
        results.push(line);
    }
    let cells_took = started.elapsed();

    let _ = writeln!(
        md,
        "| # | operation | {} |",
        COLS.map(Col::title).join(" | ")
    );
    let _ = writeln!(md, "|---|---|{}", "---|".repeat(COLS.len()));
    for (row, line) in rows.iter().zip(&results) {
        let cells: Vec<String> = line.iter().map(|c| c.cell().replace('|', "\\|")).collect();
        let _ = writeln!(md, "| {} | {} | {} |", row.id, row.name, cells.join(" | "));
    }

    let _ = writeln!(md, "\n## Graphs that came out (nodes by type; edges)\n");
    let _ = writeln!(md, "| # | {} |", COLS.map(Col::title).join(" | "));
    let _ = writeln!(md, "|---|{}", "---|".repeat(COLS.len()));
    for (row, line) in rows.iter().zip(&results) {
        let cells: Vec<String> = line
            .iter()
            .map(|c| {
                if c.graph.is_empty() {
                    "-".into()
                } else {
                    c.graph.clone()
                }
            })
            .collect();
        let _ = writeln!(md, "| {} | {} |", row.id, cells.join(" | "));
    }

    let _ = writeln!(md, "\nCells took {:.1} s.", cells_took.as_secs_f64());
    let _ = writeln!(md, "\n## Details\n");
    for (row, line) in rows.iter().zip(&results) {
        for (col, c) in COLS.iter().zip(line) {
            for d in &c.details {
                let _ = writeln!(md, "- {} {} / {}: {}", row.id, row.name, col.title(), d);
            }
        }
    }

    let _ = writeln!(
        md,
        "\n## Timings (one thread, {CALLS} calls, median of {REPEATS})\n"
    );
    let _ = writeln!(md, "| call | ns/call |");
    let _ = writeln!(md, "|---|---|");
    for (name, v) in timings() {
        let _ = writeln!(md, "| {name} | {v} |");
    }

    print!("{md}");
    if let Ok(dir) = std::env::var("OUT") {
        let path = std::path::Path::new(&dir).join("capture-probe.md");
        if let Err(e) = std::fs::write(&path, &md) {
            println!("could not write {}: {e}", path.display());
        }
    }
    println!("OK");
}
