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

use gpupool_bench::baselines::DaliScratchpad;
use gpupool_bench::scoped::on_threads;
use gpupool_bench::sys_stats::upper_median as median;
use gpupool_core::{AccessOrder, DeviceId, MemoryKind, ScratchSizes, Scratchpad, StreamOptions};

use crate::measure::Settings;
use crate::report::kind_name;
use crate::{Machine, Scratch, ALIGN, SIZES};

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
pub(crate) const VARIANTS: [Scratch; 4] =
    [Scratch::New, Scratch::Sized, Scratch::Reset, Scratch::Dali];
/// The kinds measured on many threads.
pub(crate) const KINDS: [MemoryKind; 2] = [MemoryKind::Pinned, MemoryKind::Device];

/// A scratch round's time: one variant of one kind at one thread count (the
/// one-thread rounds of `measure_scratch` and the many-thread rounds here).
pub(crate) struct Round {
    pub(crate) kind: MemoryKind,
    pub(crate) variant: Scratch,
    pub(crate) threads: usize,
    /// Time per round of the median thread (median over the repeats).
    pub(crate) ns_per_round: f64,
    /// Driver allocation calls per round in the timed rounds, where they are
    /// counted (the many-thread rounds, on a backend that counts them).
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
    fn rounds(&mut self, variant: Scratch, kind: MemoryKind, n: usize) {
        let d = DeviceId(0);
        for _ in 0..n {
            match variant {
                Scratch::New => {
                    let pad =
                        Scratchpad::new(self.backend, self.order).expect("gpupool scratchpad");
                    for &size in &SIZES {
                        black_box(pad.alloc(kind, size, ALIGN).expect("gpupool scratch"));
                    }
                }
                Scratch::Sized => {
                    let pad = Scratchpad::new(self.backend, self.order)
                        .expect("gpupool scratchpad")
                        .learn_sizes(&self.sizes);
                    for &size in &SIZES {
                        black_box(pad.alloc(kind, size, ALIGN).expect("gpupool scratch"));
                    }
                }
                Scratch::Reset => {
                    for &size in &SIZES {
                        black_box(self.kept.alloc(kind, size, ALIGN).expect("gpupool scratch"));
                    }
                    self.kept.reset().expect("gpupool scratch reset");
                }
                Scratch::Dali => {
                    // SAFETY: `order` is this worker's stream of `backend` on
                    // device 0, alive until the measurement ends.
                    let mut pad = unsafe { DaliScratchpad::new(self.backend, d, self.order) };
                    for &size in &SIZES {
                        black_box(pad.alloc(kind, size, ALIGN).expect("DALI-style scratch"));
                    }
                }
                Scratch::Raw | Scratch::Bump => {
                    unreachable!("{} runs on one thread only", variant.name())
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
    variant: Scratch,
    kind: MemoryKind,
    warm: usize,
    n: usize,
    between: &dyn Fn(),
) -> Vec<f64> {
    let d = DeviceId(0);
    let barrier = &Barrier::new(streams.len() + 1);
    let thread = move |stream| {
        // SAFETY: `stream` was created on `d` by `backend` and is destroyed
        // only after every thread of this scope ended.
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
    };
    // Every thread warm: the counters read between the two waits cover the
    // timed rounds only.
    let meanwhile = || {
        barrier.wait();
        between();
        barrier.wait();
    };
    on_threads(
        streams.iter().copied(),
        "a scratch thread",
        thread,
        meanwhile,
    )
}

/// Measures `counts` thread counts: calibrates each (rounds per thread for
/// about the target time), then runs every count in turn within each repeat
/// (1, 2, 4, .., 16, 1, 2, ..), so a drift of the machine's speed during the
/// measurement reaches every count alike instead of one (the GPU machine's
/// one-thread round time moved twofold between runs of one binary, H200,
/// 2026-12-01/02). `timed(i, n, repeat)` runs count `i` for `n` rounds per
/// thread (`repeat`: a measured repeat, not a calibration) and returns each
/// thread's time per round. Returns per count the median over the repeats of
/// the median thread's time, and the rounds per thread.
fn interleaved(
    s: &Settings,
    counts: usize,
    mut timed: impl FnMut(usize, usize, bool) -> Vec<f64>,
) -> Vec<(f64, usize)> {
    let n: Vec<usize> = (0..counts)
        .map(|i| {
            let mut n = 4usize;
            loop {
                let per = median(timed(i, n, false));
                let t = Duration::from_nanos((per * n as f64) as u64);
                if t >= s.target / 10 || n >= 1 << 24 {
                    break ((s.target.as_nanos() as f64 / per.max(1.0)) as usize).clamp(4, 1 << 24);
                }
                n *= 4;
            }
        })
        .collect();
    let mut ns = vec![Vec::with_capacity(s.repeats()); counts];
    for _ in 0..s.repeats() {
        for (i, ns) in ns.iter_mut().enumerate() {
            ns.push(median(timed(i, n[i], true)));
        }
    }
    ns.into_iter().zip(n).map(|(v, n)| (median(v), n)).collect()
}

/// A fixed piece of arithmetic that touches no memory (a dependent
/// multiply-xor chain): the control row. Its time per thread at many threads
/// against one thread is the machine's own scaling (clock speed with many
/// cores busy, cores shared with other machines' work), the floor for code
/// that shares nothing.
fn control_round(x: u64) -> u64 {
    let mut x = x;
    for _ in 0..256 {
        x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (x >> 29);
    }
    x
}

/// The control on `threads` threads: each runs `n` control rounds after a
/// barrier; their times per round.
fn run_control(threads: usize, n: usize) -> Vec<f64> {
    let barrier = &Barrier::new(threads);
    let thread = move |i| {
        let mut x = black_box(0x2545_F491_4F6C_DD1D ^ i as u64);
        for _ in 0..WARM_ROUNDS {
            x = control_round(x);
        }
        barrier.wait();
        let t = Instant::now();
        for _ in 0..n {
            x = black_box(control_round(x));
        }
        black_box(x);
        t.elapsed().as_nanos() as f64 / n as f64
    };
    on_threads(0..threads, "a control thread", thread, || {})
}

/// The many-thread rounds and the control measured beside them.
#[derive(Default)]
pub(crate) struct ThreadRounds {
    pub(crate) rows: Vec<Round>,
    /// The control round (no memory, no gpupool) per thread count: time per
    /// round of the median thread, median over the repeats.
    pub(crate) control: Vec<(usize, f64)>,
}

/// Measures every variant of every kind at each thread count of `s`, the
/// thread counts interleaved (see [`interleaved`]), and the control the same
/// way. `plain` as for the one-thread rounds (the DALI-style rounds run over
/// the plain backend); `driver_allocations(kind)` reads the backend's count
/// of driver allocation calls of `kind`, where it has one.
pub(crate) fn measure_scratch_threads<B: Machine>(
    backend: &B,
    s: &Settings,
    plain: &dyn Fn(bool),
    driver_allocations: &dyn Fn(MemoryKind) -> Option<u64>,
) -> ThreadRounds {
    let d = DeviceId(0);
    let most = s.threads.iter().copied().max().unwrap_or(1);
    // One stream per thread, created once: the first `t` of them for `t`
    // threads (a thread taking over a stream from an ended thread of an
    // earlier run adopts the blocks left on it, within its warm-up rounds).
    let streams: Vec<_> = (0..most)
        .map(|_| {
            backend
                .create_stream(d, StreamOptions::default())
                .expect("a stream per scratch thread")
        })
        .collect();
    let counts = s.threads.len();
    let mut out = ThreadRounds {
        control: s
            .threads
            .iter()
            .zip(interleaved(s, counts, |i, n, _| {
                run_control(s.threads[i], n)
            }))
            .map(|(&t, (ns, _))| (t, ns))
            .collect(),
        ..ThreadRounds::default()
    };
    eprintln!(
        "  control round on {} threads: {:.0} ns per round",
        most,
        out.control.last().map_or(0.0, |c| c.1)
    );
    for kind in KINDS {
        for variant in VARIANTS {
            let dali = variant == Scratch::Dali;
            plain(dali);
            // Driver allocation calls over the timed rounds of each count's
            // repeats (read between the warm-up and the timed rounds).
            let mut calls: Vec<Option<u64>> = vec![Some(0); counts];
            let measured = interleaved(s, counts, |i, n, repeat| {
                let before = std::cell::Cell::new(None);
                let streams = &streams[..s.threads[i]];
                let per = run_threads(backend, streams, variant, kind, WARM_ROUNDS, n, &|| {
                    before.set(driver_allocations(kind));
                });
                if repeat {
                    calls[i] = match (calls[i], before.get(), driver_allocations(kind)) {
                        (Some(c), Some(b), Some(a)) => Some(c + a.saturating_sub(b)),
                        _ => None,
                    };
                }
                per
            });
            plain(false);
            for (i, (ns, n)) in measured.into_iter().enumerate() {
                let threads = s.threads[i];
                let total_rounds = (n * threads * s.repeats()) as f64;
                out.rows.push(Round {
                    kind,
                    variant,
                    threads,
                    ns_per_round: ns,
                    driver_allocations_per_round: calls[i].map(|c| c as f64 / total_rounds),
                    rounds: n,
                });
            }
            eprintln!(
                "  scratch {} {} on {most} threads: {:.0} ns per round",
                kind_name(kind),
                variant.name(),
                out.rows.last().map_or(0.0, |r| r.ns_per_round)
            );
        }
    }
    for stream in streams {
        // SAFETY: every thread that used the stream has ended, and every
        // scratchpad on it was dropped; nothing else holds it.
        unsafe { backend.destroy_stream(stream, d) }.expect("destroying a scratch stream");
    }
    out
}

/// The markdown section of the many-thread rounds (empty if none ran).
pub(crate) fn report(measured: &ThreadRounds) -> String {
    use std::fmt::Write as _;

    use crate::report::{fmt_ns, fmt_ratio, ratio};

    let mut o = String::new();
    let rows = &measured.rows;
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
         (× its one-thread time), driver allocation calls per round once warm; the thread \
         counts measured in turn within each repeat"
    );
    let one = measured.control.iter().find(|c| c.0 == 1).map(|c| c.1);
    let control: Vec<String> = measured
        .control
        .iter()
        .map(|&(t, ns)| {
            format!(
                "{t} thr {} ({})",
                fmt_ns(ns),
                fmt_ratio(ratio(Some(ns), one))
            )
        })
        .collect();
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Control (arithmetic only, no memory, no gpupool: the machine's own scaling): {}",
        control.join(", ")
    );
    for kind in KINDS {
        let _ = writeln!(o);
        let _ = writeln!(o, "### {}", kind_name(kind));
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "| threads | {} |",
            VARIANTS.map(Scratch::name).join(" | ")
        );
        let _ = writeln!(o, "|---|{}", "---|".repeat(VARIANTS.len()));
        let mut counts: Vec<usize> = rows.iter().map(|r| r.threads).collect();
        counts.sort_unstable();
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
