//! The markdown report: formatting, the ratios, the targets of the
//! performance issue, and the facts about the run.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use gpupool_core::MemoryKind;

use crate::measure::{Results, Settings};
use crate::{Scratch, CREATE, DALI, EVENT, GPUPOOL, MUTEX_VEC, STICKY, STREAM};

pub(crate) fn kind_name(kind: MemoryKind) -> &'static str {
    match kind {
        MemoryKind::Host => "host",
        MemoryKind::Pinned => "pinned",
        MemoryKind::Device => "device",
        MemoryKind::Managed => "managed",
    }
}

/// `a ÷ b` when both are known.
pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

pub(crate) fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r >= 100.0 => format!("{r:.0}×"),
        Some(r) if r >= 10.0 => format!("{r:.1}×"),
        Some(r) if r >= 0.01 => format!("{r:.2}×"),
        Some(r) => format!("{r:.1e}×"),
        None => "–".into(),
    }
}

pub(crate) fn fmt_ns(ns: f64) -> String {
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
pub(crate) fn tput_ratio(r: &Results, op: &str, baseline: &str, threads: usize) -> Option<f64> {
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
pub(crate) struct Target {
    pub(crate) what: String,
    pub(crate) measured: Option<f64>,
    pub(crate) at_most: bool,
    pub(crate) limit: f64,
}

impl Target {
    /// A target that `measured` be at most `limit`.
    fn le(what: String, measured: Option<f64>, limit: f64) -> Self {
        Target {
            what,
            measured,
            at_most: true,
            limit,
        }
    }

    /// A target that `measured` be at least `limit`.
    fn ge(what: String, measured: Option<f64>, limit: f64) -> Self {
        Target {
            at_most: false,
            ..Target::le(what, measured, limit)
        }
    }

    pub(crate) fn met(&self) -> Option<bool> {
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

/// A pool's targets against the DALI-style pool: the time per `per_op` at
/// one thread at most the same, the throughput at `threads` at least `tput`
/// times, and (where `p999` names it) the p99.9 latency oversubscribed at
/// most a tenth.
struct PoolAgainstDali {
    op: &'static str,
    name: &'static str,
    per_op: &'static str,
    threads: usize,
    tput: f64,
    p999: Option<String>,
}

impl PoolAgainstDali {
    fn push_to(self, t: &mut Vec<Target>, r: &Results) {
        let (op, name, threads) = (self.op, self.name, self.threads);
        t.push(Target::le(
            format!("{name}: time per {} at 1 thread ÷ DALI-style", self.per_op),
            time_ratio(r, op, DALI, 1),
            1.0,
        ));
        t.push(Target::ge(
            format!("{name}: throughput at {threads} threads ÷ DALI-style"),
            tput_ratio(r, op, DALI, threads),
            self.tput,
        ));
        if let Some(what) = self.p999 {
            t.push(Target::le(what, p999_ratio(r, op, DALI), 0.1));
        }
    }
}

/// The targets of the performance issue for this machine.
pub(crate) fn targets(r: &Results, s: &Settings, cuda: bool) -> Vec<Target> {
    let over = s.oversubscribed();
    let mut t = Vec::new();
    let bumpalo = ratio(
        r.round(MemoryKind::Host, Scratch::Reset),
        r.round(MemoryKind::Host, Scratch::Bump),
    );
    if !cuda {
        for (op, name) in [(EVENT, "event pool"), (STREAM, "stream pool")] {
            let p999 = format!("{name}: p99.9 latency at {over} threads (4 per core) ÷ DALI-style");
            let per = PoolAgainstDali {
                op,
                name,
                per_op: op,
                threads: 2,
                tput: 1.5,
                p999: Some(p999),
            };
            per.push_to(&mut t, r);
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
    // Throughput ÷ DALI-style at `top` threads: at least 20× for events, 5×
    // for streams; the p99.9 latency target is the event pool's alone.
    for (op, name, per_op, tput) in [
        (EVENT, "events", "get+put", 20.0),
        (STREAM, "streams", "lease+return", 5.0),
    ] {
        let p999 =
            (op == EVENT).then(|| format!("events: p99.9 latency at {over} threads ÷ DALI-style"));
        let per = PoolAgainstDali {
            op,
            name,
            per_op,
            threads: top,
            tput,
            p999,
        };
        per.push_to(&mut t, r);
    }
    for (op, name, tput) in [(EVENT, "events", 100.0), (STREAM, "streams", 50.0)] {
        t.push(Target::ge(
            format!("{name}: throughput at {top} threads ÷ create+destroy"),
            tput_ratio(r, op, CREATE, top),
            tput,
        ));
    }
    // Scratch rounds ÷ DALI-style: new each round with learned sizes, and
    // reset reuse.
    for (kind, sized, reset) in [
        (MemoryKind::Device, 0.5, 0.1),
        (MemoryKind::Pinned, 0.5, 0.1),
        (MemoryKind::Host, 1.0, 1.0),
    ] {
        let k = kind_name(kind);
        let dali = r.round(kind, Scratch::Dali);
        t.push(Target::le(
            format!("{k} scratch round of 16, new each round (learned sizes) ÷ DALI-style"),
            ratio(r.round(kind, Scratch::Sized), dali),
            sized,
        ));
        t.push(Target::le(
            format!("{k} scratch round of 16, reset reuse ÷ DALI-style"),
            ratio(r.round(kind, Scratch::Reset), dali),
            reset,
        ));
    }
    t.push(Target::le(
        "host scratch round (reset reuse) per allocation ÷ bumpalo".into(),
        bumpalo,
        1.5,
    ));
    t
}

/// Facts about the run, for the header and the JSON.
pub(crate) struct About {
    pub(crate) backend: String,
    pub(crate) date: String,
    pub(crate) commit: String,
    pub(crate) cpu: String,
    pub(crate) command: String,
    /// `/proc/loadavg`'s first three figures when the run started (other
    /// work on the machine shows in the multi-thread figures).
    pub(crate) load: String,
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

pub(crate) fn about(backend: String) -> About {
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
pub(crate) fn report(r: &Results, s: &Settings, a: &About, targets: &[Target]) -> String {
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
        s.repeats(),
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
        s.oversubscribed(),
        s.cores
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "| operation | variant | p50 | p99 | p99.9 | p99.9 ÷ DALI-style's | samples per repeat |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for l in &r.latency {
        let vs = if l.case.variant == GPUPOOL {
            fmt_ratio(p999_ratio(r, l.case.op, DALI))
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {vs} | {} |",
            l.case.op,
            l.case.variant,
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
        let cell = |v| r.round(kind, v).map_or("–".into(), fmt_ns);
        let reset = r.round(kind, Scratch::Reset);
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            kind_name(kind),
            cell(Scratch::New),
            cell(Scratch::Sized),
            cell(Scratch::Reset),
            cell(Scratch::Dali),
            cell(Scratch::Raw),
            cell(Scratch::Bump),
            fmt_ratio(ratio(
                r.round(kind, Scratch::New),
                r.round(kind, Scratch::Dali)
            )),
            fmt_ratio(ratio(
                r.round(kind, Scratch::Sized),
                r.round(kind, Scratch::Dali)
            )),
            fmt_ratio(ratio(reset, r.round(kind, Scratch::Dali))),
            fmt_ratio(ratio(reset, r.round(kind, Scratch::Raw))),
            fmt_ratio(ratio(reset, r.round(kind, Scratch::Bump))),
        );
    }
    let _ = writeln!(o);
    o.push_str(&crate::threads::report(&r.thread_rounds));
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
