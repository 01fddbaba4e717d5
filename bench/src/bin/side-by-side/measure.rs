//! The measurements: the settings, the crew of threads, calibration and
//! timing, the pool operations and the scratch rounds, and their results.

use std::hint::black_box;
use std::sync::{mpsc, Barrier};
use std::time::{Duration, Instant};

use gpupool_bench::baselines::{bumpalo_round, raw_round, DaliScratchpad};
use gpupool_bench::pool_ops::Pools;
use gpupool_bench::sys_stats::upper_median as median;
use gpupool_core::{AccessOrder, DeviceId, MemoryKind, ScratchSizes, Scratchpad, StreamOptions};

use crate::report::kind_name;
use crate::threads::Round;
use crate::{
    Machine, Scratch, ALIGN, CREATE, DALI, EVENT, GPUPOOL, MAX_SAMPLES, MUTEX_VEC, SIZES, STICKY,
    STREAM,
};

/// How long and how often to measure.
pub(crate) struct Settings {
    /// A smoke run: fewer repeats and samples (`GPUPOOL_BENCH_QUICK`).
    pub(crate) quick: bool,
    pub(crate) target: Duration,
    pub(crate) cores: usize,
    pub(crate) threads: Vec<usize>,
}

impl Settings {
    pub(crate) fn from_env() -> Self {
        let quick = std::env::var("GPUPOOL_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let ms = std::env::var("GPUPOOL_BENCH_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(if quick { 2 } else { 100 });
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Settings {
            quick,
            target: Duration::from_millis(ms.max(1)),
            cores,
            threads: [1, 2, 4, 8, 16]
                .into_iter()
                .filter(|&t| t <= cores)
                .collect(),
        }
    }

    /// Repeats of every measurement (medians over them).
    pub(crate) fn repeats(&self) -> usize {
        if self.quick {
            5
        } else {
            7
        }
    }

    /// At least this many latency samples per repeat, over all threads.
    pub(crate) fn min_samples(&self) -> usize {
        if self.quick {
            2_000
        } else {
            50_000
        }
    }

    /// The threads of the oversubscribed latency run.
    pub(crate) fn oversubscribed(&self) -> usize {
        4 * self.cores
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

/// The `p`-quantile of sorted samples.
fn quantile(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)] as f64
}

/// Which pool operation was measured, in which variant, on how many threads.
pub(crate) struct Case {
    pub(crate) op: &'static str,
    pub(crate) variant: &'static str,
    pub(crate) threads: usize,
}

/// A pool operation's throughput at one thread count (medians over repeats).
pub(crate) struct Throughput {
    pub(crate) case: Case,
    /// Time per operation of the median thread.
    pub(crate) ns_per_op: f64,
    /// Operations of all threads per second, over the wall time from the
    /// first thread's start to the last one's end.
    pub(crate) mops: f64,
    /// Operations per thread per repeat.
    pub(crate) n: usize,
}

/// Latencies at the oversubscribed run (medians over repeats of each quantile).
pub(crate) struct Latency {
    pub(crate) case: Case,
    /// The median operation's time, ns.
    pub(crate) p50: f64,
    /// The 99th percentile, ns.
    pub(crate) p99: f64,
    /// The 99.9th percentile, ns.
    pub(crate) p999: f64,
    /// Samples per repeat, over all threads.
    pub(crate) samples: usize,
}

#[derive(Default)]
pub(crate) struct Results {
    pub(crate) throughput: Vec<Throughput>,
    pub(crate) latency: Vec<Latency>,
    pub(crate) rounds: Vec<Round>,
    /// Scratch rounds on many threads, each on its own stream, and the
    /// control measured beside them.
    pub(crate) thread_rounds: crate::threads::ThreadRounds,
}

impl Results {
    pub(crate) fn tput(&self, op: &str, variant: &str, threads: usize) -> Option<&Throughput> {
        self.throughput
            .iter()
            .find(|t| t.case.op == op && t.case.variant == variant && t.case.threads == threads)
    }

    pub(crate) fn lat(&self, op: &str, variant: &str) -> Option<&Latency> {
        self.latency
            .iter()
            .find(|l| l.case.op == op && l.case.variant == variant)
    }

    pub(crate) fn round(&self, kind: MemoryKind, variant: Scratch) -> Option<f64> {
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
pub(crate) fn measure_pools<B: Machine>(backend: &B, s: &Settings, results: &mut Results) {
    let devices = backend.device_count().expect("count the devices");
    let pools = Pools::new(backend, devices);
    let (ev, st) = (pools.event_ops(), pools.stream_ops());
    let ops = pool_ops(ev.each_ref().map(|op| &**op), st.each_ref().map(|op| &**op));

    for &threads in &s.threads {
        with_crew(threads, |crew| {
            let n: Vec<usize> = ops
                .iter()
                .map(|&(_, _, op)| calibrate(crew, op, s.target))
                .collect();
            let mut per_op = vec![Vec::new(); ops.len()];
            let mut mops = vec![Vec::new(); ops.len()];
            for _ in 0..s.repeats() {
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
                    case: Case {
                        op,
                        variant,
                        threads,
                    },
                    ns_per_op: median(std::mem::take(&mut per_op[i])),
                    mops: median(std::mem::take(&mut mops[i])),
                    n: n[i],
                });
            }
        });
        eprintln!("  pools: {threads} thread(s) done");
    }

    let threads = s.oversubscribed();
    with_crew(threads, |crew| {
        let n: Vec<usize> = ops
            .iter()
            .map(|&(_, _, op)| {
                calibrate(crew, op, s.target).clamp(
                    s.min_samples().div_ceil(threads),
                    MAX_SAMPLES.div_ceil(threads),
                )
            })
            .collect();
        let mut q = vec![[Vec::new(), Vec::new(), Vec::new()]; ops.len()];
        for _ in 0..s.repeats() {
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
                case: Case {
                    op,
                    variant,
                    threads,
                },
                p50,
                p99,
                p999,
                samples: n[i] * threads,
            });
        }
    });
    eprintln!("  pools: oversubscribed ({threads} threads) done");

    pools.purge();
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
pub(crate) fn measure_scratch<B: Machine>(
    backend: &B,
    s: &Settings,
    results: &mut Results,
    plain: &dyn Fn(bool),
) {
    let d = DeviceId(0);
    let stream = backend
        .create_stream(d, StreamOptions::default())
        .expect("a stream for the scratch rounds");
    // SAFETY: `stream` was created just above on `d` by `backend` and is
    // destroyed only at the end of this function, after every scratchpad and
    // round that uses the order (and its copies) is gone.
    let order = unsafe { AccessOrder::from_raw(backend, stream, d) };
    for kind in [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Device] {
        // Plain calls: pinned synchronously, device in stream order.
        let raw_order = if kind == MemoryKind::Device {
            order
        } else {
            AccessOrder::host()
        };
        let mut kept = Scratchpad::new(backend, order).expect("a gpupool scratchpad");
        let sizes = ScratchSizes::new();
        let mut bump = bumpalo::Bump::new();
        let mut blocks = Vec::with_capacity(SIZES.len());
        // Each round copies `kind` into a local (`k`) first: a captured `kind` is
        // reloaded from memory after every `black_box` (which may write any
        // memory whose address escaped), putting a load and an address
        // computation in front of each allocation that no caller's code has.
        let mut variants: Vec<(Scratch, RoundFn<'_>)> = vec![
            (
                Scratch::New,
                Box::new(|| {
                    let k = kind;
                    let pad = Scratchpad::new(backend, order).expect("gpupool scratchpad");
                    for &n in &SIZES {
                        black_box(pad.alloc(k, n, ALIGN).expect("gpupool scratch"));
                    }
                }),
            ),
            (
                Scratch::Sized,
                Box::new(|| {
                    let k = kind;
                    let pad = Scratchpad::new(backend, order)
                        .expect("gpupool scratchpad")
                        .learn_sizes(&sizes);
                    for &n in &SIZES {
                        black_box(pad.alloc(k, n, ALIGN).expect("gpupool scratch"));
                    }
                }),
            ),
            (
                Scratch::Reset,
                Box::new(move || {
                    let k = kind;
                    for &n in &SIZES {
                        black_box(kept.alloc(k, n, ALIGN).expect("gpupool scratch"));
                    }
                    kept.reset().expect("gpupool scratch reset");
                }),
            ),
            (
                Scratch::Dali,
                Box::new(|| {
                    let k = kind;
                    plain(true);
                    // SAFETY: `order` is a stream of `backend` on `d` (above).
                    let mut pad = unsafe { DaliScratchpad::new(backend, d, order) };
                    for &n in &SIZES {
                        black_box(pad.alloc(k, n, ALIGN).expect("DALI-style scratch"));
                    }
                    drop(pad);
                    plain(false);
                }),
            ),
            (
                Scratch::Raw,
                Box::new(move || {
                    plain(true);
                    // SAFETY: `raw_order` is host order or the stream of
                    // `backend` on `d` made above.
                    unsafe { raw_round(backend, kind, d, raw_order, &SIZES, ALIGN, &mut blocks) }
                        .expect("raw allocation calls");
                    plain(false);
                }),
            ),
        ];
        if kind == MemoryKind::Host {
            variants.push((
                Scratch::Bump,
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
        for _ in 0..s.repeats() {
            for (i, (_, f)) in variants.iter_mut().enumerate() {
                ns[i].push(time_calls(f, n[i]).as_nanos() as f64 / n[i] as f64);
            }
        }
        for (i, &(variant, _)) in variants.iter().enumerate() {
            results.rounds.push(Round {
                kind,
                variant,
                threads: 1,
                ns_per_round: median(std::mem::take(&mut ns[i])),
                driver_allocations_per_round: None,
                rounds: n[i],
            });
        }
        drop(variants); // the kept scratchpad releases its blocks
        eprintln!("  scratch: {} done", kind_name(kind));
    }
    // SAFETY: the stream made above, live until the destroy below.
    unsafe { backend.synchronize_stream(stream, d) }.expect("synchronize the scratch stream");
    // SAFETY: as above; every scratchpad and order that used it is gone (the
    // last scratchpads were dropped with `variants`), so nothing uses it after
    // this.
    unsafe { backend.destroy_stream(stream, d) }.expect("destroy the scratch stream");
}
