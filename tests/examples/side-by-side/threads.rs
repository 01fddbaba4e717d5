//! Scratch rounds on many threads at once, each thread on a stream of its
//! own: how the time of a round grows with the number of threads, and how
//! many driver allocation calls a round makes once warm.
//!
//! For each kind (pinned, device), variant and thread count, every thread
//! makes its stream, warms up, waits at a barrier and runs the same number of
//! rounds; the time per round is the median thread's, and the figure is the
//! median over the repeats. The driver allocation calls are counted over the
//! timed rounds only (after the warm-up), divided by all threads' rounds.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use gpupool_core::{AccessOrder, DeviceId, MemoryKind, ScratchSizes, Scratchpad, StreamOptions};
use gpupool_tests::baselines::DaliScratchpad;

use crate::measure::Settings;
use crate::report::kind_name;
use crate::{Machine, ALIGN, SCRATCH_DALI, SCRATCH_NEW, SCRATCH_RESET, SCRATCH_SIZED, SIZES};

/// Untimed rounds each thread runs before the barrier. Every run starts new
/// threads, and a thread's own caches reach their steady state only within
/// its first batch of frees (the CUDA backend proves pinned blocks free with
/// one stream query per 32 stream-ordered frees, and a thread taking over a
/// stream adopts what the previous thread left on it): with 2 rounds, the
/// calibration measured that warm-up, chose a few hundred rounds per thread,
/// and the timed rounds were dominated by it in some runs (H200,
/// 2026-12-01: pinned learned rounds at 16 threads 4.5–7.3 µs with 0.002–0.004
/// driver allocations per round and ~500 rounds per thread, against 0.45–0.95
/// µs with ~100,000). The same for every variant, the baselines included.
pub(crate) const WARM_ROUNDS: usize = 64;

/// The variants measured on many threads, in report order.
pub(crate) const VARIANTS: [&str; 4] = [SCRATCH_NEW, SCRATCH_SIZED, SCRATCH_RESET, SCRATCH_DALI];
/// The kinds measured on many threads.
pub(crate) const KINDS: [MemoryKind; 2] = [MemoryKind::Pinned, MemoryKind::Device];

/// One variant of one kind at one thread count.
pub(crate) struct ThreadRound {
    pub(crate) kind: MemoryKind,
    pub(crate) variant: &'static str,
    pub(crate) threads: usize,
    /// Time per round of the median thread (median over the repeats).
    pub(crate) ns_per_round: f64,
    /// Driver allocation calls per round in the timed rounds, where the
    /// backend counts them.
    pub(crate) driver_allocations_per_round: Option<f64>,
    /// Rounds per thread per repeat.
    pub(crate) rounds: usize,
}

/// What one thread keeps between its rounds of one variant.
struct Worker<'b, B: Machine> {
    backend: &'b B,
    order: AccessOrder<'b>,
    sizes: ScratchSizes,
    kept: Scratchpad<'b, B>,
}

impl<B: Machine> Worker<'_, B> {
    /// Runs `n` rounds of `variant` of `kind`.
    fn rounds(&mut self, variant: &str, kind: MemoryKind, n: usize) {
        let d = DeviceId(0);
        for _ in 0..n {
            match variant {
                SCRATCH_NEW => {
                    let pad =
                        Scratchpad::new(self.backend, self.order).expect("gpupool scratchpad");
                    for &size in &SIZES {
                        black_box(pad.alloc(kind, size, ALIGN).expect("gpupool scratch"));
                    }
                }
                SCRATCH_SIZED => {
                    let pad = Scratchpad::new(self.backend, self.order)
                        .expect("gpupool scratchpad")
                        .learn_sizes(&self.sizes);
                    for &size in &SIZES {
                        black_box(pad.alloc(kind, size, ALIGN).expect("gpupool scratch"));
                    }
                }
                SCRATCH_RESET => {
                    for &size in &SIZES {
                        black_box(self.kept.alloc(kind, size, ALIGN).expect("gpupool scratch"));
                    }
                    self.kept.reset().expect("gpupool scratch reset");
                }
                _ => {
                    // SAFETY: `order` is this worker's stream of `backend` on
                    // device 0, alive until the measurement ends.
                    let mut pad = unsafe { DaliScratchpad::new(self.backend, d, self.order) };
                    for &size in &SIZES {
                        black_box(pad.alloc(kind, size, ALIGN).expect("DALI-style scratch"));
                    }
                }
            }
        }
    }
}

/// Runs `n` rounds on each of `streams.len()` threads after a barrier, after
/// `warm` untimed rounds each; returns each thread's time per round.
fn run_threads<B: Machine>(
    backend: &B,
    streams: &[gpupool_core::StreamHandle],
    variant: &'static str,
    kind: MemoryKind,
    warm: usize,
    n: usize,
    between: &dyn Fn(),
) -> Vec<f64> {
    let d = DeviceId(0);
    let barrier = Barrier::new(streams.len() + 1);
    std::thread::scope(|scope| {
        let threads: Vec<_> = streams
            .iter()
            .map(|&stream| {
                let barrier = &barrier;
                scope.spawn(move || {
                    // SAFETY: `stream` was created on `d` by `backend` and is
                    // destroyed only after every thread of this scope ended.
                    let order = unsafe { AccessOrder::from_raw(backend, stream, d) };
                    let mut w = Worker {
                        backend,
                        order,
                        sizes: ScratchSizes::new(),
                        kept: Scratchpad::new(backend, order).expect("a gpupool scratchpad"),
                    };
                    w.rounds(variant, kind, warm);
                    barrier.wait();
                    barrier.wait();
                    let t = Instant::now();
                    w.rounds(variant, kind, n);
                    t.elapsed().as_nanos() as f64 / n as f64
                })
            })
            .collect();
        // Every thread warm: the counters read between the two waits cover
        // the timed rounds only.
        barrier.wait();
        between();
        barrier.wait();
        threads
            .into_iter()
            .map(|t| t.join().expect("a scratch thread panicked"))
            .collect()
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measures every variant of every kind at each thread count of `s`.
/// `plain` as for the one-thread rounds (the DALI-style rounds run over the
/// plain backend); `driver_allocations(kind)` reads the backend's count of
/// driver allocation calls of `kind`, where it has one.
pub(crate) fn measure_scratch_threads<B: Machine>(
    backend: &B,
    s: &Settings,
    plain: &dyn Fn(bool),
    driver_allocations: &dyn Fn(MemoryKind) -> Option<u64>,
) -> Vec<ThreadRound> {
    let d = DeviceId(0);
    let mut out = Vec::new();
    for &threads in &s.threads {
        let streams: Vec<_> = (0..threads)
            .map(|_| {
                backend
                    .create_stream(d, StreamOptions::default())
                    .expect("a stream per scratch thread")
            })
            .collect();
        for kind in KINDS {
            for variant in VARIANTS {
                let dali = variant == SCRATCH_DALI;
                plain(dali);
                // Calibrate: rounds per thread for about the target time.
                let mut n = 4usize;
                loop {
                    let per = median(run_threads(
                        backend,
                        &streams,
                        variant,
                        kind,
                        WARM_ROUNDS,
                        n,
                        &|| {},
                    ));
                    let t = Duration::from_nanos((per * n as f64) as u64);
                    if t >= s.target / 10 || n >= 1 << 24 {
                        n = ((s.target.as_nanos() as f64 / per.max(1.0)) as usize)
                            .clamp(4, 1 << 24);
                        break;
                    }
                    n *= 4;
                }
                let mut ns = Vec::with_capacity(s.repeats);
                let mut calls = Some(0u64);
                for _ in 0..s.repeats {
                    let before = std::cell::Cell::new(None);
                    let per =
                        run_threads(backend, &streams, variant, kind, WARM_ROUNDS, n, &|| {
                            before.set(driver_allocations(kind));
                        });
                    calls = match (calls, before.get(), driver_allocations(kind)) {
                        (Some(c), Some(b), Some(a)) => Some(c + a.saturating_sub(b)),
                        _ => None,
                    };
                    ns.push(median(per));
                }
                plain(false);
                let total_rounds = (n * threads * s.repeats) as f64;
                out.push(ThreadRound {
                    kind,
                    variant,
                    threads,
                    ns_per_round: median(ns),
                    driver_allocations_per_round: calls.map(|c| c as f64 / total_rounds),
                    rounds: n,
                });
                eprintln!(
                    "  scratch {} {variant} on {threads} threads: {:.0} ns per round",
                    kind_name(kind),
                    out.last().map_or(0.0, |r| r.ns_per_round)
                );
            }
        }
        for stream in streams {
            // SAFETY: every thread that used the stream has ended, and every
            // scratchpad on it was dropped; nothing else holds it.
            unsafe { backend.destroy_stream(stream, d) }.expect("destroying a scratch stream");
        }
    }
    out
}

/// The markdown section of the many-thread rounds (empty if none ran).
pub(crate) fn report(rows: &[ThreadRound]) -> String {
    use std::fmt::Write as _;

    use crate::report::{fmt_ns, fmt_ratio, ratio};

    let mut o = String::new();
    if rows.is_empty() {
        return o;
    }
    let find = |kind, variant, threads| {
        rows.iter()
            .find(|r| r.kind == kind && r.variant == variant && r.threads == threads)
    };
    let _ = writeln!(
        o,
        "## Scratch on many threads, each its own stream: time per round of the median thread \
         (× its one-thread time), driver allocation calls per round once warm"
    );
    for kind in KINDS {
        let _ = writeln!(o);
        let _ = writeln!(o, "### {}", kind_name(kind));
        let _ = writeln!(o);
        let _ = writeln!(o, "| threads | {} |", VARIANTS.join(" | "));
        let _ = writeln!(o, "|---|{}", "---|".repeat(VARIANTS.len()));
        let mut counts: Vec<usize> = rows.iter().map(|r| r.threads).collect();
        counts.dedup();
        for threads in counts {
            let cells: Vec<String> = VARIANTS
                .iter()
                .map(|&v| match find(kind, v, threads) {
                    Some(r) => format!(
                        "{} ({}), {} calls",
                        fmt_ns(r.ns_per_round),
                        fmt_ratio(ratio(
                            Some(r.ns_per_round),
                            find(kind, v, 1).map(|one| one.ns_per_round)
                        )),
                        r.driver_allocations_per_round
                            .map_or("–".into(), |c| format!("{c:.2}"))
                    ),
                    None => "–".into(),
                })
                .collect();
            let _ = writeln!(o, "| {threads} | {} |", cells.join(" | "));
        }
    }
    let _ = writeln!(o);
    o
}
