//! Kernels that keep a stream busy, for tests, examples and benchmarks: a pool
//! behaves differently for a stream with work still pending, and real work of
//! a known length is the only way to have one on a GPU.
//!
//! - [`spin`] queues a kernel that runs for a given time (a loop on
//!   `%globaltimer`).
//! - [`Gate`] queues a kernel that runs until the host opens the gate (or a
//!   timeout passes), so a test decides exactly when the stream's work ends
//!   instead of racing a timer.
//!
//! The kernels are PTX text (one thread each, `sm_70` and later), loaded into
//! every device's primary context on first use. Both take the stream as an
//! [`AccessOrder`]: a lease's or owned stream's order borrows the stream, so
//! it is alive for the call, and an order of another backend (not a CUDA
//! stream) is refused, so no unsafe code is needed to call them. A host
//! order has no stream to keep busy: `CUDA_ERROR_INVALID_VALUE`.
//!
//! ```no_run
//! use std::time::Duration;
//! use gpupool_cuda::testing::{spin, Gate};
//!
//! let lease = gpupool_cuda::streams().get(0)?;
//! spin(lease.order(), Duration::from_millis(5))?; // busy for ~5 ms
//! let gate = Gate::hold(lease.order(), Duration::from_secs(10))?;
//! // ... the stream is busy until the gate opens ...
//! gate.open();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::ffi::c_void;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};
use std::ffi::CStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, DriverError};
use gpupool_core::{AccessOrder, DeviceId, StreamHandle};

use crate::backend::CudaBackend;
use crate::driver::driver;
use crate::error::{invalid_value, out_of_memory, CudaError};
use crate::raw;

/// `gpupool_spin(u64 ns)`: returns once `%globaltimer` has advanced by `ns`.
/// `gpupool_gate(u64 flags, u64 ns)`: `flags` points at two `u32`s, `open` and
/// `done`; waits until `open != 0` or `ns` have passed, then sets `done = 1`.
const KERNELS: &CStr = c"
.version 7.0
.target sm_70
.address_size 64

.visible .entry gpupool_spin(
    .param .u64 gpupool_spin_param_0
)
{
    .reg .pred  %p<2>;
    .reg .b64   %rd<5>;

    ld.param.u64    %rd1, [gpupool_spin_param_0];
    mov.u64         %rd2, %globaltimer;
SPIN_LOOP:
    nanosleep.u32   1000;
    mov.u64         %rd3, %globaltimer;
    sub.s64         %rd4, %rd3, %rd2;
    setp.lt.u64     %p1, %rd4, %rd1;
    @%p1 bra        SPIN_LOOP;
    ret;
}

.visible .entry gpupool_gate(
    .param .u64 gpupool_gate_param_0,
    .param .u64 gpupool_gate_param_1
)
{
    .reg .pred  %p<3>;
    .reg .b32   %r<3>;
    .reg .b64   %rd<6>;

    ld.param.u64    %rd1, [gpupool_gate_param_0];
    ld.param.u64    %rd2, [gpupool_gate_param_1];
    mov.u64         %rd3, %globaltimer;
GATE_LOOP:
    ld.volatile.u32 %r1, [%rd1];
    setp.ne.s32     %p1, %r1, 0;
    @%p1 bra        GATE_DONE;
    mov.u64         %rd4, %globaltimer;
    sub.s64         %rd5, %rd4, %rd3;
    setp.ge.u64     %p2, %rd5, %rd2;
    @%p2 bra        GATE_DONE;
    nanosleep.u32   1000;
    bra.uni         GATE_LOOP;
GATE_DONE:
    mov.u32         %r2, 1;
    st.volatile.u32 [%rd1+4], %r2;
    ret;
}
";

/// The two kernels of one device, as `CUfunction` addresses.
#[derive(Copy, Clone)]
struct Kernels {
    spin: usize,
    gate: usize,
}

/// The kernels of every device, by ordinal, once loaded. A lock is fine here:
/// this is test support, and the lock is held only to look up or load.
static LOADED: Mutex<Vec<Kernels>> = Mutex::new(Vec::new());

/// The kernels of `device`. The first call loads the module into *every*
/// device's primary context: loading allocates device memory, which may wait
/// for the device's queued work, so it must not happen later, while a test
/// holds a [`Gate`] closed.
fn kernels(device: DeviceId) -> Result<Kernels, CudaError> {
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if loaded.is_empty() {
        let drv = driver()?;
        let all = (0..drv.count())
            .map(|d| drv.with_context(DeviceId(d), |_| load_kernels()))
            .collect::<Result<Vec<_>, _>>()?;
        *loaded = all;
    }
    loaded
        .get(device.index())
        .copied()
        .ok_or(CudaError::DeviceOutOfRange {
            device,
            count: loaded.len() as u32,
        })
}

/// Loads the module into the current context.
fn load_kernels() -> Result<Kernels, CudaError> {
    // SAFETY: `KERNELS` is NUL-terminated PTX text; the driver JIT-compiles it
    // into the current context. The module is never unloaded, so its
    // functions stay valid for the life of the process.
    let module = unsafe { raw::module_load_data(KERNELS) }?;
    let function = |name: &CStr| -> Result<usize, CudaError> {
        // SAFETY: `module` was just loaded, and is never unloaded.
        let f = unsafe { raw::module_get_function(module, name) }?;
        Ok(f as usize)
    };
    Ok(Kernels {
        spin: function(c"gpupool_spin")?,
        gate: function(c"gpupool_gate")?,
    })
}

/// The stream and device of a stream order of a CUDA backend:
/// `CUDA_ERROR_INVALID_VALUE` for host order, `CUDA_ERROR_INVALID_HANDLE` for
/// an order of another backend (a mock's, say), whose stream is no CUDA
/// stream.
///
/// The order borrows its stream (or names a special stream, or was made by
/// [`AccessOrder::from_raw`], whose caller vouched for it), so the stream is
/// a usable stream of the device for as long as the order lives.
fn stream_of(order: AccessOrder<'_>) -> Result<(StreamHandle, DeviceId), CudaError> {
    let (Some(stream), Some(device)) = (order.stream_handle(), order.device()) else {
        return Err(invalid_value());
    };
    if !order.is_usable_with(&CudaBackend::new()) {
        return Err(CudaError::Driver(DriverError(
            sys::CUresult::CUDA_ERROR_INVALID_HANDLE,
        )));
    }
    Ok((stream, device))
}

/// Launches a one-thread kernel. `params` point at the kernel's arguments.
///
/// # Safety
/// `function` is one of [`Kernels`] loaded into the current context, and
/// `params` match its parameters; `stream` is a usable stream of that
/// context's device (see [`CudaBackend`], "Raw
/// handles").
unsafe fn launch(
    function: usize,
    stream: StreamHandle,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    // SAFETY: `function` is a kernel of the current context (of a module
    // never unloaded) whose parameters match `params`, and `stream` a live
    // stream of that context or a special one (this function's contract);
    // the driver copies the arguments before returning.
    unsafe {
        raw::launch_kernel(
            function as sys::CUfunction,
            [1; 3],
            [1; 3],
            0,
            stream,
            params,
        )
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Queues on the stream of `order` (a stream order of a CUDA backend; a
/// special stream means its device's) a kernel that runs for `duration`,
/// then returns at once.
///
/// The stream stays busy for about `duration` from when the kernel starts, so
/// a test that must see it pending should use a [`Gate`] instead.
///
/// Errors: `CUDA_ERROR_INVALID_VALUE` for host order,
/// `CUDA_ERROR_INVALID_HANDLE` for an order of another backend.
pub fn spin(order: AccessOrder<'_>, duration: Duration) -> Result<(), CudaError> {
    let (stream, device) = stream_of(order)?;
    let k = kernels(device)?;
    driver()?.with_context(device, |_| {
        let mut ns = nanos(duration);
        // SAFETY: `k.spin` was loaded into `device`'s primary context, current
        // now, and takes one `u64`; `stream` is a usable stream of `device`
        // (`stream_of`: the order borrows it).
        unsafe { launch(k.spin, stream, &mut [(&raw mut ns).cast()]) }
    })
}

/// How many gates may exist at once.
pub const MAX_GATES: usize = 4096;

/// The flags of every gate: `MAX_GATES` pairs of `u32` in one block of
/// pinned, device-mapped, portable host memory, allocated on first use and
/// never freed. One block, because allocating or freeing pinned memory may
/// wait for work queued on the device, which must not happen while a test
/// holds a gate closed.
struct Slab {
    /// The block's host address.
    base: usize,
    /// Slots not in use.
    free: Vec<usize>,
}

static SLAB: Mutex<Option<Slab>> = Mutex::new(None);

/// Takes a free slot, allocating the block on first use (in the current
/// context). Returns the slot's index and host address.
fn take_slot() -> Result<(usize, NonNull<AtomicU32>), CudaError> {
    let mut slab = SLAB.lock().unwrap_or_else(|p| p.into_inner());
    if slab.is_none() {
        // Portable: pinned in every context; device-mapped: kernels may read
        // and write it.
        let host = raw::mem_host_alloc(
            MAX_GATES * 2 * size_of::<u32>(),
            sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
        )?;
        *slab = Some(Slab {
            base: host as usize,
            free: (0..MAX_GATES).rev().collect(),
        });
    }
    let exhausted = out_of_memory();
    let slab = slab.as_mut().ok_or(exhausted)?;
    let slot = slab.free.pop().ok_or(exhausted)?;
    let addr = slab.base + slot * 2 * size_of::<u32>();
    let flags = NonNull::new(addr as *mut AtomicU32).ok_or(exhausted)?;
    Ok((slot, flags))
}

/// Returns a slot whose kernel has finished with it.
fn give_slot(slot: usize) {
    let mut slab = SLAB.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(slab) = slab.as_mut() {
        slab.free.push(slot);
    }
}

/// A kernel queued on a stream that runs until the host [opens](Gate::open)
/// the gate, or until a timeout passes: the stream's later work waits for it,
/// so the test, not a timer, decides when the stream becomes idle.
///
/// Each gate holds one kernel; at most [`MAX_GATES`] exist at once. Dropping
/// a gate opens it and waits (at most its timeout) until the kernel has seen
/// that; a gate whose kernel never ran in that time keeps its slot forever
/// rather than hand it to another gate while the kernel may still read it.
pub struct Gate {
    /// Two `u32`s in the slab: `open` (written by the host) and `done`
    /// (written by the kernel). Every host access goes through `AtomicU32`.
    flags: NonNull<AtomicU32>,
    slot: usize,
    device: DeviceId,
    timeout: Duration,
}

// SAFETY: the flags are ordinary (pinned) host memory that only this gate
// uses while it lives; all host accesses to them are atomic, so a gate may
// move to, and be shared with, any thread.
unsafe impl Send for Gate {}
// SAFETY: as above: `&Gate` only allows atomic accesses.
unsafe impl Sync for Gate {}

impl core::fmt::Debug for Gate {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Gate")
            .field("device", &self.device)
            .field("open", &self.is_open())
            .field("done", &self.is_done())
            .finish()
    }
}

impl Gate {
    /// Queues a gate kernel on the stream of `order` (a stream order of a
    /// CUDA backend; a special stream means its device's). It keeps the
    /// stream busy until [`open`](Self::open) or until `timeout` has passed
    /// on the GPU, whichever comes first.
    ///
    /// The gate does not borrow the stream: the kernel only touches the
    /// gate's own flags (never freed), and a stream destroyed with the kernel
    /// queued still runs it.
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for host order,
    /// `CUDA_ERROR_INVALID_HANDLE` for an order of another backend.
    pub fn hold(order: AccessOrder<'_>, timeout: Duration) -> Result<Gate, CudaError> {
        let (stream, device) = stream_of(order)?;
        let k = kernels(device)?;
        driver()?.with_context(device, |_| {
            let (slot, flags) = take_slot()?;
            // From here on, dropping `gate` returns the slot (`done` is set by
            // hand if the kernel is not launched).
            let gate = Gate {
                flags,
                slot,
                device,
                timeout,
            };
            gate.open_flag().store(0, Ordering::SeqCst);
            gate.done_flag().store(0, Ordering::SeqCst);
            // SAFETY: the slot lies in the slab, allocated device-mapped.
            let mapped = unsafe { raw::mem_host_get_device_pointer(flags.as_ptr().cast(), 0) };
            let mut ns = nanos(timeout);
            let launched = mapped.and_then(|mut dptr| {
                // SAFETY: `k.gate` was loaded into `device`'s primary context,
                // current now, and takes two `u64`s; `stream` is a usable
                // stream of `device` (`stream_of`: the order borrows it).
                unsafe {
                    launch(
                        k.gate,
                        stream,
                        &mut [(&raw mut dptr).cast(), (&raw mut ns).cast()],
                    )
                }
            });
            if let Err(e) = launched {
                gate.done_flag().store(1, Ordering::SeqCst);
                return Err(e);
            }
            Ok(gate)
        })
    }

    fn open_flag(&self) -> &AtomicU32 {
        // SAFETY: `flags` points at two `u32`s of the slab, which is never
        // freed, reserved for this gate while it lives.
        unsafe { self.flags.as_ref() }
    }

    fn done_flag(&self) -> &AtomicU32 {
        // SAFETY: the second of the two `u32`s `flags` points at.
        unsafe { self.flags.add(1).as_ref() }
    }

    /// Lets the kernel finish; the stream's later work then proceeds.
    pub fn open(&self) {
        self.open_flag().store(1, Ordering::SeqCst);
    }

    /// Whether [`open`](Self::open) was called.
    pub fn is_open(&self) -> bool {
        self.open_flag().load(Ordering::SeqCst) != 0
    }

    /// Whether the kernel has finished (seen the gate open, or timed out).
    pub fn is_done(&self) -> bool {
        self.done_flag().load(Ordering::SeqCst) != 0
    }

    /// The device the gate's kernel runs on.
    pub fn device(&self) -> DeviceId {
        self.device
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
        let deadline = Instant::now() + self.timeout + Duration::from_secs(1);
        while !self.is_done() {
            if Instant::now() > deadline {
                return; // the kernel may still use the slot: never reuse it
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        give_slot(self.slot);
    }
}

/// PTX of `affine(float *y, const float *x, unsigned n)`: `y[i] = 2 * x[i] + 1`
/// for every `i < n`, one thread per element (launch with
/// `LaunchConfig::for_num_elems(n)`). Written by hand for `sm_70` and later
/// (the driver compiles it for the GPU at hand); the examples load it with
/// cudarc (`CudaContext::load_module(Ptx::from_src(AFFINE_PTX))`).
pub const AFFINE_PTX: &str = "
.version 7.0
.target sm_70
.address_size 64

.visible .entry affine(
    .param .u64 affine_param_0,
    .param .u64 affine_param_1,
    .param .u32 affine_param_2
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .f32   %f<3>;
    .reg .b64   %rd<8>;

    ld.param.u64        %rd1, [affine_param_0];
    ld.param.u64        %rd2, [affine_param_1];
    ld.param.u32        %r1, [affine_param_2];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mad.lo.s32          %r5, %r2, %r3, %r4;
    setp.ge.u32         %p1, %r5, %r1;
    @%p1 bra            AFFINE_DONE;
    cvta.to.global.u64  %rd3, %rd1;
    cvta.to.global.u64  %rd4, %rd2;
    mul.wide.u32        %rd5, %r5, 4;
    add.s64             %rd6, %rd4, %rd5;
    ld.global.f32       %f1, [%rd6];
    fma.rn.f32          %f2, %f1, 0f40000000, 0f3F800000;
    add.s64             %rd7, %rd3, %rd5;
    st.global.f32       [%rd7], %f2;
AFFINE_DONE:
    ret;
}
";
