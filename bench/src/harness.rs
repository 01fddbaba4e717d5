//! One measured run ("cell"): a design at `F` futures in flight and `T`
//! submitting threads.
//!
//! The runtime is a tokio multi-thread runtime with `T` worker threads; `T`
//! submitter tasks are spawned on it, one per worker (tokio may still move a
//! task between workers: it has no pinning, but with every worker busy with
//! its own submitter they mostly stay). Submitter `t` owns streams
//! `Gpu::streams_of(t)` and round-robins its requests over them. Per request
//! it takes a permit of a semaphore of `F` (so at most `F` futures are in
//! flight across all submitters), takes a free timestamp slot, launches the
//! request kernel, calls [`Design::submit`] (timed), spawns a task that
//! awaits the future, and yields once, so that the new task polls its future
//! (registers its waker) right away, as a task awaiting its own work would.
//! The awaiting task reads the host clock the moment the future resolves,
//! reads the kernel's finish time from the slot, and gives the slot and the
//! permit back. Its waker is wrapped (`Stamped`) so the time the design
//! called `wake` is known too: *notify* latency (the design's machinery)
//! against *wake* latency (the task running again, which adds the
//! runtime's queueing). Submitters run for `warmup + duration`; only requests submitted
//! after the warm-up are measured, completions are counted in the measured
//! window, CPU time is read at its two ends; then the run drains.
//! `%globaltimer` is calibrated against the host clock just before and just
//! after each run ([`ClockMap`]).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Wake;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

use crate::designs::{Design, Path, StepCost, Submitted};
use crate::gpu::{host_ns, ClockMap, Gpu};
use crate::sys_stats::{percentile, process_cpu_ns, this_thread_cpu_ns, CpuSnapshot};

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct CellConfig {
    /// Futures in flight at most (`F`).
    pub inflight: usize,
    /// Submitting threads (`T`): the runtime's worker threads.
    pub threads: usize,
    /// Unmeasured time at the start.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// How long each request's kernel runs, in ns.
    pub work_ns: u64,
    /// How long the drain may take before the run is declared stuck.
    pub drain_timeout: Duration,
    /// Ping rounds of each calibration.
    pub calib_rounds: usize,
}

/// One request, measured.
struct Sample {
    resolved_ns: u64,
    /// The last `wake` before the future resolved; 0 if none.
    woken_ns: u64,
    gpu_ns: u64,
    path: Path,
    /// Ready at its first poll (or in `submit`).
    first_poll: bool,
}

/// The waker handed to a design's future: notes the time of each `wake`,
/// then wakes the task.
struct Stamp {
    woken_ns: AtomicU64,
    task: Mutex<Option<Waker>>,
}

impl Wake for Stamp {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken_ns.store(host_ns(), Ordering::Release);
        if let Some(w) = &*self.task.lock().unwrap_or_else(|p| p.into_inner()) {
            w.wake_by_ref();
        }
    }
}

/// A design's future polled with a [`Stamp`] waker.
struct Stamped<F> {
    fut: F,
    stamp: Arc<Stamp>,
    polls: u32,
}

impl<F: Future + Unpin> Future for Stamped<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        {
            let mut task = self.stamp.task.lock().unwrap_or_else(|p| p.into_inner());
            if !task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        self.polls += 1;
        let waker = Waker::from(self.stamp.clone());
        Pin::new(&mut self.fut).poll(&mut Context::from_waker(&waker))
    }
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub struct CellResult {
    /// Requests submitted in the measured window.
    pub submitted: u64,
    /// Requests resolved in the measured window.
    pub completed: u64,
    /// Completions per second in the measured window.
    pub per_sec: f64,
    /// Submission step per future, mean and median, ns.
    pub submit_mean_ns: Option<f64>,
    /// Median of the same.
    pub submit_p50_ns: Option<f64>,
    /// Wake latency (resolve, host clock, minus kernel finish, GPU clock
    /// mapped to the host's), median and 99th percentile, ns.
    pub wake_p50_ns: Option<f64>,
    /// 99th percentile of the same.
    pub wake_p99_ns: Option<f64>,
    /// Latency samples.
    pub wake_samples: usize,
    /// Notify latency (the design's `wake` call, host clock, minus kernel
    /// finish), median and 99th percentile, ns; over the futures that were
    /// woken (or, for (d)'s spin, saw completion in `submit`).
    pub notify_p50_ns: Option<f64>,
    /// 99th percentile of the same.
    pub notify_p99_ns: Option<f64>,
    /// Notify samples.
    pub notify_samples: usize,
    /// Futures ready at their first poll without a wake (not counted in
    /// notify latency).
    pub first_poll_ready: u64,
    /// The calibration's offset drift over the run, ns (interpolated).
    pub drift_ns: i64,
    /// The calibration's uncertainty, ns.
    pub calib_uncertainty_ns: f64,
    /// The smallest wake latency, ns (below zero only within the
    /// calibration's uncertainty, if the clocks agree).
    pub wake_min_ns: Option<f64>,
    /// Mean time spent spinning on the stream in `submit`, per future (d).
    pub spin_mean_ns: f64,
    /// Resolved by each path: direct, spin, reactor, host function.
    pub paths: [u64; 4],
    /// Futures that resolved before the kernel's timestamp was visible.
    pub early: u64,
    /// Errors (the first one in `first_error`).
    pub errors: u64,
    /// The first error.
    pub first_error: Option<String>,
    /// CPU time of the completion machinery in the window, ns.
    pub machinery_cpu_ns: u64,
    /// Threads counted as machinery at the window's end.
    pub machinery_threads: usize,
    /// CPU time of the whole process in the window (less the main thread,
    /// which only measures), ns.
    pub process_cpu_ns: u64,
    /// The measured window's length, ns.
    pub window_ns: u64,
}

/// State one run's tasks share.
struct Shared {
    permits: Semaphore,
    free: Mutex<Vec<usize>>,
    samples: Mutex<Vec<Sample>>,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    measure_from: u64,
    stop: u64,
}

impl Shared {
    fn error(&self, e: String) {
        if self.errors.fetch_add(1, Ordering::Relaxed) == 0 {
            *self.first_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    }

    fn give_back(&self, slot: usize) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(slot);
        self.permits.add_permits(1);
    }
}

/// What a submitter saw: step costs of measured requests, spin time, count.
#[derive(Default)]
struct SubmitterOut {
    steps: Vec<u64>,
    spin_ns: u64,
    submitted: u64,
}

/// A multi-thread runtime of `threads` workers whose threads (workers and
/// blocking pool) have device 0's primary context current.
pub fn runtime(gpu: &'static Gpu, threads: usize) -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(format!("bench-rt{threads}"))
        .on_thread_start(move || gpu.bind())
        .enable_time()
        .build()
}

async fn submitter<D: Design>(
    gpu: &'static Gpu,
    design: &'static D,
    shared: Arc<Shared>,
    t: usize,
    work_ns: u64,
) -> SubmitterOut {
    let streams = gpu.streams_of(t);
    let mut out = SubmitterOut::default();
    let mut k = 0usize;
    loop {
        let Ok(permit) = shared.permits.acquire().await else {
            break;
        };
        permit.forget();
        let now = host_ns();
        if now >= shared.stop {
            shared.permits.add_permits(1);
            break;
        }
        let measured = now >= shared.measure_from;
        let slot = {
            let mut free = shared.free.lock().unwrap_or_else(|p| p.into_inner());
            free.pop().expect("a permit guarantees a free slot")
        };
        gpu.stamps.slot(slot).store(0, Ordering::SeqCst);
        let lease = &streams[k % streams.len()];
        k += 1;
        if let Err(e) = gpu.launch_work(lease, work_ns, slot) {
            shared.error(e);
            shared.give_back(slot);
            break;
        }
        let t0 = host_ns();
        let submitted = design.submit(lease);
        let t1 = host_ns();
        let Submitted {
            fut,
            step,
            spin_ns,
            ready_ns,
        } = match submitted {
            Ok(s) => s,
            Err(e) => {
                shared.error(e);
                // The kernel still writes the slot: wait for it before
                // handing the slot out again.
                let stream = crate::gpu::raw_stream(lease);
                // SAFETY: a live stream of device 0 (the lease).
                let _ = unsafe { gpupool_cuda::cudarc::driver::sys::cuStreamSynchronize(stream) };
                shared.give_back(slot);
                continue;
            }
        };
        if measured {
            out.submitted += 1;
            out.spin_ns += spin_ns;
            match step {
                StepCost::Whole => out.steps.push(t1 - t0),
                StepCost::Measured(ns) => out.steps.push(ns),
                StepCost::Skipped => {}
            }
        }
        let shared2 = shared.clone();
        let mut fut = Stamped {
            fut,
            stamp: Arc::new(Stamp {
                woken_ns: AtomicU64::new(0),
                task: Mutex::new(None),
            }),
            polls: 0,
        };
        tokio::spawn(async move {
            let r = (&mut fut).await;
            let resolved_ns = ready_ns.unwrap_or_else(host_ns);
            let gpu_ns = gpu.stamps.slot(slot).load(Ordering::Acquire);
            shared2.give_back(slot);
            match r {
                Ok(path) if measured => {
                    let woken_ns = ready_ns.unwrap_or(fut.stamp.woken_ns.load(Ordering::Acquire));
                    let sample = Sample {
                        resolved_ns,
                        woken_ns,
                        gpu_ns,
                        path,
                        first_poll: ready_ns.is_some() || fut.polls == 1,
                    };
                    shared2
                        .samples
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(sample);
                }
                Ok(_) => {}
                Err(e) => shared2.error(e),
            }
        });
        tokio::task::yield_now().await;
    }
    out
}

/// Runs `design` once with `cfg` on `rt` (whose worker count is
/// `cfg.threads`).
pub fn run_cell<D: Design>(
    rt: &Runtime,
    gpu: &'static Gpu,
    design: &'static D,
    cfg: &CellConfig,
) -> CellResult {
    let mut res = CellResult::default();
    let before = match gpu.calibrate(cfg.calib_rounds) {
        Ok(c) => c,
        Err(e) => {
            res.errors = 1;
            res.first_error = Some(e);
            return res;
        }
    };
    let f = cfg.inflight.max(1);
    let start = host_ns();
    let measure_from = start + cfg.warmup.as_nanos() as u64;
    let stop = measure_from + cfg.duration.as_nanos() as u64;
    let shared = Arc::new(Shared {
        permits: Semaphore::new(f),
        free: Mutex::new((0..f).rev().collect()),
        samples: Mutex::new(Vec::new()),
        errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
        measure_from,
        stop,
    });
    let outs: Vec<SubmitterOut> = rt.block_on(async {
        let handles: Vec<_> = (0..cfg.threads)
            .map(|t| tokio::spawn(submitter(gpu, design, shared.clone(), t, cfg.work_ns)))
            .collect();
        let at = |ns: u64| {
            tokio::time::Instant::now() + Duration::from_nanos(ns.saturating_sub(host_ns()))
        };
        tokio::time::sleep_until(at(measure_from)).await;
        let (p0, m0) = (process_cpu_ns(), this_thread_cpu_ns());
        let snap0 = CpuSnapshot::take(&design.machinery_threads());
        let w0 = host_ns();
        tokio::time::sleep_until(at(stop)).await;
        let w1 = host_ns();
        let snap1 = CpuSnapshot::take(&design.machinery_threads());
        let (p1, m1) = (process_cpu_ns(), this_thread_cpu_ns());
        res.window_ns = w1 - w0;
        res.machinery_cpu_ns = snap1.since(&snap0);
        res.machinery_threads = snap1.threads();
        res.process_cpu_ns = (p1 - p0).saturating_sub(m1 - m0);
        // A submitter waits for a permit only while futures are in flight;
        // if they never resolve (a lost wake-up), close the semaphore so it
        // stops, and report it below.
        let mut outs = Vec::new();
        for mut h in handles {
            let joined = match tokio::time::timeout(cfg.drain_timeout, &mut h).await {
                Ok(j) => j,
                Err(_) => {
                    shared.error("a submitter still waiting for a permit after the run".into());
                    shared.permits.close();
                    h.await
                }
            };
            match joined {
                Ok(o) => outs.push(o),
                Err(e) => shared.error(format!("a submitter: {e}")),
            }
        }
        let drained =
            tokio::time::timeout(cfg.drain_timeout, shared.permits.acquire_many(f as u32));
        match drained.await {
            Ok(Ok(p)) => p.forget(),
            _ => shared.error(format!(
                "{} futures still unresolved {:?} after the run",
                f - shared.permits.available_permits(),
                cfg.drain_timeout
            )),
        }
        outs
    });

    let mut steps: Vec<u64> = outs.iter().flat_map(|o| o.steps.iter().copied()).collect();
    steps.sort_unstable();
    res.submitted = outs.iter().map(|o| o.submitted).sum();
    if !steps.is_empty() {
        res.submit_mean_ns = Some(steps.iter().sum::<u64>() as f64 / steps.len() as f64);
        res.submit_p50_ns = percentile(&steps, 50.0).map(|v| v as f64);
    }
    if res.submitted > 0 {
        res.spin_mean_ns =
            outs.iter().map(|o| o.spin_ns).sum::<u64>() as f64 / res.submitted as f64;
    }
    let after = gpu.calibrate(cfg.calib_rounds).unwrap_or_else(|e| {
        shared.error(e);
        before
    });
    let clock = ClockMap { before, after };
    res.drift_ns = clock.drift_ns();
    res.calib_uncertainty_ns = clock.uncertainty_ns();
    let samples = std::mem::take(&mut *shared.samples.lock().unwrap_or_else(|p| p.into_inner()));
    let mut lat: Vec<i64> = Vec::with_capacity(samples.len());
    let mut notify: Vec<i64> = Vec::with_capacity(samples.len());
    for s in &samples {
        if (measure_from..stop).contains(&s.resolved_ns) {
            res.completed += 1;
        }
        res.paths[match s.path {
            Path::Direct => 0,
            Path::Spin => 1,
            Path::Reactor => 2,
            Path::HostFn => 3,
        }] += 1;
        if s.gpu_ns == 0 {
            res.early += 1;
            continue;
        }
        let finish = clock.to_host(s.gpu_ns);
        lat.push(s.resolved_ns as i64 - finish);
        if s.woken_ns != 0 {
            notify.push(s.woken_ns as i64 - finish);
        } else if s.first_poll {
            res.first_poll_ready += 1;
        }
    }
    notify.sort_unstable();
    res.notify_samples = notify.len();
    res.notify_p50_ns = percentile(&notify, 50.0).map(|v| v as f64);
    res.notify_p99_ns = percentile(&notify, 99.0).map(|v| v as f64);
    lat.sort_unstable();
    res.wake_samples = lat.len();
    res.wake_p50_ns = percentile(&lat, 50.0).map(|v| v as f64);
    res.wake_p99_ns = percentile(&lat, 99.0).map(|v| v as f64);
    res.wake_min_ns = lat.first().map(|&v| v as f64);
    res.per_sec = res.completed as f64 / (cfg.duration.as_secs_f64());
    res.errors = shared.errors.load(Ordering::Relaxed);
    res.first_error = shared
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    res
}
