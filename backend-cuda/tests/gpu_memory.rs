//! `MemoryBackend for CudaBackend` on a real GPU (every test is ignored by
//! default; run with `--include-ignored` on the GPU machine, where
//! `scripts/gpu-check.sh` also runs the stream-order proofs under
//! compute-sanitizer):
//!
//! 1. every kind allocates and frees in host and stream order, aligned as
//!    asked (over-aligned requests included), and copies round-trip
//!    host → device → pinned → managed → host;
//! 2. the stream-order proof: over 1,000 rounds a kernel on stream A spins
//!    ~100 µs and then sums scratch device, pinned and managed memory into a
//!    result buffer that is not scratch, while the host drops (or resets) the
//!    scratchpad and the next round allocates and writes new scratch (the
//!    host writes pinned and managed memory, a memset on the next round's
//!    stream writes device memory); every round's sum must be right; and
//!    the same on 16 threads, each on its own stream of one pool, in two
//!    waves (the first exits without waiting for its kernels, the second
//!    runs on the same streams), with every (thread, round) sum right and
//!    device and pinned blocks reused;
//! 3. the pinned (and managed) pool never hands out a block whose event has
//!    not completed: blocks are parked behind a gate kernel while eight
//!    threads allocate, free and park as fast as they can;
//! 4. a scratchpad reset loop makes no upstream allocation after warm-up
//!    ([`CudaBackend::memory_stats`]);
//! 5. the device cache: a device block freed in the order of stream A comes
//!    back to the next allocation of its size on A without a driver call,
//!    never to another stream, the host or a special stream; a kernel held
//!    on A still reads its own data while B allocates and writes, and while
//!    A reuses the block behind it; destroying a stream through the backend
//!    (or `forget_stream`) returns its blocks, a stream destroyed elsewhere
//!    keeps them from every new stream (even one with the same handle) until
//!    `trim_memory`, and nothing leaks (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`);
//! 6. device memory comes from gpupool's own memory pool, and the device's
//!    default pool (its release threshold) is left as it was; kernels
//!    launched through `with_cudarc_stream` on scratch memory passed with
//!    `kernel_arg` compute every element right.
//!
//! The memory counters are process-wide, so the tests here take one lock and
//! run one at a time whatever `--test-threads` says.

mod common;

use std::collections::{HashSet, VecDeque};
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use common::{device_count, make_current, stream_of, wait_gate, Kernels, GATE_TIMEOUT};
use gpupool_core::{
    AccessOrder, DeviceId, EventBackend, EventLease, EventPool, MemoryBackend, MemoryKind,
    Scratchpad, StreamBackend, StreamHandle, StreamLease, StreamPool,
};
use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use gpupool_cuda::testing::Gate;
use gpupool_cuda::{with_cudarc_stream, CudaBackend, CudaError, DeviceSliceExt, MemoryStats};

const D0: DeviceId = DeviceId(0);

/// One test at a time: the memory counters are shared by the process.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `test` with device 0 current, one test at a time ([`serial`]), on a
/// stream leased from a pool of `gpu`'s (more leases come from
/// `lease.pool()`).
fn on_a_leased_stream(test: impl FnOnce(CudaBackend, &StreamLease<'_, CudaBackend>)) {
    let _serial = serial();
    device_count();
    make_current(D0);
    let gpu = CudaBackend::new();
    let streams = StreamPool::new(gpu);
    test(gpu, &streams.get(0).unwrap());
}

/// Fails the test with the driver's error.
fn ok(r: sys::CUresult, what: &str) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

/// `gpupool_consume(a, b, c, n, ns, result)`: every thread waits until
/// `%globaltimer` has advanced `ns`, then the block sums `a[i] + b[i] + c[i]`
/// (`u32`, wrapping) over `i < n` into `*result` (atomically). Launch one
/// block (any width).
const CONSUME_PTX: &CStr =
    match CStr::from_bytes_with_nul(concat!(include_str!("ptx/consume.ptx"), "\0").as_bytes()) {
        Ok(ptx) => ptx,
        Err(_) => panic!("ptx/consume.ptx holds a NUL byte"),
    };

/// The consume kernel in device 0's primary context (loaded once; call with
/// that context current).
fn consume_kernel() -> sys::CUfunction {
    static F: OnceLock<usize> = OnceLock::new();
    *F.get_or_init(|| {
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: NUL-terminated PTX text, JIT-compiled into the current
        // context; the module is never unloaded.
        ok(
            unsafe { sys::cuModuleLoadData(&mut module, CONSUME_PTX.as_ptr().cast()) },
            "load the consume kernel",
        );
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `module` was just loaded; the name is NUL-terminated.
        ok(
            unsafe { sys::cuModuleGetFunction(&mut f, module, c"gpupool_consume".as_ptr()) },
            "find gpupool_consume",
        );
        f as usize
    }) as sys::CUfunction
}

/// Threads in the consume kernel's block.
const CONSUME_THREADS: u32 = 256;

/// Queues `*result += sum(a[i] + b[i] + c[i])` on the stream of `order` (of
/// device 0) after a spin of `spin`.
fn consume(order: AccessOrder<'_>, a: u64, b: u64, c: u64, n: usize, spin: Duration, result: u64) {
    let (stream, device) = stream_of(order);
    assert_eq!(device, D0, "the consume kernel is loaded on device 0");
    let (mut a, mut b, mut c, mut result) = (a, b, c, result);
    let mut n = u32::try_from(n).unwrap();
    let mut ns = u64::try_from(spin.as_nanos()).unwrap();
    let mut params: [*mut c_void; 6] = [
        (&raw mut a).cast(),
        (&raw mut b).cast(),
        (&raw mut c).cast(),
        (&raw mut n).cast(),
        (&raw mut ns).cast(),
        (&raw mut result).cast(),
    ];
    // SAFETY: the kernel's parameters are (u64, u64, u64, u32, u64, u64),
    // which `params` points at; the addresses are valid for `n` elements (the
    // callers' buffers) until the kernel has run; `stream` is a live stream
    // of device 0 (`stream_of`), whose primary context holds the kernel; the
    // driver copies the arguments before returning.
    ok(
        unsafe {
            sys::cuLaunchKernel(
                consume_kernel(),
                1,
                1,
                1,
                CONSUME_THREADS,
                1,
                1,
                0,
                stream.as_raw() as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        "launch gpupool_consume",
    );
}

/// Queues `n` copies of `value` (`u32`) at device address `dptr` on the
/// stream of `order`.
fn memset32(dptr: u64, value: u32, n: usize, order: AccessOrder<'_>) {
    let (stream, _) = stream_of(order);
    // SAFETY: `dptr` is device memory of at least `n` `u32`s that stays
    // allocated until the memset has run (the callers' contract); `stream`
    // is a live stream (`stream_of`).
    ok(
        unsafe { sys::cuMemsetD32Async(dptr, value, n, stream.as_raw() as sys::CUstream) },
        "cuMemsetD32Async",
    );
}

/// `query_stream` on the stream of `order`.
fn query(order: AccessOrder<'_>) -> gpupool_core::Completion {
    let (stream, device) = stream_of(order);
    // SAFETY: a usable stream of `device` (`stream_of`).
    unsafe { CudaBackend::new().query_stream(stream, device) }.expect("query")
}

/// `synchronize_stream` on the stream of `order`.
fn synchronize(order: AccessOrder<'_>) {
    let (stream, device) = stream_of(order);
    // SAFETY: a usable stream of `device` (`stream_of`).
    unsafe { CudaBackend::new().synchronize_stream(stream, device) }.expect("synchronize");
}

/// Whether the host may touch managed memory while kernels run.
fn concurrent_managed_access(device: DeviceId) -> bool {
    let mut v = 0;
    // SAFETY: `v` is a valid place; the ordinal is a device of this machine.
    let r = unsafe {
        sys::cuDeviceGetAttribute(
            &mut v,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
            device.0 as i32,
        )
    };
    r == sys::CUresult::CUDA_SUCCESS && v != 0
}

fn addr<T>(p: *const T) -> u64 {
    p as usize as u64
}

/// A device buffer that is not scratch: `words` `u32`s, zeroed.
struct DeviceBuffer {
    ptr: NonNull<u8>,
    bytes: usize,
}

impl DeviceBuffer {
    fn zeroed(words: usize) -> DeviceBuffer {
        let gpu = CudaBackend::new();
        let bytes = words * 4;
        let ptr = gpu
            .allocate(MemoryKind::Device, D0, bytes, 256)
            .expect("allocate a device buffer");
        // SAFETY: `words` u32s of device memory just allocated.
        ok(
            unsafe { sys::cuMemsetD32_v2(addr(ptr.as_ptr()), 0, words) },
            "cuMemsetD32",
        );
        // The memset runs on the legacy stream, which the pooled
        // (non-blocking) streams do not wait for: finish it here.
        // SAFETY: no arguments; the thread's context is device 0's.
        ok(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize");
        DeviceBuffer { ptr, bytes }
    }

    fn addr(&self) -> u64 {
        addr(self.ptr.as_ptr())
    }

    /// The contents, after everything queued on the stream of `order` (of
    /// device 0; it must include every writer).
    fn read(&self, order: AccessOrder<'_>) -> Vec<u32> {
        let gpu = CudaBackend::new();
        let (stream, device) = stream_of(order);
        assert_eq!(device, D0);
        let mut out = vec![0u32; self.bytes / 4];
        // SAFETY: `stream` is a usable stream of device 0 (`stream_of`);
        // `out` is `bytes` of host memory, the buffer `bytes` of device
        // memory of device 0; the stream is synchronized before either goes
        // away.
        unsafe {
            gpu.copy_async(
                NonNull::from(out.as_mut_slice()).cast(),
                self.ptr,
                self.bytes,
                stream,
                D0,
            )
        }
        .expect("copy to the host");
        synchronize(order);
        out
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let gpu = CudaBackend::new();
        // Nothing may still use it: synchronize the device first.
        // SAFETY: no arguments.
        let _ = unsafe { sys::cuCtxSynchronize() };
        // SAFETY: allocated with these arguments; the context is idle.
        let _ = unsafe { gpu.deallocate(MemoryKind::Device, D0, self.ptr, self.bytes, 256) };
    }
}

fn stats() -> MemoryStats {
    CudaBackend::new().memory_stats(D0).expect("memory stats")
}

/// Fills `size` bytes at a host-visible `p` and reads the ends back.
fn touch(p: NonNull<u8>, size: usize, byte: u8) {
    // SAFETY: `p` is a live host-visible block of at least `size` bytes,
    // used by nothing else.
    unsafe {
        std::ptr::write_bytes(p.as_ptr(), byte, size);
        assert_eq!(*p.as_ptr(), byte);
        assert_eq!(*p.as_ptr().add(size - 1), byte);
    }
}

// ---------------------------------------------------------------------------
// 1. every kind, both orders, alignment, copies

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_kind_allocates_and_frees_in_both_orders_aligned_as_asked() {
    on_a_leased_stream(|gpu, lease| {
        let s = lease.handle();
        let managed_ok = concurrent_managed_access(D0);
        for kind in MemoryKind::ALL {
            for align in [1usize, 16, 256, 4096, 65536] {
                for size in [1usize, 1000, 64 << 10, (1 << 20) + 3] {
                    let what = format!("{kind:?}, {size} bytes aligned to {align}");
                    // Host order.
                    let p = gpu.allocate(kind, D0, size, align).expect(&what);
                    assert_eq!(p.as_ptr() as usize % align, 0, "{what}");
                    match kind {
                        MemoryKind::Device => {
                            memset_bytes(p, size, lease.order());
                            synchronize(lease.order());
                        }
                        MemoryKind::Managed if !managed_ok => {}
                        _ => touch(p, size, 0xab),
                    }
                    // SAFETY: allocated above with these arguments; the memset
                    // has finished.
                    unsafe { gpu.deallocate(kind, D0, p, size, align) }.expect(&what);

                    // Stream order.
                    // SAFETY: `s` is the lease's live stream of device 0.
                    let p = unsafe { gpu.allocate_async(kind, D0, size, align, s) }.expect(&what);
                    assert_eq!(p.as_ptr() as usize % align, 0, "{what} (stream order)");
                    match kind {
                        MemoryKind::Device => memset_bytes(p, size, lease.order()),
                        MemoryKind::Managed if !managed_ok => {}
                        _ => touch(p, size, 0xcd),
                    }
                    // SAFETY: allocated above with these arguments; only work on
                    // `s` (the lease's live stream of device 0) uses it.
                    unsafe { gpu.deallocate_async(kind, D0, p, size, align, s) }.expect(&what);
                }
            }
            synchronize(lease.order());
        }

        // The special streams, from a thread without a current context.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for special in [
                    StreamHandle::NULL,
                    StreamHandle::LEGACY,
                    StreamHandle::PER_THREAD,
                ] {
                    // SAFETY: a special stream is usable on every device.
                    let p =
                        unsafe { gpu.allocate_async(MemoryKind::Device, D0, 4096, 256, special) }
                            .expect("device memory on a special stream");
                    // SAFETY: freed on the (special) stream it was allocated on;
                    // unused.
                    unsafe { gpu.deallocate_async(MemoryKind::Device, D0, p, 4096, 256, special) }
                        .unwrap();
                    // SAFETY: a special stream.
                    unsafe { gpu.synchronize_stream(special, D0) }.unwrap();
                }
            });
        });

        // Bad layouts are refused before anything is allocated.
        for kind in MemoryKind::ALL {
            let code = |r: Result<NonNull<u8>, CudaError>| r.map(drop).map_err(|e| e.code());
            let invalid = Err(Some(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
            assert_eq!(code(gpu.allocate(kind, D0, 0, 8)), invalid);
            assert_eq!(code(gpu.allocate(kind, D0, 8, 3)), invalid);
            // SAFETY: `s` is the lease's live stream of device 0.
            let r = unsafe { gpu.allocate_async(kind, D0, 8, 0, s) };
            assert_eq!(code(r), invalid);
        }
        let count = device_count();
        assert!(matches!(
            gpu.allocate(MemoryKind::Device, DeviceId(count), 8, 8),
            Err(CudaError::DeviceOutOfRange { .. })
        ));
    });
}

/// `cuMemsetD8Async` over `size` bytes at `p` on the stream of `order`.
fn memset_bytes(p: NonNull<u8>, size: usize, order: AccessOrder<'_>) {
    let (s, _) = stream_of(order);
    // SAFETY: `size` bytes of live device memory, freed in the order of `s`
    // (the callers' contract); `s` is a live stream (`stream_of`).
    ok(
        unsafe { sys::cuMemsetD8Async(addr(p.as_ptr()), 0xcd, size, s.as_raw() as sys::CUstream) },
        "cuMemsetD8Async",
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn copies_round_trip_host_device_pinned_managed_host() {
    on_a_leased_stream(|gpu, lease| {
        let s = lease.handle();
        let n = 1 << 18;
        let bytes = n * 4;
        let src: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ 7)
            .collect();
        // SAFETY: `s` is the lease's live stream of device 0.
        let d = unsafe { gpu.allocate_async(MemoryKind::Device, D0, bytes, 256, s) }.unwrap();
        let p = gpu.allocate(MemoryKind::Pinned, D0, bytes, 256).unwrap();
        let m = gpu.allocate(MemoryKind::Managed, D0, bytes, 256).unwrap();
        let h = gpu.allocate(MemoryKind::Host, D0, bytes, 64).unwrap();
        // SAFETY: `s` is the lease's live stream of device 0; every block is
        // `bytes` long and live until the stream is synchronized below; `src`
        // outlives the call (pageable: staged before it returns); no two ranges
        // overlap.
        unsafe {
            gpu.copy_async(d, NonNull::from(src.as_slice()).cast(), bytes, s, D0)
                .unwrap();
            gpu.copy_async(p, d, bytes, s, D0).unwrap();
            gpu.copy_async(m, p, bytes, s, D0).unwrap();
            gpu.copy_async(h, m, bytes, s, D0).unwrap();
        }
        synchronize(lease.order());
        for (name, block) in [("pinned", p), ("managed", m), ("host", h)] {
            // SAFETY: `n` initialised u32s (the copies have run), aligned.
            let got = unsafe { std::slice::from_raw_parts(block.as_ptr().cast::<u32>(), n) };
            let wrong = got.iter().zip(&src).filter(|(a, b)| a != b).count();
            assert_eq!(wrong, 0, "{wrong} of {n} words differ in the {name} copy");
        }
        // SAFETY: the stream (the lease's, live) is idle; each block is freed
        // once with its layout.
        unsafe {
            gpu.deallocate_async(MemoryKind::Device, D0, d, bytes, 256, s)
                .unwrap();
            gpu.deallocate(MemoryKind::Pinned, D0, p, bytes, 256)
                .unwrap();
            gpu.deallocate(MemoryKind::Managed, D0, m, bytes, 256)
                .unwrap();
            gpu.deallocate(MemoryKind::Host, D0, h, bytes, 64).unwrap();
        }
        synchronize(lease.order());

        // Trim gives the cached pinned and managed blocks back.
        let before = stats();
        let freed = gpu.trim_memory(D0).unwrap();
        let after = stats();
        let (pi, mi) = (MemoryKind::Pinned.index(), MemoryKind::Managed.index());
        assert!(freed >= 2 * bytes, "trim freed {freed} bytes");
        assert_eq!(after.cached_blocks[pi], 0);
        assert_eq!(after.cached_blocks[mi], 0);
        assert_eq!(after.parked_blocks[pi], 0, "the stream is idle");
        assert!(after.upstream_frees[pi] > before.upstream_frees[pi]);
        eprintln!("trim freed {freed} bytes; stats {after:?}");
    });
}

// ---------------------------------------------------------------------------
// 2. the stream-order proof

/// Rounds of the stream-order proof.
const ROUNDS: usize = 1000;
/// `u32`s of each scratch buffer per round.
const WORDS: usize = 4096;
/// How long each round's kernel spins before it reads its scratch.
const SPIN: Duration = Duration::from_micros(100);

fn pinned_value(round: usize, i: usize) -> u32 {
    (round as u32).wrapping_mul(2_654_435_761) ^ i as u32
}

fn managed_value(round: usize, i: usize) -> u32 {
    (round as u32).wrapping_mul(7).wrapping_add(3 * i as u32)
}

/// One round: scratch device memory written by a memset on `stream`, pinned
/// and managed scratch written by the host, a kernel on `stream` that spins
/// for `spin` and then sums them into `result`. Returns the sum it must find,
/// and the pinned address used.
fn round(
    scratch: &Scratchpad<'_, CudaBackend>,
    stream: AccessOrder<'_>,
    r: usize,
    managed_stand_in: Option<u64>,
    spin: Duration,
    result: u64,
) -> (u32, usize) {
    let dev = scratch.device::<u32>(WORDS).expect("device scratch");
    let dev_value = r as u32 + 1;
    memset32(dev.addr() as u64, dev_value, WORDS, stream);
    let pinned = scratch.pinned::<u32>(WORDS).expect("pinned scratch");
    let mut expected = 0u32;
    for (i, x) in pinned.iter_mut().enumerate() {
        x.write(pinned_value(r, i));
        expected = expected
            .wrapping_add(pinned_value(r, i))
            .wrapping_add(dev_value);
    }
    let managed_addr = match managed_stand_in {
        // The host may not touch managed memory while kernels run on this
        // GPU: a zeroed device buffer stands in.
        Some(zeros) => zeros,
        None => {
            let m = scratch.managed::<u32>(WORDS).expect("managed scratch");
            for (i, x) in m.iter_mut().enumerate() {
                x.write(managed_value(r, i));
                expected = expected.wrapping_add(managed_value(r, i));
            }
            addr(m.as_ptr())
        }
    };
    // Unified addressing: pinned memory is at its host address on the device.
    consume(
        stream,
        dev.addr() as u64,
        addr(pinned.as_ptr()),
        managed_addr,
        WORDS,
        spin,
        result,
    );
    (expected, pinned.as_ptr() as usize)
}

/// Runs `work` in `kept`, reset after it (a resetting proof), or, without
/// one, in a new scratchpad of `gpu`'s on `stream`, released in stream order
/// after it (a dropping proof).
fn in_kept_or_new<T>(
    kept: Option<&mut Scratchpad<'_, CudaBackend>>,
    gpu: &CudaBackend,
    stream: AccessOrder<'_>,
    work: impl FnOnce(&Scratchpad<'_, CudaBackend>) -> T,
) -> T {
    match kept {
        Some(scratch) => {
            let out = work(scratch);
            scratch.reset().expect("reset");
            out
        }
        None => {
            let scratch = Scratchpad::new(gpu, stream).expect("a scratchpad");
            let out = work(&scratch);
            scratch.release().expect("release in stream order");
            out
        }
    }
}

/// How many rounds the host may run ahead of the GPU after round `r`: 1 to 4,
/// varying, so blocks are freed and reused right at the edge of completion.
fn lag(r: usize) -> usize {
    1 + (r * 7 + r / 5) % 4
}

fn stream_order_proof(reset: bool) {
    let _serial = serial();
    device_count();
    make_current(D0);
    let gpu = CudaBackend::new();
    let streams = StreamPool::new(gpu);
    let events = EventPool::new(gpu);
    let a = streams.get(0).unwrap();
    let b = streams.get(0).unwrap();
    consume_kernel();
    let results = DeviceBuffer::zeroed(ROUNDS);
    let zeros = DeviceBuffer::zeroed(WORDS);
    let managed = if concurrent_managed_access(D0) {
        None
    } else {
        eprintln!("no concurrent managed access on this GPU: managed scratch left out");
        Some(zeros.addr())
    };
    let before = stats();
    let started = Instant::now();

    let mut expected = Vec::with_capacity(ROUNDS);
    let mut pinned_addrs = Vec::with_capacity(ROUNDS);
    let mut in_flight: VecDeque<EventLease<'_, CudaBackend>> = VecDeque::new();
    let mut kept = reset.then(|| Scratchpad::new(&gpu, a.order()).unwrap());
    for r in 0..ROUNDS {
        // Dropping: rounds alternate between A and B, so the memory freed on
        // one stream is allocated and written on the other. Resetting: A.
        let lease: &StreamLease<'_, CudaBackend> = if reset || r % 2 == 0 { &a } else { &b };
        let stream = lease.order();
        let result = results.addr() + 4 * r as u64;
        let (sum, pinned_at) = in_kept_or_new(kept.as_mut(), &gpu, stream, |scratch| {
            round(scratch, stream, r, managed, SPIN, result)
        });
        expected.push(sum);
        pinned_addrs.push(pinned_at);

        let done = events.get(0).unwrap();
        // SAFETY: the lease `done` holds this live event of device 0, and
        // `lease` this live stream of device 0.
        unsafe { gpu.record_event(done.handle(), lease.handle(), D0) }.unwrap();
        in_flight.push_back(done);
        while in_flight.len() > lag(r) {
            let e = in_flight.pop_front().unwrap();
            // SAFETY: the lease `e` holds this live event of device 0.
            unsafe { gpu.synchronize_event(e.handle(), D0) }.unwrap();
        }
    }
    drop(kept);
    let host_time = started.elapsed();
    synchronize(a.order());
    synchronize(b.order());
    drop(in_flight);
    let got = results.read(a.order());
    let after = stats();

    let wrong: Vec<usize> = (0..ROUNDS).filter(|&r| got[r] != expected[r]).collect();
    let pi = MemoryKind::Pinned.index();
    let reused_pinned = after.reuses[pi] - before.reuses[pi];
    let distinct_pinned = pinned_addrs.iter().collect::<HashSet<_>>().len();
    eprintln!(
        "{} mode: {ROUNDS} rounds in {host_time:?} (host); pinned blocks: {distinct_pinned} \
         distinct addresses, {reused_pinned} pool reuses, {} cuMemHostAlloc; device: {} \
         cuMemAllocFromPoolAsync; wrong rounds: {}",
        if reset { "reset" } else { "drop" },
        after.upstream_allocations[pi] - before.upstream_allocations[pi],
        after.upstream_allocations[MemoryKind::Device.index()]
            - before.upstream_allocations[MemoryKind::Device.index()],
        wrong.len(),
    );
    assert!(
        wrong.is_empty(),
        "{} of {ROUNDS} rounds read scratch memory that was reused too early; first: {:?}",
        wrong.len(),
        wrong
            .iter()
            .take(8)
            .map(|&r| (r, got[r], expected[r]))
            .collect::<Vec<_>>()
    );
    // Dropping, every round takes its pinned block from the pool, and blocks
    // of rounds the host has waited for are complete: the pool must reuse
    // them. (Resetting, the scratchpad keeps its block when its fence has
    // completed, so how often the pool is asked depends on timing.)
    if !reset {
        assert!(
            reused_pinned > 0,
            "the pinned pool never reused a block: the proof did not exercise reuse"
        );
        assert!(
            distinct_pinned < ROUNDS / 2,
            "{distinct_pinned} distinct pinned blocks in {ROUNDS} rounds: too little reuse"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_order_proof_dropping_the_scratchpad_every_round() {
    stream_order_proof(false);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_order_proof_resetting_the_scratchpad_every_round() {
    stream_order_proof(true);
}

/// Worker threads of each wave of the threaded stream-order proof.
const PROOF_THREADS: usize = 16;
/// Waves of workers: the first wave's threads exit before the second starts.
const WAVES: usize = 2;
/// Rounds each worker runs (one wave's share of its thread's rounds).
const WAVE_ROUNDS: usize = 40;
/// Rounds of each of the threaded proof's threads over both waves.
const THREAD_ROUNDS: usize = WAVES * WAVE_ROUNDS;
/// How long each round's kernel spins in the threaded proof (shorter than
/// [`SPIN`]: it runs 16 × 2 × 40 rounds, under the sanitizers too).
const THREAD_SPIN: Duration = Duration::from_micros(20);

/// What the workers of the threaded stream-order proof share.
struct Workers<'p> {
    /// The backend the scratchpads and events use.
    gpu: CudaBackend,
    /// The one pool every worker leases its stream from (device 0).
    streams: &'p StreamPool<CudaBackend>,
    /// The pool of the events that keep the host `lag` rounds ahead.
    events: &'p EventPool<CudaBackend>,
    /// Reset one scratchpad per worker, or make one per round.
    reset: bool,
    /// The zeroed device buffer that stands in for managed scratch.
    zeros: u64,
    /// The result buffer: one `u32` slot per (thread, round), thread-major.
    results: u64,
}

impl<'p> Workers<'p> {
    /// Runs wave `wave` of thread `t` on the calling thread: rounds
    /// `wave * WAVE_ROUNDS ..` of the thread, on the stream of `lease` (one of
    /// the pool's, leased here when `None`), the host running ahead of the
    /// GPU by `lag` rounds. Returns the sums the rounds must find, in order,
    /// and the lease (so it can be handed to the next wave) or, when
    /// `hand_over` is false, its stream's handle after the lease has gone
    /// back to the pool.
    fn run(
        &self,
        t: usize,
        wave: usize,
        lease: Option<StreamLease<'p, CudaBackend>>,
        hand_over: bool,
    ) -> (Vec<u32>, Result<StreamLease<'p, CudaBackend>, StreamHandle>) {
        // The kernel and the memsets need device 0's context on this thread.
        make_current(D0);
        let lease = lease.unwrap_or_else(|| self.streams.get(0).expect("lease a stream"));
        let stream = lease.order();
        let gpu = &self.gpu;
        let mut expected = Vec::with_capacity(WAVE_ROUNDS);
        let mut in_flight: VecDeque<EventLease<'_, CudaBackend>> = VecDeque::new();
        let mut kept = self
            .reset
            .then(|| Scratchpad::new(gpu, stream).expect("a scratchpad"));
        for r in wave * WAVE_ROUNDS..(wave + 1) * WAVE_ROUNDS {
            // The (thread, round) slot; also the round number the values are
            // made from, so no two rounds of any thread write the same ones.
            let slot = t * THREAD_ROUNDS + r;
            let result = self.results + 4 * slot as u64;
            let managed = Some(self.zeros);
            let (sum, _) = in_kept_or_new(kept.as_mut(), gpu, stream, |scratch| {
                round(scratch, stream, slot, managed, THREAD_SPIN, result)
            });
            expected.push(sum);

            let done = self.events.get(0).expect("an event");
            // SAFETY: the lease `done` holds this live event of device 0, and
            // `lease` this live stream of device 0.
            unsafe { gpu.record_event(done.handle(), lease.handle(), D0) }.expect("record");
            in_flight.push_back(done);
            while in_flight.len() > lag(slot) {
                let e = in_flight.pop_front().unwrap();
                // SAFETY: the lease `e` holds this live event of device 0.
                unsafe { gpu.synchronize_event(e.handle(), D0) }.expect("synchronize");
            }
        }
        // No waiting at the end of a wave: the last rounds' kernels may still
        // run while the next wave reuses their blocks (pending events go back
        // to the pool, which may record them again).
        drop(kept);
        drop(in_flight);
        if hand_over {
            (expected, Ok(lease))
        } else {
            (expected, Err(lease.handle()))
        }
    }
}

/// The stream-order proof on 16 threads in two waves (see the module
/// documentation, item 2): each worker leases its own stream of one pool and
/// runs [`round`]s as [`stream_order_proof`] does (managed scratch left out),
/// dropping or resetting its scratchpad; the first wave's threads exit
/// without waiting for their kernels, so the blocks they cached are left
/// keyed by their streams, and the second wave's threads run the other half
/// of the rounds on the same streams. Even threads hand their lease to their
/// successor (certainly the same stream, its kernels possibly still
/// running); odd threads return theirs to the pool and their successors
/// lease one from it (the same streams once they are idle, fresh ones
/// otherwise). Every (thread, round) sum must be right, and the device cache
/// and the pinned pool must have reused blocks.
fn stream_order_proof_on_threads(reset: bool) {
    // One at a time, device 0 current, the device cache on and empty (so
    // blocks of earlier tests' streams do not fill it up).
    let (_serial, gpu) = cache_test();
    let streams = StreamPool::new(gpu);
    let events = EventPool::new(gpu);
    consume_kernel();
    let results = DeviceBuffer::zeroed(PROOF_THREADS * THREAD_ROUNDS);
    let zeros = DeviceBuffer::zeroed(WORDS);
    let workers = Workers {
        gpu,
        streams: &streams,
        events: &events,
        reset,
        zeros: zeros.addr(),
        results: results.addr(),
    };
    let before = stats();
    let started = Instant::now();

    let mut expected: Vec<Vec<u32>> = (0..PROOF_THREADS)
        .map(|_| Vec::with_capacity(THREAD_ROUNDS))
        .collect();
    // Wave 1. Each thread is joined (its thread-local caches gone) before
    // wave 2 starts; nothing waits for the GPU in between.
    let mut handed = Vec::with_capacity(PROOF_THREADS);
    let mut wave1_streams = HashSet::new();
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..PROOF_THREADS)
            .map(|t| {
                let workers = &workers;
                scope.spawn(move || workers.run(t, 0, None, t % 2 == 0))
            })
            .collect();
        for (t, thread) in threads.into_iter().enumerate() {
            let (sums, lease) = thread.join().expect("a wave 1 worker panicked");
            expected[t].extend(sums);
            wave1_streams.insert(lease.as_ref().map_or_else(|&h| h, |l| l.handle()));
            handed.push(lease.ok());
        }
    });
    let mut same_stream = 0;
    std::thread::scope(|scope| {
        let threads: Vec<_> = handed
            .drain(..)
            .enumerate()
            .map(|(t, lease)| {
                let workers = &workers;
                scope.spawn(move || workers.run(t, 1, lease, false))
            })
            .collect();
        for (t, thread) in threads.into_iter().enumerate() {
            let (sums, lease) = thread.join().expect("a wave 2 worker panicked");
            expected[t].extend(sums);
            let stream = lease.expect_err("wave 2 returns its leases");
            same_stream += usize::from(wave1_streams.contains(&stream));
        }
    });
    let host_time = started.elapsed();
    ctx_sync();
    let reader = streams.get(0).expect("lease a stream");
    let got = results.read(reader.order());
    drop(reader);
    let after = stats();

    let wrong: Vec<(usize, usize)> = (0..PROOF_THREADS)
        .flat_map(|t| (0..THREAD_ROUNDS).map(move |r| (t, r)))
        .filter(|&(t, r)| got[t * THREAD_ROUNDS + r] != expected[t][r])
        .collect();
    let (di, pi) = (MemoryKind::Device.index(), MemoryKind::Pinned.index());
    let reused_device = after.reuses[di] - before.reuses[di];
    let reused_pinned = after.reuses[pi] - before.reuses[pi];
    eprintln!(
        "{} mode, {PROOF_THREADS} threads x {WAVES} waves x {WAVE_ROUNDS} rounds in \
         {host_time:?} (host); wave 2 on a wave 1 stream: {same_stream} of {PROOF_THREADS}; \
         device: {reused_device} reuses, {} cuMemAllocFromPoolAsync; pinned: {reused_pinned} \
         reuses, {} cuMemHostAlloc; wrong rounds: {}",
        if reset { "reset" } else { "drop" },
        after.upstream_allocations[di] - before.upstream_allocations[di],
        after.upstream_allocations[pi] - before.upstream_allocations[pi],
        wrong.len(),
    );
    assert!(
        wrong.is_empty(),
        "{} of {} (thread, round)s read scratch memory that was reused too early; first \
         (thread, round, got, expected): {:?}",
        wrong.len(),
        PROOF_THREADS * THREAD_ROUNDS,
        wrong
            .iter()
            .take(8)
            .map(|&(t, r)| (t, r, got[t * THREAD_ROUNDS + r], expected[t][r]))
            .collect::<Vec<_>>()
    );
    // Not vacuous: blocks were handed out again while kernels of earlier
    // rounds (and of the other threads) ran. Dropping, every round's device
    // block comes back from the cache on its stream; resetting, at least
    // wave 2's first device blocks on the handed-over streams do.
    assert!(
        reused_device > 0,
        "no device block was reused: the proof did not exercise reuse"
    );
    assert!(
        reused_pinned > 0,
        "no pinned block was reused: the proof did not exercise reuse"
    );
}

/// The threaded proof, each worker making a new scratchpad every round.
#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_order_proof_on_16_threads_dropping() {
    stream_order_proof_on_threads(false);
}

/// The threaded proof, each worker resetting one scratchpad every round.
#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_order_proof_on_16_threads_resetting() {
    stream_order_proof_on_threads(true);
}

// ---------------------------------------------------------------------------
// 3. a parked block is never handed out before its event completes

/// Blocks of the test's size class.
const BLOCK: usize = 64 << 10;
/// Threads allocating at once.
const THREADS: usize = 8;
/// Iterations per thread (each allocates up to four blocks and frees them).
const ITERATIONS: usize = 1500;
/// Blocks parked behind the gate in all (a bound on the memory the test
/// asks the driver for while the gate is closed).
const GATED_BUDGET: usize = 256;

fn pool_never_hands_out_a_parked_block(kind: MemoryKind) {
    on_a_leased_stream(|gpu, gated| {
        let g = gated.handle();
        let align = 256;

        // Some free blocks to start with, so the threads find some at once.
        let warm: Vec<_> = (0..16)
            .map(|_| gpu.allocate(kind, D0, BLOCK, align).unwrap())
            .collect();
        for p in warm {
            // SAFETY: allocated above, unused.
            unsafe { gpu.deallocate(kind, D0, p, BLOCK, align) }.unwrap();
        }

        // Nothing cached from earlier tests: what the pool holds from here on is
        // this test's.
        gpu.trim_memory(D0).unwrap();
        let gate = Gate::hold(gated.order(), GATE_TIMEOUT).unwrap();
        let parked: Mutex<HashSet<usize>> = Mutex::new(HashSet::new());
        let park = |p: NonNull<u8>| {
            // Recorded as parked *before* the free, so any later hand-out of it
            // while the gate is closed is caught.
            parked.lock().unwrap().insert(p.as_ptr() as usize);
            // SAFETY: allocated with these arguments; nothing uses it; the free
            // is ordered after the gate kernel on `g`, the lease `gated`'s live
            // stream of device 0.
            unsafe { gpu.deallocate_async(kind, D0, p, BLOCK, align, g) }.unwrap();
        };
        for _ in 0..32 {
            park(gpu.allocate(kind, D0, BLOCK, align).unwrap());
        }
        let before = stats();
        assert!(before.parked_blocks[kind.index()] >= 32);

        let gated_left = AtomicUsize::new(GATED_BUDGET - 32);
        let violations = AtomicUsize::new(0);
        let while_closed = AtomicUsize::new(0);
        let started = Instant::now();
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (parked, park, gate) = (&parked, &park, &gate);
                let (gated_left, violations, while_closed) =
                    (&gated_left, &violations, &while_closed);
                let streams = gated.pool();
                scope.spawn(move || {
                    // An idle stream of this thread: blocks freed on it complete
                    // at once, so the pool's scans find completed blocks among
                    // the gated ones.
                    let idle = streams.get(0).unwrap();
                    let mut held = Vec::with_capacity(4);
                    for i in 0..ITERATIONS {
                        for _ in 0..1 + (i + t) % 4 {
                            let p = gpu.allocate(kind, D0, BLOCK, align).unwrap();
                            let closed = !gate.is_done();
                            if closed {
                                while_closed.fetch_add(1, Ordering::Relaxed);
                                if parked.lock().unwrap().contains(&(p.as_ptr() as usize)) {
                                    violations.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            // Written at once, as the scratchpad's users do.
                            if kind == MemoryKind::Pinned {
                                touch(p, BLOCK, t as u8);
                            }
                            held.push(p);
                        }
                        for (j, p) in held.drain(..).enumerate() {
                            let gated_turn = (i + j + t) % 16 == 0
                                && gated_left
                                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                        n.checked_sub(1)
                                    })
                                    .is_ok();
                            if gated_turn {
                                park(p);
                            } else if (i + j) % 2 == 0 {
                                // SAFETY: allocated above; the host's writes are
                                // done, nothing else uses it.
                                unsafe { gpu.deallocate(kind, D0, p, BLOCK, align) }.unwrap();
                            } else {
                                // SAFETY: as above; nothing on `idle` (the
                                // lease's live stream of device 0) uses it.
                                unsafe {
                                    gpu.deallocate_async(kind, D0, p, BLOCK, align, idle.handle())
                                }
                                .unwrap();
                            }
                        }
                    }
                });
            }
        });
        let hammer_time = started.elapsed();
        let still_closed = !gate.is_done();
        let during = stats();
        let i = kind.index();
        eprintln!(
            "{kind:?}: {} allocations while the gate was closed, in {hammer_time:?}; {} blocks \
         parked behind it; {} from the driver, {} reused by the pool during the run",
            while_closed.load(Ordering::Relaxed),
            parked.lock().unwrap().len(),
            during.upstream_allocations[i] - before.upstream_allocations[i],
            during.reuses[i] - before.reuses[i],
        );
        assert_eq!(
            violations.load(Ordering::Relaxed),
            0,
            "a block parked behind the gate was handed out before its event completed"
        );
        if !still_closed {
            eprintln!(
                "NOTE: the gate kernel ended (timed out) before the threads finished: \
             the driver may have waited for it in an allocation; the check above covers \
             only the allocations made while it was closed"
            );
        }
        assert!(
            while_closed.load(Ordering::Relaxed) > 0,
            "no allocation happened while the gate was closed"
        );

        // Open the gate: the parked blocks become reusable, and are reused.
        gate.open();
        wait_gate(&gate);
        synchronize(gated.order());
        let parked = parked.into_inner().unwrap();
        // Taking every cached and parked block (free ones come first) must reach
        // the parked ones, now that their events have completed.
        let held = stats();
        let mut again = Vec::new();
        let mut reused = 0;
        for _ in 0..held.cached_blocks[i] + held.parked_blocks[i] + 8 {
            let p = gpu.allocate(kind, D0, BLOCK, align).unwrap();
            reused += usize::from(parked.contains(&(p.as_ptr() as usize)));
            again.push(p);
        }
        assert!(
            reused > 0,
            "no parked block was reused after its event completed"
        );
        for p in again {
            // SAFETY: allocated above, unused.
            unsafe { gpu.deallocate(kind, D0, p, BLOCK, align) }.unwrap();
        }
        gpu.trim_memory(D0).unwrap();
        assert_eq!(stats().parked_blocks[i], 0);
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_pinned_pool_never_hands_out_a_block_whose_event_is_pending() {
    pool_never_hands_out_a_parked_block(MemoryKind::Pinned);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_managed_pool_never_hands_out_a_block_whose_event_is_pending() {
    pool_never_hands_out_a_parked_block(MemoryKind::Managed);
}

// ---------------------------------------------------------------------------
// 4. a reset loop makes no upstream allocation after warm-up

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_reset_loop_makes_no_upstream_allocation_after_warm_up() {
    const WARM_UP: usize = 100;
    const MEASURED: usize = 1000;
    const LAG: usize = 2;
    on_a_leased_stream(|gpu, a| {
        let events = EventPool::new(gpu);
        let s = a.order();
        consume_kernel();
        let results = DeviceBuffer::zeroed(WARM_UP + MEASURED);
        let zeros = DeviceBuffer::zeroed(WORDS);
        let managed = (!concurrent_managed_access(D0)).then(|| zeros.addr());

        let mut scratch = Scratchpad::new(&gpu, a.order()).unwrap();
        let mut in_flight = VecDeque::new();
        let mut expected = Vec::new();
        let mut before = None;
        let mut scratch_before = None;
        for r in 0..WARM_UP + MEASURED {
            if r == WARM_UP {
                before = Some(stats());
                scratch_before = Some(scratch.stats());
            }
            let host = scratch.host::<u32>(WORDS).unwrap();
            host.iter_mut().for_each(|x| {
                x.write(r as u32);
            });
            let result = results.addr() + 4 * r as u64;
            let (sum, _) = round(&scratch, s, r, managed, SPIN, result);
            expected.push(sum);
            scratch.reset().unwrap();
            let done = events.get(0).unwrap();
            // SAFETY: the leases `done` and `a` hold this live event and stream,
            // both of device 0.
            unsafe { gpu.record_event(done.handle(), a.handle(), D0) }.unwrap();
            in_flight.push_back(done);
            while in_flight.len() > LAG {
                let e = in_flight.pop_front().unwrap();
                // SAFETY: the lease `e` holds this live event of device 0.
                unsafe { gpu.synchronize_event(e.handle(), D0) }.unwrap();
            }
        }
        let after = stats();
        let scratch_after = scratch.stats();
        synchronize(s);
        drop(in_flight);
        let got = results.read(s);
        drop(scratch);
        synchronize(s);

        let (before, scratch_before) = (before.unwrap(), scratch_before.unwrap());
        eprintln!("before the measured rounds: {before:?}");
        eprintln!("after: {after:?}");
        eprintln!(
            "scratchpad upstream calls in the measured rounds: {} allocations, {} releases",
            scratch_after.upstream_allocations - scratch_before.upstream_allocations,
            scratch_after.upstream_releases - scratch_before.upstream_releases,
        );
        assert_eq!(
            after.upstream_allocations, before.upstream_allocations,
            "upstream allocations (host, pinned, device, managed) in {MEASURED} reset rounds \
         after {WARM_UP} rounds of warm-up"
        );
        let wrong = (0..got.len()).filter(|&r| got[r] != expected[r]).count();
        assert_eq!(wrong, 0, "{wrong} rounds computed a wrong sum");
    });
}

// ---------------------------------------------------------------------------
// 5. the device cache: same stream only, never across streams, returned when
//    the stream goes

/// Device memory of gpupool's pool on device 0 that allocations hold now
/// (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`): blocks in the device cache count,
/// blocks freed to the pool do not.
fn pool_used_bytes() -> u64 {
    let pool = CudaBackend::new()
        .memory_pool(D0)
        .expect("gpupool's memory pool");
    pool_attribute(
        pool,
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    )
}

/// A `cuuint64_t` attribute of a live memory pool.
fn pool_attribute(pool: sys::CUmemoryPool, attribute: sys::CUmemPool_attribute) -> u64 {
    let mut value: u64 = 0;
    // SAFETY: the callers pass gpupool's pool or a device's default pool,
    // both alive for the whole process, and attributes of type `cuuint64_t`,
    // which `value` is.
    ok(
        unsafe { sys::cuMemPoolGetAttribute(pool, attribute, (&raw mut value).cast()) },
        "cuMemPoolGetAttribute",
    );
    value
}

/// Waits for everything on device 0's primary context.
fn ctx_sync() {
    // SAFETY: no arguments; the thread's context is device 0's.
    ok(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize");
}

/// Device memory of device 0 in the order of the stream of `order` (of
/// device 0).
fn alloc_on(size: usize, order: AccessOrder<'_>) -> NonNull<u8> {
    let (s, device) = stream_of(order);
    assert_eq!(device, D0);
    // SAFETY: a usable stream of device 0 (`stream_of`).
    unsafe { CudaBackend::new().allocate_async(MemoryKind::Device, D0, size, 256, s) }
        .expect("stream-ordered device allocation")
}

/// # Safety
/// `p` came from [`alloc_on`] with `size`; only work queued on the stream of
/// `order` uses it.
unsafe fn free_on(p: NonNull<u8>, size: usize, order: AccessOrder<'_>) {
    let (s, device) = stream_of(order);
    assert_eq!(device, D0);
    // SAFETY: the caller's contract; `s` is a usable stream of device 0
    // (`stream_of`).
    unsafe { CudaBackend::new().deallocate_async(MemoryKind::Device, D0, p, size, 256, s) }
        .expect("stream-ordered device free");
}

/// Starts a device-cache test: one at a time, device 0 current, nothing
/// cached from earlier tests, the cache on. Returns the test's lock and the
/// backend.
fn cache_test() -> (MutexGuard<'static, ()>, CudaBackend) {
    let guard = serial();
    device_count();
    make_current(D0);
    let gpu = CudaBackend::new();
    gpu.set_device_cache(true);
    gpu.trim_memory(D0).expect("trim");
    assert_eq!(stats().cached_blocks[MemoryKind::Device.index()], 0);
    (guard, gpu)
}

/// [`on_a_leased_stream`] for a device-cache test ([`cache_test`]).
fn cache_test_on_a_leased_stream(test: impl FnOnce(CudaBackend, &StreamLease<'_, CudaBackend>)) {
    let (_serial, gpu) = cache_test();
    let streams = StreamPool::new(gpu);
    test(gpu, &streams.get(0).unwrap());
}

/// The device memory of gpupool's pool in use once device 0 is idle
/// ([`pool_used_bytes`] after [`ctx_sync`]): a test that ends with the same
/// figure it started with leaked nothing.
fn used_when_idle() -> u64 {
    ctx_sync();
    pool_used_bytes()
}

/// A new stream of device 0, created by `gpu` (not a pool's), with its order.
///
/// # Safety
/// The caller destroys the stream (or lets the driver do so) only after the
/// order's last use.
unsafe fn new_stream(gpu: &CudaBackend) -> (StreamHandle, AccessOrder<'_>) {
    let s = gpu
        .create_stream(D0, Default::default())
        .expect("create a stream");
    // SAFETY: created just now by this backend on device 0; the caller keeps
    // it alive while the order is used.
    (s, unsafe { AccessOrder::from_raw(gpu, s, D0) })
}

const DI: usize = MemoryKind::Device.index();

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_cache_hands_a_block_back_on_the_same_stream_without_the_driver() {
    // Sizes no other test uses, so nothing else matches.
    const SIZE: usize = (192 << 10) + 256;
    cache_test_on_a_leased_stream(|_, a| {
        let s = a.order();

        let p1 = alloc_on(SIZE, s);
        let p2 = alloc_on(SIZE, s);
        memset_bytes(p1, SIZE, s);
        memset_bytes(p2, SIZE, s);
        let before = stats();
        // SAFETY: allocated above; only the memsets on `s` use them.
        unsafe {
            free_on(p1, SIZE, s);
            free_on(p2, SIZE, s);
        }
        let freed = stats();
        assert_eq!(
            freed.cached_blocks[DI] - before.cached_blocks[DI],
            2,
            "both frees kept by the cache (is cuStreamGetId missing from this driver?)"
        );
        assert_eq!(
            freed.upstream_frees[DI], before.upstream_frees[DI],
            "no cuMemFreeAsync for a cached block"
        );

        // Most recently freed first, with no driver allocation.
        let q2 = alloc_on(SIZE, s);
        let q1 = alloc_on(SIZE, s);
        let after = stats();
        assert_eq!((q2, q1), (p2, p1), "the cached blocks, newest first");
        assert_eq!(
            after.upstream_allocations[DI], freed.upstream_allocations[DI],
            "no cuMemAllocFromPoolAsync"
        );
        assert_eq!(after.device_cache_hits - freed.device_cache_hits, 2);
        assert_eq!(after.reuses[DI] - freed.reuses[DI], 2);
        assert_eq!(after.cached_blocks[DI], before.cached_blocks[DI]);

        // A different size is a miss.
        let other = alloc_on(SIZE + 256, s);
        let missed = stats();
        assert_eq!(missed.device_cache_misses - after.device_cache_misses, 1);
        assert_eq!(
            missed.upstream_allocations[DI] - after.upstream_allocations[DI],
            1
        );
        // SAFETY: allocated above, unused (or only by the memsets on `s`).
        unsafe {
            free_on(other, SIZE + 256, s);
            free_on(q1, SIZE, s);
            free_on(q2, SIZE, s);
        }
        synchronize(s);
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_cache_never_hands_a_block_to_another_stream_or_the_host() {
    const SIZE: usize = (320 << 10) + 512;
    cache_test_on_a_leased_stream(|gpu, a| {
        let b = a.pool().get(0).unwrap();
        let (sa, sb) = (a.order(), b.order());
        assert_ne!(sa, sb);

        let p = alloc_on(SIZE, sa);
        memset_bytes(p, SIZE, sa);
        // SAFETY: allocated above; only the memset on `sa` uses it.
        unsafe { free_on(p, SIZE, sa) };
        let before = stats();
        assert_eq!(before.cached_blocks[DI], 1);

        // Another stream: the driver, another block.
        let on_b = alloc_on(SIZE, sb);
        // The host: the driver, another block.
        let on_host = gpu
            .allocate(MemoryKind::Device, D0, SIZE, 256)
            .expect("host-order device allocation");
        // A special stream: the driver, another block.
        let legacy = AccessOrder::legacy_stream(D0);
        let on_legacy = alloc_on(SIZE, legacy);
        let after = stats();
        for (what, q) in [("B", on_b), ("host order", on_host), ("legacy", on_legacy)] {
            assert_ne!(q, p, "{what} got the block cached for A");
        }
        assert_eq!(after.device_cache_hits, before.device_cache_hits);
        assert_eq!(
            after.upstream_allocations[DI] - before.upstream_allocations[DI],
            3
        );
        assert_eq!(after.cached_blocks[DI], 1, "A's block is still cached");

        // A gets it.
        assert_eq!(alloc_on(SIZE, sa), p);
        // SAFETY: allocated above; nothing uses them (the legacy block was
        // allocated on the legacy stream and is freed there).
        unsafe {
            free_on(p, SIZE, sa);
            free_on(on_b, SIZE, sb);
            free_on(on_legacy, SIZE, legacy);
            gpu.deallocate(MemoryKind::Device, D0, on_host, SIZE, 256)
                .unwrap();
        }
        // Frees on the legacy stream are never cached.
        assert_eq!(stats().cached_blocks[DI], 2);
        ctx_sync();
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_block_cached_while_a_kernel_on_its_stream_still_reads_it_stays_intact() {
    const N: usize = 4096; // u32s read by the kernel
    const SIZE: usize = N * 4 + 768;
    const A_VALUE: u32 = 0x0A0A_0A0A;
    const B_VALUE: u32 = 0x0B0B_0B0B;
    const A_AGAIN: u32 = 0x0C0C_0C0C;
    cache_test_on_a_leased_stream(|_, a| {
        let b = a.pool().get(0).unwrap();
        let (sa, sb) = (a.order(), b.order());
        consume_kernel();
        let result = DeviceBuffer::zeroed(2);
        let zeros = DeviceBuffer::zeroed(N);

        // On A: fill X, hold A behind a gate, then sum X into result[0]; free X
        // in A's order while all of that is still queued.
        let x = alloc_on(SIZE, sa);
        memset32(addr(x.as_ptr()), A_VALUE, N, sa);
        let gate = Gate::hold(sa, GATE_TIMEOUT).unwrap();
        consume(
            sa,
            addr(x.as_ptr()),
            zeros.addr(),
            zeros.addr(),
            N,
            Duration::ZERO,
            result.addr(),
        );
        // SAFETY: only the work queued on `sa` uses `x`.
        unsafe { free_on(x, SIZE, sa) };
        assert_eq!(stats().cached_blocks[DI], 1);

        // On B: a new block of the same size, written and read at once, while
        // A's kernel is held. It must not be X.
        let y = alloc_on(SIZE, sb);
        assert_ne!(y, x, "B got the block still in use on A");
        memset32(addr(y.as_ptr()), B_VALUE, N, sb);
        consume(
            sb,
            addr(y.as_ptr()),
            zeros.addr(),
            zeros.addr(),
            N,
            Duration::ZERO,
            result.addr() + 4,
        );
        // Let B finish while A is still held (B does not wait for A unless the
        // driver's pool made it; then it finishes after the gate opens).
        let deadline = Instant::now() + Duration::from_secs(2);
        while query(sb) == gpupool_core::Completion::Pending && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let b_done_while_held = query(sb) == gpupool_core::Completion::Complete && !gate.is_done();

        // On A again: the same block, in A's order after the kernel, overwritten
        // at once (queued behind the gate, so it must not reach the kernel).
        let before = stats();
        let x2 = alloc_on(SIZE, sa);
        assert_eq!(x2, x, "A gets its own cached block back");
        assert_eq!(stats().device_cache_hits - before.device_cache_hits, 1);
        memset32(addr(x2.as_ptr()), A_AGAIN, N, sa);
        let still_held = !gate.is_done();

        gate.open();
        wait_gate(&gate);
        synchronize(sb);
        let got = result.read(sa);
        eprintln!(
            "B finished while A was held: {b_done_while_held}; gate still closed after A's \
         reuse: {still_held}; results {got:x?}"
        );
        if !still_held {
            // compute-sanitizer serializes kernels: B's work waits for the gate,
            // which then runs to its timeout. The data checks below still hold.
            eprintln!(
                "NOTE: the gate kernel ended (timed out) before A reused the block: the \
             checks below cover ordering only, not a reuse while A was held"
            );
        }
        assert_eq!(
            got[0],
            A_VALUE.wrapping_mul(N as u32),
            "A's kernel read data it did not write"
        );
        assert_eq!(got[1], B_VALUE.wrapping_mul(N as u32), "B's kernel");
        // SAFETY: allocated above; only work on their streams uses them.
        unsafe {
            free_on(x2, SIZE, sa);
            free_on(y, SIZE, sb);
        }
        ctx_sync();
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn destroying_a_stream_through_the_backend_returns_its_cached_blocks() {
    const ROUNDS: usize = 64;
    const SIZES: [usize; 4] = [64 << 10, 128 << 10, 256 << 10, 512 << 10];
    let (_serial, gpu) = cache_test();
    let used_at_start = used_when_idle();
    let start = stats();
    for round in 0..ROUNDS {
        // SAFETY: destroyed only at the end of the round, after the order's
        // last use.
        let (s, order) = unsafe { new_stream(&gpu) };
        // Two "scratchpads" a round: the second takes the first's blocks.
        for _ in 0..2 {
            let blocks: Vec<_> = SIZES.iter().map(|&n| (alloc_on(n, order), n)).collect();
            for &(p, n) in &blocks {
                memset_bytes(p, n, order);
            }
            for &(p, n) in blocks.iter().rev() {
                // SAFETY: allocated above; only the memsets on `s` use it.
                unsafe { free_on(p, n, order) };
            }
        }
        let held = stats();
        assert_eq!(
            held.cached_blocks[DI],
            SIZES.len(),
            "round {round}: the stream's blocks are cached"
        );
        let frees = held.upstream_frees[DI];
        // SAFETY: created above by this backend on device 0 and owned by this
        // test; neither `s` nor `order` is used after this.
        unsafe { gpu.destroy_stream(s, D0) }.expect("destroy");
        let gone = stats();
        assert_eq!(gone.cached_blocks[DI], 0, "round {round}: returned");
        assert_eq!(gone.upstream_frees[DI] - frees, SIZES.len() as u64);
    }
    let used_at_end = used_when_idle();
    let end = stats();
    eprintln!(
        "{ROUNDS} rounds: {} cache hits, {} misses, {} driver allocations; pool memory in use \
         {used_at_start} -> {used_at_end} bytes",
        end.device_cache_hits - start.device_cache_hits,
        end.device_cache_misses - start.device_cache_misses,
        end.upstream_allocations[DI] - start.upstream_allocations[DI],
    );
    assert_eq!(
        end.device_cache_hits - start.device_cache_hits,
        (ROUNDS * SIZES.len()) as u64,
        "every second scratchpad of a round hits"
    );
    assert_eq!(used_at_end, used_at_start, "device memory leaked");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_destroyed_elsewhere_keeps_its_blocks_from_every_other_stream_until_a_trim() {
    const SIZE: usize = (448 << 10) + 256;
    const ROUNDS: usize = 16;
    let (_serial, gpu) = cache_test();
    let used_at_start = used_when_idle();
    let mut cached = HashSet::new();
    let mut handle_reused = 0;
    let mut previous = None;
    for _ in 0..ROUNDS {
        // SAFETY: destroyed below, after the order's last use.
        let (s, order) = unsafe { new_stream(&gpu) };
        handle_reused += usize::from(previous == Some(s));
        // A block freed on an earlier, destroyed stream (perhaps with this
        // very handle value) must not come back here.
        let p = alloc_on(SIZE, order);
        assert!(
            !cached.contains(&(p.as_ptr() as usize)),
            "a block cached for a destroyed stream went to a new stream"
        );
        memset_bytes(p, SIZE, order);
        // SAFETY: allocated above; only the memset on `s` uses it.
        unsafe { free_on(p, SIZE, order) };
        cached.insert(p.as_ptr() as usize);
        // Destroyed behind the backend's back: the cache is not told.
        // SAFETY: created above, not used after this (the handle value is
        // only compared).
        ok(
            unsafe { sys::cuStreamDestroy_v2(s.as_raw() as sys::CUstream) },
            "cuStreamDestroy",
        );
        previous = Some(s);
    }
    let held = stats();
    eprintln!("handle values reused by the next stream: {handle_reused} of {ROUNDS}");
    assert_eq!(held.cached_blocks[DI], ROUNDS, "kept until a trim");
    gpu.trim_memory(D0).expect("trim");
    let used_at_end = used_when_idle();
    assert_eq!(stats().cached_blocks[DI], 0);
    assert_eq!(used_at_end, used_at_start, "device memory leaked");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forget_stream_returns_a_streams_blocks_and_the_cache_can_be_switched_off() {
    const SIZE: usize = (96 << 10) + 256;
    let (_serial, gpu) = cache_test();
    // SAFETY: destroyed at the end, after the order's last use.
    let (stream, s) = unsafe { new_stream(&gpu) };
    let p = alloc_on(SIZE, s);
    // SAFETY: allocated above, unused.
    unsafe { free_on(p, SIZE, s) };
    assert_eq!(stats().cached_blocks[DI], 1);
    // SAFETY: a live stream of device 0 (created above).
    assert_eq!(unsafe { gpu.forget_stream(stream, D0) }.unwrap(), 1);
    assert_eq!(stats().cached_blocks[DI], 0);

    gpu.set_device_cache(false);
    let before = stats();
    let q = alloc_on(SIZE, s);
    // SAFETY: allocated above, unused.
    unsafe { free_on(q, SIZE, s) };
    let after = stats();
    gpu.set_device_cache(true);
    assert_eq!(after.cached_blocks[DI], 0, "off: nothing cached");
    assert_eq!(
        after.upstream_allocations[DI] - before.upstream_allocations[DI],
        1
    );
    assert_eq!(after.upstream_frees[DI] - before.upstream_frees[DI], 1);
    synchronize(s);
    // SAFETY: created above and owned by this test; `s` is not used after
    // this.
    unsafe { gpu.destroy_stream(stream, D0) }.expect("destroy");
}

// ---------------------------------------------------------------------------
// 6. gpupool's own memory pool; cudarc interop on scratch memory

/// Device 0's default memory pool (the one `cudaMallocAsync` uses).
fn default_pool() -> sys::CUmemoryPool {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid place; device 0 exists (`device_count`).
    ok(
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, 0) },
        "cuDeviceGetDefaultMemPool",
    );
    pool
}

/// The memory pool a device address was allocated from
/// (`CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`).
fn pool_of(addr: u64) -> sys::CUmemoryPool {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `addr` is a live device allocation of this process; the
    // attribute is a `CUmemoryPool`, which `pool` is.
    ok(
        unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut pool).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                addr,
            )
        },
        "cuPointerGetAttribute(MEMPOOL_HANDLE)",
    );
    pool
}

const THRESHOLD: sys::CUmemPool_attribute =
    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_memory_comes_from_gpupools_own_pool_and_the_default_pool_is_left_alone() {
    let _serial = serial();
    device_count();
    make_current(D0);
    let gpu = CudaBackend::new();
    let default = default_pool();
    let default_threshold_before = pool_attribute(default, THRESHOLD);

    let streams = StreamPool::new(gpu);
    let lease = streams.get(0).unwrap();
    const SIZE: usize = 1 << 20;
    // Host order, stream order, and a scratchpad's device memory.
    let host_order = gpu
        .allocate(MemoryKind::Device, D0, SIZE, 256)
        .expect("host-order device allocation");
    let stream_order = alloc_on(SIZE, lease.order());
    let mut scratch = Scratchpad::new(&gpu, lease.order()).unwrap();
    let scratch_addr = scratch.device::<u32>(SIZE / 4).unwrap().kernel_arg().addr();
    synchronize(lease.order());

    let ours = gpu.memory_pool(D0).expect("gpupool's memory pool");
    assert_eq!(
        gpu.memory_pool(D0).unwrap(),
        ours,
        "one pool per device, made once"
    );
    assert_ne!(ours, default, "gpupool's pool is not the default pool");
    for (what, address) in [
        ("host-order", addr(host_order.as_ptr())),
        ("stream-order", addr(stream_order.as_ptr())),
        ("scratchpad", scratch_addr),
    ] {
        assert_eq!(
            pool_of(address),
            ours,
            "{what} device memory from gpupool's pool"
        );
    }
    assert_eq!(
        pool_attribute(ours, THRESHOLD),
        u64::MAX,
        "gpupool's pool keeps its memory across synchronizations"
    );

    scratch.reset().unwrap();
    drop(scratch);
    // SAFETY: allocated above with these arguments; only work queued on the
    // lease's stream used the stream-ordered block, nothing used the other.
    unsafe {
        free_on(stream_order, SIZE, lease.order());
        gpu.deallocate(MemoryKind::Device, D0, host_order, SIZE, 256)
            .expect("host-order device free");
    }
    synchronize(lease.order());
    gpu.trim_memory(D0).expect("trim");

    assert_eq!(
        pool_attribute(default, THRESHOLD),
        default_threshold_before,
        "the default pool's release threshold is what it was before"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernels_launched_with_with_cudarc_stream_compute_on_scratch_memory() {
    let _serial = serial();
    device_count();
    let gpu = CudaBackend::new();
    let kernels = Kernels::load(D0);
    let streams = StreamPool::new(gpu);
    let lease = streams.get(0).unwrap();
    const N: usize = 100_003; // several blocks, the last one partly full
    let scratch = Scratchpad::new(&gpu, lease.order()).unwrap();
    let x = scratch.device::<u32>(N).unwrap();
    let y = scratch.device::<u32>(N).unwrap();
    assert_eq!(x.kernel_arg().addr(), x.addr() as u64);
    let n = N as u32;
    let launched = with_cudarc_stream(&lease, |stream| {
        assert_eq!(
            stream.cu_stream() as usize,
            lease.handle().as_raw(),
            "the lease's own stream"
        );
        let x_arg = x.kernel_arg();
        let mut fill = stream.launch_builder(&kernels.fill);
        fill.arg(&x_arg).arg(&n);
        // SAFETY: `fill(unsigned *x, unsigned n)`, `x` holds `n` elements
        // of scratch memory in this stream's order.
        unsafe { fill.launch(LaunchConfig::for_num_elems(n)) }?;
        // SAFETY: `twice_plus_one(unsigned *y, const unsigned *x, unsigned
        // n)`, both hold `n` elements; after `fill` in stream order.
        unsafe {
            stream
                .launch_builder(&kernels.twice_plus_one)
                .arg(&y.kernel_arg())
                .arg(&x.kernel_arg())
                .arg(&n)
                .launch(LaunchConfig::for_num_elems(n))
        }
        .map(drop)
    });
    launched
        .expect("the primary context")
        .expect("the launches");
    let got = scratch.to_host(&y).expect("read y back");
    let wrong: Vec<(usize, u32)> = got
        .iter()
        .enumerate()
        .filter(|&(i, &v)| v != 2 * (i as u32 + 1) + 1)
        .map(|(i, &v)| (i, v))
        .take(5)
        .collect();
    assert_eq!(got.len(), N);
    assert!(wrong.is_empty(), "first wrong (index, value): {wrong:?}");

    // A panic in the closure unwinds through it (the wrapper is dropped on
    // the way) and leaves the lease usable.
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        with_cudarc_stream(&lease, |_| panic!("inside the closure"))
    }));
    assert!(caught.is_err());
    let synced = with_cudarc_stream(&lease, |stream| stream.synchronize());
    synced.unwrap().expect("the lease's stream still works");
}
