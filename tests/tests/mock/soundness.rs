//! The soundness findings (numbered as in issue 11), one test each where safe
//! code gets a typed error at run time (the ones the type system forbids are
//! the compile-fail cases in `tests/ui/`, run by `mock/compile_fail.rs`):
//!
//! | finding | what stops it |
//! |---|---|
//! | 1. forged and stale handles | compile error: `ui/forged_handles.rs`, `ui/backend_calls_need_unsafe.rs` |
//! | 2. orders outlive their streams | compile error: `ui/order_outlives_lease.rs`, `ui/order_outlives_owned_stream.rs`, `ui/scratchpad_outlives_lease.rs`; special streams stay usable (here) |
//! | 3. foreign owned handles | `Error::ForeignHandle`, value handed back (here) |
//! | 4. device mismatch in a scratchpad | `Error::WrongDevice` at construction (here) |
//! | 5. copy helpers that overstate | staged copies in the device order (here) |
//! | 6. `same_thread_reuse` and moved leases | a lease ended on another thread is queried (here) |
//! | 7. CUDA `with_context` without a guard | restored by a guard (backend-cuda) |

use gpupool_core::{
    AccessOrder, DeviceId, Error, MemoryKind, Scratchpad, ScratchpadConfig, StreamPool,
    StreamPoolConfig,
};
use gpupool_mock::{CallKind, MockBackend};
use gpupool_tests::{mock_event_pool, mock_pools, mock_stream_pool};

type R = Result<(), Error<gpupool_mock::MockError>>;

/// Lets the mock run everything queued and checks that no use raced,
/// then drops `scratch` and checks that every block was freed, with no
/// misuse or hazard.
#[track_caller]
fn drop_once_the_queue_has_run(gpu: &MockBackend, scratch: Scratchpad<'_, MockBackend>) {
    gpu.complete_everything();
    assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
    drop(scratch);
    gpu.complete_everything();
    assert_eq!(gpu.live_blocks(), 0);
    assert!(gpu.misuses().is_empty() && gpu.hazards().is_empty());
}

/// Finding 3: a stream detached from one mock machine's pool is refused by
/// another machine's pool and backend, comes back intact, and goes home.
#[test]
fn a_stream_of_another_backend_is_refused_and_handed_back() -> R {
    let (a, pool_a) = mock_stream_pool(1);
    let (b, pool_b) = mock_stream_pool(1);
    assert_ne!(gpupool_core::Backend::id(&a), gpupool_core::Backend::id(&b));
    // B's pool has a stream of its own leased, which a foreign handle of the
    // same number would alias.
    let b_lease = pool_b.get(0)?;

    let owned = pool_a.get(0)?.detach();
    let handle = owned.handle();
    let refused = pool_b.put(owned, None).unwrap_err();
    assert_eq!(refused.error, Error::ForeignHandle);
    assert_eq!(refused.value.handle(), handle);
    let refused = refused.value.destroy(&b).unwrap_err();
    assert_eq!(refused.error, Error::ForeignHandle);

    // B was never asked about A's stream; its own lease is untouched.
    assert_eq!(b.calls(CallKind::QueryStream), 0);
    assert_eq!(b.calls(CallKind::DestroyStream), 0);
    assert_eq!(pool_b.live_leases(), 1);
    drop(b_lease);
    assert_eq!(pool_b.total_stats().created, 1);

    // Home again: A takes it back and leases it out next.
    pool_a.put(refused.value, None).map_err(|r| r.error)?;
    assert_eq!(pool_a.get(0)?.handle(), handle);
    assert!(a.misuses().is_empty() && b.misuses().is_empty());
    Ok(())
}

/// Finding 3, events: the same for an event.
#[test]
fn an_event_of_another_backend_is_refused_and_handed_back() -> R {
    let (a, events_a) = mock_event_pool(1);
    let (b, events_b) = mock_event_pool(1);
    let owned = events_a.get(0)?.detach();
    let refused = events_b.put(owned, None).unwrap_err();
    assert_eq!(refused.error, Error::ForeignHandle);
    let refused = refused.value.destroy(&b).unwrap_err();
    assert_eq!(refused.error, Error::ForeignHandle);
    assert_eq!(b.calls(CallKind::DestroyEvent), 0);
    refused.value.destroy(&a).map_err(|r| r.error)?;
    assert_eq!(a.live_events(), 0);
    assert!(a.misuses().is_empty() && b.misuses().is_empty());
    Ok(())
}

/// Finding 3, orders: an order of one machine cannot be waited on with
/// another machine's events, nor carry another machine's scratchpad.
#[test]
fn an_order_of_another_backend_is_refused() -> R {
    let (a, streams_a) = mock_stream_pool(1);
    let (b, streams_b, events_b) = mock_pools(1);
    let la = streams_a.get(0)?;
    let lb = streams_b.get(0)?;
    for (waiter, awaited) in [
        (lb.order(), la.order()),
        (la.order(), lb.order()),
        (AccessOrder::host(), la.order()),
    ] {
        let refused = waiter.wait(&awaited, &events_b);
        assert_eq!(
            refused,
            Err(Error::ForeignHandle),
            "{waiter:?} after {awaited:?}"
        );
    }
    assert_eq!(
        Scratchpad::new(&b, la.order()).err(),
        Some(Error::ForeignHandle)
    );
    let event = events_b.get(0)?;
    assert_eq!(la.order().wait_event(&event), Err(Error::ForeignHandle));
    drop(event);
    assert_eq!(b.calls(CallKind::RecordEvent), 0);
    assert_eq!(b.calls(CallKind::StreamWaitEvent), 0);
    assert_eq!(b.calls(CallKind::SynchronizeStream), 0);
    // The same calls within one machine work.
    lb.order().wait(&lb.order(), &events_b)?;
    AccessOrder::host().wait(&lb.order(), &events_b)?;
    assert!(a.misuses().is_empty() && b.misuses().is_empty());
    Ok(())
}

/// Finding 2: the special streams and host order need no lease and stay
/// usable with any backend.
#[test]
fn special_stream_orders_need_no_lease() -> R {
    let (gpu, streams, events) = mock_pools(2);
    let lease = streams.get(1)?;
    lease
        .order()
        .wait(&AccessOrder::null_stream(DeviceId(1)), &events)?;
    AccessOrder::per_thread_stream(DeviceId(0)).wait(&lease.order(), &events)?;
    AccessOrder::host().wait(&AccessOrder::legacy_stream(DeviceId(0)), &events)?;
    let scratch = Scratchpad::new(&gpu, AccessOrder::null_stream(DeviceId(1)))?;
    assert_eq!(scratch.device_id()?, DeviceId(1));
    drop(scratch);
    assert!(gpu.misuses().is_empty());
    Ok(())
}

/// Finding 4: a scratchpad whose orders and device disagree is refused at
/// construction, before anything is allocated.
#[test]
fn a_scratchpad_refuses_orders_on_another_device() -> R {
    let (gpu, streams) = mock_stream_pool(2);
    let on_0 = streams.get(0)?;
    let on_1 = streams.get(1)?;
    let mismatched = ScratchpadConfig {
        device: Some(DeviceId(1)),
        ..ScratchpadConfig::default()
    };
    let pinned_on_1 = ScratchpadConfig {
        pinned_release: Some(on_1.order()),
        ..ScratchpadConfig::default()
    };
    for (config, given, actual) in [
        (mismatched, DeviceId(1), DeviceId(0)),
        (pinned_on_1, DeviceId(0), DeviceId(1)),
    ] {
        let refused = Scratchpad::with_config(&gpu, on_0.order(), config).err();
        assert_eq!(refused, Some(Error::WrongDevice { given, actual }));
    }
    // Host order for device memory, pinned released on device 1: the
    // scratchpad is device 1's, and its pinned blocks are allocated and freed
    // for device 1.
    let scratch = Scratchpad::with_config(&gpu, AccessOrder::host(), pinned_on_1)?;
    assert_eq!(scratch.device_id()?, DeviceId(1));
    scratch.pinned::<u8>(100)?;
    scratch.release()?;
    assert_eq!(gpu.calls(CallKind::Allocate), 1);
    gpu.complete_everything();
    assert_eq!(gpu.live_bytes(MemoryKind::Pinned), 0);
    assert!(gpu.misuses().is_empty() && gpu.hazards().is_empty());
    Ok(())
}

/// Finding 5: `to_device` of a pinned source (here one of the same
/// scratchpad) stages it, so the host may write the source while the copy is
/// still queued.
#[test]
fn to_device_leaves_its_source_free_at_once() -> R {
    let (gpu, streams) = mock_stream_pool(1);
    let lease = streams.get(0)?;
    let scratch = Scratchpad::new(&gpu, lease.order())?;
    let src = scratch.copy_of(MemoryKind::Pinned, &[1u32; 256])?;
    let on_device = scratch.to_device(src)?;
    assert_eq!(on_device.len(), 256);
    // Nothing has run yet: the copy is queued on the lease's stream.
    assert!(gpu.pending_work(lease.handle()).unwrap() > 0);
    gpu.host_access(src.as_ptr().cast(), size_of_val(src))
        .unwrap();
    src[0] = 7;
    drop_once_the_queue_has_run(&gpu, scratch);
    Ok(())
}

/// Finding 5: a copy helper's device block is used only in the device order,
/// so the next round, after a reset, reuses it behind the copy.
#[test]
fn a_copied_block_is_reused_only_behind_the_copy() -> R {
    let (gpu, streams) = mock_stream_pool(1);
    let lease = streams.get(0)?;
    let mut scratch = Scratchpad::new(&gpu, lease.order())?;
    let data = [3u64; 512];
    for _round in 0..3 {
        let (packed, ranges) = scratch.to_contiguous_device(&[&data[..], &data[..100]])?;
        assert_eq!(ranges.len(), 2);
        gpu.use_memory(lease.handle(), packed.as_ptr().cast(), packed.byte_len())
            .unwrap();
        // The copy (and the kernel) are still queued when the round ends.
        assert!(gpu.pending_work(lease.handle()).unwrap() > 0);
        scratch.reset()?;
    }
    drop_once_the_queue_has_run(&gpu, scratch);
    Ok(())
}

/// Finding 6: with `same_thread_reuse`, a lease taken on one thread and ended
/// on another is queried there, so the other thread is never served the
/// first thread's pending work.
#[test]
fn same_thread_reuse_never_serves_a_moved_leases_work() -> R {
    let gpu = MockBackend::new(1);
    let pool = StreamPool::with_config(
        gpu.clone(),
        StreamPoolConfig {
            same_thread_reuse: true,
            ..StreamPoolConfig::default()
        },
    );
    let lease = pool.get(0)?;
    let busy = lease.handle();
    gpu.enqueue_work(busy).unwrap(); // work of this thread, still pending
    let shared = &pool;
    let served = std::thread::scope(|s| {
        s.spawn(move || {
            drop(lease); // ends on the other thread
            shared.get(0).map(|l| l.handle())
        })
        .join()
        .unwrap()
    })?;
    assert_ne!(served, busy, "the other thread was served a pending stream");
    // The moved lease's return asked (and later scans may ask again).
    assert!(gpu.calls(CallKind::QueryStream) >= 1);
    // On the thread that took it, a lease still comes back unqueried.
    let own = pool.get(0)?;
    let h = own.handle();
    gpu.enqueue_work(h).unwrap();
    let queries = gpu.calls(CallKind::QueryStream);
    drop(own);
    let again = pool.get(0)?;
    assert_eq!(again.handle(), h);
    assert_eq!(gpu.calls(CallKind::QueryStream), queries);
    drop(again);
    gpu.complete_everything();
    drop(pool);
    assert_eq!(gpu.live_streams(), 0);
    assert!(gpu.misuses().is_empty());
    Ok(())
}
