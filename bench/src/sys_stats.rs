//! CPU time of threads and of the process (Linux `/proc`, `getrusage`), which
//! threads belong to a design's completion machinery, and percentiles.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;

/// The calling thread's kernel thread id.
pub fn tid() -> i32 {
    // SAFETY: `gettid` has no preconditions.
    unsafe { libc::gettid() }
}

/// A set of threads seen doing some work (a driver callback, a blocking
/// wait): a thread adds itself with [`TidSet::note`], once.
pub struct TidSet {
    /// Which bit of the thread-local memo is this set's (0..64).
    bit: u32,
    tids: Mutex<Vec<i32>>,
}

thread_local! {
    /// The sets this thread is in already, one bit per set.
    static NOTED: Cell<u64> = const { Cell::new(0) };
}

impl TidSet {
    /// A set; `bit` (below 64) tells sets apart in the thread-local memo.
    pub const fn new(bit: u32) -> TidSet {
        assert!(bit < 64);
        TidSet {
            bit,
            tids: Mutex::new(Vec::new()),
        }
    }

    /// Adds the calling thread (a thread-local check after the first time).
    pub fn note(&self) {
        let mask = 1u64 << self.bit;
        if NOTED.with(|n| n.get() & mask) == 0 {
            NOTED.with(|n| n.set(n.get() | mask));
            let mut tids = self.tids.lock().unwrap_or_else(|p| p.into_inner());
            let me = tid();
            if !tids.contains(&me) {
                tids.push(me);
            }
        }
    }

    /// The threads noted so far.
    pub fn tids(&self) -> Vec<i32> {
        self.tids.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The process's threads whose name (`comm`, at most 15 bytes) starts with
/// `prefix`.
pub fn threads_named(prefix: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|t| {
            std::fs::read_to_string(format!("/proc/self/task/{t}/comm"))
                .is_ok_and(|c| c.trim_end().starts_with(prefix))
        })
        .collect()
}

/// CPU time of thread `tid` of this process, in ns: `schedstat`'s run time
/// (ns) where the kernel has it, else `stat`'s utime + stime (clock ticks).
/// `None` once the thread has exited.
pub fn thread_cpu_ns(tid: i32) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
        if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
            return Some(ns);
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 here.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks * (1_000_000_000 / clock_ticks()))
}

fn clock_ticks() -> u64 {
    // SAFETY: `sysconf` has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

fn rusage_ns(who: libc::c_int) -> u64 {
    // SAFETY: all-zero is a valid `rusage`.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `ru` is a valid place for the result.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0;
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time of the whole process (every thread, living or exited), in ns.
pub fn process_cpu_ns() -> u64 {
    rusage_ns(libc::RUSAGE_SELF)
}

/// CPU time of the calling thread, in ns.
pub fn this_thread_cpu_ns() -> u64 {
    rusage_ns(libc::RUSAGE_THREAD)
}

/// CPU times of some threads at one moment.
pub struct CpuSnapshot(HashMap<i32, u64>);

impl CpuSnapshot {
    /// Reads the CPU time of each of `tids`.
    pub fn take(tids: &[i32]) -> CpuSnapshot {
        CpuSnapshot(
            tids.iter()
                .filter_map(|&t| Some((t, thread_cpu_ns(t)?)))
                .collect(),
        )
    }

    /// CPU time used between `earlier` and `self` by the threads of `self`
    /// (a thread new since `earlier` counts from its start).
    pub fn since(&self, earlier: &CpuSnapshot) -> u64 {
        self.0
            .iter()
            .map(|(t, &ns)| ns.saturating_sub(earlier.0.get(t).copied().unwrap_or(0)))
            .sum()
    }

    /// How many threads it covers.
    pub fn threads(&self) -> usize {
        self.0.len()
    }
}

/// The `p`-th percentile (0..=100) of sorted `v`, nearest rank; `None` when
/// empty.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median of `v` (sorting a copy), the mean of the middle two for an
/// even count; `None` when empty or all `None`.
pub fn median(v: &[Option<f64>]) -> Option<f64> {
    let mut xs: Vec<f64> = v
        .iter()
        .flatten()
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

/// The upper median of `v` (the middle element after sorting, the upper of
/// the middle two for an even count): the probes' figure of several runs.
/// Panics when `v` is empty.
pub fn upper_median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
