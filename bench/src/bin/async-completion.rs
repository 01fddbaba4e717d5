//! Async completion benchmark: four ways of making GPU completion awaitable
//! from async Rust, side by side in one process, on the same streams and the
//! same kernel (see the `gpupool-bench` crate docs and `src/designs/`):
//!
//! - (a) `a-gpupool`: `AccessOrder::completed` (gpupool's futures: the
//!   first poll asks about the event for up to `--spin-budget-us`, then one
//!   "gpupool-completion" engine thread per event pool watches it);
//! - (a0) `a0-gpupool-nospin`: the same with the pool's completion spin
//!   off, so every pending future goes to the engine;
//! - (b) `b-spawn_blocking`: pooled event + `cuEventSynchronize` in
//!   `spawn_blocking`;
//! - (c) `c-launch_host_func`: a `cuLaunchHostFunc` waker per future;
//! - (d) `d-cutile`: cutile-rs's cuda-async tiers (20 µs `cuStreamQuery`
//!   spin, flag-write reactor, `cuLaunchHostFunc` fallback);
//! - (d0) `d0-cutile-nospin`: the same with a spin budget of 0, so every
//!   future goes through the reactor (or the fallback): with kernels shorter
//!   than the budget the spin settles nearly every future of (d).
//!
//! Each at 1, 100 and 10,000 futures in flight (`F`) and 1, 4 and 16
//! submitting threads (`T`); cells are repeated (3 times by default, the
//! design order rotating each time) and the medians printed. Per request:
//! one one-thread kernel that spins `--work-us` on `%globaltimer`, then
//! writes its finish time into pinned mapped host memory; wake latency is the
//! host time the future resolved (its task running again) minus that finish
//! time, notify latency the time the design called `wake` minus it, through
//! `%globaltimer` calibrations made just before and after each run (the
//! offset interpolated between them).
//!
//! Build here (no GPU needed), copy, run on the GPU machine:
//!
//! ```sh
//! cargo build --release -p gpupool-bench
//! mkdir -p .gpu && cp target/release/async-completion .gpu/
//! # on the GPU machine (builds nothing; writes under $OUT):
//! bash scripts/async-bench.sh            # full run, about 2 minutes
//! bash scripts/async-bench.sh --quick    # a smoke run, well under a minute
//! ```
//!
//! Options: `--quick`, `--work-us D` (10), `--duration-ms` (500),
//! `--warmup-ms` (100), `--reps` (3), `--inflight 1,100,10000`,
//! `--threads 1,4,16`, `--streams-per-thread` (4), `--designs a,a0,b,c,d,d0`,
//! `--spin-budget-us` (20, designs a and d), `--calib-rounds` (1000),
//! `--budget-s` (200: later repetitions are skipped past it), `--out DIR`
//! (default `$OUT`, else `.`). Without a GPU it prints `skipped: <why>` and
//! exits 0; it exits 1 when a run had errors or a future resolved before its
//! kernel's timestamp was visible (an early wake-up), after printing
//! everything.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use gpupool_bench::designs::blocking::Blocking;
use gpupool_bench::designs::cutile::{Cutile, ReactorHandle};
use gpupool_bench::designs::gpupool::GpupoolFutures;
use gpupool_bench::designs::hostfn::HostFn;
use gpupool_bench::designs::Design;
use gpupool_bench::gpu::{host_ns, Calibration, Gpu, SetupError};
use gpupool_bench::harness::{run_cell, runtime, CellConfig, CellResult};
use gpupool_bench::report::{summarize, table, write_csv, Run};
use gpupool_core::EventPool;
use gpupool_cuda::CudaBackend;
use tokio::runtime::Runtime;

/// The command line.
struct Options {
    work_ns: u64,
    duration: Duration,
    warmup: Duration,
    reps: usize,
    inflight: Vec<usize>,
    threads: Vec<usize>,
    streams_per_thread: usize,
    designs: Vec<String>,
    spin_budget: Duration,
    calib_rounds: usize,
    budget: Duration,
    out: PathBuf,
    quick: bool,
}

fn list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|x| {
            x.trim()
                .replace('_', "")
                .parse::<usize>()
                .map_err(|e| format!("{x}: {e}"))
        })
        .collect()
}

fn parse() -> Result<Options, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Options {
        work_ns: 10_000,
        duration: Duration::from_millis(if quick { 150 } else { 500 }),
        warmup: Duration::from_millis(if quick { 50 } else { 100 }),
        reps: if quick { 1 } else { 3 },
        inflight: vec![1, 100, 10_000],
        threads: vec![1, 4, 16],
        streams_per_thread: 4,
        designs: ["a", "a0", "b", "c", "d", "d0"].map(String::from).to_vec(),
        spin_budget: Duration::from_micros(20),
        calib_rounds: 1000,
        budget: Duration::from_secs(200),
        out: std::env::var_os("OUT").map_or_else(|| PathBuf::from("."), PathBuf::from),
        quick,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--quick" {
            continue;
        }
        if a == "--help" || a == "-h" {
            return Err(
                "usage: async-completion [--quick] [--work-us D] [--duration-ms N] \
                 [--warmup-ms N] [--reps N] [--inflight 1,100,10000] [--threads 1,4,16] \
                 [--streams-per-thread 4] [--designs a,a0,b,c,d,d0] [--spin-budget-us 20] \
                 [--calib-rounds 1000] [--budget-s 200] [--out DIR]"
                    .into(),
            );
        }
        let v = it.next().ok_or(format!("{a} needs a value"))?;
        let float = |v: &str| v.parse::<f64>().map_err(|e| format!("{a} {v}: {e}"));
        let int = |v: &str| v.parse::<u64>().map_err(|e| format!("{a} {v}: {e}"));
        match a.as_str() {
            "--work-us" => o.work_ns = (float(v)? * 1e3) as u64,
            "--duration-ms" => o.duration = Duration::from_millis(int(v)?),
            "--warmup-ms" => o.warmup = Duration::from_millis(int(v)?),
            "--reps" => o.reps = int(v)?.max(1) as usize,
            "--inflight" => o.inflight = list(v)?,
            "--threads" => o.threads = list(v)?,
            "--streams-per-thread" => o.streams_per_thread = int(v)?.max(1) as usize,
            "--designs" => o.designs = v.split(',').map(|d| d.trim().to_string()).collect(),
            "--spin-budget-us" => o.spin_budget = Duration::from_nanos((float(v)? * 1e3) as u64),
            "--calib-rounds" => o.calib_rounds = int(v)? as usize,
            "--budget-s" => o.budget = Duration::from_secs(int(v)?),
            "--out" => o.out = PathBuf::from(v),
            _ => return Err(format!("unknown option {a} (--help)")),
        }
    }
    if o.threads.contains(&0) || o.inflight.contains(&0) {
        return Err("thread and in-flight counts start at 1".into());
    }
    Ok(o)
}

/// The designs built for this run.
struct Designs {
    gpu: &'static Gpu,
    a: Option<&'static GpupoolFutures>,
    a0: Option<&'static GpupoolFutures>,
    b: Option<&'static Blocking>,
    c: Option<&'static HostFn>,
    d: Option<&'static Cutile>,
    d0: Option<&'static Cutile>,
}

impl Designs {
    fn build(o: &Options, gpu: &'static Gpu) -> Result<Designs, String> {
        let want = |c: &str| o.designs.iter().any(|d| d == c);
        let reactor = if want("d") || want("d0") {
            Some(ReactorHandle::start()?)
        } else {
            None
        };
        // Each gpupool design its own pool (the spin is the pool's setting).
        let gpupool = |spin: Duration, name: &'static str| -> &'static GpupoolFutures {
            let events: &'static EventPool<CudaBackend> =
                Box::leak(Box::new(EventPool::new(CudaBackend::new())));
            events.set_completion_spin(spin);
            Box::leak(Box::new(GpupoolFutures::new(events, name)))
        };
        let cutile = |budget: Duration, name: &'static str| -> Option<&'static Cutile> {
            reactor.map(|r| &*Box::leak(Box::new(Cutile::new(r, budget, name))))
        };
        Ok(Designs {
            gpu,
            a: want("a").then(|| gpupool(o.spin_budget, "a-gpupool")),
            a0: want("a0").then(|| gpupool(Duration::ZERO, "a0-gpupool-nospin")),
            b: want("b").then(|| &*Box::leak(Box::new(Blocking::new(gpu.events)))),
            c: want("c").then_some(&HostFn),
            d: want("d")
                .then(|| cutile(o.spin_budget, "d-cutile"))
                .flatten(),
            d0: want("d0")
                .then(|| cutile(Duration::ZERO, "d0-cutile-nospin"))
                .flatten(),
        })
    }

    /// Every design built, in a..d order.
    fn each(&self) -> Vec<Entry<'_>> {
        let mut v: Vec<Entry<'_>> = Vec::new();
        for d in [self.a, self.a0].into_iter().flatten() {
            v.push(Entry {
                name: d.name(),
                label: d.machinery_label(),
                run: Box::new(move |rt, cfg| self.run(rt, d, cfg)),
            });
        }
        if let Some(d) = self.b {
            v.push(Entry {
                name: d.name(),
                label: d.machinery_label(),
                run: Box::new(move |rt, cfg| self.run(rt, d, cfg)),
            });
        }
        if let Some(d) = self.c {
            v.push(Entry {
                name: d.name(),
                label: d.machinery_label(),
                run: Box::new(move |rt, cfg| self.run(rt, d, cfg)),
            });
        }
        for d in [self.d, self.d0].into_iter().flatten() {
            v.push(Entry {
                name: d.name(),
                label: d.machinery_label(),
                run: Box::new(move |rt, cfg| self.run(rt, d, cfg)),
            });
        }
        v
    }

    fn run<D: Design>(&self, rt: &Runtime, d: &'static D, cfg: &CellConfig) -> CellResult {
        run_cell(rt, self.gpu, d, cfg)
    }
}

/// A design's name, what its machinery is, and how to run a cell of it.
struct Entry<'d> {
    name: &'static str,
    label: &'static str,
    run: Runner<'d>,
}

/// Runs one cell of a design.
type Runner<'d> = Box<dyn Fn(&Runtime, &CellConfig) -> CellResult + 'd>;

fn print_calibration(label: &str, c: &Calibration) {
    println!(
        "calibration ({label}): {} pings, tightest round trip {:.2} us, median {:.2} us; \
         %globaltimer changes every {:.0} ns; offset known to +-{:.2} us",
        c.rounds,
        c.best_rtt_ns as f64 / 1e3,
        c.median_rtt_ns as f64 / 1e3,
        c.tick_ns,
        c.uncertainty_ns() / 1e3
    );
}

fn main() -> ExitCode {
    let started = Instant::now();
    host_ns();
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let max_threads = o.threads.iter().copied().max().unwrap_or(1);
    let max_inflight = o.inflight.iter().copied().max().unwrap_or(1);
    let gpu = match Gpu::setup(max_threads, o.streams_per_thread, max_inflight) {
        Ok(g) => g,
        Err(SetupError::Skip(why)) => {
            println!("skipped: {why}");
            return ExitCode::SUCCESS;
        }
        Err(SetupError::Fail(e)) => {
            eprintln!("FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&o, gpu, started) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(o: &Options, gpu: &'static Gpu, started: Instant) -> Result<(), String> {
    let calib = gpu.calibrate(o.calib_rounds)?;
    let designs = Designs::build(o, gpu)?;
    let each = designs.each();
    println!(
        "# async completion benchmark{}",
        if o.quick { " (--quick)" } else { "" }
    );
    println!(
        "device: {} (driver API {}.{}); {} streams per submitting thread, leased from one \
         gpupool StreamPool for the whole run and used round-robin; kernel: 1 thread spinning \
         {:.1} us on %globaltimer, then writing it to pinned mapped host memory",
        gpu.name,
        gpu.driver_version / 1000,
        gpu.driver_version % 1000 / 10,
        o.streams_per_thread,
        o.work_ns as f64 / 1e3
    );
    println!(
        "runtime: tokio multi-thread, worker threads = T = submitter tasks (one per worker); \
         each future awaited in its own spawned task; F = permits of one semaphore shared \
         by the submitters; warm-up {:?}, measured window {:?}, {} repetition(s), design order \
         rotated each repetition; medians below",
        o.warmup, o.duration, o.reps
    );
    print_calibration("start", &calib);
    let runtimes: Vec<(usize, Runtime)> = o
        .threads
        .iter()
        .map(|&t| runtime(gpu, t).map(|rt| (t, rt)))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("building a runtime: {e}"))?;
    let cfg = |inflight: usize, threads: usize| CellConfig {
        inflight,
        threads,
        warmup: o.warmup,
        duration: o.duration,
        work_ns: o.work_ns,
        drain_timeout: Duration::from_secs(if o.quick { 5 } else { 15 }),
        calib_rounds: o.calib_rounds,
    };
    // One unmeasured pass of each design on the largest runtime: engine
    // threads, reactor, event pool, driver callback threads come up.
    if let Some((t, rt)) = runtimes.last() {
        let warm = CellConfig {
            duration: o.warmup,
            ..cfg(max_of(&o.inflight).min(1000), *t)
        };
        for e in &each {
            (e.run)(rt, &warm);
        }
    }
    let mut runs: Vec<Run> = Vec::new();
    'reps: for rep in 0..o.reps {
        for &inflight in &o.inflight {
            for (threads, rt) in &runtimes {
                if rep > 0 && started.elapsed() > o.budget {
                    eprintln!(
                        "time budget {:?} spent: later repetitions skipped",
                        o.budget
                    );
                    break 'reps;
                }
                let n = each.len();
                for i in 0..n {
                    let Entry { name, run, .. } = &each[(i + rep) % n];
                    let r = run(rt, &cfg(inflight, *threads));
                    eprintln!(
                        "[{:>5.1}s] rep {rep} {name:<20} F={inflight:<5} T={threads:<2} {} completions, {} errors",
                        started.elapsed().as_secs_f64(),
                        r.completed,
                        r.errors
                    );
                    runs.push(Run {
                        design: name,
                        inflight,
                        threads: *threads,
                        rep,
                        result: r,
                    });
                }
            }
        }
    }
    let end = gpu.calibrate(o.calib_rounds)?;
    print_calibration("end", &end);
    let worst = runs
        .iter()
        .map(|r| r.result.drift_ns.abs())
        .max()
        .unwrap_or(0);
    let unc = runs
        .iter()
        .map(|r| r.result.calib_uncertainty_ns)
        .fold(0.0, f64::max);
    println!(
        "offset drift over the whole run: {:+.2} us; each run is calibrated just before and \
         after (offset interpolated): largest drift within one run {:.2} us, largest \
         uncertainty +-{:.2} us",
        (end.offset_ns - calib.offset_ns) as f64 / 1e3,
        worst as f64 / 1e3,
        unc / 1e3
    );
    for e in &each {
        println!("machinery CPU of {}: {}", e.name, e.label);
    }
    let mut summaries = summarize(&runs);
    summaries.sort_by_key(|s| (s.inflight, s.threads, s.design));
    println!();
    print!("{}", table(&summaries));
    println!(
        "\nsubmit: host time of the submission step per future, on its submitting thread (a, a0: \
         completed(); b: event get + record + spawn_blocking; c: Arc + cuLaunchHostFunc; d, d0: \
         slot claim + cuStreamWriteValue32 + publish, or the fallback, after the spin; futures \
         the spin settled have none). notify: the design's wake() call (host clock) minus the \
         kernel's finish (GPU clock, calibrated); for d's spin, when the spin saw it. wake: the \
         awaiting task running again minus the kernel's finish (adds the runtime's queueing: \
         with F futures in flight it tends to F / throughput). CPU %: of one core over the \
         measured window; us/compl: per completion in it."
    );
    write_csv(&o.out, &runs, &summaries).map_err(|e| format!("writing CSV: {e}"))?;
    println!(
        "CSV: {} and {}; total {:.1} s",
        o.out.join("runs.csv").display(),
        o.out.join("summary.csv").display(),
        started.elapsed().as_secs_f64()
    );
    drop(each);
    for (_, rt) in runtimes {
        // A blocking wait that never returned must not hold the exit.
        rt.shutdown_timeout(Duration::from_secs(1));
    }
    let bad = runs
        .iter()
        .filter(|r| r.result.errors > 0 || r.result.early > 0)
        .count();
    if bad > 0 {
        return Err(format!(
            "{bad} run(s) had errors or early wake-ups (see the notes)"
        ));
    }
    Ok(())
}

fn max_of(v: &[usize]) -> usize {
    v.iter().copied().max().unwrap_or(1)
}
