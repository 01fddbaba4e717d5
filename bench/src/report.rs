//! The table on stdout and the CSV files: every run, and the medians over
//! repetitions of each (design, in flight, threads) cell.

use std::fmt::Write as _;
use std::path::Path as FsPath;

use crate::harness::CellResult;
use crate::sys_stats::median;

/// One run of one cell.
pub struct Run {
    /// The design's short name.
    pub design: &'static str,
    /// Futures in flight at most.
    pub inflight: usize,
    /// Submitting threads.
    pub threads: usize,
    /// Which repetition.
    pub rep: usize,
    /// What it measured.
    pub result: CellResult,
}

/// The figures of one run that the summary takes medians of.
fn figures(r: &CellResult) -> [Option<f64>; NFIG] {
    let window = r.window_ns as f64;
    let per_completion = |ns: u64| (r.completed > 0).then(|| ns as f64 / r.completed as f64 / 1e3);
    [
        r.submit_mean_ns.map(|v| v / 1e3),
        r.submit_p50_ns.map(|v| v / 1e3),
        r.notify_p50_ns.map(|v| v / 1e3),
        r.notify_p99_ns.map(|v| v / 1e3),
        r.wake_p50_ns.map(|v| v / 1e3),
        r.wake_p99_ns.map(|v| v / 1e3),
        Some(r.per_sec),
        (window > 0.0).then(|| r.machinery_cpu_ns as f64 / window * 100.0),
        per_completion(r.machinery_cpu_ns),
        (window > 0.0).then(|| r.process_cpu_ns as f64 / window * 100.0),
        per_completion(r.process_cpu_ns),
    ]
}

/// How many figures a run has.
const NFIG: usize = 11;

const FIGURE_NAMES: [&str; NFIG] = [
    "submit_mean_us",
    "submit_p50_us",
    "notify_p50_us",
    "notify_p99_us",
    "wake_p50_us",
    "wake_p99_us",
    "completions_per_s",
    "machinery_cpu_pct",
    "machinery_cpu_us_per_completion",
    "process_cpu_pct",
    "process_cpu_us_per_completion",
];

/// A cell's medians and notes.
pub struct Summary {
    /// The design's short name.
    pub design: &'static str,
    /// Futures in flight at most.
    pub inflight: usize,
    /// Submitting threads.
    pub threads: usize,
    /// Runs summarised.
    pub runs: usize,
    /// Medians of `FIGURE_NAMES`.
    pub figures: [Option<f64>; NFIG],
    /// Paths taken, errors, early wakes: summed over the runs.
    pub notes: String,
}

/// Medians per cell, in the order cells first appear in `runs`.
pub fn summarize(runs: &[Run]) -> Vec<Summary> {
    let mut keys: Vec<(&'static str, usize, usize)> = Vec::new();
    for r in runs {
        let k = (r.design, r.inflight, r.threads);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(design, inflight, threads)| {
            let cell: Vec<&Run> = runs
                .iter()
                .filter(|r| (r.design, r.inflight, r.threads) == (design, inflight, threads))
                .collect();
            let per_run: Vec<[Option<f64>; NFIG]> =
                cell.iter().map(|r| figures(&r.result)).collect();
            let mut figs = [None; NFIG];
            for (i, f) in figs.iter_mut().enumerate() {
                let col: Vec<Option<f64>> = per_run.iter().map(|p| p[i]).collect();
                *f = median(&col);
            }
            Summary {
                design,
                inflight,
                threads,
                runs: cell.len(),
                figures: figs,
                notes: notes(&cell),
            }
        })
        .collect()
}

fn notes(cell: &[&Run]) -> String {
    let mut paths = [0u64; 4];
    let (mut errors, mut early, mut spin, mut submitted) = (0u64, 0u64, 0.0f64, 0u64);
    let (mut first_poll, mut samples) = (0u64, 0usize);
    let mut first_error = None;
    for r in cell {
        for (p, q) in paths.iter_mut().zip(r.result.paths) {
            *p += q;
        }
        errors += r.result.errors;
        early += r.result.early;
        spin += r.result.spin_mean_ns * r.result.submitted as f64;
        submitted += r.result.submitted;
        first_poll += r.result.first_poll_ready;
        samples += r.result.wake_samples;
        if first_error.is_none() {
            first_error = r.result.first_error.clone();
        }
    }
    let mut s = String::new();
    let total: u64 = paths.iter().sum();
    if paths[1] + paths[2] + paths[3] > 0 && total > 0 {
        let pct = |n: u64| n as f64 * 100.0 / total as f64;
        let _ = write!(
            s,
            "spin {:.0}% reactor {:.0}% hostfn {:.0}%; spin {:.1} us/future",
            pct(paths[1]),
            pct(paths[2]),
            pct(paths[3]),
            if submitted > 0 {
                spin / submitted as f64 / 1e3
            } else {
                0.0
            }
        );
    }
    if first_poll > 0 && samples > 0 {
        let _ = write!(
            s,
            "{}ready at 1st poll {:.0}%",
            if s.is_empty() { "" } else { "; " },
            first_poll as f64 * 100.0 / samples as f64
        );
    }
    if early > 0 {
        let _ = write!(
            s,
            "{}EARLY WAKES: {early}",
            if s.is_empty() { "" } else { "; " }
        );
    }
    if errors > 0 {
        let _ = write!(
            s,
            "{}ERRORS: {errors} (first: {})",
            if s.is_empty() { "" } else { "; " },
            first_error.unwrap_or_default()
        );
    }
    s
}

fn cell_text(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x.abs() >= 10_000.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}

/// The summary as a fixed-width table.
pub fn table(summaries: &[Summary]) -> String {
    let head = [
        "design",
        "F",
        "T",
        "submit mean us",
        "submit p50 us",
        "notify p50 us",
        "notify p99 us",
        "wake p50 us",
        "wake p99 us",
        "completions/s",
        "mach CPU %",
        "mach CPU us/compl",
        "proc CPU %",
        "proc CPU us/compl",
        "notes",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for s in summaries {
        let mut row = vec![
            s.design.to_string(),
            s.inflight.to_string(),
            s.threads.to_string(),
        ];
        row.extend(s.figures.iter().map(|&v| cell_text(v)));
        row.push(s.notes.clone());
        rows.push(row);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (n, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 || i + 1 == r.len() {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
        if n == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
            out.push('\n');
        }
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn num(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.4}")).unwrap_or_default()
}

/// Writes `runs.csv` (every run) and `summary.csv` (medians) into `dir`.
pub fn write_csv(dir: &FsPath, runs: &[Run], summaries: &[Summary]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut all = String::from(
        "design,inflight,threads,rep,submitted,completed,window_ns,wake_samples,notify_samples,\
         first_poll_ready,calib_drift_us,calib_uncertainty_us,",
    );
    all.push_str(&FIGURE_NAMES.join(","));
    all.push_str(
        ",wake_min_us,spin_mean_us,paths_direct,paths_spin,paths_reactor,paths_hostfn,machinery_threads,early,errors,first_error\n",
    );
    for r in runs {
        let c = &r.result;
        let _ = write!(
            all,
            "{},{},{},{},{},{},{},{},{},{},{:.3},{:.3}",
            r.design,
            r.inflight,
            r.threads,
            r.rep,
            c.submitted,
            c.completed,
            c.window_ns,
            c.wake_samples,
            c.notify_samples,
            c.first_poll_ready,
            c.drift_ns as f64 / 1e3,
            c.calib_uncertainty_ns / 1e3
        );
        for f in figures(c) {
            let _ = write!(all, ",{}", num(f));
        }
        let _ = writeln!(
            all,
            ",{},{:.4},{},{},{},{},{},{},{},{}",
            num(c.wake_min_ns.map(|v| v / 1e3)),
            c.spin_mean_ns / 1e3,
            c.paths[0],
            c.paths[1],
            c.paths[2],
            c.paths[3],
            c.machinery_threads,
            c.early,
            c.errors,
            csv_field(c.first_error.as_deref().unwrap_or(""))
        );
    }
    std::fs::write(dir.join("runs.csv"), all)?;
    let mut sum = String::from("design,inflight,threads,runs,");
    sum.push_str(&FIGURE_NAMES.map(|n| format!("median_{n}")).join(","));
    sum.push_str(",notes\n");
    for s in summaries {
        let _ = write!(sum, "{},{},{},{}", s.design, s.inflight, s.threads, s.runs);
        for f in s.figures {
            let _ = write!(sum, ",{}", num(f));
        }
        let _ = writeln!(sum, ",{}", csv_field(&s.notes));
    }
    std::fs::write(dir.join("summary.csv"), sum)
}
