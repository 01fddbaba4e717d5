//! Mock-only (fault injection): each backend call the pools make fails once,
//! in turn, in a workload that reaches all of them. Each time an error must
//! surface (returned or parked, never a panic), the pools must stay usable,
//! and after purge and drop the mock must count zero live streams and events.
#![cfg(not(feature = "cuda"))]

use gpupool_core::{
    AccessOrder, BackendOp, DeviceId, DeviceSelector, Error, EventBackend, EventPool, MemoryKind,
    OwnedStream, Scratchpad, StreamBackend, StreamOptions, StreamPool,
};
use gpupool_mock::{CallKind, MockBackend, MockError};
use gpupool_tests::mock_stream_pool;

/// The call kinds the pools and `AccessOrder` make. (`QueryEvent` is part of
/// the backend trait for users; no pool path calls it, which `workload` checks.)
const REACHED: &[CallKind] = &[
    CallKind::DeviceCount,
    CallKind::CurrentDevice,
    CallKind::CreateStream,
    CallKind::DestroyStream,
    CallKind::QueryStream,
    CallKind::SynchronizeStream,
    CallKind::StreamWaitEvent,
    CallKind::StreamDevice,
    CallKind::CreateEvent,
    CallKind::DestroyEvent,
    CallKind::RecordEvent,
    CallKind::SynchronizeEvent,
    CallKind::Allocate,
    CallKind::Deallocate,
    CallKind::AllocateAsync,
    CallKind::DeallocateAsync,
    CallKind::CopyAsync,
];

/// Runs a small runtime's worth of pool traffic, carrying on past errors.
/// Returns every error met: returned by a call, or parked by a drop.
fn workload(gpu: &MockBackend) -> Vec<Error<MockError>> {
    let mut errors = Vec::new();
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    gpu.set_current_device(DeviceId(1));
    {
        let a = streams
            .get(DeviceSelector::Current)
            .map_err(|e| errors.push(e))
            .ok();
        let b = streams.get(0).map_err(|e| errors.push(e)).ok();
        if let (Some(a), Some(b)) = (&a, &b) {
            gpu.enqueue_work(b.handle()).unwrap();
            // Stream after stream: pooled event, record, wait.
            if let Err(e) = a.order().wait(&b.order(), &events) {
                errors.push(e);
            }
            // Host after stream: synchronize.
            if let Err(e) = AccessOrder::host().wait(&b.order(), &events) {
                errors.push(e);
            }
            gpu.enqueue_work(b.handle()).unwrap();
        }
        if let Ok(e) = events.get(1).map_err(|e| errors.push(e)) {
            if let Some(a) = &a {
                // SAFETY: the leases hold this live event and stream of this
                // machine's device 1.
                match unsafe { gpu.record_event(e.handle(), a.handle(), DeviceId(1)) } {
                    Ok(()) => {
                        if let Err(err) = AccessOrder::host().wait_event(&e) {
                            errors.push(err);
                        }
                    }
                    Err(source) => errors.push(Error::Backend {
                        op: BackendOp::RecordEvent,
                        source,
                    }),
                }
            }
        }
        // A foreign stream adopted into the pool.
        match gpu.create_stream(DeviceId(0), StreamOptions::default()) {
            Err(source) => errors.push(Error::Backend {
                op: BackendOp::CreateStream,
                source,
            }),
            // SAFETY: `raw` was just created and is handed over here.
            Ok(raw) => match unsafe { OwnedStream::adopt(gpu, raw) } {
                Ok(owned) => {
                    if let Err(r) = streams.put(owned, None) {
                        errors.push(r.error);
                        let _ = r.value.destroy(gpu);
                    }
                }
                Err(e) => {
                    errors.push(e);
                    // SAFETY: `raw` is the live stream created above on
                    // device 0, still ours (the adoption failed).
                    let _ = unsafe { gpu.destroy_stream(raw, DeviceId(0)) };
                }
            },
        }
        // Leases end here: returns query their streams (b is still busy).
    }
    // Scratch memory of all four kinds, grown, reset, grown again, copied,
    // released in stream order.
    if let Ok(lease) = streams.get(0).map_err(|e| errors.push(e)) {
        let mut scratch = Scratchpad::new(gpu, lease.order()).unwrap();
        for bytes in [100_000, 1, 300_000] {
            for kind in MemoryKind::ALL {
                if let Err(e) = scratch.alloc(kind, bytes, 64) {
                    errors.push(e);
                }
            }
        }
        let parts: [&[u32]; 2] = [&[1, 2, 3], &[4, 5]];
        // Staged through a pinned block, copied in the device order (the
        // lease's stream).
        if let Err(e) = scratch.to_contiguous_device(&parts) {
            errors.push(e);
        }
        if let Err(e) = scratch.reset() {
            errors.push(e);
        }
        for kind in MemoryKind::ALL {
            if let Err(e) = scratch.alloc(kind, 50_000, 64) {
                errors.push(e);
            }
        }
        if let Err(e) = scratch.release() {
            errors.push(e);
        }
    }
    gpu.complete_everything();
    errors.extend(streams.take_error());
    errors.extend(events.take_error());
    // The pools are still usable after whatever failed.
    assert!(
        streams.get(0).is_ok() || streams.get(0).is_ok(),
        "stream pool unusable"
    );
    assert!(
        events.get(0).is_ok() || events.get(0).is_ok(),
        "event pool unusable"
    );
    errors.extend(streams.take_error());
    for _ in 0..3 {
        match (streams.purge(), events.purge()) {
            (Ok(_), Ok(_)) => break,
            (s, e) => errors.extend(s.err().into_iter().chain(e.err())),
        }
    }
    errors.extend(streams.take_error());
    errors.extend(events.take_error());
    drop((streams, events));
    errors
}

#[test]
fn the_workload_reaches_every_listed_call_and_no_other() {
    let gpu = MockBackend::new(2);
    let errors = workload(&gpu);
    assert!(errors.is_empty(), "{errors:?}");
    for &kind in REACHED {
        assert!(gpu.calls(kind) > 0, "{kind:?} is not reached");
    }
    assert_eq!(gpu.calls(CallKind::QueryEvent), 0);
    assert_eq!((gpu.live_streams(), gpu.live_events()), (0, 0));
    assert!(MemoryKind::ALL.iter().all(|&k| gpu.live_bytes(k) == 0));
    assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
}

/// Fault positions tried by the sweep (printed at its end).
static POSITIONS_TRIED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[test]
fn each_call_failing_once_gives_an_error_and_leaks_nothing() {
    // How many calls of each kind the workload makes (it runs on one thread,
    // the same calls every time): one run counts them all.
    let totals = {
        let gpu = MockBackend::new(2);
        workload(&gpu);
        REACHED
            .iter()
            .map(|&kind| gpu.calls(kind))
            .collect::<Vec<_>>()
    };
    for (&kind, &total) in REACHED.iter().zip(&totals) {
        // Fail every call of this kind the workload makes, one run per
        // position, from setup to teardown (under Miri: the first and last).
        let positions: Vec<u64> = if cfg!(miri) {
            vec![1, total]
        } else {
            (1..=total).collect()
        };
        for n in positions {
            POSITIONS_TRIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let gpu = MockBackend::new(2);
            gpu.fail_nth(kind, n);
            let errors = workload(&gpu);
            assert_eq!(
                gpu.armed_faults(),
                0,
                "{kind:?} #{n}: the fault never fired"
            );
            let surfaced = errors.iter().any(|e| {
                matches!(e, Error::Backend { source: MockError::Injected(k), .. } if *k == kind)
            });
            assert!(surfaced, "{kind:?} #{n}: no error surfaced: {errors:?}");
            assert_eq!(gpu.live_streams(), 0, "{kind:?} #{n}: a stream leaked");
            assert_eq!(gpu.live_events(), 0, "{kind:?} #{n}: an event leaked");
            // A free that fails leaves its block allocated (the error says so);
            // every other failure leaves no byte behind.
            let leaked: usize = MemoryKind::ALL.iter().map(|&k| gpu.live_bytes(k)).sum();
            let failed_free = matches!(kind, CallKind::Deallocate | CallKind::DeallocateAsync);
            assert!(
                leaked == 0 || failed_free,
                "{kind:?} #{n}: {leaked} bytes leaked"
            );
            assert!(
                gpu.hazards().is_empty(),
                "{kind:?} #{n}: {:?}",
                gpu.hazards()
            );
            assert!(
                gpu.misuses().is_empty(),
                "{kind:?} #{n}: {:?}",
                gpu.misuses()
            );
        }
    }
    println!(
        "fault positions tried: {}",
        POSITIONS_TRIED.load(std::sync::atomic::Ordering::Relaxed)
    );
}

#[test]
fn injected_errors_name_the_operation() {
    let (gpu, pool) = mock_stream_pool(1);
    gpu.fail_nth(CallKind::CreateStream, 1);
    let e = pool.get(0).unwrap_err();
    assert_eq!(e.backend_op(), Some(BackendOp::CreateStream));
    assert!(e.to_string().contains("CreateStream"), "{e}");
}
