//! The CUDA backend on a machine without a CUDA driver (CI, development
//! machines): every call that needs the driver fails with
//! [`CudaError::NoDriver`], the pools pass it on as a backend error, and
//! nothing panics: not the calls, not printing the errors, not dropping the
//! pools.
//!
//! On a machine where `libcuda` can be loaded these tests skip themselves
//! (printing why); the GPU tests in `gpu_*.rs` cover that case.
//!
//! The tests below hand made-up stream and event handles to the backend's
//! `unsafe fn`s. That breaks their contract on a machine with a driver, but
//! each such test first checks that `libcuda` cannot be loaded here: then
//! every call fails with `NoDriver` before any handle is used (which is what
//! these tests check), and no handle ever reaches a driver.

use std::time::Duration;

use gpupool_core::{
    AccessOrder, Backend, BackendId, BackendOp, DeviceId, Error, EventBackend, EventFlags,
    EventHandle, EventPool, MemoryBackend, MemoryKind, OwnedStream, Scratchpad, StreamBackend,
    StreamHandle, StreamPool,
};
use gpupool_cuda::{testing, CudaBackend, CudaError};
use gpupool_mock::MockBackend;

const D0: DeviceId = DeviceId(0);

/// Whether `libcuda` is absent, so these tests apply; prints why not.
fn no_driver_here(test: &str) -> bool {
    // SAFETY: only tries to open the library under its usual names.
    let present = unsafe { gpupool_cuda::cudarc::driver::sys::is_culib_present() };
    if present {
        eprintln!("{test}: skipped: libcuda is present on this machine (the GPU tests cover it)");
    }
    !present
}

/// Every message of `e`'s chain (`e`, its source, ...), one a line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut lines = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        lines.push(s.to_string());
        next = s.source();
    }
    lines.join("\n")
}

fn is_no_driver<T>(r: &Result<T, Error<CudaError>>, op: BackendOp) -> bool {
    matches!(
        r,
        Err(Error::Backend { op: o, source: CudaError::NoDriver }) if *o == op
    )
}

#[test]
fn the_first_stream_get_reports_no_driver() {
    if !no_driver_here("the_first_stream_get_reports_no_driver") {
        return;
    }
    let pool = StreamPool::new(CudaBackend::new());
    let r = pool.get(0);
    assert!(
        is_no_driver(&r, BackendOp::DeviceCount),
        "expected NoDriver, got {r:?}"
    );
    // The error prints (without asking the missing driver for a description),
    // and a report that walks the chain (the pool's error, then the CUDA
    // backend's as its source) says it once.
    let report = chain(&r.unwrap_err());
    assert_eq!(report.matches("no CUDA driver").count(), 1, "{report}");
    // Asking again gives the same answer; nothing was built.
    assert!(is_no_driver(&pool.get(1), BackendOp::DeviceCount));
    assert_eq!(pool.device_count(), None);
    assert_eq!(pool.purge().unwrap(), 0);
    assert!(pool.take_error().is_none());
}

#[test]
fn the_event_pool_and_access_order_report_no_driver() {
    if !no_driver_here("the_event_pool_and_access_order_report_no_driver") {
        return;
    }
    let events = EventPool::new(CudaBackend::new());
    assert!(is_no_driver(&events.get(0), BackendOp::DeviceCount));
    assert!(is_no_driver(&events.get_shared(0), BackendOp::DeviceCount));

    // SAFETY: no driver here (checked above): the handles never reach one
    // (see the module documentation).
    let (a, b) = unsafe {
        (
            AccessOrder::from_raw(
                events.backend(),
                StreamHandle::from_raw(0x1000),
                DeviceId(0),
            ),
            AccessOrder::from_raw(
                events.backend(),
                StreamHandle::from_raw(0x2000),
                DeviceId(0),
            ),
        )
    };
    assert!(is_no_driver(&a.wait(&b, &events), BackendOp::DeviceCount));
    // The host asks whether the stream is capturing before it waits.
    let host_wait = AccessOrder::host().wait(&a, &events);
    assert!(is_no_driver(&host_wait, BackendOp::CaptureStatus));
}

#[test]
fn the_process_wide_pools_report_no_driver() {
    if !no_driver_here("the_process_wide_pools_report_no_driver") {
        return;
    }
    assert!(is_no_driver(
        &gpupool_cuda::streams().get(0),
        BackendOp::DeviceCount
    ));
    assert!(is_no_driver(
        &gpupool_cuda::events().get(0),
        BackendOp::DeviceCount
    ));
    assert_eq!(gpupool_cuda::streams().live_leases(), 0);
}

#[test]
fn every_backend_call_reports_no_driver() {
    if !no_driver_here("every_backend_call_reports_no_driver") {
        return;
    }
    let gpu = CudaBackend::new();
    let d = DeviceId(0);
    // SAFETY: no driver here (checked above): the handles never reach one
    // (see the module documentation).
    let (s, e) = unsafe {
        (
            StreamHandle::from_raw(0x1000),
            EventHandle::from_raw(0x2000),
        )
    };
    let no = Err::<(), _>(CudaError::NoDriver);
    assert_eq!(gpu.device_count().map(drop), no);
    assert_eq!(gpu.current_device().map(drop), no);
    assert_eq!(gpu.create_stream(d, Default::default()).map(drop), no);
    // SAFETY: (every call of this block) no driver here, as above.
    unsafe {
        assert_eq!(gpu.destroy_stream(s, d), no);
        assert_eq!(gpu.query_stream(s, d).map(drop), no);
        assert_eq!(gpu.query_stream(StreamHandle::LEGACY, d).map(drop), no);
        assert_eq!(gpu.synchronize_stream(s, d), no);
        assert_eq!(gpu.stream_wait_event(s, d, e), no);
        assert_eq!(gpu.stream_device(s).map(drop), no);
    }
    assert_eq!(
        gpu.create_event(d, EventFlags::DISABLE_TIMING).map(drop),
        no
    );
    // SAFETY: (every call of this block) no driver here, as above.
    unsafe {
        assert_eq!(gpu.destroy_event(e, d), no);
        assert_eq!(gpu.record_event(e, s, d), no);
        assert_eq!(gpu.query_event(e, d).map(drop), no);
        assert_eq!(gpu.synchronize_event(e, d), no);
        assert_eq!(gpu.forget_stream(s, d), Err(CudaError::NoDriver));
    }
    assert_eq!(gpu.context(d).map(drop), no);
    // SAFETY: no driver here, as above.
    let order = unsafe { AccessOrder::from_raw(&gpu, s, d) };
    assert_eq!(testing::spin(order, Duration::from_millis(1)), no);
    assert_eq!(
        testing::Gate::hold(order, Duration::from_millis(1)).map(drop),
        no
    );
    // A special stream's order: the same.
    let legacy = AccessOrder::legacy_stream(d);
    assert_eq!(testing::spin(legacy, Duration::from_millis(1)), no);
}

#[test]
fn every_memory_call_reports_no_driver() {
    if !no_driver_here("every_memory_call_reports_no_driver") {
        return;
    }
    let gpu = CudaBackend::new();
    // SAFETY: no driver here (checked above): the handle never reaches one
    // (see the module documentation).
    let s = unsafe { StreamHandle::from_raw(0x1000) };
    let no = Err::<(), _>(CudaError::NoDriver);
    let p = std::ptr::NonNull::<u8>::dangling();
    for kind in MemoryKind::ALL {
        assert_eq!(gpu.allocate(kind, D0, 64, 8).map(drop), no);
        // SAFETY: no driver here, as above.
        let r = unsafe { gpu.allocate_async(kind, D0, 64, 8, s) };
        assert_eq!(r.map(drop), no);
        // SAFETY: the driver is missing, so nothing is freed: the call fails
        // before it looks at the pointer.
        assert_eq!(unsafe { gpu.deallocate(kind, D0, p, 64, 8) }, no);
        // SAFETY: as above.
        assert_eq!(unsafe { gpu.deallocate_async(kind, D0, p, 64, 8, s) }, no);
    }
    // SAFETY: as above: nothing is copied.
    assert_eq!(unsafe { gpu.copy_async(p, p, 64, s, D0) }, no);
    assert_eq!(gpu.memory_stats(D0).map(drop), no);
    assert_eq!(gpu.trim_memory(D0).map(drop), no);
    assert_eq!(gpu.memory_pool(D0).map(drop), no);

    // A scratchpad over the CUDA backend passes the error on and drops cleanly.
    // SAFETY: no driver here, as above.
    let order = unsafe { AccessOrder::from_raw(&gpu, s, D0) };
    let scratch = Scratchpad::new(&gpu, order).unwrap();
    let r = scratch.pinned::<u32>(16);
    assert!(
        is_no_driver(&r, BackendOp::Allocate),
        "expected NoDriver, got {r:?}"
    );
    let r = scratch.device::<u32>(16).map(drop);
    assert!(
        is_no_driver(&r, BackendOp::AllocateAsync),
        "expected NoDriver, got {r:?}"
    );
    assert_eq!(scratch.stats().upstream_allocations, 0);
    drop(scratch);
}

#[test]
fn a_special_stream_is_never_destroyed() {
    // Refused before the driver is asked, so this holds with or without one.
    for s in [
        StreamHandle::NULL,
        StreamHandle::LEGACY,
        StreamHandle::PER_THREAD,
    ] {
        assert_eq!(
            // SAFETY: a special stream is usable on every device (and is
            // refused here before the driver is asked).
            unsafe { CudaBackend::new().destroy_stream(s, DeviceId(0)) },
            Err(CudaError::SpecialStream(s))
        );
    }
}

#[test]
fn every_cuda_backend_shares_one_id_without_a_driver_call() {
    // Works with or without a driver: asking for the id calls nothing.
    let (a, b) = (CudaBackend::new(), CudaBackend::default());
    assert_eq!(a.id(), b.id());
    assert_eq!(a.id(), a.id());
    assert_ne!(a.id(), BackendId::unique());
    // The pools know their backend by this id: nothing was asked of the
    // driver.
    let pool = StreamPool::new(a);
    assert_eq!(pool.device_count(), None);
    assert_eq!(pool.backend().id(), b.id());
}

#[test]
fn the_scoped_cudarc_interop_refuses_another_backends_stream_and_reports_no_driver() {
    // SAFETY: a made-up handle that never reaches a driver (below).
    let fake = unsafe { StreamHandle::from_raw(0x1000) };
    // Another backend's stream: refused before anything is called, with or
    // without a driver (the handle never reaches one).
    // A backend that is not CUDA's: the mock, with an id of its own.
    let other = MockBackend::new(1);
    // SAFETY: the stream is only offered to `with_cudarc_owned_stream`,
    // which must refuse it by its backend's id (no backend ever sees it).
    let foreign = unsafe { OwnedStream::from_raw_parts(&other, fake, DeviceId(0)) }.unwrap();
    let mut ran = false;
    let r = gpupool_cuda::with_cudarc_owned_stream(&foreign, |_| ran = true);
    assert_eq!(r, Err(CudaError::ForeignStream(fake)));
    assert!(!ran, "the closure does not run");
    let _ = foreign.into_raw();

    if !no_driver_here(
        "the_scoped_cudarc_interop_refuses_another_backends_stream_and_reports_no_driver",
    ) {
        return;
    }
    // A CUDA stream without a driver: `NoDriver`, and the closure never runs.
    // SAFETY: breaks the contract on a machine with a driver, which returned
    // above; here every call fails with `NoDriver` before the handle is used.
    let owned =
        unsafe { OwnedStream::from_raw_parts(&CudaBackend::new(), fake, DeviceId(0)) }.unwrap();
    let r = gpupool_cuda::with_cudarc_owned_stream(&owned, |_| ran = true);
    assert_eq!(r, Err(CudaError::NoDriver));
    assert!(!ran, "the closure does not run");
    let _ = owned.into_raw();
}

#[test]
fn the_testing_kernels_refuse_host_order_and_another_backends_stream() {
    // Refused before the driver is asked, so this holds with or without one.
    use gpupool_cuda::cudarc::driver::sys::CUresult;
    let code = |r: Result<(), CudaError>| r.map_err(|e| e.code());
    let host = AccessOrder::host();
    let invalid_value = Err(Some(CUresult::CUDA_ERROR_INVALID_VALUE));
    assert_eq!(code(testing::spin(host, Duration::ZERO)), invalid_value);
    assert_eq!(
        code(testing::Gate::hold(host, Duration::ZERO).map(drop)),
        invalid_value
    );
    // A backend that is not CUDA's: the mock, with an id of its own.
    let other = MockBackend::new(1);
    // SAFETY: the order names a "stream" of `other`, which has none; it is
    // handed only to the testing helpers, which must refuse it because it is
    // not a CUDA backend's (no driver ever sees the handle).
    let foreign =
        unsafe { AccessOrder::from_raw(&other, StreamHandle::from_raw(0x1000), DeviceId(0)) };
    let invalid_handle = Err(Some(CUresult::CUDA_ERROR_INVALID_HANDLE));
    assert_eq!(code(testing::spin(foreign, Duration::ZERO)), invalid_handle);
    assert_eq!(
        code(testing::Gate::hold(foreign, Duration::ZERO).map(drop)),
        invalid_handle
    );
}

#[test]
fn errors_print_without_a_driver() {
    use gpupool_cuda::cudarc::driver::{sys::CUresult, DriverError};
    // Formatting a driver error must not ask a missing driver for its text
    // (cudarc's own formatting would panic here).
    let e = CudaError::Driver(DriverError(CUresult::CUDA_ERROR_NOT_READY));
    if no_driver_here("errors_print_without_a_driver") {
        assert_eq!(
            e.to_string(),
            "CUDA driver call failed: CUDA_ERROR_NOT_READY (600)"
        );
        assert!(std::error::Error::source(&e).is_none());
    }
    assert_eq!(format!("{e:?}"), "Driver(CUDA_ERROR_NOT_READY)");
    assert_eq!(e.code(), Some(CUresult::CUDA_ERROR_NOT_READY));
    assert!(!e.is_no_driver() && !e.is_deinitialized());
    let e = CudaError::DeviceOutOfRange {
        device: DeviceId(3),
        count: 2,
    };
    assert_eq!(
        e.to_string(),
        "device 3 is out of range: there are 2 devices"
    );
    assert!(CudaError::NoDriver.is_no_driver());
}
