//! (d) cutile-rs's `cuda-async` completion path, ported (design, not code)
//! from NVlabs/cutile-rs `cuda-async/src/{device_future,reactor,slot_table}.rs`
//! and `cuda-core/src/runtime.rs` (`launch_host_function`). Its three tiers:
//!
//! 1. **Inline spin.** Right after the work is queued (in cuda-async: in the
//!    future's first poll, which launches the work), poll `cuStreamQuery` on
//!    the stream for a budget (default 20 µs, `CUDA_ASYNC_SPIN_BUDGET_US`
//!    there; `--spin-budget-us` here), `spin_loop` between queries; if the
//!    stream is idle, the future is ready without any registration.
//! 2. **Flag-write reactor.** Otherwise claim a slot of a fixed table
//!    (1024 `u32` flags in pinned, device-mapped, portable host memory), clear
//!    its flag, queue `cuStreamWriteValue32(stream, flag, 1, 0)` after the
//!    work, store the waker state in the slot and set the slot's bit in an
//!    active bitmap (`Release`); one process-wide reactor thread scans the
//!    set bits, retires slots whose flag reads 1 (clears the bit, takes the
//!    state, recycles the index) and signals them outside any lock. The
//!    registrant unparks the reactor only on the idle-to-active transition
//!    (a count of armed slots, incremented before the bit is set); the
//!    reactor parks when nothing is armed, else spins 10,000 empty passes
//!    before yielding between passes.
//! 3. **Host-function fallback.** No free slot (or the write refused):
//!    `cuLaunchHostFunc` with a boxed closure that signals the state.
//!
//! The state is `{AtomicWaker, AtomicBool complete}` (cuda-async's
//! `StreamCallbackState`, `Relaxed` flag as there); the future's `Executing`
//! poll checks the flag, registers the waker, checks again. Left out:
//! cuda-async's thread-local execution lock (it serialises *launches* on a
//! thread, which the benchmark's submitter already does) and its
//! `CUDA_ASYNC_HOST_SYNC` switch (the `cuLaunchHostFunc_v2` sync modes).

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::future::Future;
use core::pin::Pin;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use core::task::{Context, Poll};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use gpupool_cuda::cudarc::driver::sys;

use super::{Design, Lease, Path, StepCost, Submitted};
use crate::gpu::{check, host_ns, raw_stream, Pinned};
use crate::sys_stats::{threads_named, TidSet};

/// Slots of the flag table (cuda-async's `NUM_SLOTS`).
pub const NUM_SLOTS: usize = 1024;
/// Empty scan passes the reactor spins before yielding between passes.
const SPIN_PASSES: u32 = 10_000;
/// The reactor thread's name (`comm` keeps 15 bytes).
const REACTOR_NAME: &str = "cutile-reactor";

/// The driver threads that ran a fallback callback.
static FALLBACK_THREADS: TidSet = TidSet::new(3);

/// What a completion signal fires against (cuda-async's
/// `StreamCallbackState`).
pub struct CallbackState {
    waker: AtomicWaker,
    complete: AtomicBool,
}

impl CallbackState {
    fn new() -> Self {
        CallbackState {
            waker: AtomicWaker::new(),
            complete: AtomicBool::new(false),
        }
    }

    /// Marks the work complete and wakes the task.
    fn signal(&self) {
        self.complete.store(true, Ordering::Relaxed);
        self.waker.wake();
    }
}

/// A slot's payload: written by the registrant before the slot's active bit
/// is set (`Release`), taken by the reactor after it sees the bit
/// (`Acquire`); between claim and recycling the slot has that one producer
/// and that one consumer.
struct SlotCell(UnsafeCell<Option<Arc<CallbackState>>>);

// SAFETY: the cell is only accessed under the single-producer /
// single-consumer discipline above, ordered by the active bit; the payload
// (`Arc<CallbackState>`) is Send + Sync.
unsafe impl Sync for SlotCell {}

/// The slot protocol (cuda-async's `SlotTable`, over pinned flags).
struct SlotTable {
    flags: Pinned,
    active: Vec<AtomicU64>,
    payload: Vec<SlotCell>,
    free: Mutex<Vec<usize>>,
    /// Armed, not yet retired slots: drives the empty-to-wake unpark.
    n_armed: AtomicUsize,
}

impl SlotTable {
    fn flag(&self, slot: usize) -> &AtomicU32 {
        self.flags.flag32(slot)
    }

    fn is_idle(&self) -> bool {
        self.n_armed.load(Ordering::Acquire) == 0
    }

    fn lock_free(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn claim(&self) -> Option<usize> {
        self.lock_free().pop()
    }

    fn release(&self, slot: usize) {
        self.lock_free().push(slot);
    }

    /// Clears the flag before the device write is queued.
    fn reset_flag(&self, slot: usize) {
        self.flag(slot).store(0, Ordering::Release);
    }

    /// Stores the payload, counts the slot armed, sets its bit; true on the
    /// idle-to-active transition.
    fn publish(&self, slot: usize, state: Arc<CallbackState>) -> bool {
        // SAFETY: the slot was claimed by this registrant and its bit is not
        // set: the reactor does not touch the cell (the protocol above).
        unsafe { *self.payload[slot].0.get() = Some(state) };
        let was_idle = self.n_armed.fetch_add(1, Ordering::AcqRel) == 0;
        self.active[slot / 64].fetch_or(1u64 << (slot % 64), Ordering::Release);
        was_idle
    }

    /// One pass: retires every armed slot whose flag reads 1.
    fn scan_once(&self, woken: &mut Vec<Arc<CallbackState>>, retired: &mut Vec<usize>) {
        for (word, bits_of) in self.active.iter().enumerate() {
            let mut bits = bits_of.load(Ordering::Acquire);
            while bits != 0 {
                let bit = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let slot = word * 64 + bit;
                if slot >= NUM_SLOTS {
                    break;
                }
                if self.flag(slot).load(Ordering::Acquire) == 1 {
                    bits_of.fetch_and(!(1u64 << bit), Ordering::AcqRel);
                    // SAFETY: the reactor is the slot's one consumer; the
                    // bit was seen (Acquire, after the payload's write) and
                    // the slot is recycled only below.
                    if let Some(state) = unsafe { (*self.payload[slot].0.get()).take() } {
                        woken.push(state);
                    }
                    retired.push(slot);
                }
            }
        }
        if !retired.is_empty() {
            let n = retired.len();
            self.lock_free().append(retired);
            self.n_armed.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

/// The process-wide reactor.
struct Reactor {
    table: SlotTable,
    scanner: OnceLock<Thread>,
}

impl Reactor {
    /// Allocates the flags (in the current context) and starts the thread.
    fn start() -> Result<&'static Reactor, String> {
        let flags = Pinned::new(NUM_SLOTS.div_ceil(2))?;
        let reactor: &'static Reactor = Box::leak(Box::new(Reactor {
            table: SlotTable {
                flags,
                active: (0..NUM_SLOTS.div_ceil(64))
                    .map(|_| AtomicU64::new(0))
                    .collect(),
                payload: (0..NUM_SLOTS)
                    .map(|_| SlotCell(UnsafeCell::new(None)))
                    .collect(),
                free: Mutex::new((0..NUM_SLOTS).rev().collect()),
                n_armed: AtomicUsize::new(0),
            },
            scanner: OnceLock::new(),
        }));
        let handle = thread::Builder::new()
            .name(REACTOR_NAME.into())
            .spawn(move || reactor.scan_loop())
            .map_err(|e| format!("starting the reactor: {e}"))?;
        let _ = reactor.scanner.set(handle.thread().clone());
        Ok(reactor)
    }

    fn scan_loop(&self) {
        let mut idle_passes: u32 = 0;
        let mut woken = Vec::new();
        let mut retired = Vec::new();
        loop {
            self.table.scan_once(&mut woken, &mut retired);
            if !woken.is_empty() {
                for state in woken.drain(..) {
                    state.signal();
                }
                idle_passes = 0;
                continue;
            }
            if self.table.is_idle() {
                thread::park();
                idle_passes = 0;
                continue;
            }
            idle_passes += 1;
            if idle_passes < SPIN_PASSES {
                core::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
    }

    /// Arms a slot after the work queued on `stream`.
    fn register(&self, stream: sys::CUstream, state: Arc<CallbackState>) -> Result<(), String> {
        let slot = self.table.claim().ok_or("reactor slot pool exhausted")?;
        self.table.reset_flag(slot);
        let addr = self.table.flags.device_addr32(slot);
        // SAFETY: `stream` is a live stream of device 0 (the caller's lease);
        // `addr` is the device alias of a flag in the reactor's pinned block,
        // never freed.
        let r = unsafe { sys::cuStreamWriteValue32_v2(stream, addr, 1, 0) };
        if let Err(e) = check("cuStreamWriteValue32", r) {
            self.table.release(slot);
            return Err(e);
        }
        if self.table.publish(slot, state) {
            if let Some(t) = self.scanner.get() {
                t.unpark();
            }
        }
        Ok(())
    }
}

/// cuda-core's host-function trampoline: runs the boxed closure once.
///
/// # Safety
/// `user` is a `Box<F>` leaked for this call, passed here once.
unsafe extern "C" fn trampoline<F: FnOnce() + Send>(user: *mut c_void) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the contract: this call owns the box.
        let f = unsafe { Box::from_raw(user.cast::<F>()) };
        f();
    });
}

/// `cuLaunchHostFunc` with a boxed closure (cuda-core's
/// `launch_host_function`).
fn launch_host_function<F: FnOnce() + Send>(stream: sys::CUstream, f: F) -> Result<(), String> {
    let user = Box::into_raw(Box::new(f)).cast::<c_void>();
    // SAFETY: `stream` is a live stream of device 0; `trampoline::<F>`
    // takes the box `user` exactly once.
    let r = unsafe { sys::cuLaunchHostFunc(stream, Some(trampoline::<F>), user) };
    check("cuLaunchHostFunc", r).inspect_err(|_| {
        // SAFETY: not queued: the box is still ours.
        drop(unsafe { Box::from_raw(user.cast::<F>()) });
    })
}

/// The process-wide reactor, started once and shared by every [`Cutile`].
#[derive(Clone, Copy)]
pub struct ReactorHandle(&'static Reactor);

impl ReactorHandle {
    /// Allocates the flag table and starts the reactor thread (call with
    /// device 0's context current).
    pub fn start() -> Result<ReactorHandle, String> {
        Reactor::start().map(ReactorHandle)
    }
}

/// Design (d), with a spin budget (cuda-async's default: 20 µs; 0 sends
/// every future to the reactor, as cuda-async's correctness tests do).
pub struct Cutile {
    reactor: &'static Reactor,
    spin_budget: Duration,
    name: &'static str,
}

impl Cutile {
    /// Registers with `reactor`; `name` is the design's name in the report.
    pub fn new(reactor: ReactorHandle, spin_budget: Duration, name: &'static str) -> Cutile {
        Cutile {
            reactor: reactor.0,
            spin_budget,
            name,
        }
    }
}

/// cuda-async's `DeviceFuture` past its first poll.
pub struct CutileFut {
    state: Option<Arc<CallbackState>>,
    path: Path,
}

impl Future for CutileFut {
    type Output = Result<Path, String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let path = self.path;
        let Some(state) = &self.state else {
            return Poll::Ready(Ok(path)); // the spin saw it
        };
        if state.complete.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(path));
        }
        state.waker.register(cx.waker());
        if state.complete.load(Ordering::Relaxed) {
            Poll::Ready(Ok(path))
        } else {
            Poll::Pending
        }
    }
}

impl Design for Cutile {
    type Fut = CutileFut;

    fn name(&self) -> &'static str {
        self.name
    }

    fn submit(&'static self, lease: Lease) -> Result<Submitted<CutileFut>, String> {
        let stream = raw_stream(lease);
        // Tier 1: the bounded spin.
        let t0 = host_ns();
        let already_complete = !self.spin_budget.is_zero() && {
            let deadline = Instant::now() + self.spin_budget;
            loop {
                // SAFETY: `stream` is a live stream of device 0 (the lease).
                match unsafe { sys::cuStreamQuery(stream) } {
                    sys::CUresult::CUDA_SUCCESS => break true,
                    sys::CUresult::CUDA_ERROR_NOT_READY => {}
                    _ => break false,
                }
                if Instant::now() >= deadline {
                    break false;
                }
                core::hint::spin_loop();
            }
        };
        let t1 = host_ns();
        if already_complete {
            return Ok(Submitted {
                fut: CutileFut {
                    state: None,
                    path: Path::Spin,
                },
                step: StepCost::Skipped,
                spin_ns: t1 - t0,
                ready_ns: Some(t1),
            });
        }
        // Tier 2, else tier 3.
        let state = Arc::new(CallbackState::new());
        let path = if self.reactor.register(stream, state.clone()).is_ok() {
            Path::Reactor
        } else {
            let s = state.clone();
            launch_host_function(stream, move || {
                FALLBACK_THREADS.note();
                s.signal();
            })?;
            Path::HostFn
        };
        let t2 = host_ns();
        Ok(Submitted {
            fut: CutileFut {
                state: Some(state),
                path,
            },
            step: StepCost::Measured(t2 - t1),
            spin_ns: t1 - t0,
            ready_ns: None,
        })
    }

    fn machinery_threads(&self) -> Vec<i32> {
        let mut t = threads_named(REACTOR_NAME);
        t.extend(FALLBACK_THREADS.tids());
        t.sort_unstable();
        t.dedup();
        t
    }

    fn machinery_label(&self) -> &'static str {
        "the reactor thread + driver threads that ran a fallback callback"
    }
}
