//! A cell: the capture begun, the operation run, the capture ended and its
//! graph launched, the outcome and the clean-up; a cell on the capturing
//! thread.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

use gpupool_core::StreamHandle;
use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::MemoryStats;

use crate::driver::{bind_context, capture_status, cu, graph_summary, launch_graph};
use crate::env::{Env, Pools};
use crate::errors::{panic_text, short_error, short_of_text, take_lost, Res};
use crate::ops::Row;
use crate::{Col, BUF_WORDS, D0, GPU, SUCCESS};

#[derive(Default)]
pub(crate) struct CellOut {
    pub(crate) op: String,
    pub(crate) status: String,
    pub(crate) end: String,
    /// Empty when no graph came out.
    pub(crate) launch: String,
    pub(crate) graph: String,
    pub(crate) details: Vec<String>,
}

impl CellOut {
    pub(crate) fn cell(&self) -> String {
        let mut s = format!("{} · {} · {}", self.op, self.status, self.end);
        if !self.launch.is_empty() {
            let _ = write!(s, " · {}", self.launch);
        }
        s
    }

    pub(crate) fn failed(why: String) -> CellOut {
        CellOut {
            op: format!("SETUP FAILED: {why}"),
            status: "-".into(),
            end: "-".into(),
            ..CellOut::default()
        }
    }
}

/// Begins a capture on `stream` in `mode` and captures a memset on it.
pub(crate) fn begin_capture(
    stream: StreamHandle,
    mode: sys::CUstreamCaptureMode,
    buf: u64,
) -> Result<(), String> {
    // SAFETY: a live stream (a lease of a leaked pool), not capturing.
    let r = unsafe { sys::cuStreamBeginCapture_v2(cu(stream), mode) };
    if r != SUCCESS {
        return Err(format!("begin {r:?}"));
    }
    // SAFETY: `buf` holds BUF_WORDS words for the whole run.
    let r = unsafe { sys::cuMemsetD32Async(buf, 1, BUF_WORDS, cu(stream)) };
    if r != SUCCESS {
        return Err(format!("captured memset {r:?}"));
    }
    Ok(())
}

/// Reads the status of the capture on `stream`, ends it, and launches the
/// graph if one came out.
pub(crate) fn finish_capture(stream: StreamHandle, launch: usize, out: &mut CellOut) {
    out.status = capture_status(stream);
    let mut g: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: a live stream whose capture this thread began.
    let r = unsafe { sys::cuStreamEndCapture(cu(stream), &mut g) };
    out.end = if r == SUCCESS {
        "end ok".into()
    } else {
        format!("end {r:?}")
    };
    if !g.is_null() {
        out.graph = graph_summary(g);
        if r == SUCCESS {
            out.launch = launch_graph(g, launch as sys::CUstream);
        }
        // SAFETY: the graph the capture returned, ours alone.
        unsafe { sys::cuGraphDestroy(g) };
    }
    let after = capture_status(stream);
    if after != "NONE" {
        out.details
            .push(format!("!! origin still {after} after cuStreamEndCapture"));
    }
}

/// What the operation returned, with the errors it parked in the pools and
/// the errors it reported as lost.
pub(crate) fn outcome(r: std::thread::Result<Res>, env: &Env, out: &mut CellOut) {
    let mut s = match r {
        Ok(Ok(())) => "ok".to_string(),
        Ok(Err(f)) => {
            out.details.push(format!("op: {}", f.long));
            format!("Err({})", f.short)
        }
        Err(p) => {
            let t = panic_text(&*p);
            out.details.push(format!("op panicked: {t}"));
            format!("PANIC({})", t.chars().take(80).collect::<String>())
        }
    };
    let mut parked = Vec::new();
    parked.extend(env.streams.take_error());
    parked.extend(env.origin_pool.take_error());
    parked.extend(env.events.take_error());
    for e in &parked {
        let _ = write!(s, " +parked({})", short_error(e));
        out.details.push(format!("parked: {e:#}"));
    }
    for e in take_lost() {
        let _ = write!(s, " +lost({})", short_of_text(&e));
        out.details.push(format!("lost: {e}"));
    }
    for n in env.notes.borrow_mut().drain(..) {
        out.details.push(format!("note: {n}"));
    }
    if let (Some(before), true) = (env.mem_before.borrow().as_ref(), env.read_mem) {
        if let Ok(after) = GPU.memory_stats(D0) {
            let d = mem_delta(before, &after);
            if !d.is_empty() {
                out.details.push(format!("memory during op: {d}"));
            }
        }
    }
    out.op = s;
}

pub(crate) fn mem_delta(a: &MemoryStats, b: &MemoryStats) -> String {
    const KINDS: [&str; 4] = ["host", "pinned", "device", "managed"];
    const PER_KIND: [&str; 5] = [
        "upstream allocs",
        "upstream frees",
        "reuses",
        "parked",
        "cached",
    ];
    const DEVICE: [&str; 3] = ["cache hits", "cache misses", "cache evictions"];
    // The counters named in PER_KIND, of kind `i`.
    let per_kind = |m: &MemoryStats, i: usize| {
        [
            m.upstream_allocations[i] as i64,
            m.upstream_frees[i] as i64,
            m.reuses[i] as i64,
            m.parked_blocks[i] as i64,
            m.cached_blocks[i] as i64,
        ]
    };
    // The counters named in DEVICE.
    let device = |m: &MemoryStats| {
        [
            m.device_cache_hits as i64,
            m.device_cache_misses as i64,
            m.device_cache_evictions as i64,
        ]
    };
    let mut parts = Vec::new();
    let mut changed = |what: &str, names: &[&str], x: &[i64], y: &[i64]| {
        for ((name, x), y) in names.iter().zip(x).zip(y) {
            if x != y {
                parts.push(format!("{what} {name} {:+}", y - x));
            }
        }
    };
    for (i, kind) in KINDS.iter().enumerate() {
        changed(kind, &PER_KIND, &per_kind(a, i), &per_kind(b, i));
    }
    changed("device", &DEVICE, &device(a), &device(b));
    parts.join(", ")
}

/// Drops what the operation kept, checks the watched streams, purges the
/// cell's pools (unless a stream is still capturing).
pub(crate) fn clean_up(env: Env, out: &mut CellOut) {
    let kept = std::mem::take(&mut *env.keep.borrow_mut());
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| drop(kept))) {
        out.details.push(format!(
            "after end: drop of kept values panicked: {}",
            panic_text(&*p)
        ));
    }
    let mut parked = Vec::new();
    parked.extend(env.streams.take_error());
    parked.extend(env.origin_pool.take_error());
    parked.extend(env.events.take_error());
    for e in parked {
        out.details.push(format!("after end: parked: {e:#}"));
    }
    let mut capturing = false;
    for &s in env.watch.borrow().iter() {
        let st = capture_status(s);
        if st != "NONE" {
            capturing = true;
            out.details
                .push(format!("!! side stream still {st} after the capture ended"));
        }
    }
    let origin = env.origin.borrow_mut().take();
    drop(origin);
    if let Some(e) = env.origin_pool.take_error() {
        out.details.push(format!("after end: origin return: {e:#}"));
    }
    if capturing {
        out.details
            .push("pools leaked (a stream still captures)".into());
    } else {
        for (what, r) in [
            ("streams", env.streams.purge()),
            ("origin pool", env.origin_pool.purge()),
            ("events", env.events.purge()),
        ] {
            if let Err(e) = r {
                out.details.push(format!("after end: purge {what}: {e:#}"));
            }
        }
    }
    for e in take_lost() {
        out.details.push(format!("after end: lost: {e}"));
    }
}

/// Runs the row's operation (beginning the capture after it if it never
/// did) and reads its outcome.
pub(crate) fn run_op(row: &Row, env: &Env) -> CellOut {
    take_lost();
    let r = catch_unwind(AssertUnwindSafe(|| row.op.run(env)));
    let mut out = CellOut::default();
    if !env.began.get() {
        out.details
            .push("!! the operation never began the capture".into());
        env.begin();
    }
    outcome(r, env, &mut out);
    out
}

/// A cell whose operation runs on the capturing thread.
pub(crate) fn same_thread_cell(
    row: &Row,
    col: Col,
    buf: u64,
    launch: usize,
    read_mem: bool,
) -> CellOut {
    if let Err(e) = bind_context() {
        return CellOut::failed(e);
    }
    let pools = Pools::leaked();
    let origin = match pools.origin_pool.get(0) {
        Ok(l) => l,
        Err(e) => return CellOut::failed(format!("origin: {e:#}")),
    };
    let origin_raw = origin.handle();
    let begin_error = RefCell::new(None);
    let begin_fn = || {
        if let Err(e) = begin_capture(origin_raw, col.mode(), buf) {
            *begin_error.borrow_mut() = Some(e);
        }
    };
    let env = Env::new(pools, origin, buf, &begin_fn, read_mem);
    let mut out = run_op(row, &env);
    if let Some(e) = begin_error.borrow_mut().take() {
        out.details.push(format!("!! begin failed: {e}"));
    }
    finish_capture(origin_raw, launch, &mut out);
    clean_up(env, &mut out);
    out
}
