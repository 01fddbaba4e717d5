//! Two builds of gpupool in one process: the one-thread rows of the
//! `gpupool-rows` crate (`bench/rows/`), compiled once against a build from
//! before a change (`rows_before`) and once against the working tree
//! (`rows_after`), timed in alternating blocks of a few milliseconds: for
//! each row, a block of the one build, then a block of the other (the order
//! swapped every pair), `PAIRS` times. A pair's two blocks run within
//! milliseconds of each other on the same thread, so a drift of the
//! machine's speed (between processes the GPU machine's rows moved up to
//! twofold, in step) falls on both alike; the median over the pairs of each
//! pair's after/before quotient is the comparison.
//!
//! Built by `scripts/same-process-rows.sh REV`, which writes the two copies
//! of the rows crate and the manifest that names them. Environment: `PAIRS`
//! (default 61), `BLOCK_MS` (default 5), `ROWS` (only the rows whose name
//! contains it), `ROW` (only the row of exactly that name), `OUT` (writes `same-process-rows.json` there). With
//! `--mock`, on the mock backend (no GPU; the mock's own costs are not
//! CUDA's); with `--bare`, on a backend that only allocates host memory
//! (`bench/rows/src/bare.rs`: what the core's own code costs, on any
//! machine). Otherwise on CUDA: without a driver or a GPU it says "skipped"
//! and exits 0.
//!
//! `THREADS` (default 1): that many threads, each with its own rows (its own
//! pools, stream and scratchpads, on the same backend), time the same row
//! together: every block starts on all threads at once (a barrier), and a
//! pair's figure of each build is the median thread's. What the threads
//! share is each build's process-wide state (the CUDA backend's memory and
//! block caches, the driver), so this compares how the two builds scale.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

// The timing helpers of the rows crate, from one build: the same code times
// both.
use rows_before::{calibrate, time};

/// The `q` quantile (0..=1) of `v`, nearest rank.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// One row's figures: ns per operation of each build, per pair.
struct Figures {
    name: String,
    before: Vec<f64>,
    after: Vec<f64>,
}

/// What the timing threads share: the barrier each block starts behind, and
/// the count the leading thread calibrated for the row being timed.
struct Crew {
    barrier: Barrier,
    count: AtomicUsize,
}

fn compare(
    crew: &Crew,
    leader: bool,
    before_rows: &mut [rows_before::Row<'_>],
    after_rows: &mut [rows_after::Row<'_>],
    pairs: usize,
    block: Duration,
) -> Vec<Figures> {
    assert_eq!(
        before_rows.len(),
        after_rows.len(),
        "the builds' rows differ"
    );
    let only = std::env::var("ROWS").unwrap_or_default();
    let exact = std::env::var("ROW").ok();
    let mut out = Vec::new();
    for ((name, b), (name_after, a)) in before_rows.iter_mut().zip(after_rows.iter_mut()) {
        assert_eq!(name, name_after, "the builds' rows differ");
        if !name.contains(only.as_str()) || exact.as_ref().is_some_and(|e| e != name) {
            continue;
        }
        // One count for both builds and every thread (the leader's before
        // build's), so a pair's two blocks do the same work; warm both first.
        if leader {
            let n = calibrate(b, block);
            calibrate(a, block);
            // Relaxed: the barrier below orders the store before every
            // thread's load.
            crew.count.store(n, Ordering::Relaxed);
        }
        crew.barrier.wait();
        let n = crew.count.load(Ordering::Relaxed);
        time(b, n);
        time(a, n);
        let mut fig = Figures {
            name: name.clone(),
            before: Vec::with_capacity(pairs),
            after: Vec::with_capacity(pairs),
        };
        for i in 0..pairs {
            let per = |t: Duration| t.as_nanos() as f64 / n as f64;
            crew.barrier.wait();
            if i % 2 == 0 {
                fig.before.push(per(time(b, n)));
                crew.barrier.wait();
                fig.after.push(per(time(a, n)));
            } else {
                fig.after.push(per(time(a, n)));
                crew.barrier.wait();
                fig.before.push(per(time(b, n)));
            }
        }
        // The leader calibrates the next row alone.
        crew.barrier.wait();
        out.push(fig);
    }
    out
}

/// Both builds' rows, each on its own backend, compared on `threads`
/// threads: each pair's figure of a build is the median thread's.
fn both<B, A>(
    before_backend: &B,
    after_backend: &A,
    pairs: usize,
    block: Duration,
    threads: usize,
) -> Vec<Figures>
where
    B: rows_before::gpupool_core::ScratchBackend + Sync,
    A: rows_after::gpupool_core::ScratchBackend + Sync,
{
    let crew = Crew {
        barrier: Barrier::new(threads),
        count: AtomicUsize::new(0),
    };
    let per_thread: Vec<Vec<Figures>> = std::thread::scope(|s| {
        let crew = &crew;
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    rows_before::with_rows(before_backend, |b| {
                        rows_after::with_rows(after_backend, |a| {
                            compare(crew, t == 0, b, a, pairs, block)
                        })
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a timing thread panicked"))
            .collect()
    });
    let median_thread = |row: usize, pair: usize, of: fn(&Figures) -> &Vec<f64>| {
        let v: Vec<f64> = per_thread.iter().map(|f| of(&f[row])[pair]).collect();
        quantile(&v, 0.5)
    };
    (0..per_thread[0].len())
        .map(|row| Figures {
            name: per_thread[0][row].name.clone(),
            before: (0..pairs)
                .map(|i| median_thread(row, i, |f| &f.before))
                .collect(),
            after: (0..pairs)
                .map(|i| median_thread(row, i, |f| &f.after))
                .collect(),
        })
        .collect()
}

fn main() {
    use rows_after::gpupool_core::Backend as _;
    let pairs = env_usize("PAIRS", 61).max(1);
    let block = Duration::from_millis(env_usize("BLOCK_MS", 5) as u64);
    let threads = env_usize("THREADS", 1).max(1);
    let mock = std::env::args().any(|a| a == "--mock");
    let bare = std::env::args().any(|a| a == "--bare");
    let figures = if bare {
        both(
            &rows_before::Bare::new(),
            &rows_after::Bare::new(),
            pairs,
            block,
            threads,
        )
    } else if mock {
        both(
            &rows_before::Mock::new(1),
            &rows_after::Mock::new(1),
            pairs,
            block,
            threads,
        )
    } else {
        let before_gpu = rows_before::Gpu::new();
        let after_gpu = rows_after::Gpu::new();
        match after_gpu.device_count() {
            Ok(n) if n > 0 => {}
            _ => {
                println!("skipped: no CUDA driver or no GPU");
                return;
            }
        }
        both(&before_gpu, &after_gpu, pairs, block, threads)
    };
    let on = if threads > 1 {
        format!("{threads} threads at once (the median thread's figures)")
    } else {
        "one thread".to_string()
    };
    println!(
        "{pairs} pairs of {} ms blocks, same process, {on}, {}; after/before per pair:",
        block.as_millis(),
        if bare {
            "bare backend (the core's own cost)"
        } else if mock {
            "mock backend"
        } else {
            "CUDA backend"
        }
    );
    println!("| row | before ns | after ns | median of pairs' after/before | quartiles |");
    println!("|---|---|---|---|---|");
    let mut json = Vec::new();
    for f in &figures {
        let q: Vec<f64> = f.before.iter().zip(&f.after).map(|(b, a)| a / b).collect();
        let (b, a) = (quantile(&f.before, 0.5), quantile(&f.after, 0.5));
        let (q1, m, q3) = (quantile(&q, 0.25), quantile(&q, 0.5), quantile(&q, 0.75));
        println!(
            "| {} | {b:.1} | {a:.1} | {m:.3} | {q1:.3}–{q3:.3} |",
            f.name
        );
        json.push(format!(
            "  \"{}\": {{\"before_ns\": {b:.3}, \"after_ns\": {a:.3}, \"median_ratio\": {m:.4}, \"q1\": {q1:.4}, \"q3\": {q3:.4}, \"ratios\": [{}]}}",
            f.name,
            q.iter().map(|r| format!("{r:.4}")).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(dir) = std::env::var_os("OUT") {
        let path = std::path::Path::new(&dir).join("same-process-rows.json");
        std::fs::write(&path, format!("{{\n{}\n}}\n", json.join(",\n")))
            .expect("writing same-process-rows.json");
    }
    println!("OK");
}
