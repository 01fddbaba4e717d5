//! Mock-only: the pools and the scratchpad inside a CUDA graph capture, as
//! the mock models it (`gpupool_mock`'s crate documentation, "Capture"): a
//! capturing stream records work instead of running it, and a call the
//! driver refuses there (a query, a synchronization, a potentially unsafe
//! call in the capture's mode) is a misuse that invalidates the capture.
//! Only safe code: the captures are begun and ended through the leases
//! (`StreamLease::begin_capture`, `end_capture`).
//!
//! The mock refuses in a capture what the H200 refused
//! (`docs/graph-capture.md`); the limits that come from the driver itself
//! (a Global capture forbids every thread's queries) are shown with the mode
//! that avoids them.
#![cfg(not(feature = "cuda"))]
#![forbid(unsafe_code)]

use super::common::{
    busy_lease, capturing, complete_and_assert_clean, forked, forked_and_joined, join, leases,
    mock_rig,
};
use gpupool_core::{
    AccessOrder, BackendOp, CaptureStatus, DeviceId, Error, MemoryKind, Scratchpad, StreamLease,
    StreamPool,
};
use gpupool_mock::{CaptureMode, MockBackend};
use gpupool_tests::assert_clean;
use gpupool_tests::mock_pools;

/// Asserts that the capture begun on `origin` is still active (not
/// invalidated by a refused call), showing the mock's misuses if not.
#[track_caller]
fn assert_capture_active(gpu: &MockBackend, origin: &StreamLease<'_, MockBackend>) {
    assert_eq!(
        gpu.capture_status_of(origin.handle()),
        Ok(CaptureStatus::Active),
        "{:?}",
        gpu.misuses()
    );
}

const D0: DeviceId = DeviceId(0);

/// The fork/join pattern inside a capture: the origin forks a side lease
/// (`side.order().wait(origin)`), the side works, the origin joins it back,
/// and the side lease is returned while the capture is still open. Nothing
/// breaks the capture; the side stream is held while the capture is open
/// (no `get`, on this thread or another, is given it) and leased again once
/// the capture has ended.
#[test]
fn fork_join_inside_a_capture_returns_the_side_stream_after_the_end() {
    mock_rig!(gpu, streams, events; [origin] = capturing(CaptureMode::Global));

    let side = forked(&streams, &origin, &events);
    let side_stream = side.handle();
    assert_eq!(
        gpu.capture_status_of(side_stream),
        Ok(CaptureStatus::Active)
    );
    gpu.enqueue_work(side_stream).unwrap(); // the side's kernel: captured
    join(&origin, &side, &events);
    drop(side); // inside the capture
    assert_clean(&gpu);
    assert_capture_active(&gpu, &origin);

    // While the capture is open nobody gets the side stream.
    let here = streams.get(0).unwrap();
    assert_ne!(here.handle(), side_stream);
    let there =
        std::thread::scope(|s| s.spawn(|| streams.get(0).unwrap().detach()).join().unwrap());
    assert_ne!(there.handle(), side_stream);
    assert_clean(&gpu);

    let graph = origin.end_capture().unwrap();
    assert_eq!(graph.node_count(), 1);
    assert_eq!(
        gpu.capture_status_of(side_stream),
        Ok(CaptureStatus::NotCapturing)
    );

    // Found again once the capture has ended.
    let again = streams.get(0).unwrap();
    assert_eq!(again.handle(), side_stream, "the side stream is reused");
    assert_eq!(streams.stats(D0).unwrap().busy_hits, 1);

    gpu.launch_graph(&graph, again.handle()).unwrap();
    gpu.complete_everything();
    drop((again, here, origin));
    streams.put(there, None).unwrap();
    drop(graph);
    assert!(streams.take_error().is_none());
    assert_clean(&gpu);
}

/// The host cannot wait for a capturing stream: a typed error, asked with
/// `capture_status` first, and the capture is left intact.
#[test]
fn a_host_wait_on_a_capturing_stream_is_a_typed_error() {
    mock_rig!(gpu, streams, events; [origin] = capturing(CaptureMode::Global));
    let waited = AccessOrder::host().wait(&origin.order(), &events);
    assert!(matches!(waited, Err(Error::StreamCapturing)), "{waited:?}");
    assert_capture_active(&gpu, &origin);
    assert_eq!(gpu.calls(BackendOp::SynchronizeStream), 0);
    origin.end_capture().unwrap();
    assert_clean(&gpu);
}

/// Only a lease whose stream was ever in a capture asks `capture_status`
/// at its return: one that began a capture, joined one (its wait on a
/// capturing stream), or was told (`note_capture`). A wait on a stream that
/// never was in a capture asks nothing either.
#[test]
fn only_a_lease_that_was_in_a_capture_asks_its_capture_status() {
    let (gpu, streams, events) = mock_pools(1);
    let plain = streams.get(0).unwrap();
    drop(plain);
    assert_eq!(gpu.calls(BackendOp::CaptureStatus), 0);
    assert_eq!(gpu.calls(BackendOp::QueryStream), 1);

    let [a, b] = leases(&streams);
    a.order().wait(&b.order(), &events).unwrap();
    drop(b);
    drop(a); // waited, but on a stream that was never in a capture
    assert_eq!(gpu.calls(BackendOp::CaptureStatus), 0);

    let [origin, side] = capturing(&streams, CaptureMode::Relaxed);
    side.order().wait(&origin.order(), &events).unwrap(); // asks the origin
    assert_eq!(gpu.calls(BackendOp::CaptureStatus), 1);
    // The origin (capturing) asks itself, the side before the record (a
    // capturing stream joins no other capture) and after it.
    join(&origin, &side, &events);
    assert_eq!(gpu.calls(BackendOp::CaptureStatus), 4);
    drop(side); // joined: asks, held
    assert_eq!(gpu.calls(BackendOp::CaptureStatus), 5);
    origin.end_capture().unwrap();
    drop(origin);

    let c = streams.get(0).unwrap();
    c.note_capture();
    let before = gpu.calls(BackendOp::CaptureStatus);
    drop(c);
    assert_eq!(gpu.calls(BackendOp::CaptureStatus), before + 1);
    assert_clean(&gpu);
}

/// A detached stream in a capture cannot be put into a pool: it comes back
/// with `Error::StreamCapturing`, and nothing queried it.
#[test]
fn putting_a_capturing_stream_is_rejected() {
    mock_rig!(gpu, streams, _events; [lease] = capturing(CaptureMode::Global));
    let owned = lease.detach();
    let queries = gpu.calls(BackendOp::QueryStream);
    let rejected = streams.put(owned, None).unwrap_err();
    assert!(matches!(rejected.error, Error::StreamCapturing));
    let owned = rejected.value;
    assert_eq!(gpu.calls(BackendOp::QueryStream), queries);
    assert_eq!(
        gpu.capture_status_of(owned.handle()),
        Ok(CaptureStatus::Active)
    );
    gpu.end_capture(owned.handle()).unwrap();
    streams.put(owned, None).unwrap();
    assert_clean(&gpu);
}

/// A device scratchpad made and dropped inside a capture on the origin: its
/// block is a graph allocation, its drop the graph's free; the graph is
/// launched twice with no hazard, and its memory goes when it is dropped.
#[test]
fn a_device_scratchpad_inside_a_capture_becomes_memory_nodes() {
    mock_rig!(gpu, streams, _events; [origin] = capturing(CaptureMode::Global));
    {
        let scratch = Scratchpad::new(&gpu, origin.order()).unwrap();
        let x = scratch.device::<u32>(256).unwrap();
        let y = scratch.device::<f32>(256).unwrap();
        gpu.launch_map(&origin.order(), &x, &y, |v| v as f32)
            .unwrap();
        gpu.launch_map(&origin.order(), &y, &x, |v| v as u32)
            .unwrap();
    } // dropped inside the capture
    assert_clean(&gpu);
    let graph = origin.end_capture().unwrap();
    // One block: allocated, two kernels, freed.
    assert_eq!(graph.node_count(), 4);
    let reserved = gpu.live_bytes(MemoryKind::Device);
    assert!(reserved > 0, "kept for the graph");

    let replay = streams.get(0).unwrap();
    gpu.launch_graph(&graph, replay.handle()).unwrap();
    gpu.launch_graph(&graph, replay.handle()).unwrap();
    assert_eq!(gpu.pending_work(replay.handle()), Ok(8));
    complete_and_assert_clean(&gpu);
    drop(graph);
    assert_eq!(gpu.live_bytes(MemoryKind::Device), 0);
    drop((replay, origin));
    assert_clean(&gpu);
}

/// A pinned scratchpad released in the order of a capturing stream (the mock
/// does not batch host reuse, so a reset outside a capture would ask the
/// stream): its reset inside the capture asks nothing the capture refuses,
/// and its block is handed to nobody while the graph lives.
#[test]
fn a_pinned_scratchpad_reset_inside_a_capture_keeps_its_block_for_the_graph() {
    pinned_reset_inside_a_capture(false);
}

/// The same with a backend that batches host reuse (as CUDA's does): the
/// reset gives the block back in stream order, which for a capturing stream
/// is the backend's `keep_for_graph`.
#[test]
fn a_batching_backend_keeps_a_pinned_block_reset_inside_a_capture_for_the_graph() {
    pinned_reset_inside_a_capture(true);
}

fn pinned_reset_inside_a_capture(batched: bool) {
    let (gpu, streams, _events) = mock_pools(1);
    gpu.set_batches_host_reuse(batched);
    let origin = streams.get(0).unwrap();
    let mut scratch = Scratchpad::new(&gpu, origin.order()).unwrap();
    scratch.pinned::<u8>(100).unwrap(); // before the capture
    let [(old, size)] = scratch.blocks(MemoryKind::Pinned)[..] else {
        panic!("one pinned block")
    };
    origin.begin_capture(CaptureMode::Global).unwrap();
    let queries = gpu.calls(BackendOp::QueryStream) + gpu.calls(BackendOp::QueryEvent);
    scratch.reset().unwrap();
    assert_eq!(
        gpu.calls(BackendOp::QueryStream) + gpu.calls(BackendOp::QueryEvent),
        queries,
        "{:?}",
        gpu.misuses()
    );
    assert_clean(&gpu);
    assert_capture_active(&gpu, &origin);
    let graph = origin.end_capture().unwrap();

    // The next round (outside the capture) gets another block; the old one
    // is still allocated.
    scratch.pinned::<u8>(100).unwrap();
    let [(new, _)] = scratch.blocks(MemoryKind::Pinned)[..] else {
        panic!("one pinned block")
    };
    assert_ne!(new, old, "the graph's block is not handed out again");
    let held = gpu.live_bytes(MemoryKind::Pinned) - scratch.stats().reserved[1];
    assert_eq!(held, size, "the graph's block is still allocated");
    gpu.launch_graph(&graph, origin.handle()).unwrap();
    gpu.complete_everything();
    drop(graph);
    drop(scratch);
    assert_clean(&gpu);
}

// ---- other threads during a capture ------------------------------------------

/// Begins a capture in `mode` on a lease, returns another lease on another
/// thread meanwhile, asserts that the capture stays active and ends it; then
/// `check`s the machine and the pool (the capture's lease still out).
fn lease_returned_on_another_thread_during_a_capture(
    mode: CaptureMode,
    check: impl FnOnce(&MockBackend, &StreamPool<MockBackend>),
) {
    mock_rig!(gpu, streams, _events; [origin] = capturing(mode));
    std::thread::scope(|s| {
        s.spawn(|| drop(streams.get(0).unwrap()));
    });
    assert_capture_active(&gpu, &origin);
    origin.end_capture().unwrap();
    check(&gpu, &streams);
}

/// A lease that never waited, returned on another thread while a capture is
/// open, queries its stream. A Global capture forbids every thread that
/// query (the driver's rule, measured on the H200); a ThreadLocal capture
/// forbids it only to its own thread, so the capture stays valid.
#[test]
fn a_lease_returned_on_another_thread_during_a_thread_local_capture_leaves_it_valid() {
    lease_returned_on_another_thread_during_a_capture(CaptureMode::ThreadLocal, |gpu, _| {
        assert!(gpu.misuses().is_empty(), "{:?}", gpu.misuses());
    });
}

/// The same return during a Global capture begun through gpupool: the
/// driver would refuse another thread's query in a global capture and
/// invalidate it, but the backend runs its own calls with the thread's
/// interaction mode relaxed while a capture gpupool began is open (the CUDA
/// backend's `unrestricted`; the mock models it), so the capture stays valid.
/// (A capture begun through the raw handle still restricts every call, as
/// `gpupool_mock`'s own capture tests show.)
#[test]
fn a_lease_returned_on_another_thread_during_a_global_capture_leaves_it_valid() {
    lease_returned_on_another_thread_during_a_capture(CaptureMode::Global, |gpu, streams| {
        assert!(streams.take_error().is_none());
        assert_clean(gpu);
    });
}

/// `get` with a pending stream in its busy list queries it; on another
/// thread than a ThreadLocal capture's, that leaves the capture valid.
#[test]
fn a_get_on_another_thread_during_a_thread_local_capture_leaves_it_valid() {
    let (gpu, streams, _events) = mock_pools(1);
    let busy = busy_lease(&gpu, &streams);
    drop(busy); // pending: the busy list
    let origin = streams.get(0).unwrap(); // a new stream
    origin.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let other =
        std::thread::scope(|s| s.spawn(|| streams.get(0).unwrap().detach()).join().unwrap());
    assert_capture_active(&gpu, &origin);
    origin.end_capture().unwrap();
    streams.put(other, None).unwrap();
    assert!(gpu.misuses().is_empty(), "{:?}", gpu.misuses());
}

/// A purge while a capture is open leaves the streams the pool holds for
/// that capture (a returned side stream): destroying one would break it.
#[test]
fn a_purge_during_a_capture_keeps_the_streams_held_for_it() {
    mock_rig!(gpu, streams, events; [origin] = capturing(CaptureMode::Relaxed));
    let side = forked_and_joined(&streams, &origin, &events);
    let side_handle = side.handle();
    drop(side);
    let purged = streams.purge();
    assert!(gpu.misuses().is_empty(), "{:?} {purged:?}", gpu.misuses());
    origin.end_capture().unwrap();
    // Once the capture has ended, the pool leases the side stream again.
    let again = streams.get(0).unwrap();
    assert_eq!(again.handle(), side_handle);
}

/// `Scratchpad::to_host` in the order of a capturing stream is refused with
/// a typed error (the host cannot wait for a copy that runs at each
/// replay), and the capture stays intact.
#[test]
fn a_read_back_inside_a_capture_is_a_typed_error() {
    mock_rig!(gpu, streams, _events; [origin] = capturing(CaptureMode::Relaxed));
    let scratch = Scratchpad::new(&gpu, origin.order()).unwrap();
    let x = scratch.device::<u32>(4).unwrap();
    let read = scratch.to_host(&x);
    assert!(matches!(read, Err(Error::StreamCapturing)), "{read:?}");
    assert!(gpu.misuses().is_empty(), "{:?}", gpu.misuses());
}

/// A pinned block released in the order of a capturing stream (a reset
/// inside the capture) goes to the backend's `keep_for_graph`: the mock
/// holds it for the graph and frees it when the graph is dropped.
#[test]
fn a_pinned_block_released_inside_a_capture_is_freed_with_its_graph() {
    let (gpu, streams, _events) = mock_pools(1);
    let origin = streams.get(0).unwrap();
    let mut scratch = Scratchpad::new(&gpu, origin.order()).unwrap();
    scratch.pinned::<u8>(100).unwrap();
    origin.begin_capture(CaptureMode::Global).unwrap();
    scratch.reset().unwrap();
    let graph = origin.end_capture().unwrap();
    drop(scratch);
    drop(graph);
    assert_eq!(gpu.live_bytes(MemoryKind::Pinned), 0, "leaked");
}

/// The same upload in a Relaxed capture works: the staging block is freed in
/// the capture's order and held for the graph, which replays the copy from
/// it.
#[test]
fn a_staged_upload_inside_a_relaxed_capture_holds_its_staging_for_the_graph() {
    mock_rig!(gpu, streams, _events; [origin] = capturing(CaptureMode::Relaxed));
    let graph = {
        let scratch = Scratchpad::new(&gpu, origin.order()).unwrap();
        let x = scratch.to_device(&[1u32, 2, 3]).unwrap();
        gpu.launch_map(&origin.order(), &x, &x, |v| v * 2).unwrap();
        drop(scratch);
        origin.end_capture().unwrap()
    };
    // The device block is reserved for the graph, the staging block held.
    assert!(gpu.live_bytes(MemoryKind::Device) > 0);
    assert_eq!(gpu.live_bytes(MemoryKind::Pinned), 12);
    gpu.launch_graph(&graph, origin.handle()).unwrap();
    gpu.complete_everything();
    drop(graph);
    assert_eq!(gpu.live_blocks(), 0);
    drop(origin);
    assert_clean(&gpu);
}
