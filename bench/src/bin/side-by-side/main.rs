//! gpupool against its baselines, side by side, in one run: event get+put,
//! stream lease+return and scratch rounds, each measured in the same process
//! as the baselines it is compared with (`gpupool_bench::baselines`).
//!
//! ```sh
//! # the mock backend (the pools' own overhead: the mock's calls cost little)
//! cargo run --release -p gpupool-bench --bin side-by-side
//! # a real GPU (the CUDA backend's figures)
//! cargo run --release -p gpupool-bench --features cuda --bin side-by-side -- --cuda
//! # either, with a plot of the throughput ratios
//! cargo run --release -p gpupool-bench --bin side-by-side -- --svg ratios.svg
//! ```
//!
//! What it measures:
//! - **Pools**: event get+put and stream lease+return (the default pool, and
//!   same-thread reuse as its own row) against the DALI-style pools, a
//!   `Mutex<Vec<_>>` pool and creating and destroying each time, at 1, 2, 4, 8
//!   and 16 threads (up to the cores there are). Every thread of a long-lived
//!   crew runs the operation `n` times after a barrier; throughput is all
//!   threads' operations over the wall time from the first thread's start to
//!   the last one's end, the time per operation is the median thread's.
//! - **Oversubscribed**: four threads per core, every operation timed on its
//!   own: p50, p99 and p99.9.
//! - **Scratch rounds on many threads** (pinned, device; 1 to 16 threads,
//!   each on a stream of its own): gpupool new each round, with learned
//!   sizes, reset reuse, and DALI-style new each round; time per round of
//!   the median thread and the driver allocation calls per round once warm.
//! - **Scratch rounds** of 16 allocations (1 B to 64 KiB) on one thread, per
//!   kind (host, pinned, device): gpupool's `Scratchpad` made anew each round
//!   (plain, and with `learn_sizes`: one block of the size the earlier rounds
//!   needed) and reset between rounds, DALI's scratchpad made anew each round, one
//!   plain allocation call per buffer (host: the system allocator; pinned:
//!   synchronous; device: stream-ordered), and for host memory bumpalo.
//!
//! Every variant is calibrated to take about the target time per measurement,
//! then the variants take turns, repeat after repeat; each figure is the
//! median over the repeats, and every ratio is formed from two medians of this
//! run. The targets section states each target of the performance issue with
//! the ratio measured and whether it is met.
//!
//! Output: markdown tables on stdout; JSON to `$OUT/side-by-side.json` when
//! `OUT` is set, else `target/side-by-side.json`; with `--svg PATH` one SVG
//! plot. `GPUPOOL_BENCH_QUICK=1` makes a smoke run of a few seconds;
//! `GPUPOOL_BENCH_MS` sets the time per measurement (default 100 ms). Ends
//! with `OK`. With `--cuda` and no driver or GPU it prints `skipped` and exits 0.

mod measure;
mod output;
mod report;
mod threads;

use std::process::ExitCode;
use std::time::Instant;

#[cfg(feature = "cuda")]
use gpupool_core::DeviceId;
use gpupool_core::{EventBackend, MemoryBackend, MemoryKind, StreamBackend};

use measure::{measure_pools, measure_scratch, Results, Settings};
use output::{to_json, to_svg};
use report::{about, report, targets};

/// A backend everything here runs on.
trait Machine: StreamBackend + EventBackend + MemoryBackend + Clone + Send + Sync + 'static {}
impl<T: StreamBackend + EventBackend + MemoryBackend + Clone + Send + Sync + 'static> Machine
    for T
{
}

const EVENT: &str = "event get+put";
const STREAM: &str = "stream lease+return";
const STICKY: &str = "stream lease+return, same-thread reuse";
const GPUPOOL: &str = "gpupool";
const DALI: &str = "DALI-style";
const MUTEX_VEC: &str = "Mutex<Vec>";
const CREATE: &str = "create+destroy";
/// The baselines of the pool tables, in column order.
const POOL_BASELINES: [&str; 3] = [DALI, MUTEX_VEC, CREATE];

/// 16 sizes between 1 B and 64 KiB (as in `benches/scratchpad.rs`).
const SIZES: [usize; 16] = [
    1, 24, 100, 512, 4096, 65536, 17, 3000, 8192, 40000, 64, 256, 1024, 12345, 50000, 2,
];
const ALIGN: usize = 8;
/// At most this many latency samples per repeat (8 bytes each).
const MAX_SAMPLES: usize = 4_000_000;

/// The variants of a scratch round, in the scratch table's column order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scratch {
    /// gpupool's `Scratchpad` made anew each round.
    New,
    /// The same with `learn_sizes`.
    Sized,
    /// One gpupool `Scratchpad`, reset between rounds.
    Reset,
    /// DALI's scratchpad made anew each round.
    Dali,
    /// One plain allocation call per buffer.
    Raw,
    /// bumpalo (host memory only).
    Bump,
}

impl Scratch {
    /// The variant's name in the report's rows and columns and in the JSON.
    const fn name(self) -> &'static str {
        match self {
            Scratch::New => "gpupool new each round",
            Scratch::Sized => "gpupool new each round, learned sizes",
            Scratch::Reset => "gpupool reset reuse",
            Scratch::Dali => "DALI-style new each round",
            Scratch::Raw => "raw calls",
            Scratch::Bump => "bumpalo",
        }
    }
}

/// Parsed command line.
struct Args {
    cuda: bool,
    svg: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        cuda: false,
        svg: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--cuda" => args.cuda = true,
            "--svg" => args.svg = Some(it.next().ok_or("--svg needs a path")?),
            "-h" | "--help" => {
                return Err("usage: side-by-side [--cuda] [--svg PATH]\n\
                            env: GPUPOOL_BENCH_QUICK=1 (a few seconds), GPUPOOL_BENCH_MS=N, OUT=DIR"
                    .into())
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(args)
}

/// Runs everything on `backend`; `leftovers` says what the backend still
/// holds afterwards, where it can tell.
fn run<B: Machine>(
    backend: B,
    name: String,
    args: &Args,
    plain: &dyn Fn(bool),
    driver_allocations: &dyn Fn(MemoryKind) -> Option<u64>,
    leftovers: impl Fn() -> Option<String>,
) -> ExitCode {
    let s = Settings::from_env();
    let a = about(name);
    eprintln!(
        "side-by-side: {}, {} cores, threads {:?} and {} oversubscribed, {} repeats of {} ms",
        a.backend,
        s.cores,
        s.threads,
        s.oversubscribed(),
        s.repeats(),
        s.target.as_millis()
    );
    let started = Instant::now();
    let mut r = Results::default();
    measure_pools(&backend, &s, &mut r);
    measure_scratch(&backend, &s, &mut r, plain);
    r.thread_rounds = threads::measure_scratch_threads(&backend, &s, plain, driver_allocations);
    let cuda = !a.backend.starts_with("mock");
    let t = targets(&r, &s, cuda);
    print!("{}", report(&r, &s, &a, &t));
    println!();
    let json = to_json(&r, &s, &a, &t);
    // `$OUT`, else the workspace's `target/` (where the build ran), else `./target`.
    let path = match std::env::var_os("OUT") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(|root| root.join("target"))
            .filter(|t| t.is_dir())
            .unwrap_or_else(|| "target".into()),
    }
    .join("side-by-side.json");
    let written = match path.parent() {
        Some(dir) => std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, json)),
        None => std::fs::write(&path, json),
    };
    match written {
        Ok(()) => println!("JSON: {}", path.display()),
        Err(e) => {
            eprintln!("could not write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(svg) = &args.svg {
        if let Err(e) = std::fs::write(svg, to_svg(&r, &s, &a)) {
            eprintln!("could not write {svg}: {e}");
            return ExitCode::FAILURE;
        }
        println!("SVG: {svg}");
    }
    if let Some(left) = leftovers() {
        eprintln!("the backend still holds {left} after every pool was purged");
        return ExitCode::FAILURE;
    }
    println!("took {:.1} s", started.elapsed().as_secs_f64());
    println!("OK");
    ExitCode::SUCCESS
}

#[cfg(feature = "cuda")]
fn run_cuda(args: &Args) -> ExitCode {
    use gpupool_cuda::CudaBackend;
    let gpu = CudaBackend::new();
    match gpupool_core::Backend::device_count(&gpu) {
        Ok(0) => return skipped("no CUDA GPU"),
        Err(e) => return skipped(&e.to_string()),
        Ok(_) => {}
    }
    let name = gpu
        .context(DeviceId(0))
        .ok()
        .and_then(|c| c.name().ok())
        .unwrap_or_else(|| "GPU 0".into());
    // The baselines' scratch rounds run without the backend's same-stream
    // device cache and without the idle-stream question on pinned frees
    // (DALI has neither: its device figures are what the plain driver pool
    // costs, and its pinned pool records an event at every stream-ordered
    // free), gpupool's with both.
    let plain = |on: bool| {
        gpu.set_device_cache(!on);
        gpu.set_idle_probe(!on);
    };
    let driver_allocations = move |kind: MemoryKind| {
        gpu.memory_stats(DeviceId(0))
            .ok()
            .map(|m| m.upstream_allocations[kind.index()])
    };
    run(
        gpu,
        format!("CUDA backend, {name}"),
        args,
        &plain,
        &driver_allocations,
        || None,
    )
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_: &Args) -> ExitCode {
    skipped("built without the `cuda` feature (add `--features cuda`)")
}

/// Says why the run is skipped; a skip is a success.
fn skipped(why: &str) -> ExitCode {
    println!("skipped: {why}");
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if args.cuda {
        return run_cuda(&args);
    }
    let mock = gpupool_mock::MockBackend::new(1);
    let probe = mock.clone();
    let counter = mock.clone();
    // The mock's allocation calls of every kind (it does not count them per
    // kind; the kinds are measured one at a time).
    let driver_allocations = move |_: MemoryKind| {
        use gpupool_mock::CallKind;
        Some(counter.calls(CallKind::Allocate) + counter.calls(CallKind::AllocateAsync))
    };
    run(
        mock,
        "mock backend".into(),
        &args,
        &|_| {},
        &driver_allocations,
        move || {
            let (s, e) = (probe.live_streams(), probe.live_events());
            (s + e > 0).then(|| format!("{s} streams and {e} events"))
        },
    )
}
