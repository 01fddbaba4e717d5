//! The mock's memory: each kind allocates aligned host memory, byte and block
//! accounting, fault injection on every memory call, frees that misname their
//! block, stream-ordered frees reclaimed only once the stream passes them, the
//! hazard detector, `copy_async` round trips, and a many-thread smoke test.
//! Also run under Miri with strict provenance.
#![cfg(not(loom))]

use core::ptr::NonNull;

use gpupool_core::{
    DeviceId, EventBackend, EventHandle, MemoryBackend, MemoryKind, StreamBackend, StreamHandle,
};
use gpupool_mock::{
    BlockLayout, CallKind, CompletionPolicy, Hazard, HazardKind, Misuse, MockBackend, MockError,
};

use MemoryKind::{Device, Host, Managed, Pinned};

mod common;
use common::{event, hazard_kinds, mock_with_stream, on_threads, stream, D0, D1};

fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr().addr()
}

/// Frees a block synchronously; the test owns it and nothing uses it.
fn free(mock: &MockBackend, kind: MemoryKind, p: NonNull<u8>, size: usize, align: usize) {
    // SAFETY: `p` came from this mock with these arguments and is not used again.
    unsafe { mock.deallocate(kind, D0, p, size, align) }.unwrap();
}

/// Frees in stream order, returning the mock's answer.
fn free_on(
    mock: &MockBackend,
    kind: MemoryKind,
    p: NonNull<u8>,
    size: usize,
    s: StreamHandle,
) -> Result<(), MockError> {
    // SAFETY: the mock checks every argument; it is the thing under test.
    unsafe { mock.deallocate_async(kind, D0, p, size, 8, s) }
}

/// Asserts that `mock` holds no memory: no live or pending bytes of any
/// kind, no block.
#[track_caller]
fn assert_no_leak(mock: &MockBackend) {
    for kind in MemoryKind::ALL {
        assert_eq!(mock.live_bytes(kind), 0, "{kind:?} leaked");
        assert_eq!(mock.pending_free_bytes(kind), 0, "{kind:?} still pending");
    }
    assert_eq!(mock.live_blocks(), 0);
}

/// Lets `mock` run everything queued, then [`assert_no_leak`].
#[track_caller]
fn assert_no_leak_once_all_has_run(mock: &MockBackend) {
    mock.complete_everything();
    assert_no_leak(mock);
}

/// A new one-device mock, two streams and an event of its device 0, and a
/// device block of `size` bytes.
fn two_streams_an_event_and_a_device_block(
    size: usize,
) -> (MockBackend, [StreamHandle; 2], EventHandle, NonNull<u8>) {
    let mock = MockBackend::new(1);
    let (a, b) = (stream(&mock, D0), stream(&mock, D0));
    let e = event(&mock, D0);
    let p = mock.allocate(Device, D0, size, 8).unwrap();
    (mock, [a, b], e, p)
}

#[test]
fn every_kind_allocates_aligned_writable_memory_and_frees_it() {
    let (mock, s) = mock_with_stream(1);
    for kind in MemoryKind::ALL {
        for shift in 0..=12 {
            let align = 1usize << shift;
            for size in [1, 3, 64, 5000] {
                let p = mock.allocate(kind, D0, size, align).unwrap();
                assert_eq!(addr(p) % align, 0, "{kind:?} {size} {align}");
                // The memory is real: write both ends through the pointer.
                // SAFETY: the block is `size` bytes long and ours.
                unsafe {
                    p.as_ptr().write(0xA5);
                    p.as_ptr().add(size - 1).write(0x5A);
                    assert_eq!(p.as_ptr().read(), if size == 1 { 0x5A } else { 0xA5 });
                }
                assert_eq!(mock.live_bytes(kind), size);
                free(&mock, kind, p, size, align);
                assert_eq!(mock.live_bytes(kind), 0);

                // SAFETY: `s` is a live stream of device 0 of this mock.
                let q = unsafe { mock.allocate_async(kind, D0, size, align, s) }.unwrap();
                assert_eq!(addr(q) % align, 0);
                // SAFETY: as above.
                unsafe { mock.deallocate_async(kind, D0, q, size, align, s) }.unwrap();
            }
        }
    }
    assert_no_leak(&mock);
    assert!(mock.misuses().is_empty());
    assert!(mock.hazards().is_empty());
    assert_eq!(mock.calls(CallKind::Allocate), 4 * 13 * 4);
    assert_eq!(mock.calls(CallKind::AllocateAsync), 4 * 13 * 4);
    assert_eq!(mock.calls(CallKind::Deallocate), 4 * 13 * 4);
    assert_eq!(mock.calls(CallKind::DeallocateAsync), 4 * 13 * 4);
}

#[test]
fn live_and_peak_bytes_are_counted_per_kind() {
    let mock = MockBackend::new(1);
    let a = mock.allocate(Host, D0, 100, 8).unwrap();
    let b = mock.allocate(Host, D0, 50, 8).unwrap();
    let c = mock.allocate(Device, D0, 4096, 256).unwrap();
    assert_eq!(mock.live_bytes(Host), 150);
    assert_eq!(mock.live_bytes(Device), 4096);
    assert_eq!(mock.live_bytes(Pinned), 0);
    assert_eq!(mock.live_blocks(), 3);
    free(&mock, Host, a, 100, 8);
    assert_eq!(mock.live_bytes(Host), 50);
    assert_eq!(mock.peak_live_bytes(Host), 150);
    let d = mock.allocate(Host, D0, 20, 8).unwrap();
    assert_eq!(mock.peak_live_bytes(Host), 150, "70 live is below the peak");
    free(&mock, Host, b, 50, 8);
    free(&mock, Host, d, 20, 8);
    free(&mock, Device, c, 4096, 256);
    assert_eq!(mock.peak_live_bytes(Device), 4096);
    assert_eq!(mock.peak_live_bytes(Managed), 0);
    assert_no_leak(&mock);
}

#[test]
fn fault_injection_fails_each_memory_call_kind_with_no_effect() {
    let (mock, s) = mock_with_stream(1);

    mock.fail_nth(CallKind::Allocate, 1);
    assert_eq!(
        mock.allocate(Pinned, D0, 64, 8),
        Err(MockError::Injected(CallKind::Allocate))
    );
    mock.fail_nth(CallKind::AllocateAsync, 1);
    // SAFETY: `s` is a live stream of device 0 of this mock.
    let r = unsafe { mock.allocate_async(Device, D0, 64, 8, s) };
    assert_eq!(r, Err(MockError::Injected(CallKind::AllocateAsync)));
    assert_eq!(
        mock.live_blocks(),
        0,
        "an injected allocation allocates nothing"
    );

    let p = mock.allocate(Pinned, D0, 64, 8).unwrap();
    let q = mock.allocate(Host, D0, 64, 8).unwrap();
    mock.fail_nth(CallKind::Deallocate, 1);
    // SAFETY: `p` is a live block of these arguments.
    let r = unsafe { mock.deallocate(Pinned, D0, p, 64, 8) };
    assert_eq!(r, Err(MockError::Injected(CallKind::Deallocate)));
    assert_eq!(
        mock.live_bytes(Pinned),
        64,
        "an injected free frees nothing"
    );

    mock.fail_nth(CallKind::CopyAsync, 1);
    // SAFETY: two live, disjoint blocks of 64 bytes.
    let r = unsafe { mock.copy_async(q, p, 64, s, D0) };
    assert_eq!(r, Err(MockError::Injected(CallKind::CopyAsync)));
    assert_eq!(
        mock.pending_work(s),
        Ok(0),
        "an injected copy queues nothing"
    );

    mock.fail_nth(CallKind::DeallocateAsync, 1);
    assert_eq!(
        free_on(&mock, Pinned, p, 64, s),
        Err(MockError::Injected(CallKind::DeallocateAsync))
    );
    assert_eq!(mock.pending_free_bytes(Pinned), 0);
    assert_eq!(mock.live_bytes(Pinned), 64);

    // Every call still counts, and the blocks can be freed afterwards.
    free_on(&mock, Pinned, p, 64, s).unwrap();
    free(&mock, Host, q, 64, 8);
    assert_eq!(mock.calls(CallKind::Allocate), 3);
    assert_eq!(mock.calls(CallKind::AllocateAsync), 1);
    assert_eq!(mock.calls(CallKind::Deallocate), 2);
    assert_eq!(mock.calls(CallKind::DeallocateAsync), 2);
    assert_eq!(mock.calls(CallKind::CopyAsync), 1);
    assert_eq!(mock.armed_faults(), 0);
    assert!(
        mock.misuses().is_empty(),
        "injected failures are not misuses"
    );
    assert_no_leak(&mock);
}

#[test]
fn bad_frees_are_misuses_with_no_effect() {
    let (mock, s) = mock_with_stream(2);
    let p = mock.allocate(Host, D0, 64, 16).unwrap();
    let a = addr(p);
    let given = |kind, device, size, align| BlockLayout {
        kind,
        device,
        size,
        align,
    };
    let allocated = given(Host, D0, 64, 16);

    // SAFETY: for every free below, the mock checks every argument and refuses
    // the bad ones with no effect; that is what is tested.
    unsafe {
        let inner = p.add(8);
        assert_eq!(
            mock.deallocate(Host, D0, inner, 56, 16),
            Err(MockError::InvalidPointer(a + 8))
        );
        let mismatch = |g| MockError::BlockMismatch {
            addr: a,
            allocated,
            given: g,
        };
        for (kind, device, size, align) in [
            (Pinned, D0, 64, 16),
            (Host, D1, 64, 16),
            (Host, D0, 32, 16),
            (Host, D0, 64, 8),
        ] {
            let wrong = mock.deallocate(kind, device, p, size, align);
            assert_eq!(wrong, Err(mismatch(given(kind, device, size, align))));
        }
        assert_eq!(
            mock.deallocate(Host, DeviceId(7), p, 64, 16),
            Err(MockError::InvalidDevice(DeviceId(7)))
        );
        assert_eq!(mock.live_bytes(Host), 64, "no bad free had an effect");

        // A stream-ordered free, then a second free while it is pending.
        mock.enqueue_work(s).unwrap();
        mock.deallocate_async(Host, D0, p, 64, 16, s).unwrap();
        assert_eq!(
            mock.deallocate_async(Host, D0, p, 64, 16, s),
            Err(MockError::DoubleFree(a))
        );
        assert_eq!(
            mock.deallocate(Host, D0, p, 64, 16),
            Err(MockError::DoubleFree(a))
        );
        mock.complete_all(s).unwrap();
        // Reclaimed, and still remembered: a double free all the same.
        assert_eq!(
            mock.deallocate(Host, D0, p, 64, 16),
            Err(MockError::DoubleFree(a))
        );
    }

    // A pointer that never came from the mock.
    let mut mine = [0u8; 4];
    let foreign = NonNull::from(&mut mine).cast::<u8>();
    // SAFETY: refused by the mock.
    let r = unsafe { mock.deallocate(Host, D0, foreign, 4, 1) };
    assert_eq!(r, Err(MockError::InvalidPointer(addr(foreign))));

    let misuses = mock.misuses();
    assert_eq!(misuses.len(), 10);
    assert_eq!(misuses[0].call, CallKind::Deallocate);
    assert_eq!(
        misuses[6],
        Misuse {
            call: CallKind::DeallocateAsync,
            error: MockError::DoubleFree(a),
            harness: None,
        }
    );
    assert!(mock.hazards().is_empty());
    assert_no_leak(&mock);
}

#[test]
fn bad_allocations_are_misuses() {
    let mock = MockBackend::new(1);
    assert_eq!(
        mock.allocate(Host, D0, 0, 8),
        Err(MockError::InvalidLayout { size: 0, align: 8 })
    );
    assert_eq!(
        mock.allocate(Host, D0, 8, 3),
        Err(MockError::InvalidLayout { size: 8, align: 3 })
    );
    assert_eq!(
        mock.allocate(Host, D0, 8, 0),
        Err(MockError::InvalidLayout { size: 8, align: 0 })
    );
    assert_eq!(
        mock.allocate(Device, D0, usize::MAX - 2, 8),
        Err(MockError::InvalidLayout {
            size: usize::MAX - 2,
            align: 8
        })
    );
    assert_eq!(
        mock.allocate(Device, D1, 8, 8),
        Err(MockError::InvalidDevice(D1))
    );
    // SAFETY: a handle the mock never made, on purpose: the mock's trait
    // methods are sound for any handle (it checks each one and reports a
    // misuse; see `MockBackend`'s safety section).
    let bogus = unsafe { StreamHandle::from_raw(0x4242) };
    // SAFETY: as above.
    let r = unsafe { mock.allocate_async(Device, D0, 8, 8, bogus) };
    assert_eq!(r, Err(MockError::InvalidStream(bogus)));
    // A special stream is the device's implicit stream: allowed.
    // SAFETY: a special stream names device 0's implicit stream.
    let p = unsafe { mock.allocate_async(Device, D0, 8, 8, StreamHandle::NULL) }.unwrap();
    free_on(&mock, Device, p, 8, StreamHandle::PER_THREAD).unwrap();
    assert_eq!(mock.misuses().len(), 6);
    assert_no_leak(&mock);
}

#[test]
fn stream_ordered_free_is_reclaimed_only_once_the_stream_passes_it() {
    let (mock, s) = mock_with_stream(1);
    // SAFETY: `s` is a live stream of device 0 of this mock.
    let p = unsafe { mock.allocate_async(Device, D0, 256, 8, s) }.unwrap();
    mock.use_memory(s, p.as_ptr(), 256).unwrap();
    mock.enqueue_work(s).unwrap();
    free_on(&mock, Device, p, 256, s).unwrap();
    mock.enqueue_work(s).unwrap(); // after the free: not needed for it
    assert_eq!(mock.pending_free_bytes(Device), 256);
    assert_eq!(mock.live_bytes(Device), 256, "free-pending is still live");
    assert_eq!(mock.live_blocks(), 1);

    assert!(mock.complete_one(s).unwrap());
    assert_eq!(
        mock.pending_free_bytes(Device),
        256,
        "one item still before the free"
    );
    assert!(mock.complete_one(s).unwrap());
    assert_eq!(mock.pending_free_bytes(Device), 0);
    assert_eq!(mock.live_bytes(Device), 0);
    assert_eq!(mock.pending_work(s), Ok(1));
    assert!(
        mock.hazards().is_empty(),
        "work on the freeing stream is ordered"
    );

    // An idle stream reclaims at once.
    let q = mock.allocate(Pinned, D0, 64, 8).unwrap();
    mock.complete_all(s).unwrap();
    free_on(&mock, Pinned, q, 64, s).unwrap();
    assert_eq!(mock.live_bytes(Pinned), 0);

    // Destroying the stream, synchronizing it, or completing everything
    // reclaims too.
    for how in 0..3 {
        let t = stream(&mock, D0);
        let r = mock.allocate(Managed, D0, 32, 8).unwrap();
        mock.enqueue_work(t).unwrap();
        free_on(&mock, Managed, r, 32, t).unwrap();
        assert_eq!(mock.pending_free_bytes(Managed), 32);
        match how {
            // SAFETY: `t` is a live stream of device 0 of this mock, not used
            // after it is destroyed.
            0 => unsafe { mock.destroy_stream(t, D0) }.unwrap(),
            // SAFETY: `t` is a live stream of device 0 of this mock.
            1 => unsafe { mock.synchronize_stream(t, D0) }.unwrap(),
            _ => mock.complete_everything(),
        }
        assert_eq!(mock.pending_free_bytes(Managed), 0, "case {how}");
        assert_eq!(mock.live_bytes(Managed), 0, "case {how}");
    }
    // SAFETY: `s` is a live stream of device 0 of this mock, not used after.
    unsafe { mock.destroy_stream(s, D0) }.unwrap();
    assert!(mock.hazards().is_empty());
    assert_no_leak(&mock);
}

#[test]
fn stream_ordered_free_waits_for_an_event_the_stream_waits_on() {
    let (mock, [a, b], e, p) = two_streams_an_event_and_a_device_block(64);
    mock.enqueue_work(b).unwrap();
    // SAFETY: `e`, `a` and `b` are live handles of device 0 of this mock.
    unsafe {
        mock.record_event(e, b, D0).unwrap();
        mock.stream_wait_event(a, D0, e).unwrap();
    }
    free_on(&mock, Device, p, 64, a).unwrap();
    assert_eq!(mock.pending_free_bytes(Device), 64, "a is blocked on b");
    mock.complete_one(b).unwrap();
    // The wait resolves by itself, and the free with it.
    assert_eq!(mock.pending_free_bytes(Device), 0);
    assert_no_leak(&mock);
}

#[test]
fn hazard_sync_free_while_a_kernel_uses_the_block() {
    let (mock, s) = mock_with_stream(1);
    let p = mock.allocate(Device, D0, 128, 8).unwrap();
    mock.use_memory(s, p.as_ptr(), 128).unwrap();
    free(&mock, Device, p, 128, 8);
    assert_eq!(
        mock.hazards(),
        [Hazard {
            kind: HazardKind::FreedWhileInUse,
            addr: addr(p),
            len: 128,
            stream: None,
            conflict: Some(s),
        }]
    );
    assert_eq!(mock.live_bytes(Device), 0, "freed anyway");
    mock.clear_hazards();

    // Once the kernel has completed, the same free is fine.
    let q = mock.allocate(Device, D0, 128, 8).unwrap();
    mock.use_memory(s, q.as_ptr(), 128).unwrap();
    // SAFETY: `s` is a live stream of device 0 of this mock.
    unsafe { mock.synchronize_stream(s, D0) }.unwrap();
    free(&mock, Device, q, 128, 8);
    assert!(mock.hazards().is_empty());
    assert!(mock.misuses().is_empty());
}

/// With `set_fail_on_hazard`, the call that finds a hazard panics with it,
/// once the machine is released: the machine stays usable, the hazard is
/// recorded as usual, and a later call that finds none does not panic.
/// `set_checking` turns manual completion on with it.
#[test]
fn a_hazard_panics_where_it_is_found_when_asked() {
    let (mock, s) = mock_with_stream(1);
    mock.set_policy(CompletionPolicy::Immediate);
    mock.set_checking(true);
    let p = mock.allocate(Device, D0, 128, 8).unwrap();
    mock.use_memory(s, p.as_ptr(), 128).unwrap();
    assert_eq!(
        mock.pending_work(s),
        Ok(1),
        "checking mode completes lazily"
    );
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        free(&mock, Device, p, 128, 8);
    }))
    .expect_err("the free under the kernel panics");
    let message = panicked.downcast_ref::<String>().expect("a message");
    assert!(message.contains("FreedWhileInUse"), "{message}");
    assert_eq!(mock.hazards().len(), 1, "recorded too");
    // Still usable: a correctly ordered free panics no more.
    let q = mock.allocate(Device, D0, 128, 8).unwrap();
    mock.use_memory(s, q.as_ptr(), 128).unwrap();
    // SAFETY: `s` is a live stream of device 0 of this mock.
    unsafe { mock.synchronize_stream(s, D0) }.unwrap();
    free(&mock, Device, q, 128, 8);
    mock.set_checking(false);
    assert_eq!(mock.hazards().len(), 1);
}

#[test]
fn hazard_async_free_on_one_stream_while_another_uses_the_block() {
    let mock = MockBackend::new(1);
    let (a, b) = (stream(&mock, D0), stream(&mock, D0));
    let p = mock.allocate(Device, D0, 64, 8).unwrap();
    mock.use_memory(b, p.as_ptr(), 64).unwrap();
    free_on(&mock, Device, p, 64, a).unwrap();
    let hazards = mock.hazards();
    assert_eq!(hazards.len(), 1);
    assert_eq!(hazards[0].kind, HazardKind::FreedWhileInUse);
    assert_eq!((hazards[0].stream, hazards[0].conflict), (Some(a), Some(b)));
    assert_no_leak_once_all_has_run(&mock);
}

#[test]
fn no_hazard_when_the_freeing_stream_waits_on_an_event_after_the_use() {
    let (mock, [a, b], e, p) = two_streams_an_event_and_a_device_block(64);
    mock.use_memory(b, p.as_ptr(), 64).unwrap();
    // SAFETY: `e`, `a` and `b` are live handles of device 0 of this mock.
    unsafe {
        mock.record_event(e, b, D0).unwrap(); // after the use
        mock.stream_wait_event(a, D0, e).unwrap();
    }
    free_on(&mock, Device, p, 64, a).unwrap();
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    assert_eq!(mock.pending_free_bytes(Device), 64);
    mock.complete_one(b).unwrap();
    assert_no_leak(&mock);
}

#[test]
fn hazard_when_the_event_was_recorded_before_the_use() {
    let (mock, [a, b], e, p) = two_streams_an_event_and_a_device_block(64);
    mock.enqueue_work(b).unwrap();
    // SAFETY: `e` and `b` are live handles of device 0 of this mock.
    unsafe { mock.record_event(e, b, D0) }.unwrap(); // before the use: orders nothing
    mock.use_memory(b, p.as_ptr(), 64).unwrap();
    // SAFETY: `a` and `e` are live handles of device 0 of this mock.
    unsafe { mock.stream_wait_event(a, D0, e) }.unwrap();
    free_on(&mock, Device, p, 64, a).unwrap();
    assert_eq!(mock.hazards().len(), 1);
    assert_no_leak_once_all_has_run(&mock);
}

#[test]
fn ordering_follows_waits_transitively() {
    let mock = MockBackend::new(1);
    let (a, b, c) = (stream(&mock, D0), stream(&mock, D0), stream(&mock, D0));
    let (e1, e2) = (event(&mock, D0), event(&mock, D0));
    let p = mock.allocate(Device, D0, 64, 8).unwrap();
    mock.use_memory(b, p.as_ptr(), 64).unwrap();
    // SAFETY: the streams and events are live handles of device 0 of this mock.
    unsafe {
        mock.record_event(e1, b, D0).unwrap();
        mock.stream_wait_event(c, D0, e1).unwrap();
        mock.record_event(e2, c, D0).unwrap();
        mock.stream_wait_event(a, D0, e2).unwrap();
    }
    free_on(&mock, Device, p, 64, a).unwrap(); // a → c → b: ordered
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    assert_no_leak_once_all_has_run(&mock);
}

#[test]
fn hazard_concurrent_use_on_two_streams_unless_ordered() {
    let (mock, [a, b], e, p) = two_streams_an_event_and_a_device_block(256);
    mock.use_memory(a, p.as_ptr(), 128).unwrap();
    // Another part of the block: no conflict.
    // SAFETY: 128 is inside the 256-byte block.
    let upper = unsafe { p.as_ptr().add(128) };
    mock.use_memory(b, upper, 128).unwrap();
    assert!(mock.hazards().is_empty());
    // The same part without a wait: a race.
    mock.use_memory(b, p.as_ptr(), 64).unwrap();
    let h = mock.hazards();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].kind, HazardKind::ConcurrentUse);
    assert_eq!((h[0].stream, h[0].conflict), (Some(b), Some(a)));
    mock.clear_hazards();
    // b waits for a's use first: ordered (b's earlier use of the same range is
    // on b itself, hence ordered too).
    // SAFETY: `e`, `a` and `b` are live handles of device 0 of this mock.
    unsafe {
        mock.record_event(e, a, D0).unwrap();
        mock.stream_wait_event(b, D0, e).unwrap();
    }
    mock.use_memory(b, p.as_ptr(), 128).unwrap();
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    mock.complete_everything();
    free(&mock, Device, p, 256, 8);
    assert!(mock.hazards().is_empty());
}

#[test]
fn hazard_host_access_to_a_block_a_pending_kernel_uses() {
    let (mock, s) = mock_with_stream(1);
    let p = mock.allocate(Pinned, D0, 64, 8).unwrap();
    mock.host_access(p.as_ptr(), 64).unwrap();
    assert!(mock.hazards().is_empty(), "nothing uses it yet");
    mock.use_memory(s, p.as_ptr(), 32).unwrap();
    // SAFETY: offset 32 is inside the block.
    let tail = unsafe { p.as_ptr().add(32) };
    mock.host_access(tail, 32).unwrap();
    assert!(mock.hazards().is_empty(), "the other half is not in use");
    mock.host_access(p.as_ptr(), 8).unwrap();
    let h = mock.hazards();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].kind, HazardKind::HostAccessWhileInUse);
    assert_eq!((h[0].stream, h[0].conflict), (None, Some(s)));
    mock.clear_hazards();
    mock.complete_all(s).unwrap();
    mock.host_access(p.as_ptr(), 64).unwrap();
    assert!(mock.hazards().is_empty());

    // The host cannot touch device memory, and must stay inside a block.
    let d = mock.allocate(Device, D0, 16, 8).unwrap();
    mock.host_access(d.as_ptr(), 16).unwrap();
    mock.host_access(p.as_ptr(), 65).unwrap();
    let kinds: Vec<HazardKind> = mock.hazards().iter().map(|h| h.kind).collect();
    assert_eq!(
        kinds,
        [HazardKind::HostAccessToDevice, HazardKind::OutOfBounds]
    );
    free(&mock, Pinned, p, 64, 8);
    free(&mock, Device, d, 16, 8);
    assert_no_leak(&mock);
}

#[test]
fn hazard_use_after_free() {
    let (mock, s) = mock_with_stream(1);
    // Free-pending: a use on the freeing stream after the free is still late.
    let p = mock.allocate(Device, D0, 64, 8).unwrap();
    let a = p.as_ptr().cast_const();
    mock.enqueue_work(s).unwrap();
    free_on(&mock, Device, p, 64, s).unwrap();
    mock.use_memory(s, a, 64).unwrap();
    mock.host_access(a, 1).unwrap();
    // Reclaimed: refused, and recorded all the same.
    mock.complete_all(s).unwrap();
    assert_eq!(
        mock.use_memory(s, a, 64),
        Err(MockError::UseAfterFree {
            addr: a.addr(),
            len: 64
        })
    );
    assert_eq!(mock.pending_work(s), Ok(0), "nothing queued");
    let h = mock.hazards();
    assert_eq!(h.len(), 3);
    assert!(
        h.iter().all(|h| h.kind == HazardKind::UsedAfterFree),
        "{h:?}"
    );
    assert_eq!(h[0].stream, Some(s));
    assert_eq!(h[1].stream, None);
    mock.complete_all(s).unwrap();
    assert_no_leak(&mock);
}

#[test]
fn copy_async_round_trips_bytes_and_tracks_both_ranges() {
    let (mock, s) = mock_with_stream(1);
    let data: Vec<u8> = (0..200u8).collect();
    // SAFETY: `s` is a live stream of device 0 of this mock.
    let dev = unsafe { mock.allocate_async(Device, D0, 256, 256, s) }.unwrap();
    let host = mock.allocate(Pinned, D0, 200, 8).unwrap();

    // SAFETY: `data` is 200 readable bytes of ours and `dev` is a live block
    // of 256; they cannot overlap; nothing else touches them meanwhile.
    unsafe { mock.copy_async(dev, NonNull::from(&data[..]).cast(), 200, s, D0) }.unwrap();
    // SAFETY: `dev` and `host` are live, disjoint blocks of at least 200 bytes.
    unsafe { mock.copy_async(host, dev, 200, s, D0) }.unwrap();
    assert_eq!(mock.pending_work(s), Ok(2));

    // Both blocks are in use until the copies complete.
    mock.host_access(host.as_ptr(), 200).unwrap();
    assert_eq!(mock.hazards().len(), 1);
    mock.clear_hazards();
    // SAFETY: `s` is a live stream of device 0 of this mock.
    unsafe { mock.synchronize_stream(s, D0) }.unwrap();
    mock.host_access(host.as_ptr(), 200).unwrap();
    assert!(mock.hazards().is_empty());
    // SAFETY: the pinned block holds 200 initialised bytes and the copies are done.
    let back = unsafe { core::slice::from_raw_parts(host.as_ptr(), 200) };
    assert_eq!(back, &data[..]);

    // Two streams reading the device block at once is fine; a kernel on
    // another stream writing it while a copy reads it is a race.
    let t = stream(&mock, D0);
    let other = mock.allocate(Pinned, D0, 200, 8).unwrap();
    // SAFETY: as above; `other` is a third live block of 200 bytes.
    unsafe {
        mock.copy_async(host, dev, 200, s, D0).unwrap();
        mock.copy_async(other, dev, 200, t, D0).unwrap();
    }
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    mock.use_memory(t, dev.as_ptr(), 8).unwrap();
    assert_eq!(mock.hazards()[0].kind, HazardKind::ConcurrentUse);
    mock.complete_everything();

    free_on(&mock, Device, dev, 256, s).unwrap_err(); // wrong alignment given
                                                      // SAFETY: live block with its true layout.
    unsafe { mock.deallocate_async(Device, D0, dev, 256, 256, s) }.unwrap();
    free(&mock, Pinned, host, 200, 8);
    free(&mock, Pinned, other, 200, 8);
    assert_eq!(mock.misuses().len(), 1);
    assert_no_leak(&mock);
}

#[test]
fn copy_async_rejects_bad_ranges() {
    let (mock, s) = mock_with_stream(1);
    let a = mock.allocate(Host, D0, 64, 8).unwrap();
    let b = mock.allocate(Device, D0, 64, 8).unwrap();
    let mut pageable = [0u8; 64];
    let foreign = NonNull::from(&mut pageable).cast::<u8>();
    let bad = |p: NonNull<u8>, len| MockError::InvalidRange { addr: addr(p), len };
    // SAFETY: a handle the mock never made, on purpose: the mock's trait
    // methods are sound for any handle (it checks each one and reports a
    // misuse; see `MockBackend`'s safety section).
    let bogus = unsafe { StreamHandle::from_raw(0x4242) };
    // SAFETY: every copy below is refused by the mock's checks before any byte
    // moves, or copies between live disjoint ranges.
    unsafe {
        // Past the end of the destination block, or of the source block.
        assert_eq!(mock.copy_async(b, a, 65, s, D0), Err(bad(b, 65)));
        assert_eq!(
            mock.copy_async(b.add(1), a, 64, s, D0),
            Err(bad(b.add(1), 64))
        );
        assert_eq!(
            mock.copy_async(b, a.add(8), 64, s, D0),
            Err(bad(a.add(8), 64))
        );
        // A destination outside every block: refused, and the error says why.
        let untracked = mock.copy_async(foreign, a, 8, s, D0).unwrap_err();
        assert_eq!(
            untracked,
            MockError::UntrackedDestination {
                addr: addr(foreign),
                len: 8
            }
        );
        assert!(
            untracked.to_string().contains("no memory of this mock"),
            "{untracked}"
        );
        // Overlapping ranges in one block.
        assert_eq!(
            mock.copy_async(a.add(4), a, 8, s, D0),
            Err(MockError::OverlappingCopy {
                dst: addr(a) + 4,
                src: addr(a),
                len: 8
            })
        );
        // A free-pending block, as source or destination.
        mock.enqueue_work(s).unwrap();
        mock.deallocate_async(Device, D0, b, 64, 8, s).unwrap();
        assert_eq!(mock.copy_async(a, b, 8, s, D0), Err(bad(b, 8)));
        assert_eq!(mock.copy_async(b, a, 8, s, D0), Err(bad(b, 8)));
        // Bad stream and device.
        assert_eq!(
            mock.copy_async(a, foreign, 8, bogus, D0),
            Err(MockError::InvalidStream(bogus))
        );
        assert_eq!(
            mock.copy_async(a, foreign, 8, s, D1),
            Err(MockError::InvalidDevice(D1))
        );
        // Fine: a foreign source within a live destination, and zero bytes.
        mock.copy_async(a, foreign, 64, s, D0).unwrap();
        mock.copy_async(a, foreign, 0, s, D0).unwrap();
    }
    assert_eq!(mock.misuses().len(), 9);
    assert!(mock.misuses().iter().all(|m| m.call == CallKind::CopyAsync));
    assert!(mock.hazards().is_empty());
    mock.complete_all(s).unwrap();
    free(&mock, Host, a, 64, 8);
    assert_no_leak(&mock);
}

#[test]
fn immediate_policy_completes_uses_and_frees_at_once() {
    let mock = MockBackend::new(1);
    mock.set_policy(CompletionPolicy::Immediate);
    let (a, b) = (stream(&mock, D0), stream(&mock, D0));
    let p = mock.allocate(Device, D0, 64, 8).unwrap();
    mock.use_memory(a, p.as_ptr(), 64).unwrap();
    mock.use_memory(b, p.as_ptr(), 64).unwrap();
    free_on(&mock, Device, p, 64, b).unwrap();
    assert!(mock.hazards().is_empty());
    assert_no_leak(&mock);
}

#[test]
fn dropping_the_mock_frees_blocks_still_allocated() {
    // Run under Miri, this would report a leak if the drop did not free them.
    let (mock, s) = mock_with_stream(1);
    let clone = mock.clone();
    let _ = mock.allocate(Host, D0, 1024, 64).unwrap();
    let p = mock.allocate(Device, D0, 64, 8).unwrap();
    mock.enqueue_work(s).unwrap();
    free_on(&mock, Device, p, 64, s).unwrap();
    drop(mock);
    assert_eq!(clone.live_blocks(), 2, "a clone keeps the machine alive");
    drop(clone);
}

#[test]
fn many_threads_allocate_use_and_free() {
    const THREADS: usize = if cfg!(miri) { 3 } else { 8 };
    const ROUNDS: usize = if cfg!(miri) { 10 } else { 500 };
    let mock = MockBackend::new(1);
    on_threads(&mock, THREADS, |mock, t| {
        let s = stream(&mock, D0);
        let kind = MemoryKind::ALL[t % 4];
        for i in 0..ROUNDS {
            let size = 8 + (i % 7) * 24;
            // SAFETY: `s` is a live stream of device 0 of this mock.
            let p = unsafe { mock.allocate_async(kind, D0, size, 8, s) }.unwrap();
            mock.use_memory(s, p.as_ptr(), size).unwrap();
            if i % 3 == 0 {
                mock.complete_one(s).unwrap();
            }
            // SAFETY: `p` is ours; only work on `s` used it.
            unsafe { mock.deallocate_async(kind, D0, p, size, 8, s) }.unwrap();
        }
        // SAFETY: `s` is a live stream of device 0 of this mock, not used
        // after.
        unsafe { mock.destroy_stream(s, D0) }.unwrap();
    });
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    assert!(mock.misuses().is_empty());
    assert_no_leak(&mock);
    let total: u64 = [CallKind::AllocateAsync, CallKind::DeallocateAsync]
        .iter()
        .map(|&k| mock.calls(k))
        .sum();
    assert_eq!(total, (2 * THREADS * ROUNDS) as u64);
}

#[test]
#[cfg_attr(miri, ignore = "Miri aborts on allocations past its address space")]
fn out_of_memory_is_an_error_but_not_a_misuse() {
    let mock = MockBackend::new(1);
    let huge = isize::MAX as usize - 4096;
    assert_eq!(
        mock.allocate(Host, D0, huge, 8),
        Err(MockError::OutOfMemory {
            size: huge,
            align: 8
        })
    );
    assert!(mock.misuses().is_empty());
    assert_eq!(mock.calls(CallKind::Allocate), 1);
    assert_no_leak(&mock);
}

// ---- the simulated kernel: `launch_map` ------------------------------------

/// The order of a live stream `s` of this mock on `d`.
fn order_of(
    mock: &MockBackend,
    s: StreamHandle,
    d: DeviceId,
) -> gpupool_core::AccessOrder<'static> {
    // SAFETY: `s` is a live stream of `mock` on `d`; the tests below never
    // destroy it while the order is in use (and the mock checks every handle
    // it is given anyway).
    unsafe { gpupool_core::AccessOrder::from_raw(mock, s, d) }
}

#[test]
fn launch_map_computes_at_once_and_queues_one_item_on_its_stream() {
    let (mock, s) = mock_with_stream(1);
    let order = order_of(&mock, s, D0);
    let scratch = gpupool_core::Scratchpad::new(&mock, order).unwrap();
    let x = scratch.to_device(&[1u32, 2, 3, 4]).unwrap();
    let y = scratch.device::<f64>(4).unwrap();
    mock.complete_all(s).unwrap();
    let calls = mock.total_calls();
    mock.launch_map(&order, &x, &y, |v| f64::from(v) * 1.5)
        .unwrap();
    assert_eq!(mock.total_calls(), calls, "a harness call: not counted");
    assert_eq!(
        mock.pending_work(s).unwrap(),
        1,
        "one work item on the stream"
    );
    // Read in the kernel's order: after it (the read-back waits for `s`).
    assert_eq!(scratch.to_host(&y).unwrap(), [1.5, 3.0, 4.5, 6.0]);
    assert_eq!(mock.pending_work(s).unwrap(), 0);
    // In place: source and destination the same memory.
    mock.launch_map(&order, &x, &x, |v| v * 10).unwrap();
    assert_eq!(scratch.to_host(&x).unwrap(), [10, 20, 30, 40]);
    // Empty slices: one item, and `f` is not called.
    let none = scratch.device::<u32>(0).unwrap();
    let before = mock.pending_work(s).unwrap();
    mock.launch_map(&order, &none, &none, |_| -> u32 { unreachable!() })
        .unwrap();
    assert_eq!(mock.pending_work(s).unwrap(), before + 1);
    drop(scratch);
    mock.complete_everything();
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    assert!(mock.misuses().is_empty());
    assert_no_leak(&mock);
}

#[test]
fn launch_map_refuses_bad_orders_and_slices_and_touches_nothing() {
    let (mock, s) = mock_with_stream(2);
    let order = order_of(&mock, s, D0);
    let scratch = gpupool_core::Scratchpad::new(&mock, order).unwrap();
    let x = scratch.to_device(&[1u8, 2, 3]).unwrap();
    let y = scratch.to_device(&[0u8; 3]).unwrap();
    let short = scratch.device::<u8>(2).unwrap();
    mock.complete_all(s).unwrap();
    let other = MockBackend::new(1);
    let other_s = stream(&other, D0);
    let other_scratch =
        gpupool_core::Scratchpad::new(&other, order_of(&other, other_s, D0)).unwrap();
    let foreign = other_scratch.to_device(&[5u8; 3]).unwrap();
    let config = gpupool_core::ScratchpadConfig {
        device: Some(D1),
        ..Default::default()
    };
    let on_one =
        gpupool_core::Scratchpad::with_config(&mock, gpupool_core::AccessOrder::host(), config)
            .unwrap();
    let d1 = on_one.to_device(&[7u8; 3]).unwrap();
    let id = |v: u8| v;
    let cases = [
        (
            mock.launch_map(&gpupool_core::AccessOrder::host(), &x, &y, id),
            MockError::HostOrder,
        ),
        (
            mock.launch_map(&order_of(&other, other_s, D0), &x, &y, id),
            MockError::ForeignOrder,
        ),
        (
            mock.launch_map(&order, &x, &short, id),
            MockError::LengthMismatch { src: 3, dst: 2 },
        ),
        (
            mock.launch_map(&order, &foreign, &y, id),
            MockError::NotDeviceMemory {
                addr: foreign.addr(),
                len: 3,
            },
        ),
        (
            mock.launch_map(&order, &x, &d1, id),
            MockError::CrossDevice {
                given: D0,
                actual: D1,
            },
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, Err(want));
    }
    // A stream destroyed meanwhile (an order made unsafely) is refused too.
    let gone = stream(&mock, D0);
    // SAFETY: a live stream of this mock, destroyed once; the order made
    // from it below is only handed to the mock, which checks it.
    unsafe { mock.destroy_stream(gone, D0) }.unwrap();
    assert_eq!(
        mock.launch_map(&order_of(&mock, gone, D0), &x, &y, id),
        Err(MockError::InvalidStream(gone))
    );
    assert_eq!(mock.pending_work(s).unwrap(), 0, "nothing queued");
    assert_eq!(scratch.to_host(&y).unwrap(), [0; 3], "nothing written");
    // A panicking function: nothing written or queued, and the mock still works.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        mock.launch_map(&order, &x, &y, |v| {
            if v == 2 {
                panic!("kernel bug")
            } else {
                v
            }
        })
    }));
    assert!(panicked.is_err());
    assert_eq!(mock.pending_work(s).unwrap(), 0);
    assert_eq!(scratch.to_host(&y).unwrap(), [0; 3]);
    mock.launch_map(&order, &x, &y, |v| v + 1).unwrap();
    assert_eq!(scratch.to_host(&y).unwrap(), [2, 3, 4]);
    assert!(mock.misuses().is_empty(), "harness errors are not misuses");
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
}

#[test]
fn launch_map_uses_its_ranges_until_it_completes() {
    let mock = MockBackend::new(1);
    let (a, b) = (stream(&mock, D0), stream(&mock, D0));
    let scratch = gpupool_core::Scratchpad::new(&mock, order_of(&mock, a, D0)).unwrap();
    let x = scratch.to_device(&[1u32; 16]).unwrap();
    let y = scratch.device::<u32>(16).unwrap();
    mock.complete_all(a).unwrap();
    // The kernel on `b` reads `x` and writes `y`, still queued.
    mock.launch_map(&order_of(&mock, b, D0), &x, &y, |v| v + 1)
        .unwrap();
    // Another stream writing what it reads, or touching what it writes,
    // without a wait: both races are reported, naming `b`.
    mock.use_memory(a, x.as_ptr().cast(), x.byte_len()).unwrap();
    mock.use_memory(a, y.as_ptr().cast(), 4).unwrap();
    let kinds = hazard_kinds(&mock);
    assert_eq!(
        kinds,
        [
            (HazardKind::ConcurrentUse, Some(b)),
            (HazardKind::ConcurrentUse, Some(b))
        ]
    );
    mock.clear_hazards();
    // Once `b` has completed it, nothing conflicts any more.
    mock.complete_all(b).unwrap();
    mock.complete_all(a).unwrap();
    mock.use_memory(a, y.as_ptr().cast(), y.byte_len()).unwrap();
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    // A copy on `a` that reads the result while the kernel on `b` still
    // writes it is flagged too.
    mock.complete_all(a).unwrap();
    mock.launch_map(&order_of(&mock, b, D0), &x, &y, |v| v * 3)
        .unwrap();
    let staged = mock.allocate(Pinned, D0, y.byte_len(), 8).unwrap();
    // SAFETY: `staged` is a live pinned block of `y`'s size, `y` live device
    // memory of this mock; they do not overlap; `a` is a live stream of D0.
    unsafe {
        mock.copy_async(
            staged,
            NonNull::new(y.as_ptr().cast()).unwrap(),
            y.byte_len(),
            a,
            D0,
        )
    }
    .unwrap();
    assert_eq!(
        mock.hazards().len(),
        1,
        "a copy on `a` reads what `b` writes"
    );
    mock.complete_everything();
    free(&mock, Pinned, staged, y.byte_len(), 8);
}
