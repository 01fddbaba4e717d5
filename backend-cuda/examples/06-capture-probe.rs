//! What each gpupool pool and scratchpad operation does today while a CUDA
//! graph capture is open (issue 14, step 1: measure), in each capture mode.
//!
//! Columns: the capture mode of a capture begun on the thread that runs the
//! operation (`global`, `thread-local`, `relaxed`), and `other thread`:
//! thread A begins a GLOBAL capture on its stream and waits while thread B
//! runs the operation on streams and events that are not in the capture.
//!
//! Every cell starts afresh: a new thread (new per-thread caches), new
//! stream and event pools, a capture origin leased from a pool of its own,
//! the gpupool memory pools trimmed. The capture is begun with a little
//! captured work (a memset on the origin), the operation runs, then the
//! capture's status is read on the origin (`cuStreamIsCapturing`), the
//! capture is ended, and a graph that came out is instantiated, launched
//! once and synchronized. Whatever the operation leaves to drop (leases,
//! raw allocations) is dropped only after the capture has ended, so only
//! the operation itself runs inside the capture. A cell is
//! `op result · status · end [· launch]`; the full error messages, parked
//! and lost errors, notes and memory counters follow the table.
//!
//! Row 10c runs in a fresh process (the first device allocation of the
//! process, which creates gpupool's memory pool, made inside the capture).
//!
//! Then the cost of the capture queries, one thread, 200k calls, median of
//! 5 runs. Prints everything (and writes `$OUT/capture-probe.md` when `OUT`
//! is set), then "OK". Without a driver or a GPU it says "skipped" and exits 0.
//!
//! `cargo run --release -p gpupool-cuda --example 06-capture-probe`

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpupool_core::{
    set_lost_error_hook, AccessOrder, Backend, DeviceId, EventBackend, EventPool, MemoryKind,
    Scratchpad, ScratchpadConfig, StreamHandle, StreamLease, StreamPool,
};
use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::{CudaBackend, CudaError, MemoryStats};

type GpuError = gpupool_core::Error<CudaError>;
type Lease = StreamLease<'static, CudaBackend>;

static GPU: CudaBackend = CudaBackend::new();
const D0: DeviceId = DeviceId(0);
/// How long any step of a cell may take before the cell is given up.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a whole cell may take.
const CELL_TIMEOUT: Duration = Duration::from_secs(25);
/// Cells not started by then are skipped (the run must stay well inside
/// the device lease).
const RUN_BUDGET: Duration = Duration::from_secs(180);
/// 32-bit words of the device buffer the captured memsets write.
const BUF_WORDS: usize = 1024;
const CALLS: usize = 200_000;
const REPEATS: usize = 5;

const SUCCESS: sys::CUresult = sys::CUresult::CUDA_SUCCESS;

// ---------------------------------------------------------------------------
// Columns

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Col {
    Global,
    ThreadLocal,
    Relaxed,
    OtherThread,
}

const COLS: [Col; 4] = [
    Col::Global,
    Col::ThreadLocal,
    Col::Relaxed,
    Col::OtherThread,
];

impl Col {
    fn title(self) -> &'static str {
        match self {
            Col::Global => "global",
            Col::ThreadLocal => "thread-local",
            Col::Relaxed => "relaxed",
            Col::OtherThread => "other thread",
        }
    }

    fn arg(self) -> &'static str {
        match self {
            Col::Global => "global",
            Col::ThreadLocal => "thread-local",
            Col::Relaxed => "relaxed",
            Col::OtherThread => "other",
        }
    }

    fn from_arg(s: &str) -> Option<Col> {
        COLS.into_iter().find(|c| c.arg() == s)
    }

    /// The mode of the capture thread A begins (GLOBAL for "other thread").
    fn mode(self) -> sys::CUstreamCaptureMode {
        use sys::CUstreamCaptureMode as M;
        match self {
            Col::Global | Col::OtherThread => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
            Col::ThreadLocal => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            Col::Relaxed => M::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

// ---------------------------------------------------------------------------
// Raw driver helpers

fn cu(s: StreamHandle) -> sys::CUstream {
    s.as_raw() as sys::CUstream
}

fn cu_event(e: gpupool_core::EventHandle) -> sys::CUevent {
    e.as_raw() as sys::CUevent
}

/// The capture status of `s` as a word (or the error of the query).
fn capture_status(s: StreamHandle) -> String {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: every stream passed here is alive: owned by a pool that is
    // purged only after the last status read of the cell.
    let r = unsafe { sys::cuStreamIsCapturing(cu(s), &mut st) };
    if r != SUCCESS {
        return format!("{r:?}");
    }
    match st {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => "NONE",
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => "ACTIVE",
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => "INVALIDATED",
    }
    .to_string()
}

/// Makes device 0's primary context current on the calling thread.
fn bind_context() -> Result<(), String> {
    let ctx = GPU.context(D0).map_err(|e| format!("{e}"))?;
    ctx.bind_to_thread().map_err(|e| format!("{e:?}"))
}

fn node_type_name(t: u32) -> String {
    match t {
        0 => "kernel",
        1 => "memcpy",
        2 => "memset",
        3 => "host",
        4 => "child_graph",
        5 => "empty",
        6 => "wait_event",
        7 => "event_record",
        8 => "sem_signal",
        9 => "sem_wait",
        10 => "mem_alloc",
        11 => "mem_free",
        12 => "batch_mem_op",
        13 => "conditional",
        _ => return format!("type{t}"),
    }
    .to_string()
}

/// The graph's nodes by type and its edge count.
fn graph_summary(g: sys::CUgraph) -> String {
    let r = catch_unwind(|| {
        let mut n = 0usize;
        // SAFETY: `g` is a graph just returned by cuStreamEndCapture, not
        // destroyed yet; a null node array asks for the count.
        let r = unsafe { sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n) };
        if r != SUCCESS {
            return format!("cuGraphGetNodes {r:?}");
        }
        let mut nodes = vec![std::ptr::null_mut(); n];
        // SAFETY: as above; `nodes` holds `n` entries.
        let r = unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n) };
        if r != SUCCESS {
            return format!("cuGraphGetNodes {r:?}");
        }
        let mut counts: Vec<(String, usize)> = Vec::new();
        for &node in &nodes[..n] {
            let mut t: u32 = u32::MAX;
            // SAFETY: a node of `g`; the type is read as a plain u32 (the
            // driver may know types the bindings' enum does not).
            let r = unsafe {
                sys::cuGraphNodeGetType(node, (&mut t as *mut u32).cast::<sys::CUgraphNodeType>())
            };
            let name = if r == SUCCESS {
                node_type_name(t)
            } else {
                format!("{r:?}")
            };
            match counts.iter_mut().find(|(k, _)| *k == name) {
                Some((_, c)) => *c += 1,
                None => counts.push((name, 1)),
            }
        }
        let mut edges = 0usize;
        // SAFETY: `g` as above; null arrays ask for the count.
        let r = unsafe {
            sys::cuGraphGetEdges_v2(
                g,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut edges,
            )
        };
        let edges = if r == SUCCESS {
            format!("{edges} edges")
        } else {
            format!("edges {r:?}")
        };
        let nodes: Vec<String> = counts
            .into_iter()
            .map(|(k, c)| if c == 1 { k } else { format!("{k}×{c}") })
            .collect();
        format!("{} nodes ({}); {edges}", n, nodes.join(" "))
    });
    r.unwrap_or_else(|p| format!("panic: {}", panic_text(&*p)))
}

/// Instantiates `g`, launches it once on `stream` and synchronizes.
fn launch_graph(g: sys::CUgraph, stream: sys::CUstream) -> String {
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: `g` is a live graph; `exec` receives the executable graph.
    let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, g, 0) };
    if r != SUCCESS {
        return format!("launch: instantiate {r:?}");
    }
    // SAFETY: `exec` was just instantiated; `stream` is the probe's launch
    // stream (created by main, never captured, never destroyed).
    let launched = unsafe { sys::cuGraphLaunch(exec, stream) };
    // SAFETY: as above.
    let synced = unsafe { sys::cuStreamSynchronize(stream) };
    // SAFETY: `exec` is ours and no launch of it is pending (synchronized).
    unsafe { sys::cuGraphExecDestroy(exec) };
    match (launched, synced) {
        (SUCCESS, SUCCESS) => "launch ok".into(),
        (SUCCESS, s) => format!("launch ok, sync {s:?}"),
        (l, _) => format!("launch {l:?}"),
    }
}

// ---------------------------------------------------------------------------
// Errors, parked and lost

/// An operation's failure: the short form for the table, the long one for
/// the details.
struct Fail {
    short: String,
    long: String,
}

type Res = Result<(), Fail>;

fn short_error(e: &GpuError) -> String {
    match e {
        gpupool_core::Error::Backend { op, source } => match source.code() {
            Some(c) => format!("{op:?} {c:?}"),
            None => format!("{op:?} {source:?}"),
        },
        other => format!("{other:?}"),
    }
}

fn labelled(step: &str, s: String) -> String {
    if step.is_empty() {
        s
    } else {
        format!("{step}: {s}")
    }
}

/// A gpupool result, with the step it came from.
fn at<T>(step: &str, r: Result<T, GpuError>) -> Result<T, Fail> {
    r.map_err(|e| Fail {
        short: labelled(step, short_error(&e)),
        long: labelled(step, format!("{e:#}")),
    })
}

/// A backend (not pool) result.
fn backend<T>(step: &str, r: Result<T, CudaError>) -> Result<T, Fail> {
    r.map_err(|e| Fail {
        short: labelled(
            step,
            e.code()
                .map_or_else(|| format!("{e:?}"), |c| format!("{c:?}")),
        ),
        long: labelled(step, format!("{e}")),
    })
}

/// A raw driver result.
fn raw(step: &str, r: sys::CUresult) -> Res {
    if r == SUCCESS {
        Ok(())
    } else {
        let s = labelled(step, format!("{r:?}"));
        Err(Fail {
            short: s.clone(),
            long: s,
        })
    }
}

/// Errors reported through the lost-error hook (drops with no owner).
static LOST: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn lost_hook(e: &dyn std::fmt::Display) {
    if let Ok(mut v) = LOST.lock() {
        v.push(format!("{e:#}"));
    }
}

fn take_lost() -> Vec<String> {
    LOST.lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default()
}

/// "Op CUDA_ERROR_X" out of a long error text.
fn short_of_text(s: &str) -> String {
    let op = s
        .find("backend call ")
        .and_then(|i| {
            let rest = &s[i + "backend call ".len()..];
            rest.find(' ').map(|j| rest[..j].to_string())
        })
        .unwrap_or_default();
    let code = s
        .find("CUDA_ERROR_")
        .map(|i| {
            s[i..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                .collect::<String>()
        })
        .unwrap_or_else(|| s.chars().take(60).collect());
    if op.is_empty() {
        code
    } else {
        format!("{op} {code}")
    }
}

fn panic_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic)".into()
    }
}

// ---------------------------------------------------------------------------
// What an operation sees

/// Runs a closure when dropped (raw resources freed after the capture).
struct Deferred(Option<Box<dyn FnOnce()>>);

impl Drop for Deferred {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// The world of one operation.
struct Env<'a> {
    streams: &'static StreamPool<CudaBackend>,
    events: &'static EventPool<CudaBackend>,
    origin_pool: &'static StreamPool<CudaBackend>,
    /// The lease of `origin_raw` (row 2 takes it).
    origin: RefCell<Option<Lease>>,
    /// The stream the operation works on: the capture's origin, or (other
    /// thread) B's own stream, which is not in the capture.
    origin_raw: StreamHandle,
    buf: sys::CUdeviceptr,
    begin_fn: &'a dyn Fn(),
    began: Cell<bool>,
    notes: RefCell<Vec<String>>,
    /// Dropped only after the capture has ended, in this order.
    keep: RefCell<Vec<Box<dyn Any>>>,
    /// Side streams whose status is checked after the capture ended.
    watch: RefCell<Vec<StreamHandle>>,
    /// Memory counters when the operation began (None in a fresh process,
    /// where reading them would initialise the memory state early).
    mem_before: RefCell<Option<MemoryStats>>,
    read_mem: bool,
}

/// A value whose drop would call the driver: dropped by `drop_now`, or,
/// when the operation returns (or fails) without doing so, kept until the
/// capture has ended.
struct Kept<'e, 'a, T: 'static> {
    env: &'e Env<'a>,
    val: Option<T>,
}

impl<T: 'static> Kept<'_, '_, T> {
    fn drop_now(mut self) {
        drop(self.val.take());
    }
}

impl<T: 'static> std::ops::Deref for Kept<'_, '_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.val.as_ref().expect("taken")
    }
}

impl<T: 'static> std::ops::DerefMut for Kept<'_, '_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.val.as_mut().expect("taken")
    }
}

impl<T: 'static> Drop for Kept<'_, '_, T> {
    fn drop(&mut self) {
        if let Some(v) = self.val.take() {
            self.env.keep(v);
        }
    }
}

impl<'a> Env<'a> {
    /// Begins the capture (once): from here on the operation is measured.
    fn begin(&self) {
        if !self.began.replace(true) {
            if self.read_mem {
                *self.mem_before.borrow_mut() = GPU.memory_stats(D0).ok();
            }
            (self.begin_fn)();
            // A capture begun through the raw handle: the lease is told
            // (docs/graph-capture.md, rule 3).
            if let Some(lease) = self.origin.borrow().as_ref() {
                lease.note_capture();
            }
        }
    }

    /// The order of `origin_raw`, a stream that captures.
    fn order(&self) -> AccessOrder<'static> {
        // SAFETY: `origin_raw` is a stream of a pool that is leaked for the
        // cell and purged only after everything the operation made (the
        // keep list included) is dropped (`from_raw_capturable` asks for
        // nothing about captures).
        unsafe { AccessOrder::from_raw_capturable(&GPU, self.origin_raw, D0) }
    }

    fn keep<T: 'static>(&self, v: T) {
        self.keep.borrow_mut().push(Box::new(v));
    }

    fn hold<'e, T: 'static>(&'e self, v: T) -> Kept<'e, 'a, T> {
        Kept {
            env: self,
            val: Some(v),
        }
    }

    fn note(&self, s: impl Into<String>) {
        self.notes.borrow_mut().push(s.into());
    }

    /// A little work on `stream`: a memset of the probe's buffer.
    fn work(&self, stream: StreamHandle) -> Res {
        // SAFETY: `buf` holds BUF_WORDS words for the whole run; `stream` is
        // alive (a lease of a leaked pool).
        raw("memset", unsafe {
            sys::cuMemsetD32Async(self.buf, 0, BUF_WORDS, cu(stream))
        })
    }

    /// A memset of `bytes` at `addr` (scratch device memory) on the origin.
    fn work_at(&self, addr: usize, bytes: usize) -> Res {
        // SAFETY: `addr` is `bytes` of scratch device memory allocated in
        // the origin's order and alive until the scratchpad's reset or drop.
        raw("memset scratch", unsafe {
            sys::cuMemsetD8Async(addr as sys::CUdeviceptr, 0, bytes, cu(self.origin_raw))
        })
    }

    /// A lease of a stream of the cell's pool, watched after the capture.
    fn side(&self) -> Result<Kept<'_, 'a, Lease>, Fail> {
        let l = at("get side", self.streams.get(0))?;
        self.watch.borrow_mut().push(l.handle());
        Ok(self.hold(l))
    }

    /// A lease of a stream of the cell's pool, not in any capture.
    fn other(&self) -> Result<Kept<'_, 'a, Lease>, Fail> {
        Ok(self.hold(at("get other", self.streams.get(0))?))
    }

    /// Puts two events in the event pool, so that `wait` finds one.
    fn warm_events(&self) -> Res {
        let a = at("warm events", self.events.get(0))?;
        let b = at("warm events", self.events.get(0))?;
        drop((a, b));
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The operations (rows)

struct Row {
    id: &'static str,
    name: &'static str,
    op: fn(&Env) -> Res,
    /// Run in a fresh process (process-wide first use).
    fresh_process: bool,
}

fn row(id: &'static str, name: &'static str, op: fn(&Env) -> Res) -> Row {
    Row {
        id,
        name,
        op,
        fresh_process: false,
    }
}

fn op_get_empty(env: &Env) -> Res {
    env.begin();
    let l = at("", env.streams.get(0))?;
    env.keep(l);
    Ok(())
}

fn op_get_ready(env: &Env) -> Res {
    drop(at("warm", env.streams.get(0))?);
    env.begin();
    let l = at("", env.streams.get(0))?;
    env.keep(l);
    Ok(())
}

fn op_drop_origin(env: &Env) -> Res {
    env.begin();
    let lease = env.origin.borrow_mut().take();
    drop(lease);
    Ok(())
}

fn op_drop_joined_side(env: &Env) -> Res {
    let side = env.side()?;
    env.warm_events()?;
    env.begin();
    at("fork", side.order().wait(&env.order(), env.events))?;
    env.note(format!(
        "after fork: side {}",
        capture_status(side.handle())
    ));
    env.work(side.handle())?;
    side.drop_now();
    Ok(())
}

fn op_drop_side_after_join(env: &Env) -> Res {
    let side = env.side()?;
    env.warm_events()?;
    env.begin();
    at("fork", side.order().wait(&env.order(), env.events))?;
    env.work(side.handle())?;
    at("join", env.order().wait(&side.order(), env.events))?;
    env.note(format!(
        "after join: side {}",
        capture_status(side.handle())
    ));
    side.drop_now();
    Ok(())
}

fn op_drop_other(env: &Env) -> Res {
    let l = env.other()?;
    env.begin();
    l.drop_now();
    Ok(())
}

fn op_events(env: &Env) -> Res {
    env.begin();
    let e = at("get", env.events.get(0))?;
    drop(e); // no driver call
    Ok(())
}

fn op_fork_join(env: &Env) -> Res {
    let side = env.side()?;
    env.warm_events()?;
    env.begin();
    at("fork", side.order().wait(&env.order(), env.events))?;
    env.note(format!(
        "after fork: side {}",
        capture_status(side.handle())
    ));
    env.work(side.handle())?;
    at("join", env.order().wait(&side.order(), env.events))?;
    env.work(env.origin_raw)?;
    env.note(format!(
        "after join: origin {}, side {}",
        capture_status(env.origin_raw),
        capture_status(side.handle())
    ));
    Ok(())
}

fn op_host_wait(env: &Env) -> Res {
    env.begin();
    at("", AccessOrder::host().wait(&env.order(), env.events))
}

fn op_host_wait_event(env: &Env) -> Res {
    let e = env.hold(at("get event", env.events.get(0))?);
    env.begin();
    // SAFETY: a leased event of device 0 and the origin (alive, see `order`).
    backend("record", unsafe {
        GPU.record_event(e.handle(), env.origin_raw, D0)
    })?;
    at("wait_event", AccessOrder::host().wait_event(&*e))
}

/// A new scratchpad on the origin: 4 KiB of device memory, written by a
/// memset in the origin's order, then the scratchpad dropped.
fn scratch_device(env: &Env) -> Res {
    let s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    let d = at("alloc", s.device::<u8>(4096))?;
    env.work_at(d.addr(), d.byte_len())?;
    s.drop_now();
    Ok(())
}

fn op_dev_cold(env: &Env) -> Res {
    env.begin();
    scratch_device(env)
}

fn op_dev_cached(env: &Env) -> Res {
    {
        let s = at("warm new", Scratchpad::new(&GPU, env.order()))?;
        at("warm alloc", s.device::<u8>(4096))?;
    }
    if let Ok(m) = GPU.memory_stats(D0) {
        env.note(format!(
            "before capture: device cache holds {} block(s)",
            m.cached_blocks[MemoryKind::Device.index()]
        ));
    }
    env.begin();
    scratch_device(env)
}

fn op_dev_reset(env: &Env) -> Res {
    env.begin();
    let mut s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    {
        let d = at("alloc", s.device::<u8>(4096))?;
        env.work_at(d.addr(), d.byte_len())?;
    }
    at("reset", s.reset())?;
    {
        let d = at("alloc 2", s.device::<u8>(4096))?;
        env.work_at(d.addr(), d.byte_len())?;
    }
    s.drop_now();
    Ok(())
}

fn op_dev_reset_grown(env: &Env) -> Res {
    env.begin();
    let mut s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    {
        let a = at("alloc", s.device::<u8>(4096))?;
        let b = at("alloc big", s.device::<u8>(128 * 1024))?;
        env.work_at(a.addr(), a.byte_len())?;
        env.work_at(b.addr(), b.byte_len())?;
    }
    env.note(format!(
        "blocks before reset: {}",
        s.stats().blocks[MemoryKind::Device.index()]
    ));
    at("reset", s.reset())?;
    {
        let d = at("alloc 2", s.device::<u8>(4096))?;
        env.work_at(d.addr(), d.byte_len())?;
    }
    s.drop_now();
    Ok(())
}

/// A scratchpad on the origin (release order: the origin) with 4 KiB of
/// host-visible `kind` memory written by the host; reset and allocated
/// again when `reset`; dropped.
fn scratch_host_visible(env: &Env, kind: MemoryKind, reset: bool) -> Res {
    let mut s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    {
        let p = at("alloc", s.uninit::<u32>(kind, 1024))?;
        p.iter_mut().for_each(|x| {
            x.write(7);
        });
    }
    if reset {
        at("reset", s.reset())?;
        let p = at("alloc 2", s.uninit::<u32>(kind, 1024))?;
        p.iter_mut().for_each(|x| {
            x.write(8);
        });
    }
    s.drop_now();
    Ok(())
}

/// Leaves a free block of `kind` in the pool (a host-order release).
fn warm_host_visible(env: &Env, kind: MemoryKind) -> Res {
    let config = ScratchpadConfig {
        pinned_release: Some(AccessOrder::host()),
        managed_release: Some(AccessOrder::host()),
        ..ScratchpadConfig::default()
    };
    let s = at(
        "warm new",
        Scratchpad::with_config(&GPU, env.order(), config),
    )?;
    at("warm alloc", s.uninit::<u32>(kind, 1024))?;
    drop(s);
    Ok(())
}

fn op_pinned_cold(env: &Env) -> Res {
    env.begin();
    scratch_host_visible(env, MemoryKind::Pinned, false)
}

fn op_pinned_warm(env: &Env) -> Res {
    warm_host_visible(env, MemoryKind::Pinned)?;
    env.begin();
    scratch_host_visible(env, MemoryKind::Pinned, false)
}

fn op_pinned_reset(env: &Env) -> Res {
    env.begin();
    scratch_host_visible(env, MemoryKind::Pinned, true)
}

fn op_managed_cold(env: &Env) -> Res {
    env.begin();
    scratch_host_visible(env, MemoryKind::Managed, false)
}

fn op_managed_warm(env: &Env) -> Res {
    warm_host_visible(env, MemoryKind::Managed)?;
    env.begin();
    scratch_host_visible(env, MemoryKind::Managed, false)
}

fn op_managed_reset(env: &Env) -> Res {
    env.begin();
    scratch_host_visible(env, MemoryKind::Managed, true)
}

fn op_to_device(env: &Env) -> Res {
    env.begin();
    let s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    {
        at("to_device", s.to_device(&[1u32, 2, 3, 4]))?;
    }
    s.drop_now();
    Ok(())
}

fn op_to_host(env: &Env) -> Res {
    let s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    let d = at("to_device (before)", s.to_device(&[1u32, 2, 3, 4]))?;
    env.begin();
    let v = at("to_host", s.to_host(&d))?;
    env.note(format!("to_host gave {v:?}"));
    Ok(()) // the scratchpad is dropped after the capture
}

fn op_raw_stream_query(env: &Env) -> Res {
    let l = env.other()?;
    env.begin();
    // SAFETY: a live leased stream.
    raw("", unsafe { sys::cuStreamQuery(cu(l.handle())) })
}

fn op_raw_event_query(env: &Env) -> Res {
    let l = env.other()?;
    let e = env.hold(at("get event", env.events.get(0))?);
    // SAFETY: a leased event of device 0 and a leased stream of device 0.
    backend("record (before)", unsafe {
        GPU.record_event(e.handle(), l.handle(), D0)
    })?;
    env.begin();
    // SAFETY: a leased event.
    raw("", unsafe { sys::cuEventQuery(cu_event(e.handle())) })
}

fn op_raw_stream_sync(env: &Env) -> Res {
    let l = env.other()?;
    env.begin();
    // SAFETY: a live leased stream with no work.
    raw("", unsafe { sys::cuStreamSynchronize(cu(l.handle())) })
}

fn op_raw_mem_alloc(env: &Env) -> Res {
    env.begin();
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: an out-pointer; the context is current.
    raw("", unsafe { sys::cuMemAlloc_v2(&mut p, 4096) })?;
    env.keep(Deferred(Some(Box::new(move || {
        // SAFETY: `p` came from cuMemAlloc and nothing uses it.
        unsafe { sys::cuMemFree_v2(p) };
    }))));
    Ok(())
}

fn op_raw_host_alloc(env: &Env) -> Res {
    env.begin();
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: an out-pointer; the context is current.
    raw("", unsafe { sys::cuMemHostAlloc(&mut p, 4096, 0) })?;
    let addr = p as usize;
    env.keep(Deferred(Some(Box::new(move || {
        // SAFETY: `addr` came from cuMemHostAlloc and nothing uses it.
        unsafe { sys::cuMemFreeHost(addr as *mut c_void) };
    }))));
    Ok(())
}

fn op_raw_mem_alloc_async(env: &Env) -> Res {
    let l = env.other()?;
    env.begin();
    let mut p: sys::CUdeviceptr = 0;
    let s = cu(l.handle());
    // SAFETY: an out-pointer and a live leased stream.
    raw("", unsafe { sys::cuMemAllocAsync(&mut p, 4096, s) })?;
    let addr = s as usize;
    // Pushed before the lease's `Kept` goes to the keep list: freed while
    // the stream is still leased.
    env.keep(Deferred(Some(Box::new(move || {
        let s = addr as sys::CUstream;
        // SAFETY: `p` came from cuMemAllocAsync on `s`, which is alive
        // (its lease is dropped after this).
        unsafe {
            sys::cuMemFreeAsync(p, s);
            sys::cuStreamSynchronize(s);
        }
    }))));
    Ok(())
}

fn op_raw_event_record(env: &Env) -> Res {
    let l = env.other()?;
    let e = env.hold(at("get event", env.events.get(0))?);
    env.begin();
    // SAFETY: a leased event and a leased stream, both of device 0.
    raw("", unsafe {
        sys::cuEventRecord(cu_event(e.handle()), cu(l.handle()))
    })
}

fn op_raw_event_create(env: &Env) -> Res {
    env.begin();
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: an out-pointer; the context is current.
    raw("", unsafe {
        sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    })?;
    let addr = e as usize;
    env.keep(Deferred(Some(Box::new(move || {
        // SAFETY: our event, unused.
        unsafe { sys::cuEventDestroy_v2(addr as sys::CUevent) };
    }))));
    Ok(())
}

fn op_raw_stream_create(env: &Env) -> Res {
    env.begin();
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: an out-pointer; the context is current.
    raw("", unsafe {
        sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
    })?;
    let addr = s as usize;
    env.keep(Deferred(Some(Box::new(move || {
        // SAFETY: our stream, with no work.
        unsafe { sys::cuStreamDestroy_v2(addr as sys::CUstream) };
    }))));
    Ok(())
}

fn rows() -> Vec<Row> {
    vec![
        row("1a", "stream get (empty pool: creates)", op_get_empty),
        row("1b", "stream get (ready stream: pops)", op_get_ready),
        row("2", "drop origin lease", op_drop_origin),
        row(
            "3",
            "drop joined side (not joined back)",
            op_drop_joined_side,
        ),
        row("4", "drop side after join", op_drop_side_after_join),
        row("5", "drop lease not in capture", op_drop_other),
        row("6", "event get (empty: creates) + drop", op_events),
        row("7", "fork + join (order.wait)", op_fork_join),
        row("8", "host.wait(origin)", op_host_wait),
        row("9", "host wait_event (rec. on origin)", op_host_wait_event),
        row("10a", "scratch device 4K + drop", op_dev_cold),
        row(
            "10b",
            "scratch device 4K + drop (cached block)",
            op_dev_cached,
        ),
        Row {
            fresh_process: true,
            ..row(
                "10c",
                "scratch device 4K + drop (first in process)",
                op_dev_cold,
            )
        },
        row("11a", "scratch device alloc, reset, alloc", op_dev_reset),
        row("11b", "scratch device reset (2 blocks)", op_dev_reset_grown),
        row("12a", "scratch pinned + drop (empty pool)", op_pinned_cold),
        row("12b", "scratch pinned + drop (free block)", op_pinned_warm),
        row("12c", "scratch pinned alloc, reset, alloc", op_pinned_reset),
        row(
            "13a",
            "scratch managed + drop (empty pool)",
            op_managed_cold,
        ),
        row(
            "13b",
            "scratch managed + drop (free block)",
            op_managed_warm,
        ),
        row(
            "13c",
            "scratch managed alloc, reset, alloc",
            op_managed_reset,
        ),
        row("14a", "scratch to_device + drop", op_to_device),
        row("14b", "scratch to_host", op_to_host),
        row(
            "15a",
            "raw cuStreamQuery (other stream)",
            op_raw_stream_query,
        ),
        row(
            "15b",
            "raw cuEventQuery (other stream's)",
            op_raw_event_query,
        ),
        row("15c", "raw cuStreamSynchronize (other)", op_raw_stream_sync),
        row("15d", "raw cuMemAlloc_v2", op_raw_mem_alloc),
        row("15e", "raw cuMemHostAlloc", op_raw_host_alloc),
        row(
            "15f",
            "raw cuMemAllocAsync (other stream)",
            op_raw_mem_alloc_async,
        ),
        row(
            "15g",
            "raw cuEventRecord (other stream)",
            op_raw_event_record,
        ),
        row("15h", "raw cuEventCreate", op_raw_event_create),
        row("15i", "raw cuStreamCreate", op_raw_stream_create),
    ]
}

// ---------------------------------------------------------------------------
// Cells

#[derive(Default)]
struct CellOut {
    op: String,
    status: String,
    end: String,
    /// Empty when no graph came out.
    launch: String,
    graph: String,
    details: Vec<String>,
}

impl CellOut {
    fn cell(&self) -> String {
        let mut s = format!("{} · {} · {}", self.op, self.status, self.end);
        if !self.launch.is_empty() {
            let _ = write!(s, " · {}", self.launch);
        }
        s
    }

    fn failed(why: String) -> CellOut {
        CellOut {
            op: format!("SETUP FAILED: {why}"),
            status: "-".into(),
            end: "-".into(),
            ..CellOut::default()
        }
    }
}

/// Begins a capture on `stream` in `mode` and captures a memset on it.
fn begin_capture(
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
fn finish_capture(stream: StreamHandle, launch: usize, out: &mut CellOut) {
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
fn outcome(r: std::thread::Result<Res>, env: &Env, out: &mut CellOut) {
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

fn mem_delta(a: &MemoryStats, b: &MemoryStats) -> String {
    const KINDS: [&str; 4] = ["host", "pinned", "device", "managed"];
    let mut parts = Vec::new();
    for (i, kind) in KINDS.iter().enumerate() {
        let fields: [(&str, i64, i64); 5] = [
            (
                "upstream allocs",
                a.upstream_allocations[i] as i64,
                b.upstream_allocations[i] as i64,
            ),
            (
                "upstream frees",
                a.upstream_frees[i] as i64,
                b.upstream_frees[i] as i64,
            ),
            ("reuses", a.reuses[i] as i64, b.reuses[i] as i64),
            (
                "parked",
                a.parked_blocks[i] as i64,
                b.parked_blocks[i] as i64,
            ),
            (
                "cached",
                a.cached_blocks[i] as i64,
                b.cached_blocks[i] as i64,
            ),
        ];
        for (name, x, y) in fields {
            if x != y {
                parts.push(format!("{kind} {name} {:+}", y - x));
            }
        }
    }
    for (name, x, y) in [
        ("cache hits", a.device_cache_hits, b.device_cache_hits),
        ("cache misses", a.device_cache_misses, b.device_cache_misses),
        (
            "cache evictions",
            a.device_cache_evictions,
            b.device_cache_evictions,
        ),
    ] {
        if x != y {
            parts.push(format!("device {name} {:+}", y as i64 - x as i64));
        }
    }
    parts.join(", ")
}

/// Drops what the operation kept, checks the watched streams, purges the
/// cell's pools (unless a stream is still capturing).
fn clean_up(env: Env, out: &mut CellOut) {
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

fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// A cell whose operation runs on the capturing thread.
fn same_thread_cell(row: &Row, col: Col, buf: u64, launch: usize, read_mem: bool) -> CellOut {
    if let Err(e) = bind_context() {
        return CellOut::failed(e);
    }
    let streams = leak(StreamPool::new(GPU));
    let events = leak(EventPool::new(GPU));
    let origin_pool = leak(StreamPool::new(GPU));
    let origin = match origin_pool.get(0) {
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
    let env = Env {
        streams,
        events,
        origin_pool,
        origin: RefCell::new(Some(origin)),
        origin_raw,
        buf,
        begin_fn: &begin_fn,
        began: Cell::new(false),
        notes: RefCell::new(Vec::new()),
        keep: RefCell::new(Vec::new()),
        watch: RefCell::new(Vec::new()),
        mem_before: RefCell::new(None),
        read_mem,
    };
    take_lost();
    let r = catch_unwind(AssertUnwindSafe(|| (row.op)(&env)));
    let mut out = CellOut::default();
    if !env.began.get() {
        out.details
            .push("!! the operation never began the capture".into());
        env.begin();
    }
    outcome(r, &env, &mut out);
    if let Some(e) = begin_error.borrow_mut().take() {
        out.details.push(format!("!! begin failed: {e}"));
    }
    finish_capture(origin_raw, launch, &mut out);
    clean_up(env, &mut out);
    out
}

enum Msg {
    Ready,
    Begun(Result<(), String>),
    Done,
    Ended,
}

/// Thread A: begins a GLOBAL capture when B is ready, ends it when B is done.
fn capture_thread(buf: u64, launch: usize, rx: Receiver<Msg>, to_b: Sender<Msg>) -> CellOut {
    let mut out = CellOut::default();
    if let Err(e) = bind_context() {
        let _ = to_b.send(Msg::Begun(Err(e.clone())));
        return CellOut::failed(e);
    }
    let origin_pool = leak(StreamPool::new(GPU));
    let origin = match origin_pool.get(0) {
        Ok(l) => l,
        Err(e) => {
            let _ = to_b.send(Msg::Begun(Err(format!("{e:#}"))));
            return CellOut::failed(format!("origin: {e:#}"));
        }
    };
    let origin_raw = origin.handle();
    if !matches!(rx.recv_timeout(STEP_TIMEOUT), Ok(Msg::Ready)) {
        out.details.push("!! A: B never got ready".into());
    }
    let begun = begin_capture(origin_raw, Col::OtherThread.mode(), buf);
    if let Err(e) = &begun {
        out.details.push(format!("!! begin failed: {e}"));
    }
    let _ = to_b.send(Msg::Begun(begun));
    if !matches!(rx.recv_timeout(STEP_TIMEOUT), Ok(Msg::Done)) {
        out.details
            .push("!! A: B's operation did not finish in time".into());
    }
    finish_capture(origin_raw, launch, &mut out);
    let _ = to_b.send(Msg::Ended);
    drop(origin);
    if let Some(e) = origin_pool.take_error() {
        out.details.push(format!("A: origin return: {e:#}"));
    }
    if let Err(e) = origin_pool.purge() {
        out.details.push(format!("A: purge: {e:#}"));
    }
    out
}

/// Thread B: runs the operation on its own streams while A captures.
fn operation_thread(row_index: usize, buf: u64, rx: Receiver<Msg>, to_a: Sender<Msg>) -> CellOut {
    let row = &rows()[row_index];
    if let Err(e) = bind_context() {
        let _ = to_a.send(Msg::Ready);
        let _ = to_a.send(Msg::Done);
        return CellOut::failed(e);
    }
    let streams = leak(StreamPool::new(GPU));
    let events = leak(EventPool::new(GPU));
    let origin_pool = leak(StreamPool::new(GPU));
    let origin = match origin_pool.get(0) {
        Ok(l) => l,
        Err(e) => {
            let _ = to_a.send(Msg::Ready);
            let _ = to_a.send(Msg::Done);
            return CellOut::failed(format!("B's stream: {e:#}"));
        }
    };
    let origin_raw = origin.handle();
    let notes = RefCell::new(Vec::new());
    let begin_fn = || {
        let _ = to_a.send(Msg::Ready);
        match rx.recv_timeout(STEP_TIMEOUT) {
            Ok(Msg::Begun(Ok(()))) => {}
            Ok(Msg::Begun(Err(e))) => notes.borrow_mut().push(format!("!! A's begin failed: {e}")),
            _ => notes.borrow_mut().push("!! B: A never began".to_string()),
        }
    };
    let env = Env {
        streams,
        events,
        origin_pool,
        origin: RefCell::new(Some(origin)),
        origin_raw,
        buf,
        begin_fn: &begin_fn,
        began: Cell::new(false),
        notes: RefCell::new(Vec::new()),
        keep: RefCell::new(Vec::new()),
        watch: RefCell::new(Vec::new()),
        mem_before: RefCell::new(None),
        read_mem: true,
    };
    take_lost();
    let r = catch_unwind(AssertUnwindSafe(|| (row.op)(&env)));
    let mut out = CellOut::default();
    if !env.began.get() {
        out.details
            .push("!! the operation never began the capture".into());
        env.begin();
    }
    outcome(r, &env, &mut out);
    let _ = to_a.send(Msg::Done);
    if !matches!(rx.recv_timeout(STEP_TIMEOUT), Ok(Msg::Ended)) {
        out.details.push("!! B: A never ended the capture".into());
    }
    clean_up(env, &mut out);
    out.details.extend(notes.into_inner());
    out
}

fn other_thread_cell(row_index: usize, buf: u64, launch: usize) -> CellOut {
    let (to_a, a_rx) = channel();
    let (to_b, b_rx) = channel();
    let a = std::thread::spawn(move || capture_thread(buf, launch, a_rx, to_b));
    let b = std::thread::spawn(move || operation_thread(row_index, buf, b_rx, to_a));
    let a = a.join();
    let b = b.join();
    let mut out = match b {
        Ok(b) => b,
        Err(p) => CellOut::failed(format!("thread B panicked: {}", panic_text(&*p))),
    };
    match a {
        Ok(a) => {
            out.status = a.status;
            out.end = a.end;
            out.launch = a.launch;
            out.graph = a.graph;
            out.details.extend(a.details);
        }
        Err(p) => out
            .details
            .push(format!("thread A panicked: {}", panic_text(&*p))),
    }
    out
}

/// Runs one cell on threads of its own and waits for it (at most
/// CELL_TIMEOUT: a cell that hangs is reported and left behind).
fn run_cell(row_index: usize, col: Col, buf: u64, launch: usize, read_mem: bool) -> CellOut {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let out = catch_unwind(|| match col {
            Col::OtherThread => other_thread_cell(row_index, buf, launch),
            _ => same_thread_cell(&rows()[row_index], col, buf, launch, read_mem),
        })
        .unwrap_or_else(|p| CellOut::failed(format!("harness panicked: {}", panic_text(&*p))));
        let _ = tx.send(out);
    });
    match rx.recv_timeout(CELL_TIMEOUT) {
        Ok(out) => out,
        Err(_) => CellOut {
            op: "TIMEOUT".into(),
            status: "?".into(),
            end: "?".into(),
            details: vec![format!(
                "!! cell did not finish in {CELL_TIMEOUT:?}; later cells may be affected"
            )],
            ..CellOut::default()
        },
    }
}

/// Runs one cell in a fresh process (`--cell ID COL`).
fn run_cell_in_child(id: &str, col: Col) -> CellOut {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return CellOut::failed(format!("current_exe: {e}")),
    };
    let mut child = match Command::new(exe)
        .args(["--cell", id, col.arg()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return CellOut::failed(format!("spawn: {e}")),
    };
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < CELL_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return CellOut::failed("child process timed out".into());
            }
        }
    }
    let mut text = String::new();
    if let Some(mut so) = child.stdout.take() {
        use std::io::Read;
        let _ = so.read_to_string(&mut text);
    }
    let mut out = CellOut::failed(format!("no CELL line from the child; its stdout: {text}"));
    let mut details = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split('\t').collect();
        match parts.as_slice() {
            ["CELL", op, status, end, launch, graph] => {
                out.op = op.to_string();
                out.status = status.to_string();
                out.end = end.to_string();
                out.launch = launch.to_string();
                out.graph = graph.to_string();
            }
            ["DETAIL", d] => details.push(d.to_string()),
            _ => {}
        }
    }
    out.details = details;
    out
}

fn clean_field(s: &str) -> String {
    s.replace(['\t', '\n'], " ")
}

/// The child's side of `run_cell_in_child`.
fn child_main(id: &str, col: &str, buf: u64, launch: usize) {
    let rows = rows();
    let (Some(index), Some(col)) = (rows.iter().position(|r| r.id == id), Col::from_arg(col))
    else {
        println!("DETAIL\tbad --cell arguments {id} {col}");
        return;
    };
    let out = run_cell(index, col, buf, launch, true);
    println!(
        "CELL\t{}\t{}\t{}\t{}\t{}",
        clean_field(&out.op),
        clean_field(&out.status),
        clean_field(&out.end),
        clean_field(&out.launch),
        clean_field(&out.graph)
    );
    for d in &out.details {
        println!("DETAIL\t{}", clean_field(d));
    }
}

// ---------------------------------------------------------------------------
// Warm-up and timings

/// Makes the first use of every memory kind outside any capture (gpupool's
/// device memory pool, the pinned and managed pools, the staging path),
/// then gives the blocks back, so that the cells see empty pools but
/// initialised state.
fn warm_up() -> Result<(), String> {
    let pool = StreamPool::new(GPU);
    let l = pool.get(0).map_err(|e| format!("{e:#}"))?;
    {
        let s = Scratchpad::new(&GPU, l.order()).map_err(|e| format!("{e:#}"))?;
        s.device::<u8>(4096).map_err(|e| format!("device: {e:#}"))?;
        s.pinned::<u32>(1024)
            .map_err(|e| format!("pinned: {e:#}"))?;
        s.managed::<u32>(1024)
            .map_err(|e| format!("managed: {e:#}"))?;
        let d = s
            .to_device(&[1u32, 2])
            .map_err(|e| format!("to_device: {e:#}"))?;
        s.to_host(&d).map_err(|e| format!("to_host: {e:#}"))?;
    }
    AccessOrder::host()
        .wait(&l.order(), gpupool_cuda::events())
        .map_err(|e| format!("{e:#}"))?;
    drop(l);
    pool.purge().map_err(|e| format!("{e:#}"))?;
    GPU.trim_memory(D0).map_err(|e| format!("trim: {e}"))?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// ns per call of `f`, median of REPEATS runs of CALLS calls.
fn time_call(mut f: impl FnMut() -> sys::CUresult) -> Result<f64, String> {
    let r = f();
    if r != SUCCESS {
        return Err(format!("{r:?}"));
    }
    let mut runs = Vec::new();
    for _ in 0..REPEATS {
        let t = Instant::now();
        for _ in 0..CALLS {
            std::hint::black_box(f());
        }
        runs.push(t.elapsed().as_nanos() as f64 / CALLS as f64);
    }
    Ok(median(runs))
}

fn timings() -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut s: sys::CUstream = std::ptr::null_mut();
    let mut c: sys::CUstream = std::ptr::null_mut();
    // SAFETY: out-pointers; the context is current on this thread.
    let created = unsafe {
        (
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
            sys::cuStreamCreate(&mut c, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
        )
    };
    if created != (SUCCESS, SUCCESS) {
        rows.push(("streams".into(), format!("{created:?}")));
        return rows;
    }
    let fmt = |r: Result<f64, String>| match r {
        Ok(ns) => format!("{ns:.1}"),
        Err(e) => format!("failed: {e}"),
    };
    let mut one = |name: &str, f: &mut dyn FnMut() -> sys::CUresult| {
        let r = catch_unwind(AssertUnwindSafe(|| time_call(&mut *f)))
            .unwrap_or_else(|p| Err(format!("panic: {}", panic_text(&*p))));
        rows.push((name.to_string(), fmt(r)));
    };
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    // In every closure below: `s` and `c` are live streams created above,
    // the out-pointers are locals, null optional outputs are allowed.
    one("cuStreamIsCapturing (idle stream)", &mut || {
        // SAFETY: see above.
        unsafe { sys::cuStreamIsCapturing(s, &mut st) }
    });
    one("cuStreamGetCaptureInfo_v3 (status + id)", &mut || {
        // SAFETY: see above.
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                s,
                &mut st,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    });
    one("cuStreamQuery (idle stream)", &mut || {
        // SAFETY: see above.
        unsafe { sys::cuStreamQuery(s) }
    });
    // The same query on a stream that captures (relaxed, so nothing else is
    // affected).
    // SAFETY: `c` is live and not capturing.
    let begun = unsafe {
        sys::cuStreamBeginCapture_v2(c, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
    };
    if begun == SUCCESS {
        one("cuStreamIsCapturing (capturing stream)", &mut || {
            // SAFETY: see above.
            unsafe { sys::cuStreamIsCapturing(c, &mut st) }
        });
        one("cuStreamGetCaptureInfo_v3 (capturing stream)", &mut || {
            // SAFETY: see above.
            unsafe {
                sys::cuStreamGetCaptureInfo_v3(
                    c,
                    &mut st,
                    &mut id,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            }
        });
        let mut g: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the capture begun above on `c`.
        unsafe {
            sys::cuStreamEndCapture(c, &mut g);
            if !g.is_null() {
                sys::cuGraphDestroy(g);
            }
        }
    } else {
        rows.push((
            "capturing-stream timings".into(),
            format!("begin {begun:?}"),
        ));
    }
    // SAFETY: our streams, idle.
    unsafe {
        sys::cuStreamDestroy_v2(s);
        sys::cuStreamDestroy_v2(c);
    }
    rows
}

// ---------------------------------------------------------------------------

fn device_info() -> String {
    let mut v: i32 = 0;
    let mut name = [0 as std::ffi::c_char; 128];
    let mut dev: sys::CUdevice = 0;
    // SAFETY: out-pointers; the driver is initialised (device_count).
    unsafe {
        sys::cuDriverGetVersion(&mut v);
        sys::cuDeviceGet(&mut dev, 0);
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev);
    }
    // SAFETY: cuDeviceGetName writes a NUL-terminated string (the buffer
    // starts zeroed, so it is terminated even if the call failed).
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy();
    format!("{name}, driver API {}.{}", v / 1000, (v % 1000) / 10)
}

fn main() {
    match GPU.device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => {
            println!("skipped: the CUDA driver reports no GPU");
            return;
        }
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    }
    set_lost_error_hook(Some(lost_hook));
    if let Err(e) = bind_context() {
        println!("skipped: cannot make device 0's primary context current: {e}");
        return;
    }
    // The device buffer the captured memsets write, and the stream graphs
    // are launched on: raw driver objects, so that gpupool's memory state
    // is untouched by them.
    let mut buf: sys::CUdeviceptr = 0;
    let mut launch: sys::CUstream = std::ptr::null_mut();
    // SAFETY: out-pointers; the context is current.
    let (a, b) = unsafe {
        (
            sys::cuMemAlloc_v2(&mut buf, BUF_WORDS * 4),
            sys::cuStreamCreate(
                &mut launch,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ),
        )
    };
    assert_eq!((a, b), (SUCCESS, SUCCESS), "buffer and launch stream");
    let launch = launch as usize;

    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--cell" {
        child_main(&args[2], &args[3], buf, launch);
        return;
    }

    let mut md = String::new();
    let _ = writeln!(md, "# gpupool under CUDA graph capture: probe\n");
    let _ = writeln!(md, "Device: {}\n", device_info());
    let _ = writeln!(
        md,
        "Cell: `op result · capture status right after (cuStreamIsCapturing on the origin) · cuStreamEndCapture · graph launch`. \
         `+parked(..)`: an error a lease's drop parked in its pool; `+lost(..)`: an error a drop reported to the lost-error hook.\n"
    );
    if let Err(e) = warm_up() {
        let _ = writeln!(md, "!! warm-up failed: {e}\n");
    }
    let rows = rows();
    let mut results: Vec<Vec<CellOut>> = Vec::new();
    let started = Instant::now();
    for (i, row) in rows.iter().enumerate() {
        let mut line = Vec::new();
        for col in COLS {
            if started.elapsed() > RUN_BUDGET {
                line.push(CellOut {
                    op: "not run (time budget)".into(),
                    status: "-".into(),
                    end: "-".into(),
                    ..CellOut::default()
                });
                continue;
            }
            let mut out = if row.fresh_process {
                run_cell_in_child(row.id, col)
            } else {
                run_cell(i, col, buf, launch, true)
            };
            if let Err(e) = GPU.trim_memory(D0) {
                out.details.push(format!("trim after the cell: {e}"));
            }
            line.push(out);
        }
        results.push(line);
    }
    let cells_took = started.elapsed();

    let _ = writeln!(
        md,
        "| # | operation | {} |",
        COLS.map(Col::title).join(" | ")
    );
    let _ = writeln!(md, "|---|---|{}", "---|".repeat(COLS.len()));
    for (row, line) in rows.iter().zip(&results) {
        let cells: Vec<String> = line.iter().map(|c| c.cell().replace('|', "\\|")).collect();
        let _ = writeln!(md, "| {} | {} | {} |", row.id, row.name, cells.join(" | "));
    }

    let _ = writeln!(md, "\n## Graphs that came out (nodes by type; edges)\n");
    let _ = writeln!(md, "| # | {} |", COLS.map(Col::title).join(" | "));
    let _ = writeln!(md, "|---|{}", "---|".repeat(COLS.len()));
    for (row, line) in rows.iter().zip(&results) {
        let cells: Vec<String> = line
            .iter()
            .map(|c| {
                if c.graph.is_empty() {
                    "-".into()
                } else {
                    c.graph.clone()
                }
            })
            .collect();
        let _ = writeln!(md, "| {} | {} |", row.id, cells.join(" | "));
    }

    let _ = writeln!(md, "\nCells took {:.1} s.", cells_took.as_secs_f64());
    let _ = writeln!(md, "\n## Details\n");
    for (row, line) in rows.iter().zip(&results) {
        for (col, c) in COLS.iter().zip(line) {
            for d in &c.details {
                let _ = writeln!(md, "- {} {} / {}: {}", row.id, row.name, col.title(), d);
            }
        }
    }

    let _ = writeln!(
        md,
        "\n## Timings (one thread, {CALLS} calls, median of {REPEATS})\n"
    );
    let _ = writeln!(md, "| call | ns/call |");
    let _ = writeln!(md, "|---|---|");
    for (name, v) in timings() {
        let _ = writeln!(md, "| {name} | {v} |");
    }

    print!("{md}");
    if let Ok(dir) = std::env::var("OUT") {
        let path = std::path::Path::new(&dir).join("capture-probe.md");
        if let Err(e) = std::fs::write(&path, &md) {
            println!("could not write {}: {e}", path.display());
        }
    }
    println!("OK");
}
