//! gpupool against its baselines, side by side, in one run: event get+put,
//! stream lease+return and scratch rounds, each measured in the same process
//! as the baselines it is compared with (`gpupool_tests::baselines`).
//!
//! ```sh
//! # the mock backend (the pools' own overhead: the mock's calls cost little)
//! cargo run --release -p gpupool-tests --example side-by-side
//! # a real GPU (the CUDA backend's figures)
//! cargo run --release -p gpupool-tests --features cuda --example side-by-side -- --cuda
//! # either, with a plot of the throughput ratios
//! cargo run --release -p gpupool-tests --example side-by-side -- --svg ratios.svg
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

use std::fmt::Write as _;
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::{mpsc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpupool_core::{
    AccessOrder, DeviceId, EventBackend, EventFlags, EventPool, MemoryBackend, MemoryKind,
    ScratchSizes, Scratchpad, StreamBackend, StreamOptions, StreamPool, StreamPoolConfig,
};
use gpupool_tests::baselines::{
    bumpalo_round, event_create_destroy, raw_round, stream_create_destroy, DaliEventPool,
    DaliScratchpad, DaliStreamPool, MutexVecEventPool, MutexVecStreamPool,
};

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
const SCRATCH_NEW: &str = "gpupool new each round";
const SCRATCH_SIZED: &str = "gpupool new each round, learned sizes";
const SCRATCH_RESET: &str = "gpupool reset reuse";
const SCRATCH_DALI: &str = "DALI-style new each round";
const SCRATCH_RAW: &str = "raw calls";
const SCRATCH_BUMP: &str = "bumpalo";

/// How long and how often to measure.
struct Settings {
    quick: bool,
    repeats: usize,
    target: Duration,
    /// At least this many latency samples per repeat, over all threads.
    min_samples: usize,
    cores: usize,
    threads: Vec<usize>,
    oversubscribed: usize,
}

impl Settings {
    fn from_env() -> Self {
        let quick = std::env::var("GPUPOOL_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let ms = std::env::var("GPUPOOL_BENCH_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(if quick { 2 } else { 100 });
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Settings {
            quick,
            repeats: if quick { 5 } else { 7 },
            target: Duration::from_millis(ms.max(1)),
            min_samples: if quick { 2_000 } else { 50_000 },
            cores,
            threads: [1, 2, 4, 8, 16]
                .into_iter()
                .filter(|&t| t <= cores)
                .collect(),
            oversubscribed: 4 * cores,
        }
    }
}

/// One operation, run once per call, shared by the threads of a crew.
type Op<'a> = &'a (dyn Fn() + Sync);

/// What a crew member sends back: when its run started and ended, or the
/// time of each operation.
enum Report {
    Span(Instant, Instant),
    Latencies(Vec<u64>),
}

/// Long-lived threads that run an operation together after a barrier.
struct Crew<'a> {
    jobs: Vec<mpsc::Sender<(Op<'a>, usize, bool)>>,
    reports: mpsc::Receiver<Report>,
}

impl<'a> Crew<'a> {
    fn run(&self, op: Op<'a>, n: usize, timed: bool) -> Vec<Report> {
        for job in &self.jobs {
            job.send((op, n, timed)).expect("a crew member is gone");
        }
        (0..self.jobs.len())
            .map(|_| self.reports.recv().expect("a crew member died"))
            .collect()
    }

    /// Every member's start and end of `n` operations.
    fn spans(&self, op: Op<'a>, n: usize) -> Vec<(Instant, Instant)> {
        self.run(op, n, false)
            .into_iter()
            .map(|r| match r {
                Report::Span(start, end) => (start, end),
                Report::Latencies(_) => unreachable!("asked for spans"),
            })
            .collect()
    }

    /// The wall time of `n` operations on every member: from the first
    /// start to the last end.
    fn wall(&self, op: Op<'a>, n: usize) -> Duration {
        wall(&self.spans(op, n))
    }

    /// Every operation's time, all members together.
    fn latencies(&self, op: Op<'a>, n: usize) -> Vec<u64> {
        self.run(op, n, true)
            .into_iter()
            .flat_map(|r| match r {
                Report::Latencies(v) => v,
                Report::Span(..) => unreachable!("asked for latencies"),
            })
            .collect()
    }
}

/// Runs `f` with a crew of `threads` threads, which end when it returns.
fn with_crew<'a, R>(threads: usize, f: impl FnOnce(&Crew<'a>) -> R) -> R {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let (report_tx, reports) = mpsc::channel();
        let mut jobs = Vec::new();
        for _ in 0..threads {
            let (tx, rx) = mpsc::channel::<(Op<'a>, usize, bool)>();
            let report_tx = report_tx.clone();
            let barrier = &barrier;
            s.spawn(move || {
                for (op, n, timed) in rx {
                    let report = if timed {
                        let mut v = Vec::with_capacity(n);
                        barrier.wait();
                        for _ in 0..n {
                            let t = Instant::now();
                            op();
                            v.push(t.elapsed().as_nanos() as u64);
                        }
                        Report::Latencies(v)
                    } else {
                        barrier.wait();
                        let start = Instant::now();
                        for _ in 0..n {
                            op();
                        }
                        Report::Span(start, Instant::now())
                    };
                    if report_tx.send(report).is_err() {
                        break;
                    }
                }
            });
            jobs.push(tx);
        }
        let crew = Crew { jobs, reports };
        let out = f(&crew);
        drop(crew); // closes the job channels: the members end
        out
    })
}

/// How many operations per thread take about `target` on `crew` (the runs
/// that find out also warm the pools up for this many threads).
fn calibrate<'a>(crew: &Crew<'a>, op: Op<'a>, target: Duration) -> usize {
    let mut n = 16usize;
    loop {
        let took = crew.wall(op, n);
        if took >= target / 10 || n >= 1 << 28 {
            let per_op = took.as_secs_f64().max(1e-9) / n as f64;
            return ((target.as_secs_f64() / per_op) as usize).clamp(16, 1 << 28);
        }
        n *= 4;
    }
}

/// From the first start to the last end.
fn wall(spans: &[(Instant, Instant)]) -> Duration {
    let start = spans.iter().map(|s| s.0).min();
    let end = spans.iter().map(|s| s.1).max();
    match (start, end) {
        (Some(s), Some(e)) => e - s,
        _ => Duration::ZERO,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The `p`-quantile of sorted samples.
fn quantile(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)] as f64
}

/// A pool operation's throughput at one thread count (medians over repeats).
struct Throughput {
    op: &'static str,
    variant: &'static str,
    threads: usize,
    /// Time per operation of the median thread.
    ns_per_op: f64,
    /// Operations of all threads per second, over the wall time from the
    /// first thread's start to the last one's end.
    mops: f64,
    /// Operations per thread per repeat.
    n: usize,
}

/// Latencies at the oversubscribed run (medians over repeats of each quantile).
struct Latency {
    op: &'static str,
    variant: &'static str,
    threads: usize,
    p50: f64,
    p99: f64,
    p999: f64,
    samples: usize,
}

/// A scratch round's time (median over repeats).
struct Round {
    kind: MemoryKind,
    variant: &'static str,
    ns_per_round: f64,
    rounds: usize,
}

#[derive(Default)]
struct Results {
    throughput: Vec<Throughput>,
    latency: Vec<Latency>,
    rounds: Vec<Round>,
}

impl Results {
    fn tput(&self, op: &str, variant: &str, threads: usize) -> Option<&Throughput> {
        self.throughput
            .iter()
            .find(|t| t.op == op && t.variant == variant && t.threads == threads)
    }

    fn lat(&self, op: &str, variant: &str) -> Option<&Latency> {
        self.latency
            .iter()
            .find(|l| l.op == op && l.variant == variant)
    }

    fn round(&self, kind: MemoryKind, variant: &str) -> Option<f64> {
        self.rounds
            .iter()
            .find(|r| r.kind == kind && r.variant == variant)
            .map(|r| r.ns_per_round)
    }
}

/// The pool operations measured: (operation, variant, op). The stream
/// baselines serve both stream tables (default and same-thread reuse).
fn pool_ops<'a>(ev: [Op<'a>; 4], st: [Op<'a>; 5]) -> Vec<(&'static str, &'static str, Op<'a>)> {
    vec![
        (EVENT, GPUPOOL, ev[0]),
        (EVENT, DALI, ev[1]),
        (EVENT, MUTEX_VEC, ev[2]),
        (EVENT, CREATE, ev[3]),
        (STREAM, GPUPOOL, st[0]),
        (STICKY, GPUPOOL, st[1]),
        (STREAM, DALI, st[2]),
        (STREAM, MUTEX_VEC, st[3]),
        (STREAM, CREATE, st[4]),
    ]
}

/// Measures the pool operations at every thread count and oversubscribed.
fn measure_pools<B: Machine>(backend: &B, s: &Settings, results: &mut Results) {
    let d = DeviceId(0);
    let flags = EventFlags::DISABLE_TIMING;
    let devices = backend.device_count().expect("count the devices");
    let events = EventPool::new(backend.clone());
    let dali_events = DaliEventPool::new(backend.clone(), flags).expect("a DALI-style event pool");
    let mv_events = MutexVecEventPool::new(backend.clone(), flags, devices);
    let streams = StreamPool::new(backend.clone());
    let sticky = StreamPool::with_config(
        backend.clone(),
        StreamPoolConfig {
            same_thread_reuse: true,
            ..StreamPoolConfig::default()
        },
    );
    let dali_streams = DaliStreamPool::new(backend.clone());
    let mv_streams = MutexVecStreamPool::new(backend.clone(), devices);

    let ev_ours = || {
        black_box(events.get(d).expect("gpupool event get").get());
    };
    let ev_dali = || {
        let e = dali_events.get(d).expect("DALI-style event get");
        dali_events.put(black_box(e), d);
    };
    let ev_mv = || {
        let e = mv_events.get(d).expect("Mutex<Vec> event get");
        mv_events.put(black_box(e), d);
    };
    let ev_raw = || event_create_destroy(backend, d, flags).expect("event create+destroy");
    let st_ours = || {
        black_box(streams.get(d).expect("gpupool stream get").get());
    };
    let st_sticky = || {
        black_box(sticky.get(d).expect("gpupool stream get").get());
    };
    let st_dali = || {
        black_box(dali_streams.get(d).expect("DALI-style stream get").get());
    };
    let st_mv = || {
        let st = mv_streams.get(d).expect("Mutex<Vec> stream get");
        mv_streams.put(black_box(st), d);
    };
    let st_raw = || stream_create_destroy(backend, d).expect("stream create+destroy");
    let ops = pool_ops(
        [&ev_ours, &ev_dali, &ev_mv, &ev_raw],
        [&st_ours, &st_sticky, &st_dali, &st_mv, &st_raw],
    );

    for &threads in &s.threads {
        with_crew(threads, |crew| {
            let n: Vec<usize> = ops
                .iter()
                .map(|&(_, _, op)| calibrate(crew, op, s.target))
                .collect();
            let mut per_op = vec![Vec::new(); ops.len()];
            let mut mops = vec![Vec::new(); ops.len()];
            for _ in 0..s.repeats {
                for (i, &(_, _, op)) in ops.iter().enumerate() {
                    let spans = crew.spans(op, n[i]);
                    let mut times: Vec<Duration> = spans.iter().map(|(s, e)| *e - *s).collect();
                    times.sort();
                    per_op[i].push(times[times.len() / 2].as_nanos() as f64 / n[i] as f64);
                    let took = wall(&spans).as_secs_f64().max(1e-9);
                    mops[i].push((threads * n[i]) as f64 / took / 1e6);
                }
            }
            for (i, &(op, variant, _)) in ops.iter().enumerate() {
                results.throughput.push(Throughput {
                    op,
                    variant,
                    threads,
                    ns_per_op: median(std::mem::take(&mut per_op[i])),
                    mops: median(std::mem::take(&mut mops[i])),
                    n: n[i],
                });
            }
        });
        eprintln!("  pools: {threads} thread(s) done");
    }

    let threads = s.oversubscribed;
    with_crew(threads, |crew| {
        let n: Vec<usize> = ops
            .iter()
            .map(|&(_, _, op)| {
                calibrate(crew, op, s.target).clamp(
                    s.min_samples.div_ceil(threads),
                    MAX_SAMPLES.div_ceil(threads),
                )
            })
            .collect();
        let mut q = vec![[Vec::new(), Vec::new(), Vec::new()]; ops.len()];
        for _ in 0..s.repeats {
            for (i, &(_, _, op)) in ops.iter().enumerate() {
                let mut all = crew.latencies(op, n[i]);
                all.sort_unstable();
                for (j, p) in [0.5, 0.99, 0.999].into_iter().enumerate() {
                    q[i][j].push(quantile(&all, p));
                }
            }
        }
        for (i, &(op, variant, _)) in ops.iter().enumerate() {
            let [p50, p99, p999] = std::mem::take(&mut q[i]).map(median);
            results.latency.push(Latency {
                op,
                variant,
                threads,
                p50,
                p99,
                p999,
                samples: n[i] * threads,
            });
        }
    });
    eprintln!("  pools: oversubscribed ({threads} threads) done");

    assert_eq!(streams.live_leases(), 0, "gpupool stream leases left out");
    assert_eq!(sticky.live_leases(), 0, "gpupool stream leases left out");
    assert_eq!(events.live_leases(), 0, "gpupool event leases left out");
    assert_eq!(dali_streams.live_leases(), 0, "DALI-style leases left out");
    streams.purge().expect("purge the stream pool");
    sticky.purge().expect("purge the same-thread stream pool");
    events.purge().expect("purge the event pool");
    dali_streams
        .purge()
        .expect("purge the DALI-style stream pool");
    dali_events
        .purge()
        .expect("purge the DALI-style event pool");
    mv_streams
        .purge()
        .expect("purge the Mutex<Vec> stream pool");
    mv_events.purge().expect("purge the Mutex<Vec> event pool");
}

/// One scratch round of a variant, with its state.
type RoundFn<'a> = Box<dyn FnMut() + 'a>;

/// Times `n` calls of `f`.
fn time_calls(f: &mut dyn FnMut(), n: usize) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed()
}

/// Measures the scratch rounds of each kind on this thread. `plain(true)`
/// turns off whatever the backend caches for gpupool's own use (the CUDA
/// backend's same-stream device cache) for the baselines' rounds, and
/// `plain(false)` turns it back on: the baselines are measured over the plain
/// backend, as DALI would run, and gpupool over the backend it ships with.
fn measure_scratch<B: Machine>(
    backend: &B,
    s: &Settings,
    results: &mut Results,
    plain: &dyn Fn(bool),
) {
    let d = DeviceId(0);
    let stream = backend
        .create_stream(d, StreamOptions::default())
        .expect("a stream for the scratch rounds");
    let order = AccessOrder::stream(stream, d);
    for kind in [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Device] {
        // Plain calls: pinned synchronously, device in stream order.
        let raw_order = if kind == MemoryKind::Device {
            order
        } else {
            AccessOrder::host()
        };
        let mut kept = Scratchpad::new(backend, order);
        let sizes = ScratchSizes::new();
        let mut bump = bumpalo::Bump::new();
        let mut blocks = Vec::with_capacity(SIZES.len());
        let mut variants: Vec<(&'static str, RoundFn<'_>)> = vec![
            (
                SCRATCH_NEW,
                Box::new(|| {
                    let pad = Scratchpad::new(backend, order);
                    for &n in &SIZES {
                        black_box(pad.alloc(kind, n, ALIGN).expect("gpupool scratch"));
                    }
                }),
            ),
            (
                SCRATCH_SIZED,
                Box::new(|| {
                    let pad = Scratchpad::new(backend, order).learn_sizes(&sizes);
                    for &n in &SIZES {
                        black_box(pad.alloc(kind, n, ALIGN).expect("gpupool scratch"));
                    }
                }),
            ),
            (
                SCRATCH_RESET,
                Box::new(move || {
                    for &n in &SIZES {
                        black_box(kept.alloc(kind, n, ALIGN).expect("gpupool scratch"));
                    }
                    kept.reset().expect("gpupool scratch reset");
                }),
            ),
            (
                SCRATCH_DALI,
                Box::new(|| {
                    plain(true);
                    let mut pad = DaliScratchpad::new(backend, d, order);
                    for &n in &SIZES {
                        black_box(pad.alloc(kind, n, ALIGN).expect("DALI-style scratch"));
                    }
                    drop(pad);
                    plain(false);
                }),
            ),
            (
                SCRATCH_RAW,
                Box::new(move || {
                    plain(true);
                    raw_round(backend, kind, d, raw_order, &SIZES, ALIGN, &mut blocks)
                        .expect("raw allocation calls");
                    plain(false);
                }),
            ),
        ];
        if kind == MemoryKind::Host {
            variants.push((
                SCRATCH_BUMP,
                Box::new(move || bumpalo_round(&mut bump, &SIZES, ALIGN)),
            ));
        }
        let n: Vec<usize> = variants
            .iter_mut()
            .map(|(_, f)| {
                let mut n = 16usize;
                loop {
                    let t = time_calls(f, n);
                    if t >= s.target / 10 || n >= 1 << 28 {
                        let per = t.as_secs_f64().max(1e-9) / n as f64;
                        break ((s.target.as_secs_f64() / per) as usize).clamp(16, 1 << 28);
                    }
                    n *= 4;
                }
            })
            .collect();
        let mut ns = vec![Vec::new(); variants.len()];
        for _ in 0..s.repeats {
            for (i, (_, f)) in variants.iter_mut().enumerate() {
                ns[i].push(time_calls(f, n[i]).as_nanos() as f64 / n[i] as f64);
            }
        }
        for (i, (variant, _)) in variants.iter().enumerate() {
            results.rounds.push(Round {
                kind,
                variant,
                ns_per_round: median(std::mem::take(&mut ns[i])),
                rounds: n[i],
            });
        }
        drop(variants); // the kept scratchpad releases its blocks
        eprintln!("  scratch: {} done", kind_name(kind));
    }
    backend
        .synchronize_stream(stream, d)
        .expect("synchronize the scratch stream");
    backend
        .destroy_stream(stream, d)
        .expect("destroy the scratch stream");
}

fn kind_name(kind: MemoryKind) -> &'static str {
    match kind {
        MemoryKind::Host => "host",
        MemoryKind::Pinned => "pinned",
        MemoryKind::Device => "device",
        MemoryKind::Managed => "managed",
    }
}

/// `a ÷ b` when both are known.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r >= 100.0 => format!("{r:.0}×"),
        Some(r) if r >= 10.0 => format!("{r:.1}×"),
        Some(r) if r >= 0.01 => format!("{r:.2}×"),
        Some(r) => format!("{r:.1e}×"),
        None => "–".into(),
    }
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e4 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns >= 100.0 {
        format!("{ns:.0} ns")
    } else {
        format!("{ns:.1} ns")
    }
}

fn fmt_mops(m: f64) -> String {
    if m >= 10.0 {
        format!("{m:.1}")
    } else if m >= 0.1 {
        format!("{m:.2}")
    } else {
        format!("{m:.4}")
    }
}

/// The throughput ratio gpupool ÷ `baseline` for `op` at `threads` (the
/// baseline's stream figures serve the same-thread row too).
fn tput_ratio(r: &Results, op: &str, baseline: &str, threads: usize) -> Option<f64> {
    let base_op = if op == STICKY { STREAM } else { op };
    ratio(
        r.tput(op, GPUPOOL, threads).map(|t| t.mops),
        r.tput(base_op, baseline, threads).map(|t| t.mops),
    )
}

/// The time ratio per operation (median thread) gpupool ÷ `baseline`.
fn time_ratio(r: &Results, op: &str, baseline: &str, threads: usize) -> Option<f64> {
    let base_op = if op == STICKY { STREAM } else { op };
    ratio(
        r.tput(op, GPUPOOL, threads).map(|t| t.ns_per_op),
        r.tput(base_op, baseline, threads).map(|t| t.ns_per_op),
    )
}

/// The p99.9 latency ratio gpupool ÷ `baseline` at the oversubscribed run.
fn p999_ratio(r: &Results, op: &str, baseline: &str) -> Option<f64> {
    let base_op = if op == STICKY { STREAM } else { op };
    ratio(
        r.lat(op, GPUPOOL).map(|l| l.p999),
        r.lat(base_op, baseline).map(|l| l.p999),
    )
}

/// One target of the performance issue and what this run measured for it.
struct Target {
    what: String,
    measured: Option<f64>,
    at_most: bool,
    limit: f64,
}

impl Target {
    fn le(what: String, measured: Option<f64>, limit: f64) -> Self {
        Target {
            what,
            measured,
            at_most: true,
            limit,
        }
    }

    fn ge(what: String, measured: Option<f64>, limit: f64) -> Self {
        Target {
            what,
            measured,
            at_most: false,
            limit,
        }
    }

    fn met(&self) -> Option<bool> {
        self.measured.map(|m| {
            if self.at_most {
                m <= self.limit
            } else {
                m >= self.limit
            }
        })
    }

    fn verdict(&self) -> &'static str {
        match self.met() {
            Some(true) => "met",
            Some(false) => "not met",
            None => "not measured",
        }
    }
}

/// The targets of the performance issue for this machine.
fn targets(r: &Results, s: &Settings, cuda: bool) -> Vec<Target> {
    let over = s.oversubscribed;
    let mut t = Vec::new();
    let bumpalo = ratio(
        r.round(MemoryKind::Host, SCRATCH_RESET),
        r.round(MemoryKind::Host, SCRATCH_BUMP),
    );
    if !cuda {
        for (op, name) in [(EVENT, "event pool"), (STREAM, "stream pool")] {
            t.push(Target::le(
                format!("{name}: time per {op} at 1 thread ÷ DALI-style"),
                time_ratio(r, op, DALI, 1),
                1.0,
            ));
            t.push(Target::ge(
                format!("{name}: throughput at 2 threads ÷ DALI-style"),
                tput_ratio(r, op, DALI, 2),
                1.5,
            ));
            t.push(Target::le(
                format!("{name}: p99.9 latency at {over} threads (4 per core) ÷ DALI-style"),
                p999_ratio(r, op, DALI),
                0.1,
            ));
        }
        t.push(Target::le(
            "host scratch round (reset reuse) per allocation ÷ bumpalo (stated for the GPU \
             machine; host memory does not depend on the backend)"
                .into(),
            bumpalo,
            1.5,
        ));
        return t;
    }
    // The GPU targets name 16 threads (a 16-core machine) and 64 oversubscribed.
    let top = if s.threads.contains(&16) {
        16
    } else {
        s.threads.last().copied().unwrap_or(1)
    };
    t.push(Target::le(
        "events: time per get+put at 1 thread ÷ DALI-style".into(),
        time_ratio(r, EVENT, DALI, 1),
        1.0,
    ));
    t.push(Target::ge(
        format!("events: throughput at {top} threads ÷ DALI-style"),
        tput_ratio(r, EVENT, DALI, top),
        20.0,
    ));
    t.push(Target::le(
        format!("events: p99.9 latency at {over} threads ÷ DALI-style"),
        p999_ratio(r, EVENT, DALI),
        0.1,
    ));
    t.push(Target::le(
        "streams: time per lease+return at 1 thread ÷ DALI-style".into(),
        time_ratio(r, STREAM, DALI, 1),
        1.0,
    ));
    t.push(Target::ge(
        format!("streams: throughput at {top} threads ÷ DALI-style"),
        tput_ratio(r, STREAM, DALI, top),
        5.0,
    ));
    t.push(Target::ge(
        format!("events: throughput at {top} threads ÷ create+destroy"),
        tput_ratio(r, EVENT, CREATE, top),
        100.0,
    ));
    t.push(Target::ge(
        format!("streams: throughput at {top} threads ÷ create+destroy"),
        tput_ratio(r, STREAM, CREATE, top),
        50.0,
    ));
    for kind in [MemoryKind::Device, MemoryKind::Pinned] {
        let k = kind_name(kind);
        let dali = r.round(kind, SCRATCH_DALI);
        t.push(Target::le(
            format!("{k} scratch round of 16, new each round (learned sizes) ÷ DALI-style"),
            ratio(r.round(kind, SCRATCH_SIZED), dali),
            0.5,
        ));
        t.push(Target::le(
            format!("{k} scratch round of 16, reset reuse ÷ DALI-style"),
            ratio(r.round(kind, SCRATCH_RESET), dali),
            0.1,
        ));
    }
    let host_dali = r.round(MemoryKind::Host, SCRATCH_DALI);
    t.push(Target::le(
        "host scratch round of 16, new each round (learned sizes) ÷ DALI-style".into(),
        ratio(r.round(MemoryKind::Host, SCRATCH_SIZED), host_dali),
        1.0,
    ));
    t.push(Target::le(
        "host scratch round of 16, reset reuse ÷ DALI-style".into(),
        ratio(r.round(MemoryKind::Host, SCRATCH_RESET), host_dali),
        1.0,
    ));
    t.push(Target::le(
        "host scratch round (reset reuse) per allocation ÷ bumpalo".into(),
        bumpalo,
        1.5,
    ));
    t
}

/// Facts about the run, for the header and the JSON.
struct About {
    backend: String,
    date: String,
    commit: String,
    cpu: String,
    command: String,
    /// `/proc/loadavg`'s first three figures when the run started (other
    /// work on the machine shows in the multi-thread figures).
    load: String,
}

/// The civil date (UTC) of a Unix time, as `YYYY-MM-DD`.
fn utc_date(unix_secs: u64) -> String {
    // Howard Hinnant's days-to-civil.
    let z = (unix_secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn about(backend: String) -> About {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let commit = std::env::var("GPUPOOL_COMMIT").ok().or_else(|| {
        let out = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let command = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into());
    About {
        backend,
        date: utc_date(secs),
        commit: commit.unwrap_or_else(|| "unknown".into()),
        cpu,
        command,
        load,
    }
}

/// The markdown report: tables, then the targets.
fn report(r: &Results, s: &Settings, a: &About, targets: &[Target]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# gpupool side by side: {}", a.backend);
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "- {} UTC, commit {}, {} cores ({}), load average {} at the start; arguments: `{}`{}",
        a.date,
        a.commit,
        s.cores,
        a.cpu,
        a.load,
        a.command,
        if s.quick { " (quick run)" } else { "" }
    );
    let _ = writeln!(
        o,
        "- each figure is the median of {} repeats of about {} ms, the variants taking turns; \
         ratios are gpupool ÷ baseline from two medians of this run",
        s.repeats,
        s.target.as_millis()
    );
    for op in [EVENT, STREAM, STICKY] {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "## {op}: throughput, Mops/s of all threads (time per op of the median thread)"
        );
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "| threads | gpupool | DALI-style | Mutex<Vec> | create+destroy | gpupool ÷ DALI-style | gpupool ÷ Mutex<Vec> | gpupool ÷ create+destroy |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|");
        let base_op = if op == STICKY { STREAM } else { op };
        for &threads in &s.threads {
            let cell = |op: &str, v: &str| {
                r.tput(op, v, threads).map_or("–".into(), |t| {
                    format!("{} ({})", fmt_mops(t.mops), fmt_ns(t.ns_per_op))
                })
            };
            let _ = writeln!(
                o,
                "| {threads} | {} | {} | {} | {} | {} | {} | {} |",
                cell(op, GPUPOOL),
                cell(base_op, DALI),
                cell(base_op, MUTEX_VEC),
                cell(base_op, CREATE),
                fmt_ratio(tput_ratio(r, op, DALI, threads)),
                fmt_ratio(tput_ratio(r, op, MUTEX_VEC, threads)),
                fmt_ratio(tput_ratio(r, op, CREATE, threads)),
            );
        }
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "## Oversubscribed: {} threads on {} cores, latency of one operation",
        s.oversubscribed, s.cores
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "| operation | variant | p50 | p99 | p99.9 | p99.9 ÷ DALI-style's | samples per repeat |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for l in &r.latency {
        let vs = if l.variant == GPUPOOL {
            fmt_ratio(p999_ratio(r, l.op, DALI))
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {vs} | {} |",
            l.op,
            l.variant,
            fmt_ns(l.p50),
            fmt_ns(l.p99),
            fmt_ns(l.p999),
            l.samples
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "## Scratch: a round of 16 allocations (1 B – 64 KiB), one thread, time per round"
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "(The baselines run over the plain backend: on CUDA without the backend's same-stream device \
         cache and without the idle-stream question on pinned stream-ordered frees, which only \
         gpupool's scratch uses.)"
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "| kind | gpupool new | gpupool new, learned sizes | gpupool reset | DALI-style new | raw calls | bumpalo | new ÷ DALI-style | new, learned ÷ DALI-style | reset ÷ DALI-style | reset ÷ raw calls | reset ÷ bumpalo |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for kind in [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Device] {
        let cell = |v: &str| r.round(kind, v).map_or("–".into(), fmt_ns);
        let reset = r.round(kind, SCRATCH_RESET);
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            kind_name(kind),
            cell(SCRATCH_NEW),
            cell(SCRATCH_SIZED),
            cell(SCRATCH_RESET),
            cell(SCRATCH_DALI),
            cell(SCRATCH_RAW),
            cell(SCRATCH_BUMP),
            fmt_ratio(ratio(
                r.round(kind, SCRATCH_NEW),
                r.round(kind, SCRATCH_DALI)
            )),
            fmt_ratio(ratio(
                r.round(kind, SCRATCH_SIZED),
                r.round(kind, SCRATCH_DALI)
            )),
            fmt_ratio(ratio(reset, r.round(kind, SCRATCH_DALI))),
            fmt_ratio(ratio(reset, r.round(kind, SCRATCH_RAW))),
            fmt_ratio(ratio(reset, r.round(kind, SCRATCH_BUMP))),
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "## Targets ({})",
        if a.backend.starts_with("mock") {
            "development machine, mock backend, against the DALI-style baseline"
        } else {
            "GPU machine, CUDA backend"
        }
    );
    let _ = writeln!(o);
    for t in targets {
        let _ = writeln!(
            o,
            "- {}: {} (target {} {}×): **{}**",
            t.what,
            fmt_ratio(t.measured),
            if t.at_most { "≤" } else { "≥" },
            t.limit,
            t.verdict()
        );
    }
    let met = targets.iter().filter(|t| t.met() == Some(true)).count();
    let _ = writeln!(o);
    let _ = writeln!(o, "{met} of {} targets met.", targets.len());
    o
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_num(x: Option<f64>) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.6}"),
        _ => "null".into(),
    }
}

fn to_json(r: &Results, s: &Settings, a: &About, targets: &[Target]) -> String {
    let mut o = String::from("{\n");
    let _ = writeln!(
        o,
        "  \"machine\": {{\"backend\": {}, \"cpu\": {}, \"cores\": {}, \"load_average\": {}}},",
        json_str(&a.backend),
        json_str(&a.cpu),
        s.cores,
        json_str(&a.load)
    );
    let _ = writeln!(
        o,
        "  \"run\": {{\"date\": {}, \"commit\": {}, \"arguments\": {}, \"quick\": {}, \"repeats\": {}, \"target_ms\": {}, \"threads\": {:?}, \"oversubscribed_threads\": {}}},",
        json_str(&a.date),
        json_str(&a.commit),
        json_str(&a.command),
        s.quick,
        s.repeats,
        s.target.as_millis(),
        s.threads,
        s.oversubscribed
    );
    let rows: Vec<String> = r
        .throughput
        .iter()
        .map(|t| {
            format!(
                "    {{\"operation\": {}, \"variant\": {}, \"threads\": {}, \"ns_per_op\": {}, \"mops\": {}, \"ops_per_thread\": {}}}",
                json_str(t.op),
                json_str(t.variant),
                t.threads,
                json_num(Some(t.ns_per_op)),
                json_num(Some(t.mops)),
                t.n
            )
        })
        .collect();
    let _ = writeln!(o, "  \"throughput\": [\n{}\n  ],", rows.join(",\n"));
    let rows: Vec<String> = r
        .latency
        .iter()
        .map(|l| {
            format!(
                "    {{\"operation\": {}, \"variant\": {}, \"threads\": {}, \"p50_ns\": {}, \"p99_ns\": {}, \"p999_ns\": {}, \"samples\": {}}}",
                json_str(l.op),
                json_str(l.variant),
                l.threads,
                json_num(Some(l.p50)),
                json_num(Some(l.p99)),
                json_num(Some(l.p999)),
                l.samples
            )
        })
        .collect();
    let _ = writeln!(o, "  \"latency\": [\n{}\n  ],", rows.join(",\n"));
    let rows: Vec<String> = r
        .rounds
        .iter()
        .map(|x| {
            format!(
                "    {{\"kind\": {}, \"variant\": {}, \"allocations\": {}, \"ns_per_round\": {}, \"ns_per_allocation\": {}, \"rounds\": {}}}",
                json_str(kind_name(x.kind)),
                json_str(x.variant),
                SIZES.len(),
                json_num(Some(x.ns_per_round)),
                json_num(Some(x.ns_per_round / SIZES.len() as f64)),
                x.rounds
            )
        })
        .collect();
    let _ = writeln!(o, "  \"scratch\": [\n{}\n  ],", rows.join(",\n"));
    let rows: Vec<String> = targets
        .iter()
        .map(|t| {
            format!(
                "    {{\"target\": {}, \"measured\": {}, \"comparison\": {}, \"limit\": {}, \"met\": {}}}",
                json_str(&t.what),
                json_num(t.measured),
                json_str(if t.at_most { "<=" } else { ">=" }),
                json_num(Some(t.limit)),
                t.met().map_or("null".into(), |m| m.to_string())
            )
        })
        .collect();
    let _ = writeln!(o, "  \"targets\": [\n{}\n  ]", rows.join(",\n"));
    o.push_str("}\n");
    o
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One SVG: per operation, bars of gpupool's throughput ratio against each
/// baseline at each thread count, on a log scale around 1×.
fn to_svg(r: &Results, s: &Settings, a: &About) -> String {
    const COLORS: [&str; 3] = ["#d62728", "#1f77b4", "#7f7f7f"];
    let ops = [EVENT, STREAM, STICKY];
    let (panel_w, panel_h, top, left, bottom) = (330.0, 300.0, 70.0, 60.0, 60.0);
    let width = left + panel_w * ops.len() as f64 + 20.0;
    let height = top + panel_h + bottom;
    let ratios: Vec<f64> = ops
        .iter()
        .flat_map(|&op| {
            s.threads.iter().flat_map(move |&t| {
                POOL_BASELINES
                    .iter()
                    .filter_map(move |&b| tput_ratio(r, op, b, t))
            })
        })
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    let lo = ratios
        .iter()
        .copied()
        .fold(0.5f64, f64::min)
        .log10()
        .floor();
    let hi = ratios.iter().copied().fold(2.0f64, f64::max).log10().ceil();
    let y = |v: f64| top + panel_h * (hi - v.log10()) / (hi - lo);
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        o,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{left}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        xml(&format!(
            "gpupool throughput ÷ baseline ({}; {} UTC, {})",
            a.backend, a.date, a.commit
        ))
    );
    let _ = writeln!(
        o,
        r#"<text x="{left}" y="36">{}</text>"#,
        xml("log scale; above 1× gpupool is faster. Median of the repeats of one run.")
    );
    for (i, name) in POOL_BASELINES.iter().enumerate() {
        let x = left + 10.0 + 150.0 * i as f64;
        let _ = writeln!(
            o,
            r#"<rect x="{x}" y="44" width="12" height="12" fill="{}"/><text x="{}" y="54">{}</text>"#,
            COLORS[i],
            x + 16.0,
            xml(&format!("÷ {name}"))
        );
    }
    // Decade grid lines and labels.
    let mut e = lo;
    while e <= hi {
        let v = 10f64.powf(e);
        let yy = y(v);
        let _ = writeln!(
            o,
            r##"<line x1="{left}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}×</text>"##,
            width - 20.0,
            left - 4.0,
            yy + 4.0,
            if v >= 1.0 {
                format!("{v:.0}")
            } else {
                format!("{v}")
            }
        );
        e += 1.0;
    }
    let one = y(1.0);
    for (p, op) in ops.iter().enumerate() {
        let x0 = left + panel_w * p as f64;
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"#,
            x0 + panel_w / 2.0,
            top + panel_h + 40.0,
            xml(op)
        );
        let group_w = (panel_w - 20.0) / s.threads.len().max(1) as f64;
        let bar_w = (group_w - 8.0) / POOL_BASELINES.len() as f64;
        for (g, &threads) in s.threads.iter().enumerate() {
            let gx = x0 + 10.0 + group_w * g as f64;
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{threads} t</text>"#,
                gx + group_w / 2.0,
                top + panel_h + 16.0
            );
            for (b, base) in POOL_BASELINES.iter().enumerate() {
                let Some(v) = tput_ratio(r, op, base, threads) else {
                    continue;
                };
                let yy = y(v.max(10f64.powf(lo)));
                let (y1, h) = if yy < one {
                    (yy, one - yy)
                } else {
                    (one, yy - one)
                };
                let bx = gx + 4.0 + bar_w * b as f64;
                let _ = writeln!(
                    o,
                    r#"<rect x="{bx:.1}" y="{y1:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                    bar_w - 1.0,
                    h.max(0.5),
                    COLORS[b],
                    xml(&format!(
                        "{op}, {threads} threads: gpupool ÷ {base} = {v:.3}"
                    ))
                );
            }
        }
        let _ = writeln!(
            o,
            r#"<line x1="{x0:.1}" x2="{:.1}" y1="{one:.1}" y2="{one:.1}" stroke="black"/>"#,
            x0 + panel_w
        );
    }
    o.push_str("</svg>\n");
    o
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
    leftovers: impl Fn() -> Option<String>,
) -> ExitCode {
    let s = Settings::from_env();
    let a = about(name);
    eprintln!(
        "side-by-side: {}, {} cores, threads {:?} and {} oversubscribed, {} repeats of {} ms",
        a.backend,
        s.cores,
        s.threads,
        s.oversubscribed,
        s.repeats,
        s.target.as_millis()
    );
    let started = Instant::now();
    let mut r = Results::default();
    measure_pools(&backend, &s, &mut r);
    measure_scratch(&backend, &s, &mut r, plain);
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
        Ok(0) => {
            println!("skipped: no CUDA GPU");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!("skipped: {e}");
            return ExitCode::SUCCESS;
        }
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
    run(gpu, format!("CUDA backend, {name}"), args, &plain, || None)
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_: &Args) -> ExitCode {
    println!("skipped: built without the `cuda` feature (add `--features cuda`)");
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
    run(mock, "mock backend".into(), &args, &|_| {}, move || {
        let (s, e) = (probe.live_streams(), probe.live_events());
        (s + e > 0).then(|| format!("{s} streams and {e} events"))
    })
}
