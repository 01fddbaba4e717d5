//! The GPU side of the benchmark: the device, its primary context, the
//! streams every design uses, the request kernel, the pinned timestamp slots
//! it writes, and the calibration of `%globaltimer` against the host clock.
//!
//! Every request runs [`Gpu::launch_work`]: a one-thread kernel that spins on
//! `%globaltimer` for `D` ns and then stores `%globaltimer` (its finish
//! time, GPU clock) into the request's slot of pinned, device-mapped host
//! memory. The host reads the slot when the request's future resolves; with
//! the calibrated offset, resolve time (host clock) minus finish time is the
//! wake latency.

use core::ffi::c_void;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use gpupool_core::{Backend, DeviceId, Error as PoolError, EventPool, StreamLease, StreamPool};
use gpupool_cuda::cudarc::driver::safe::CudaContext;
use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::{CudaBackend, CudaError};

/// Nanoseconds on the host clock (`CLOCK_MONOTONIC` through [`Instant`])
/// since the first call in the process.
pub fn host_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A driver result as a `Result`, with the call named.
pub fn check(what: &str, r: sys::CUresult) -> Result<(), String> {
    r.result().map_err(|e| format!("{what}: {e:?}"))
}

/// Launches `f` as one block of one thread, no shared memory, on `stream`.
///
/// # Safety
///
/// `f` is a kernel function handle of the current context whose parameters
/// `params` point at, and `stream` is a live stream of that context.
#[inline(always)]
unsafe fn launch_one_thread(
    f: usize,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> sys::CUresult {
    // SAFETY: the caller's word.
    unsafe {
        sys::cuLaunchKernel(
            f as sys::CUfunction,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            core::ptr::null_mut(),
        )
    }
}

/// The CUDA backend when the driver loads and reports a GPU; otherwise says
/// "skipped: no CUDA driver or no GPU" on stdout and returns `None` (a probe
/// without a GPU skips and exits 0).
pub fn cuda_or_skip() -> Option<CudaBackend> {
    let gpu = CudaBackend::new();
    match gpu.device_count() {
        Ok(n) if n > 0 => Some(gpu),
        _ => {
            println!("skipped: no CUDA driver or no GPU");
            None
        }
    }
}

/// The stream of a lease, as the driver's handle.
pub fn raw_stream(lease: &StreamLease<'_, CudaBackend>) -> sys::CUstream {
    lease.handle().as_raw() as sys::CUstream
}

/// The kernels: `bench_work(u64 ns, u64 out)` spins `ns` on `%globaltimer`,
/// then stores the time it finished at `out` (a mapped host address);
/// `bench_ping(u64 flags, u64 ts, u32 n, u64 timeout)` answers `n` pings of
/// the host (`flags[0]` = round asked, `flags[1]` = round answered), storing
/// `%globaltimer` for each at `ts[i]`; `bench_tick(u64 out)` stores the time
/// `%globaltimer` takes to change 64 times.
const PTX: &CStr = c"
.version 7.0
.target sm_70
.address_size 64

.visible .entry bench_work(
    .param .u64 bench_work_param_0,
    .param .u64 bench_work_param_1
)
{
    .reg .pred  %p<2>;
    .reg .b64   %rd<6>;

    ld.param.u64    %rd1, [bench_work_param_0];
    ld.param.u64    %rd2, [bench_work_param_1];
    mov.u64         %rd3, %globaltimer;
WORK_LOOP:
    mov.u64         %rd4, %globaltimer;
    sub.s64         %rd5, %rd4, %rd3;
    setp.lt.u64     %p1, %rd5, %rd1;
    @%p1 bra        WORK_LOOP;
    st.volatile.u64 [%rd2], %rd4;
    membar.sys;
    ret;
}

.visible .entry bench_ping(
    .param .u64 bench_ping_param_0,
    .param .u64 bench_ping_param_1,
    .param .u32 bench_ping_param_2,
    .param .u64 bench_ping_param_3
)
{
    .reg .pred  %p<4>;
    .reg .b32   %r<4>;
    .reg .b64   %rd<8>;

    ld.param.u64    %rd1, [bench_ping_param_0];
    ld.param.u64    %rd2, [bench_ping_param_1];
    ld.param.u32    %r1, [bench_ping_param_2];
    ld.param.u64    %rd3, [bench_ping_param_3];
    mov.u64         %rd4, %globaltimer;
    mov.u32         %r2, 1;
PING_ROUND:
    setp.gt.u32     %p1, %r2, %r1;
    @%p1 bra        PING_DONE;
PING_WAIT:
    ld.volatile.u32 %r3, [%rd1];
    setp.ge.u32     %p2, %r3, %r2;
    @%p2 bra        PING_SEEN;
    mov.u64         %rd5, %globaltimer;
    sub.s64         %rd6, %rd5, %rd4;
    setp.ge.u64     %p3, %rd6, %rd3;
    @%p3 bra        PING_DONE;
    bra.uni         PING_WAIT;
PING_SEEN:
    mov.u64         %rd7, %globaltimer;
    st.volatile.u64 [%rd2], %rd7;
    membar.sys;
    st.volatile.u32 [%rd1+4], %r2;
    membar.sys;
    add.s64         %rd2, %rd2, 8;
    add.u32         %r2, %r2, 1;
    bra.uni         PING_ROUND;
PING_DONE:
    ret;
}

.visible .entry bench_tick(
    .param .u64 bench_tick_param_0
)
{
    .reg .pred  %p<4>;
    .reg .b32   %r<2>;
    .reg .b64   %rd<7>;

    ld.param.u64    %rd1, [bench_tick_param_0];
    mov.u64         %rd2, %globaltimer;
TICK_FIRST:
    mov.u64         %rd3, %globaltimer;
    setp.eq.u64     %p1, %rd3, %rd2;
    @%p1 bra        TICK_FIRST;
    mov.u64         %rd4, %rd3;
    mov.u32         %r1, 0;
TICK_LOOP:
    mov.u64         %rd5, %globaltimer;
    setp.eq.u64     %p2, %rd5, %rd4;
    @%p2 bra        TICK_LOOP;
    mov.u64         %rd4, %rd5;
    add.u32         %r1, %r1, 1;
    setp.lt.u32     %p3, %r1, 64;
    @%p3 bra        TICK_LOOP;
    sub.s64         %rd6, %rd4, %rd3;
    st.volatile.u64 [%rd1], %rd6;
    membar.sys;
    ret;
}
";

/// Pinned, device-mapped, portable host memory of `len` `u64`s, never freed
/// (the process keeps it until exit; freeing pinned memory may wait for the
/// device). Every host access is atomic.
pub struct Pinned {
    host: usize,
    dev: u64,
    len: usize,
}

impl Pinned {
    /// Allocates `len` u64s in the current context.
    pub fn new(len: usize) -> Result<Pinned, String> {
        let mut host: *mut c_void = core::ptr::null_mut();
        // SAFETY: `host` is a valid place for the pointer; a context is
        // current (the caller bound the device's primary context).
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(
                &mut host,
                len * size_of::<u64>(),
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        })?;
        // SAFETY: the block was just allocated with `len` u64s.
        unsafe { core::ptr::write_bytes(host.cast::<u64>(), 0, len) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` is the start of a device-mapped allocation.
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0)
        })?;
        Ok(Pinned {
            host: host as usize,
            dev,
            len,
        })
    }

    /// Slot `i` as the host sees it.
    pub fn slot(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.len, "slot {i} of {}", self.len);
        // SAFETY: in bounds (asserted), 8-aligned (pinned memory is
        // page-aligned), never freed; every host access is atomic and the
        // device only stores whole u64s.
        unsafe { AtomicU64::from_ptr((self.host as *mut u64).add(i)) }
    }

    /// The `i`-th `u32` of the block (two per slot) as the host sees it.
    pub fn flag32(&self, i: usize) -> &AtomicU32 {
        assert!(i < 2 * self.len, "u32 {i} of {}", 2 * self.len);
        // SAFETY: in bounds (asserted), 4-aligned, never freed; whoever uses
        // these u32s uses them only through atomics (and the device's
        // 32-bit stores).
        unsafe { AtomicU32::from_ptr((self.host as *mut u32).add(i)) }
    }

    /// The `i`-th `u32` of the block as the device sees it.
    pub fn device_addr32(&self, i: usize) -> u64 {
        assert!(i < 2 * self.len, "u32 {i} of {}", 2 * self.len);
        self.dev + (i * size_of::<u32>()) as u64
    }

    /// Slot `i` as the device sees it.
    pub fn device_addr(&self, i: usize) -> u64 {
        assert!(i < self.len, "slot {i} of {}", self.len);
        self.dev + (i * size_of::<u64>()) as u64
    }
}

/// Everything the designs share, made once and leaked (`&'static`).
pub struct Gpu {
    /// `cuDeviceGetName` of device 0.
    pub name: String,
    /// `cuDriverGetVersion`.
    pub driver_version: i32,
    /// Device 0's primary context (retained by `_ctx`).
    pub ctx: usize,
    _ctx: Arc<CudaContext>,
    work: usize,
    ping: usize,
    tick: usize,
    /// Every submitting thread's streams, `streams_per_thread` apiece,
    /// leased for the whole run.
    pub leases: Vec<StreamLease<'static, CudaBackend>>,
    /// Streams per submitting thread.
    pub streams_per_thread: usize,
    /// The process's stream and event pools (leaked).
    pub streams: &'static StreamPool<CudaBackend>,
    /// Events with timing disabled.
    pub events: &'static EventPool<CudaBackend>,
    /// The request slots: at most this many requests in flight.
    pub stamps: Pinned,
    calib: Pinned,
}

/// Why there is nothing to run, or what failed.
pub enum SetupError {
    /// No driver, no GPU.
    Skip(String),
    /// Anything else.
    Fail(String),
}

/// The number of `u64`s of the calibration block past the two flags.
const CALIB_ROUNDS_MAX: usize = 4096;

impl Gpu {
    /// Leases `threads * streams_per_thread` streams of device 0, loads the
    /// kernels, allocates `max_inflight` request slots; binds device 0's
    /// primary context to the calling thread.
    pub fn setup(
        threads: usize,
        streams_per_thread: usize,
        max_inflight: usize,
    ) -> Result<&'static Gpu, SetupError> {
        let streams: &'static StreamPool<CudaBackend> =
            Box::leak(Box::new(StreamPool::new(CudaBackend::new())));
        let events: &'static EventPool<CudaBackend> =
            Box::leak(Box::new(EventPool::new(CudaBackend::new())));
        let first = match streams.get(0) {
            Ok(lease) => lease,
            Err(PoolError::Backend {
                source: CudaError::NoDriver,
                ..
            }) => {
                return Err(SetupError::Skip(
                    "no CUDA driver on this machine (libcuda not found)".into(),
                ))
            }
            Err(PoolError::NoDevice) => {
                return Err(SetupError::Skip("the CUDA driver reports no GPU".into()))
            }
            Err(e) => return Err(SetupError::Fail(format!("leasing a stream: {e}"))),
        };
        let fail = SetupError::Fail;
        let ctx = CudaBackend::new()
            .context(DeviceId(0))
            .map_err(|e| fail(format!("device 0's context: {e}")))?;
        ctx.bind_to_thread()
            .map_err(|e| fail(format!("binding the context: {e:?}")))?;
        let name = ctx.name().unwrap_or_else(|e| format!("(name: {e:?})"));
        let mut driver_version = 0;
        // SAFETY: a valid place for the version.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut driver_version)
        })
        .map_err(fail)?;
        let mut module: sys::CUmodule = core::ptr::null_mut();
        // SAFETY: `PTX` is NUL-terminated PTX text, compiled into the current
        // context (device 0's primary one, bound above); the module is never
        // unloaded, so its functions live as long as the process.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut module, PTX.as_ptr().cast())
        })
        .map_err(fail)?;
        let function = |name: &CStr| -> Result<usize, SetupError> {
            let mut f: sys::CUfunction = core::ptr::null_mut();
            // SAFETY: `module` was just loaded; `name` is NUL-terminated.
            check("cuModuleGetFunction", unsafe {
                sys::cuModuleGetFunction(&mut f, module, name.as_ptr())
            })
            .map_err(SetupError::Fail)?;
            Ok(f as usize)
        };
        let (work, ping, tick) = (
            function(c"bench_work")?,
            function(c"bench_ping")?,
            function(c"bench_tick")?,
        );
        let mut leases = vec![first];
        while leases.len() < threads * streams_per_thread {
            leases.push(
                streams
                    .get(0)
                    .map_err(|e| fail(format!("leasing a stream: {e}")))?,
            );
        }
        let stamps = Pinned::new(max_inflight.max(1)).map_err(fail)?;
        let calib = Pinned::new(CALIB_ROUNDS_MAX + 2).map_err(fail)?;
        Ok(Box::leak(Box::new(Gpu {
            name,
            driver_version,
            ctx: ctx.cu_ctx() as usize,
            _ctx: ctx,
            work,
            ping,
            tick,
            leases,
            streams_per_thread,
            streams,
            events,
            stamps,
            calib,
        })))
    }

    /// Makes device 0's primary context current on the calling thread (every
    /// runtime thread calls it when it starts).
    pub fn bind(&self) {
        // SAFETY: `ctx` is device 0's primary context, retained for the life
        // of the process by `_ctx`.
        let _ = unsafe { sys::cuCtxSetCurrent(self.ctx as sys::CUcontext) };
    }

    /// The streams of submitting thread `t`.
    pub fn streams_of(&self, t: usize) -> &[StreamLease<'static, CudaBackend>] {
        let s = self.streams_per_thread;
        &self.leases[t * s..(t + 1) * s]
    }

    /// Queues the request kernel on `lease`'s stream: it runs `ns` ns, then
    /// stores its finish time (GPU clock) in request slot `slot`.
    pub fn launch_work(
        &self,
        lease: &StreamLease<'_, CudaBackend>,
        ns: u64,
        slot: usize,
    ) -> Result<(), String> {
        let mut ns = ns;
        let mut out = self.stamps.device_addr(slot);
        let mut params: [*mut c_void; 2] = [(&raw mut ns).cast(), (&raw mut out).cast()];
        // SAFETY: `work` is `bench_work(u64, u64)` of device 0's primary
        // context, `params` point at two u64s (the driver copies them before
        // returning), `out` is a slot of the mapped block (never freed), and
        // the stream is a live stream of device 0 (the lease borrows it).
        check("cuLaunchKernel", unsafe {
            launch_one_thread(self.work, raw_stream(lease), &mut params)
        })
    }

    /// Measures `%globaltimer` against [`host_ns`]: `rounds` pings of a kernel
    /// that answers each with its clock; the tightest round trip gives the
    /// offset. Also measures how often `%globaltimer` ticks.
    pub fn calibrate(&self, rounds: usize) -> Result<Calibration, String> {
        let rounds = rounds.clamp(1, CALIB_ROUNDS_MAX);
        let lease = &self.leases[0];
        let stream = raw_stream(lease);
        let (go, ack) = (self.calib.flag32(0), self.calib.flag32(1));
        go.store(0, Ordering::SeqCst);
        ack.store(0, Ordering::SeqCst);
        let mut flags = self.calib.device_addr(0);
        let mut ts = self.calib.device_addr(1);
        let mut n = rounds as u32;
        let mut timeout: u64 = 5_000_000_000;
        let mut params: [*mut c_void; 4] = [
            (&raw mut flags).cast(),
            (&raw mut ts).cast(),
            (&raw mut n).cast(),
            (&raw mut timeout).cast(),
        ];
        // SAFETY: `ping` is `bench_ping(u64, u64, u32, u64)` of the current
        // context, `params` match it, both addresses are in the mapped
        // calibration block (never freed), the stream is leased for good.
        check("cuLaunchKernel(ping)", unsafe {
            launch_one_thread(self.ping, stream, &mut params)
        })?;
        let mut best: Option<(u64, u64, u64)> = None; // (rtt, mid, gpu)
        let mut rtts = Vec::with_capacity(rounds);
        let deadline = Instant::now() + Duration::from_secs(5);
        for i in 1..=rounds as u32 {
            let t0 = host_ns();
            go.store(i, Ordering::SeqCst);
            while ack.load(Ordering::SeqCst) < i {
                if Instant::now() > deadline {
                    return Err("calibration: the ping kernel did not answer".into());
                }
                std::hint::spin_loop();
            }
            let t1 = host_ns();
            let gpu = self.calib.slot(i as usize).load(Ordering::SeqCst);
            let rtt = t1 - t0;
            rtts.push(rtt);
            if best.is_none_or(|(b, _, _)| rtt < b) {
                best = Some((rtt, t0 + rtt / 2, gpu));
            }
        }
        // SAFETY: the stream is live (leased for good).
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(stream)
        })?;
        let tick = self.tick_ns(stream)?;
        let (rtt, mid, gpu) = best.ok_or("calibration: no rounds")?;
        rtts.sort_unstable();
        Ok(Calibration {
            offset_ns: mid as i64 - gpu as i64,
            host_mid_ns: mid,
            best_rtt_ns: rtt,
            median_rtt_ns: rtts[rtts.len() / 2],
            tick_ns: tick,
            rounds,
        })
    }

    /// The mean time `%globaltimer` takes to change, over 64 changes.
    fn tick_ns(&self, stream: sys::CUstream) -> Result<f64, String> {
        let slot = CALIB_ROUNDS_MAX + 1;
        self.calib.slot(slot).store(0, Ordering::SeqCst);
        let mut out = self.calib.device_addr(slot);
        let mut params: [*mut c_void; 1] = [(&raw mut out).cast()];
        // SAFETY: `tick` is `bench_tick(u64)` of the current context; `out`
        // is in the mapped calibration block; the stream is leased for good.
        check("cuLaunchKernel(tick)", unsafe {
            launch_one_thread(self.tick, stream, &mut params)
        })?;
        // SAFETY: as above.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(stream)
        })?;
        Ok(self.calib.slot(slot).load(Ordering::SeqCst) as f64 / 64.0)
    }
}

/// `%globaltimer` against the host clock.
#[derive(Clone, Copy, Debug)]
pub struct Calibration {
    /// host_ns = gpu_ns + offset_ns, from the tightest round trip.
    pub offset_ns: i64,
    /// When (host clock) that round trip was made: its midpoint.
    pub host_mid_ns: u64,
    /// The tightest round trip: the offset is known to ± half of it (plus
    /// one tick of `%globaltimer`).
    pub best_rtt_ns: u64,
    /// The median round trip.
    pub median_rtt_ns: u64,
    /// The mean time between changes of `%globaltimer`.
    pub tick_ns: f64,
    /// Rounds made.
    pub rounds: usize,
}

impl Calibration {
    /// The uncertainty of the offset: half the tightest round trip plus one
    /// tick.
    pub fn uncertainty_ns(&self) -> f64 {
        self.best_rtt_ns as f64 / 2.0 + self.tick_ns
    }

    /// A GPU time on the host clock.
    pub fn to_host(&self, gpu_ns: u64) -> i64 {
        gpu_ns as i64 + self.offset_ns
    }
}

/// `%globaltimer` against the host clock over one run: calibrations made
/// just before and just after it, the offset interpolated linearly between
/// them (the two clocks drift apart by a few microseconds per second).
#[derive(Clone, Copy, Debug)]
pub struct ClockMap {
    /// Made just before the run.
    pub before: Calibration,
    /// Made just after it.
    pub after: Calibration,
}

impl ClockMap {
    /// A GPU time on the host clock.
    pub fn to_host(&self, gpu_ns: u64) -> i64 {
        let (b, a) = (&self.before, &self.after);
        let approx = gpu_ns as i64 + b.offset_ns;
        let (t0, t1) = (b.host_mid_ns as i64, a.host_mid_ns as i64);
        if t1 <= t0 {
            return approx;
        }
        let frac = ((approx - t0) as f64 / (t1 - t0) as f64).clamp(0.0, 1.0);
        approx + ((a.offset_ns - b.offset_ns) as f64 * frac) as i64
    }

    /// How far the offset moved between the two calibrations, ns.
    pub fn drift_ns(&self) -> i64 {
        self.after.offset_ns - self.before.offset_ns
    }

    /// The larger uncertainty of the two, ns.
    pub fn uncertainty_ns(&self) -> f64 {
        self.before
            .uncertainty_ns()
            .max(self.after.uncertainty_ns())
    }
}
