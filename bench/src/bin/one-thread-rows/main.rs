//! gpupool's own one-thread rows of the side-by-side benchmark (stream and
//! event pools, scratch rounds of each kind), short and interleaved, for
//! comparing two builds. Two ways:
//!
//! - `scripts/same-process-rows.sh` (preferred) compiles the rows (the
//!   `gpupool-rows` crate, `bench/rows/`) against two builds of gpupool into
//!   one binary and alternates the two builds' rows in blocks of milliseconds
//!   within one process, so a drift of the machine's speed falls on both
//!   alike;
//! - `scripts/gpu-before-after.sh` runs two builds of this binary
//!   alternately, many times in a few minutes, and `scripts/compare-rows.py`
//!   takes each row's median over the runs of each build. Between processes
//!   the GPU machine's rows moved up to twofold (H200, 2026-12-02), in step
//!   with each other, so this needs many pairs.
//!
//! Each row runs for about `TARGET`, once per repeat, the rows in turn within
//! each repeat; the figure is the median of `REPEATS`. Writes `$OUT/rows.json`
//! (`{"row": ns, ...}`) and prints the table. Without a driver or a GPU it
//! says "skipped" and exits 0.
//!
//! `cargo run --release -p gpupool-bench --bin one-thread-rows`

use std::time::Duration;

use gpupool_bench::gpu::cuda_or_skip;
use gpupool_bench::sys_stats::upper_median as median;
use gpupool_rows as rows;

const REPEATS: usize = 9;
const TARGET: Duration = Duration::from_millis(20);

fn main() {
    let Some(gpu) = cuda_or_skip() else {
        return;
    };
    let figures = rows::with_rows(&gpu, |rows| {
        let n: Vec<usize> = rows
            .iter_mut()
            .map(|(_, f)| rows::calibrate(f, TARGET))
            .collect();
        let mut ns = vec![Vec::with_capacity(REPEATS); rows.len()];
        for _ in 0..REPEATS {
            for (i, (_, f)) in rows.iter_mut().enumerate() {
                ns[i].push(rows::time(f, n[i]).as_nanos() as f64 / n[i] as f64);
            }
        }
        rows.iter()
            .zip(ns)
            .map(|((name, _), v)| (name.clone(), median(v)))
            .collect::<Vec<(String, f64)>>()
    });
    println!("| row | ns |");
    println!("|---|---|");
    for (name, ns) in &figures {
        println!("| {name} | {ns:.1} |");
    }
    if let Some(dir) = std::env::var_os("OUT") {
        let body: Vec<String> = figures
            .iter()
            .map(|(name, ns)| format!("  \"{name}\": {ns:.3}"))
            .collect();
        let path = std::path::Path::new(&dir).join("rows.json");
        std::fs::write(&path, format!("{{\n{}\n}}\n", body.join(",\n")))
            .expect("writing rows.json");
    }
    println!("OK");
}
