//! Mock-only: the scratchpad (DALI's `DynamicScratchpad`, and gpupool's
//! differences) where only the mock can see it: upstream call kinds, live and
//! free-pending bytes, hazards, injected failures, copies checked byte for
//! byte. What can be seen through the scratchpad's own API is in the generic
//! suite, `suite/scratch.rs`.
use std::mem::MaybeUninit;

use gpupool_core::{
    AccessOrder, DeviceId, DeviceSlice, Error, KernelContext, MemoryBackend, MemoryKind,
    Scratchpad, ScratchpadConfig,
};
use gpupool_mock::{CallKind, MockBackend};
use gpupool_tests::{error_chain, mock, with_scratchpad};

/// Streams straight from the mock (see `MockStream`).
use gpupool_tests::MockStream as Stream;

const KINDS: [MemoryKind; 4] = MemoryKind::ALL;
/// Warm reset rounds counted for upstream calls (fewer under Miri: after the
/// first few, each round takes the paths the ones before it took).
const WARM_ROUNDS: usize = if cfg!(miri) { 6 } else { 1000 };

fn upstream_calls(gpu: &MockBackend) -> u64 {
    [
        CallKind::Allocate,
        CallKind::AllocateAsync,
        CallKind::Deallocate,
        CallKind::DeallocateAsync,
    ]
    .iter()
    .map(|&k| gpu.calls(k))
    .sum()
}

fn live_bytes(gpu: &MockBackend) -> usize {
    KINDS.iter().map(|&k| gpu.live_bytes(k)).sum()
}

/// Runs `warm_up` rounds on `scratch`, each `round`, then `s` finishing it,
/// then a reset; then [`WARM_ROUNDS`] more, each checked by `check_warm`
/// before it finishes. Returns the upstream calls those warm rounds made.
fn upstream_calls_when_warm(
    gpu: &MockBackend,
    s: Stream<'_>,
    scratch: &mut Scratchpad<'_, MockBackend>,
    warm_up: usize,
    round: impl Fn(&Scratchpad<'_, MockBackend>),
    check_warm: impl Fn(&Scratchpad<'_, MockBackend>),
) -> u64 {
    for _ in 0..warm_up {
        round(scratch);
        gpu.complete_all(s.get()).unwrap();
        scratch.reset().unwrap();
    }
    let before = upstream_calls(gpu);
    for _ in 0..WARM_ROUNDS {
        round(scratch);
        check_warm(scratch);
        gpu.complete_all(s.get()).unwrap();
        scratch.reset().unwrap();
    }
    upstream_calls(gpu) - before
}

#[test]
fn each_kind_takes_its_first_block_in_its_allocation_order() {
    with_scratchpad(|gpu, _, scratch| {
        scratch.pinned::<u8>(10).unwrap();
        scratch.device::<u8>(10).unwrap();
        assert_eq!(gpu.calls(CallKind::Allocate), 1, "pinned: host order");
        assert_eq!(
            gpu.calls(CallKind::AllocateAsync),
            1,
            "device: the device order"
        );
    });
}

#[test]
fn growth_doubles_from_64_kib_until_the_request_fits_then_doubles_again() {
    let gpu = mock(1);
    let scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
    assert_eq!(scratch.first_block_size(MemoryKind::Host), 64 * 1024);
    let k = 1024;
    scratch.alloc(MemoryKind::Host, 1, 1).unwrap();
    scratch.alloc(MemoryKind::Host, 64 * k, 1).unwrap(); // does not fit the rest
    scratch.alloc(MemoryKind::Host, 200 * k, 1).unwrap(); // next 256 KiB
    scratch.alloc(MemoryKind::Host, 1000 * k, 1).unwrap(); // 512 KiB doubles to 1 MiB
    scratch.alloc(MemoryKind::Host, 1, 1).unwrap(); // fits in the 1 MiB block
    let sizes: Vec<usize> = scratch
        .blocks(MemoryKind::Host)
        .iter()
        .map(|b| b.1)
        .collect();
    assert_eq!(sizes, [64 * k, 128 * k, 256 * k, 1024 * k]);
    assert_eq!(
        gpu.live_bytes(MemoryKind::Host),
        sizes.iter().sum::<usize>()
    );
}

#[test]
fn bad_alignment_and_sizes_are_typed_errors_and_the_scratchpad_stays_usable() {
    let gpu = mock(1);
    let scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
    for align in [0, 3, 6, 1000] {
        assert_eq!(
            scratch.alloc(MemoryKind::Host, 8, align).unwrap_err(),
            Error::InvalidAlignment { align }
        );
    }
    assert_eq!(
        scratch
            .alloc(MemoryKind::Host, isize::MAX as usize + 1, 1)
            .unwrap_err(),
        Error::SizeOverflow
    );
    assert_eq!(
        scratch.host::<u64>(usize::MAX / 4).unwrap_err(),
        Error::SizeOverflow
    );
    assert_eq!(
        scratch.uninit::<u8>(MemoryKind::Device, 4).unwrap_err(),
        Error::NotHostAccessible
    );
    assert_eq!(gpu.calls(CallKind::Allocate), 0);
    let ok = scratch.copy_of(MemoryKind::Host, &[1u32, 2, 3]).unwrap();
    assert_eq!(ok, &[1, 2, 3]);
}

#[test]
fn a_failing_upstream_is_an_error_that_changes_nothing_and_leaks_nothing() {
    for kind in KINDS {
        for op in [CallKind::Allocate, CallKind::AllocateAsync] {
            let gpu = mock(1);
            let s = Stream::new(&gpu);
            {
                let scratch = Scratchpad::new(&gpu, s.order()).unwrap();
                scratch.alloc(kind, 100, 8).unwrap();
                gpu.fail_nth(op, 1);
                let big = scratch.alloc(kind, 1 << 20, 8);
                if gpu.armed_faults() == 0 {
                    assert_eq!(big.unwrap_err().backend_op(), Some(op), "{kind:?}");
                    assert_eq!(
                        scratch.stats().blocks[kind.index()],
                        1,
                        "{kind:?}: unchanged"
                    );
                    scratch.alloc(kind, 1 << 20, 8).unwrap();
                } else {
                    big.unwrap(); // this kind does not make that call
                    gpu.clear_faults();
                }
                assert_eq!(scratch.stats().blocks[kind.index()], 2);
            }
            gpu.complete_everything();
            assert_eq!(live_bytes(&gpu), 0, "{kind:?} {op:?}: leaked");
        }
    }
}

#[test]
fn drop_releases_every_block_in_its_release_order() {
    let gpu = mock(1);
    let s = Stream::new(&gpu);
    {
        let scratch = Scratchpad::new(&gpu, s.order()).unwrap();
        for kind in KINDS {
            scratch.alloc(kind, 100_000, 64).unwrap();
        }
        gpu.use_memory(s.get(), scratch.device::<u8>(16).unwrap().as_ptr(), 16)
            .unwrap();
    }
    // Host blocks are freed at once; pinned, device and managed in stream order.
    assert_eq!(gpu.live_bytes(MemoryKind::Host), 0);
    assert!(gpu.pending_free_bytes(MemoryKind::Device) > 0);
    assert_eq!(gpu.calls(CallKind::DeallocateAsync), 3);
    gpu.complete_all(s.get()).unwrap();
    assert_eq!(live_bytes(&gpu), 0);
    assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
}

#[test]
fn a_scratchpad_can_be_moved_while_its_memory_stays_valid() {
    let gpu = mock(1);
    let scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
    let first = scratch.alloc(MemoryKind::Host, 16, 8).unwrap().unwrap();
    let moved = Box::new(scratch);
    let second = moved.alloc(MemoryKind::Host, 16, 8).unwrap().unwrap();
    assert_eq!(second.as_ptr() as usize, first.as_ptr() as usize + 16);
    let again = *moved;
    drop(again);
    assert_eq!(live_bytes(&gpu), 0);
}

#[test]
fn reset_reuses_blocks_and_a_steady_loop_asks_upstream_for_nothing() {
    with_scratchpad(|gpu, s, mut scratch| {
        let round = |scratch: &Scratchpad<'_, MockBackend>| {
            for (i, kind) in KINDS.into_iter().enumerate() {
                for j in 0..4 {
                    let bytes = 1000 * (i + 1) + 30_000 * j;
                    let p = scratch.alloc(kind, bytes, 64).unwrap().unwrap();
                    if kind.is_host_accessible() {
                        gpu.host_access(p.as_ptr(), bytes).unwrap();
                    }
                    gpu.use_memory(s.get(), p.as_ptr(), bytes).unwrap();
                }
            }
        };
        let warm = upstream_calls_when_warm(gpu, s, &mut scratch, 3, round, |_| {});
        assert_eq!(warm, 0, "upstream calls in the warm rounds");
        assert_eq!(
            scratch.stats().blocks,
            [1, 1, 1, 1],
            "converged to one block per kind"
        );
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
        drop(scratch);
        gpu.complete_everything();
        assert_eq!(live_bytes(gpu), 0);
    });
}

#[test]
fn a_pinned_block_still_read_by_the_stream_is_not_handed_out_again() {
    with_scratchpad(|gpu, s, mut scratch| {
        let p = scratch.pinned::<u8>(4096).unwrap().as_mut_ptr() as *const u8;
        gpu.use_memory(s.get(), p, 4096).unwrap(); // a copy still reading it
        scratch.reset().unwrap();
        // The stream has not passed the reset: the block must not come back.
        let q = scratch.pinned::<u8>(4096).unwrap().as_ptr() as *const u8;
        assert_ne!(q, p);
        gpu.host_access(q, 4096).unwrap();
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
        // Once the stream has passed it, a reset's block is reused.
        gpu.complete_all(s.get()).unwrap();
        scratch.reset().unwrap();
        let r = scratch.pinned::<u8>(4096).unwrap().as_ptr() as *const u8;
        assert_eq!(r, q);
    });
}

#[test]
fn the_hazard_detector_reports_a_wrong_release_order() {
    // A test double of a mistake: pinned memory declared released in host order
    // while the stream still reads it. The mock must report the reuse.
    let gpu = mock(1);
    let s = Stream::new(&gpu);
    let config = ScratchpadConfig {
        pinned_release: Some(AccessOrder::host()),
        ..ScratchpadConfig::default()
    };
    let mut scratch = Scratchpad::with_config(&gpu, s.order(), config).unwrap();
    let p = scratch.pinned::<u8>(4096).unwrap().as_ptr() as *const u8;
    gpu.use_memory(s.get(), p, 4096).unwrap();
    scratch.reset().unwrap(); // host order: reused at once
    let q = scratch.pinned::<u8>(4096).unwrap().as_ptr() as *const u8;
    assert_eq!(q, p);
    gpu.host_access(q, 4096).unwrap();
    assert!(
        !gpu.hazards().is_empty(),
        "the detector missed a reuse while in use"
    );
}

/// `on_device` read back by hand: copied with the backend's `copy_async` on
/// `s` into new host scratch of `scratch`, once `s` has run the copy.
fn copied_back<'a, T>(
    gpu: &MockBackend,
    s: Stream<'_>,
    scratch: &'a Scratchpad<'_, MockBackend>,
    on_device: &DeviceSlice<'_, T>,
) -> &'a [T] {
    let back = scratch.host::<T>(on_device.len()).unwrap();
    // SAFETY: both ranges are live scratch blocks of `on_device.byte_len()`
    // bytes, not overlapping; `s` is a live stream of device 0 of this mock.
    unsafe {
        gpu.copy_async(
            std::ptr::NonNull::new(back.as_mut_ptr().cast()).unwrap(),
            std::ptr::NonNull::new(on_device.as_ptr().cast()).unwrap(),
            on_device.byte_len(),
            s.get(),
            DeviceId(0),
        )
        .unwrap();
    }
    gpu.complete_all(s.get()).unwrap();
    // SAFETY: the copy wrote every element.
    unsafe { &*(back as *const [MaybeUninit<T>] as *const [T]) }
}

#[test]
fn copy_helpers_round_trip_data_exactly() {
    with_scratchpad(|gpu, s, scratch| {
        let src: Vec<u32> = (0..1000).map(|i| i * 7 + 1).collect();
        let on_device = scratch.to_device(&src).unwrap(); // in the device order: `s`
        assert_eq!(copied_back(gpu, s, &scratch, &on_device), &src[..]);

        let parts: [&[u16]; 3] = [&[1, 2, 3], &[], &[9, 8]];
        let (host, ranges) = scratch
            .to_contiguous_host(MemoryKind::Pinned, &parts)
            .unwrap();
        assert_eq!(host, &[1, 2, 3, 9, 8]);
        assert_eq!(ranges, [0..3, 3..3, 3..5]);

        let copies = gpu.calls(CallKind::CopyAsync);
        let (dev, ranges) = scratch.to_contiguous_device(&parts).unwrap();
        assert_eq!(
            gpu.calls(CallKind::CopyAsync),
            copies + 1,
            "one copy for all parts"
        );
        assert_eq!(ranges, [0..3, 3..3, 3..5]);
        assert_eq!(copied_back(gpu, s, &scratch, &dev), &[1, 2, 3, 9, 8]);
        assert_eq!(
            gpu.pending_free_bytes(MemoryKind::Pinned),
            0,
            "staging released after the copy"
        );
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
    });
}

#[test]
fn a_kernel_context_carries_the_order_and_a_borrowed_scratchpad() {
    with_scratchpad(|_, s, scratch| {
        let ctx = KernelContext::with_scratchpad(s.order(), &scratch);
        let tmp = ctx.scratchpad.unwrap().device::<f32>(256).unwrap();
        assert_eq!(ctx.order, s.order());
        assert_eq!(tmp.len(), 256);
        let bare: KernelContext<'_, '_, MockBackend> = KernelContext::new(AccessOrder::host());
        assert!(bare.scratchpad.is_none());
    });
}

#[test]
fn release_reports_and_drop_never_panics_on_upstream_failure() {
    with_scratchpad(|gpu, s, scratch| {
        scratch.alloc(MemoryKind::Device, 10, 8).unwrap();
        gpu.fail_nth(CallKind::DeallocateAsync, 1);
        assert_eq!(
            scratch.release().unwrap_err().backend_op(),
            Some(gpupool_core::BackendOp::DeallocateAsync)
        );
        let scratch = Scratchpad::new(gpu, s.order()).unwrap();
        scratch.alloc(MemoryKind::Pinned, 10, 8).unwrap();
        gpu.fail_nth(CallKind::DeallocateAsync, 1);
        drop(scratch); // must not panic
    });
}

/// 4096 bytes of pinned scratch that a copy on `s` has read, and finished.
fn a_pinned_block_read_by_a_finished_copy(
    gpu: &MockBackend,
    s: Stream<'_>,
    scratch: &Scratchpad<'_, MockBackend>,
) -> *const u8 {
    let p = scratch.pinned::<u8>(4096).unwrap().as_mut_ptr() as *const u8;
    gpu.use_memory(s.get(), p, 4096).unwrap();
    gpu.complete_all(s.get()).unwrap();
    p
}

/// The driver calls a pinned reset makes: (stream queries, event records).
fn reset_calls(gpu: &MockBackend) -> (u64, u64) {
    (
        gpu.calls(CallKind::QueryStream),
        gpu.calls(CallKind::RecordEvent),
    )
}

#[test]
fn a_reset_on_an_idle_stream_keeps_the_pinned_block_without_a_fence() {
    with_scratchpad(|gpu, s, mut scratch| {
        let p = a_pinned_block_read_by_a_finished_copy(gpu, s, &scratch);
        for _ in 0..20 {
            let before = reset_calls(gpu);
            scratch.reset().unwrap();
            // One question, no event.
            assert_eq!(reset_calls(gpu), (before.0 + 1, before.1));
            let q = scratch.pinned::<u8>(4096).unwrap().as_ptr() as *const u8;
            assert_eq!(q, p, "the kept block is handed out at once");
            gpu.host_access(q, 4096).unwrap();
            gpu.use_memory(s.get(), q, 4096).unwrap();
            gpu.complete_all(s.get()).unwrap();
        }
        assert_eq!(gpu.live_events(), 0);
        assert_eq!(
            gpu.calls(CallKind::AllocateAsync) + gpu.calls(CallKind::Allocate),
            1
        );
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
    });
}

#[test]
fn a_stream_found_busy_at_reset_is_fenced_and_not_asked_for_seven_resets() {
    with_scratchpad(|gpu, s, mut scratch| {
        let mut calls = Vec::new();
        for _ in 0..17 {
            let p = scratch.pinned::<u8>(4096).unwrap().as_mut_ptr() as *const u8;
            gpu.host_access(p, 4096).unwrap();
            gpu.use_memory(s.get(), p, 4096).unwrap(); // still running at reset
            let before = reset_calls(gpu);
            scratch.reset().unwrap();
            let after = reset_calls(gpu);
            calls.push((after.0 - before.0, after.1 - before.1));
            gpu.complete_all(s.get()).unwrap();
        }
        // Asked at the 1st, 9th and 17th reset; fenced at every one.
        let asked: Vec<usize> = (0..17).filter(|&i| calls[i].0 == 1).collect();
        assert_eq!(asked, [0, 8, 16]);
        assert!(calls.iter().all(|c| c.1 == 1), "{calls:?}");
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
    });
}

#[test]
fn a_backend_that_batches_host_reuse_gets_the_pinned_block_back_at_each_reset_unasked() {
    with_scratchpad(|gpu, s, mut scratch| {
        gpu.set_batches_host_reuse(true);
        for round in 0..20 {
            let p = scratch.pinned::<u8>(4096).unwrap().as_mut_ptr() as *const u8;
            gpu.host_access(p, 4096).unwrap();
            gpu.use_memory(s.get(), p, 4096).unwrap(); // a copy still reading it
            let before = (reset_calls(gpu), gpu.calls(CallKind::DeallocateAsync));
            scratch.reset().unwrap();
            let after = (reset_calls(gpu), gpu.calls(CallKind::DeallocateAsync));
            assert_eq!(after.0, before.0, "round {round}: no question, no fence");
            assert_eq!(
                after.1,
                before.1 + 1,
                "round {round}: given back in stream order"
            );
            assert_eq!(scratch.stats().blocks[MemoryKind::Pinned.index()], 0);
            if round % 3 == 2 {
                gpu.complete_all(s.get()).unwrap();
            }
        }
        assert_eq!(gpu.live_events(), 0);
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
        gpu.complete_all(s.get()).unwrap();
        drop(scratch);
        assert_eq!(
            gpu.live_bytes(MemoryKind::Pinned),
            0,
            "every block given back"
        );
    });
}

#[test]
fn a_failed_idle_question_at_reset_counts_as_busy() {
    with_scratchpad(|gpu, s, mut scratch| {
        let p = a_pinned_block_read_by_a_finished_copy(gpu, s, &scratch);
        gpu.fail_nth(CallKind::QueryStream, 1);
        let records = gpu.calls(CallKind::RecordEvent);
        scratch.reset().unwrap(); // the failed question is not an error of reset
        assert_eq!(gpu.armed_faults(), 0);
        assert_eq!(
            gpu.calls(CallKind::RecordEvent),
            records + 1,
            "fenced instead"
        );
        // The fence has completed (the stream was idle): the block comes back.
        let q = scratch.pinned::<u8>(4096).unwrap().as_ptr() as *const u8;
        assert_eq!(q, p);
        gpu.host_access(q, 4096).unwrap();
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
    });
}

#[test]
fn a_reset_loop_holds_one_block_within_twice_what_a_round_asks_for() {
    // The side-by-side benchmark's round: 16 sizes from 2 B to 64 KiB.
    const SIZES: [usize; 16] = [
        1, 24, 100, 512, 4096, 65536, 17, 3000, 8192, 40000, 64, 256, 1024, 12345, 50000, 2,
    ];
    let asked: usize = SIZES.iter().sum();
    with_scratchpad(|gpu, s, mut scratch| {
        let round = |scratch: &Scratchpad<'_, MockBackend>| {
            for kind in KINDS {
                for &n in &SIZES {
                    let p = scratch.alloc(kind, n, 8).unwrap().unwrap();
                    gpu.use_memory(s.get(), p.as_ptr(), n).unwrap();
                }
            }
        };
        let one_block_each = |scratch: &Scratchpad<'_, MockBackend>| {
            let st = scratch.stats();
            for kind in KINDS {
                let i = kind.index();
                assert_eq!(st.blocks[i], 1, "{kind:?}");
                assert!(
                    st.reserved[i] <= 2 * asked,
                    "{kind:?}: {} reserved for {asked} asked",
                    st.reserved[i]
                );
            }
        };
        // Warm-up: the first round grows by doubling (64 + 128 + 256 KiB per
        // kind), its reset gives those back, the second takes one block each.
        let warm = upstream_calls_when_warm(gpu, s, &mut scratch, 2, round, one_block_each);
        assert_eq!(warm, 0, "upstream calls after warm-up");
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
    });
}

#[test]
fn a_reset_of_a_kind_unused_since_the_last_one_asks_nothing() {
    with_scratchpad(|gpu, s, mut scratch| {
        let p = a_pinned_block_read_by_a_finished_copy(gpu, s, &scratch);
        scratch.reset().unwrap(); // asks once: idle, the block is kept
        let asked = reset_calls(gpu);
        for _ in 0..5 {
            // Rounds that use only device memory: the pinned block is untouched.
            let d = scratch.device::<u8>(100).unwrap().as_ptr() as *const u8;
            gpu.use_memory(s.get(), d, 100).unwrap();
            scratch.reset().unwrap();
        }
        assert_eq!(
            reset_calls(gpu),
            asked,
            "no question, no fence for the idle kind"
        );
        // The block is still the one kept, handed out at once.
        gpu.complete_all(s.get()).unwrap();
        let q = scratch.pinned::<u8>(4096).unwrap().as_ptr() as *const u8;
        assert_eq!(q, p);
        gpu.host_access(q, 4096).unwrap();
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
    });
}

// ---- read-back: `to_host` / `copy_to_host` ---------------------------------

/// Uploads `src`, reads it back with both forms, checks it, in the device
/// order `order`; and that an empty slice makes no backend call.
fn round_trip<T>(gpu: &MockBackend, order: AccessOrder<'_>, src: &[T])
where
    T: gpupool_core::bytemuck::Pod + PartialEq + std::fmt::Debug,
{
    let scratch = Scratchpad::new(gpu, order).unwrap();
    let on_device = scratch.to_device(src).unwrap();
    let calls = gpu.total_calls();
    assert_eq!(scratch.to_host(&on_device).unwrap(), src);
    let mut back = vec![T::zeroed(); src.len()];
    scratch.copy_to_host(&on_device, &mut back).unwrap();
    assert_eq!(back, src);
    if src.is_empty() {
        assert_eq!(gpu.total_calls(), calls, "an empty read-back calls nothing");
    }
}

#[test]
fn to_host_round_trips_several_types_and_lengths_in_either_order() {
    let gpu = mock(1);
    let s = Stream::new(&gpu);
    for order in [s.order(), AccessOrder::host()] {
        for len in [0usize, 1, 7, 1000] {
            let ints: Vec<u32> = (0..len as u32)
                .map(|i| i.wrapping_mul(2_654_435_761))
                .collect();
            round_trip(&gpu, order, &ints);
            let bytes: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
            round_trip(&gpu, order, &bytes);
            let halves: Vec<i16> = (0..len).map(|i| -(i as i16)).collect();
            round_trip(&gpu, order, &halves);
            let floats: Vec<f64> = (0..len).map(|i| i as f64 * 0.25 - 3.0).collect();
            round_trip(&gpu, order, &floats);
            let arrays: Vec<[u16; 3]> = (0..len as u16).map(|i| [i, i ^ 7, !i]).collect();
            round_trip(&gpu, order, &arrays);
        }
    }
    gpu.complete_everything();
    assert_eq!(live_bytes(&gpu), 0);
    assert!(gpu.misuses().is_empty() && gpu.hazards().is_empty());
}

#[test]
fn never_written_device_memory_reads_back_as_zeros() {
    // The mock's blocks start zeroed: a read of bytes nothing wrote is
    // defined (Miri checks it), as it is on a GPU.
    with_scratchpad(|_, _, scratch| {
        let fresh = scratch.device::<u64>(33).unwrap();
        assert_eq!(scratch.to_host(&fresh).unwrap(), [0u64; 33]);
    });
}

#[test]
fn a_length_mismatch_is_a_typed_error_and_the_scratchpad_stays_usable() {
    with_scratchpad(|gpu, _, scratch| {
        let on_device = scratch.to_device(&[1u32, 2, 3]).unwrap();
        let calls = gpu.total_calls();
        for len in [0, 2, 4] {
            let mut dst = vec![9u32; len];
            let e = scratch.copy_to_host(&on_device, &mut dst).unwrap_err();
            assert_eq!(
                e,
                Error::LengthMismatch {
                    expected: 3,
                    actual: len
                }
            );
            assert!(std::error::Error::source(&e).is_none());
            assert_eq!(dst, vec![9u32; len], "the buffer is untouched");
        }
        assert_eq!(gpu.total_calls(), calls, "refused before any backend call");
        assert_eq!(scratch.to_host(&on_device).unwrap(), [1, 2, 3]);
        let more = scratch.to_device(&[4u32, 5]).unwrap();
        assert_eq!(scratch.to_host(&more).unwrap(), [4, 5]);
        assert!(gpu.misuses().is_empty() && gpu.hazards().is_empty());
    });
}

#[test]
fn a_slice_of_another_device_or_machine_is_refused_before_any_call() {
    let gpu = mock(2);
    let s = Stream::new(&gpu); // device 0
    let here = Scratchpad::new(&gpu, s.order()).unwrap();
    let config = ScratchpadConfig {
        device: Some(DeviceId(1)),
        ..ScratchpadConfig::default()
    };
    let there = Scratchpad::with_config(&gpu, AccessOrder::host(), config).unwrap();
    let on_one = there.to_device(&[1u8, 2]).unwrap();
    assert_eq!(on_one.device(), DeviceId(1));
    let other_gpu = mock(1);
    let elsewhere = Scratchpad::new(&other_gpu, AccessOrder::host()).unwrap();
    let foreign = elsewhere.to_device(&[3u8, 4]).unwrap();
    here.device::<u8>(1).unwrap(); // resolves `here`'s device
    let calls = gpu.total_calls();
    assert_eq!(
        here.to_host(&on_one).unwrap_err(),
        Error::WrongDevice {
            given: DeviceId(0),
            actual: DeviceId(1)
        }
    );
    assert_eq!(here.to_host(&foreign).unwrap_err(), Error::ForeignHandle);
    assert_eq!(gpu.total_calls(), calls);
    // Each scratchpad reads its own.
    assert_eq!(there.to_host(&on_one).unwrap(), [1, 2]);
    assert_eq!(elsewhere.to_host(&foreign).unwrap(), [3, 4]);
    assert!(gpu.misuses().is_empty() && other_gpu.misuses().is_empty());
}

#[test]
fn to_host_copies_on_the_device_order_stream_and_returns_after_the_copy() {
    with_scratchpad(|gpu, s, scratch| {
        let on_device = scratch.to_device(&[7u32; 64]).unwrap();
        // A kernel on the device order's stream writes the slice; still queued.
        gpu.use_memory(s.get(), on_device.as_ptr().cast(), on_device.byte_len())
            .unwrap();
        assert!(gpu.pending_work(s.get()).unwrap() > 0);
        let (copies, syncs) = (
            gpu.calls(CallKind::CopyAsync),
            gpu.calls(CallKind::SynchronizeStream),
        );
        assert_eq!(scratch.to_host(&on_device).unwrap(), [7; 64]);
        assert_eq!(gpu.calls(CallKind::CopyAsync), copies + 1);
        assert_eq!(gpu.calls(CallKind::SynchronizeStream), syncs + 1);
        assert_eq!(
            gpu.pending_work(s.get()).unwrap(),
            0,
            "the kernel and the copy behind it have run before it returns"
        );
        assert_eq!(
            gpu.live_bytes(MemoryKind::Pinned),
            0,
            "both staging blocks (the upload's, the read-back's) are freed"
        );
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());

        // A kernel on another stream, not ordered before the device order: the
        // read-back's copy (on `s`) races it, which the mock reports.
        let t = Stream::new(gpu);
        gpu.use_memory(t.get(), on_device.as_ptr().cast(), on_device.byte_len())
            .unwrap();
        scratch.to_host(&on_device).unwrap();
        let hazards = gpu.hazards();
        assert_eq!(hazards.len(), 1, "{hazards:?}");
        assert_eq!(hazards[0].kind, gpupool_mock::HazardKind::ConcurrentUse);
        assert_eq!(
            (hazards[0].stream, hazards[0].conflict),
            (Some(s.get()), Some(t.get()))
        );
        assert!(gpu.misuses().is_empty());
    });
}

#[test]
fn a_failed_read_back_leaves_the_buffer_and_the_scratchpad_as_they_were() {
    with_scratchpad(|gpu, _, scratch| {
        let on_device = scratch.to_device(&[1u16, 2, 3]).unwrap();
        gpu.complete_everything();
        let live = live_bytes(gpu);
        for op in [
            CallKind::Allocate,
            CallKind::CopyAsync,
            CallKind::SynchronizeStream,
        ] {
            gpu.fail_nth(op, 1);
            let mut dst = [0u16; 3];
            let e = scratch.copy_to_host(&on_device, &mut dst).unwrap_err();
            assert_eq!(e.backend_op(), Some(op));
            if op != CallKind::SynchronizeStream {
                assert_eq!(live_bytes(gpu), live, "{op:?}: the staging block is freed");
            }
            assert_eq!(dst, [0; 3], "{op:?}: the buffer is untouched");
        }
        assert_eq!(scratch.to_host(&on_device).unwrap(), [1, 2, 3]);
    });
}

#[test]
fn error_messages_do_not_repeat_their_sources() {
    // A real failure: an injected copy failure during a read-back.
    with_scratchpad(|gpu, _, scratch| {
        let on_device = scratch.to_device(&[1u8; 8]).unwrap();
        gpu.fail_nth(CallKind::CopyAsync, 1);
        let e = scratch.to_host(&on_device).unwrap_err();
        assert_eq!(
            error_chain(&e),
            [
                "backend call CopyAsync failed",
                "injected failure of a CopyAsync call"
            ]
        );
    });
}

#[test]
fn copy_to_host_after_a_reset_reads_the_bytes_back_as_another_type() {
    with_scratchpad(|gpu, _, mut scratch| {
        let bits: Vec<u32> = [1.5f32, -0.0, 3.25e9, f32::INFINITY]
            .iter()
            .map(|f| f.to_bits())
            .collect();
        let first = scratch.to_device(&bits).unwrap().addr();
        scratch.reset().unwrap();
        let floats = scratch.device::<f32>(bits.len()).unwrap();
        assert_eq!(floats.addr(), first, "the same bytes, handed out again");
        let mut back = [0f32; 4];
        scratch.copy_to_host(&floats, &mut back).unwrap();
        let want: Vec<u32> = back.iter().map(|f| f.to_bits()).collect();
        assert_eq!(want, bits);
        // And as bytes, after another reset.
        scratch.reset().unwrap();
        let bytes = scratch.device::<u8>(16).unwrap();
        assert_eq!(bytes.addr(), first);
        let expected: Vec<u8> = bits.iter().flat_map(|b| b.to_ne_bytes()).collect();
        assert_eq!(scratch.to_host(&bytes).unwrap(), expected);
        gpu.complete_everything();
        assert!(gpu.misuses().is_empty() && gpu.hazards().is_empty());
    });
}

#[test]
fn mixed_parts_pack_into_one_copy_each_aligned_for_its_type() {
    use gpupool_core::bytemuck::cast_slice;
    with_scratchpad(|gpu, _, scratch| {
        let flags: &[u8] = &[1, 0, 1];
        let weights: &[f64] = &[0.5, -2.0];
        let ids: &[u32] = &[10, 20, 30];
        let copies = gpu.calls(CallKind::CopyAsync);
        let (block, ranges) = scratch
            .to_contiguous_device_bytes(&[flags, cast_slice(weights), cast_slice(ids)], 8)
            .unwrap();
        assert_eq!(gpu.calls(CallKind::CopyAsync), copies + 1, "one copy");
        assert_eq!(ranges, [0..3, 8..24, 24..36]);
        assert_eq!(block.addr() % 8, 0);
        let back = scratch.to_host(&block).unwrap();
        assert_eq!(&back[0..3], flags);
        assert_eq!(&back[3..8], [0; 5], "the gap is zeroed");
        // `back` is a `Vec<u8>`, aligned for bytes only: compare bytes.
        assert_eq!(&back[8..24], cast_slice::<f64, u8>(weights));
        assert_eq!(&back[24..36], cast_slice::<u32, u8>(ids));
        assert_eq!(
            scratch.to_contiguous_device_bytes(&[flags], 3).unwrap_err(),
            Error::InvalidAlignment { align: 3 }
        );
        gpu.complete_everything();
        assert!(gpu.misuses().is_empty() && gpu.hazards().is_empty());
    });
}
