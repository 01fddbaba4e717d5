//! The ranges no call may touch (the crate documentation's "Refusals"): a
//! range of a block the mock has already reclaimed (a use after free), and a
//! graph's memory used by work that is not the graph's. Each refusal is an
//! error, is recorded (a misuse for `copy_async`, a backend call; a hazard
//! for the harness calls) and reads, writes and queues nothing. Also the
//! quarantine that makes the first possible: bounded, and forgetful beyond
//! its bounds. Run under Miri with strict provenance too: no test may read
//! freed memory through the mock.
#![cfg(not(loom))]

use core::ptr::NonNull;

use gpupool_core::{AccessOrder, MemoryBackend, MemoryKind, Scratchpad, StreamHandle};
use gpupool_mock::{CallKind, CaptureMode, HazardKind, Misuse, MockBackend, MockError};

use MemoryKind::{Device, Host, Pinned};

mod common;
use common::{begin, mock_with_stream, stream, D0};

fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr().addr()
}

/// A live pinned block of `len` bytes, every byte `fill`.
fn pinned_filled(mock: &MockBackend, len: usize, fill: u8) -> NonNull<u8> {
    let p = mock.allocate(Pinned, D0, len, 8).unwrap();
    // SAFETY: a live host-visible block of `len` bytes, ours, unused by any
    // stream.
    unsafe { core::ptr::write_bytes(p.as_ptr(), fill, len) };
    p
}

/// The bytes of a live host-visible block that no stream uses.
fn bytes_of(p: NonNull<u8>, len: usize) -> Vec<u8> {
    // SAFETY: the caller's block is live, `len` bytes long, initialised
    // (blocks start zeroed), and nothing writes it meanwhile.
    unsafe { core::slice::from_raw_parts(p.as_ptr(), len) }.to_vec()
}

/// Checks that the 64-byte pinned block `pinned` (allocated with alignment
/// 8, unused) still holds `byte` everywhere ("nothing copied"), frees it and
/// checks that no block is left.
fn nothing_copied_then_free(mock: &MockBackend, pinned: NonNull<u8>, byte: u8) {
    assert_eq!(bytes_of(pinned, 64), [byte; 64], "nothing copied");
    // SAFETY: allocated with this layout, unused (the caller's contract).
    unsafe { mock.deallocate(Pinned, D0, pinned, 64, 8) }.unwrap();
    assert_eq!(mock.live_blocks(), 0);
}

/// The error of a call naming `len` bytes at `p`, a range the mock no longer
/// knows as a block.
fn invalid_range(p: NonNull<u8>, len: usize) -> MockError {
    MockError::InvalidRange { addr: addr(p), len }
}

/// The misuse a refused `copy_async` logs.
fn copy_misuse(error: MockError) -> Misuse {
    Misuse {
        call: CallKind::CopyAsync,
        error,
        harness: None,
    }
}

/// The (kind, stream) of each hazard recorded so far.
fn hazard_kinds(mock: &MockBackend) -> Vec<(HazardKind, Option<StreamHandle>)> {
    mock.hazards().iter().map(|h| (h.kind, h.stream)).collect()
}

// ---- use after free ----------------------------------------------------------

/// The shape of the scratchpad bug that made this check: a device block
/// allocated on a capturing stream (a graph allocation), the capture ended,
/// the graph dropped (which frees the block), then a copy from the block's
/// address into a live pinned block. It used to read freed memory; it is
/// refused, logged, and copies nothing.
#[test]
fn a_copy_from_the_allocation_of_a_dropped_graph_is_refused() {
    let (mock, s) = mock_with_stream(1);
    let pinned = pinned_filled(&mock, 64, 0xAB);
    begin(&mock, s, CaptureMode::Global).unwrap();
    // SAFETY: a live stream of this mock's device 0.
    let p = unsafe { mock.allocate_async(Device, D0, 64, 64, s) }.unwrap();
    let graph = mock.end_capture(s).unwrap();
    drop(graph);
    assert_eq!(mock.live_bytes(Device), 0, "freed with its graph");
    assert_eq!(mock.quarantined_blocks(), 1, "and remembered");

    // SAFETY: `pinned` is a live block of 64 bytes; `p` is freed, on
    // purpose: the mock refuses it before touching either.
    let copied = unsafe { mock.copy_async(pinned, p, 64, s, D0) };
    let refused = MockError::UseAfterFree {
        addr: addr(p),
        len: 64,
    };
    assert_eq!(copied, Err(refused.clone()));
    assert_eq!(mock.misuses(), [copy_misuse(refused)]);
    assert!(
        mock.hazards().is_empty(),
        "a refused backend call: a misuse"
    );
    assert_eq!(mock.pending_work(s), Ok(0), "nothing queued");
    nothing_copied_then_free(&mock, pinned, 0xAB);
}

/// A block freed synchronously, named by a copy as its source, as its
/// destination, or by a range that only starts inside it.
#[test]
fn a_copy_from_or_into_a_block_freed_synchronously_is_refused() {
    let (mock, s) = mock_with_stream(1);
    let dev = mock.allocate(Device, D0, 64, 8).unwrap();
    let data = [7u8; 64];
    let src = NonNull::from(&data).cast::<u8>();
    // SAFETY: `data` is 64 readable bytes of ours, `dev` a live block of
    // 64; disjoint, and nothing else touches them meanwhile.
    unsafe { mock.copy_async(dev, src, 64, s, D0) }.unwrap();
    mock.complete_all(s).unwrap();
    // SAFETY: allocated with this layout; its copy has completed.
    unsafe { mock.deallocate(Device, D0, dev, 64, 8) }.unwrap();

    let pinned = pinned_filled(&mock, 128, 0);
    // Only compared by the mock: no pointer arithmetic on freed memory.
    let inside = NonNull::new(dev.as_ptr().wrapping_add(32)).unwrap();
    // SAFETY: `pinned` is live, `dev` freed on purpose, `src` ours: every
    // copy below is refused before a byte moves.
    let got = unsafe {
        [
            mock.copy_async(pinned, dev, 64, s, D0),
            mock.copy_async(dev, src, 64, s, D0),
            mock.copy_async(pinned, inside, 64, s, D0),
        ]
    };
    let refused = [
        MockError::UseAfterFree {
            addr: addr(dev),
            len: 64,
        },
        MockError::UseAfterFree {
            addr: addr(dev),
            len: 64,
        },
        MockError::UseAfterFree {
            addr: addr(dev) + 32,
            len: 64,
        },
    ];
    assert_eq!(got, refused.clone().map(Err));
    assert_eq!(mock.misuses(), refused.map(copy_misuse));
    assert!(mock.hazards().is_empty());
    assert_eq!(mock.pending_work(s), Ok(0), "nothing queued");
    assert_eq!(bytes_of(pinned, 128), [0; 128], "nothing copied");
    // A second free of it is a double free while the mock remembers it.
    // SAFETY: a double free on purpose; the mock refuses it.
    let again = unsafe { mock.deallocate(Device, D0, dev, 64, 8) };
    assert_eq!(again, Err(MockError::DoubleFree(addr(dev))));
    // SAFETY: allocated with this layout, unused.
    unsafe { mock.deallocate(Pinned, D0, pinned, 128, 8) }.unwrap();
}

/// A block freed in stream order: a copy is refused while it is
/// free-pending (a bad range, as before) and once it is reclaimed (a use
/// after free); the harness calls refuse the reclaimed range and record a
/// hazard, queueing nothing.
#[test]
fn harness_calls_refuse_a_reclaimed_range_and_record_it() {
    let (mock, s) = mock_with_stream(1);
    let p = mock.allocate(Pinned, D0, 64, 8).unwrap();
    let q = pinned_filled(&mock, 64, 1);
    mock.enqueue_work(s).unwrap();
    // SAFETY: allocated with this layout; nothing uses it.
    unsafe { mock.deallocate_async(Pinned, D0, p, 64, 8, s) }.unwrap();
    // SAFETY: live blocks, or refused by the mock before a byte moves.
    let pending = unsafe { mock.copy_async(q, p, 64, s, D0) };
    assert_eq!(pending, Err(invalid_range(p, 64)));
    mock.complete_all(s).unwrap();
    assert_eq!(mock.quarantined_blocks(), 1);

    let refused = MockError::UseAfterFree {
        addr: addr(p),
        len: 64,
    };
    // SAFETY: as above.
    let reclaimed = unsafe { mock.copy_async(q, p, 64, s, D0) };
    assert_eq!(reclaimed, Err(refused.clone()));
    assert_eq!(mock.use_memory(s, p.as_ptr(), 64), Err(refused.clone()));
    assert_eq!(mock.host_access(p.as_ptr(), 64), Err(refused.clone()));
    // A range that only starts inside the freed block, or only ends there
    // (addresses only compared by the mock).
    let (middle, before) = (p.as_ptr().wrapping_add(60), p.as_ptr().wrapping_sub(4));
    assert_eq!(
        mock.use_memory(s, middle, 8),
        Err(MockError::UseAfterFree {
            addr: addr(p) + 60,
            len: 8
        })
    );
    assert_eq!(
        mock.host_access(before, 8),
        Err(MockError::UseAfterFree {
            addr: addr(p) - 4,
            len: 8
        })
    );
    assert_eq!(
        hazard_kinds(&mock),
        [
            (HazardKind::UsedAfterFree, Some(s)),
            (HazardKind::UsedAfterFree, None),
            (HazardKind::UsedAfterFree, Some(s)),
            (HazardKind::UsedAfterFree, None),
        ]
    );
    assert_eq!(mock.pending_work(s), Ok(0), "nothing queued");
    assert_eq!(
        mock.misuses(),
        [copy_misuse(invalid_range(p, 64)), copy_misuse(refused),],
        "the harness calls' refusals are hazards, not misuses"
    );
    assert_eq!(bytes_of(q, 64), [1; 64], "nothing copied");
    // SAFETY: allocated with this layout, unused.
    unsafe { mock.deallocate(Pinned, D0, q, 64, 8) }.unwrap();
}

/// The quarantine keeps at most `QUARANTINE_BLOCKS` blocks: beyond that the
/// oldest is really freed and forgotten, and its range is foreign memory
/// again (a use of it is a hazard as any foreign range's is, not a
/// refusal; a free of it an unknown pointer).
#[test]
fn the_quarantine_forgets_its_oldest_block_beyond_its_bound() {
    let mock = MockBackend::new(1);
    let s = stream(&mock, D0);
    let n = MockBackend::QUARANTINE_BLOCKS;
    let blocks: Vec<NonNull<u8>> = (0..=n)
        .map(|_| mock.allocate(Host, D0, 8, 8).unwrap())
        .collect();
    for &p in &blocks {
        // SAFETY: allocated with this layout, freed once, unused.
        unsafe { mock.deallocate(Host, D0, p, 8, 8) }.unwrap();
    }
    assert_eq!(mock.quarantined_blocks(), n);
    assert_eq!(mock.quarantined_bytes(), 8 * n);

    // The oldest is forgotten: foreign memory to the mock now.
    let (oldest, kept) = (blocks[0], blocks[1]);
    mock.use_memory(s, oldest.as_ptr(), 8).unwrap();
    assert_eq!(hazard_kinds(&mock), [(HazardKind::UsedAfterFree, Some(s))]);
    // SAFETY: a free of a forgotten block on purpose; the mock refuses it.
    let forgotten = unsafe { mock.deallocate(Host, D0, oldest, 8, 8) };
    assert_eq!(forgotten, Err(MockError::InvalidPointer(addr(oldest))));
    // The next one is still remembered.
    assert_eq!(
        mock.use_memory(s, kept.as_ptr(), 8),
        Err(MockError::UseAfterFree {
            addr: addr(kept),
            len: 8
        })
    );
    assert_eq!(mock.pending_work(s), Ok(1), "only the foreign use queued");
}

/// The quarantine keeps at most `QUARANTINE_BYTES`: older blocks go to make
/// room, and a block larger than the bound is not kept at all.
#[test]
fn the_quarantine_keeps_at_most_its_bytes() {
    let mock = MockBackend::new(1);
    let half = MockBackend::QUARANTINE_BYTES / 2;
    for _ in 0..3 {
        let p = mock.allocate(Host, D0, half, 8).unwrap();
        // SAFETY: allocated with this layout, freed once, unused.
        unsafe { mock.deallocate(Host, D0, p, half, 8) }.unwrap();
    }
    assert_eq!(mock.quarantined_blocks(), 2);
    assert_eq!(mock.quarantined_bytes(), 2 * half);
    let big = MockBackend::QUARANTINE_BYTES + 1;
    let p = mock.allocate(Host, D0, big, 8).unwrap();
    // SAFETY: as above.
    unsafe { mock.deallocate(Host, D0, p, big, 8) }.unwrap();
    assert_eq!(mock.quarantined_blocks(), 2, "too large to keep");
    assert_eq!(mock.quarantined_bytes(), 2 * half);
    assert!(mock.misuses().is_empty());
}

// ---- a graph's memory outside the graph ---------------------------------------

/// A graph allocation belongs to its capture and graph: a copy or kernel of
/// any other work is refused, during the capture, after it while the graph
/// lives, and after the graph is dropped (freed under running launches, then
/// reclaimed). The capture's own items and the graph's launches may use it.
#[test]
fn a_graph_allocation_is_refused_to_work_outside_its_graph() {
    let (mock, s) = mock_with_stream(1);
    let (other, capturing) = (stream(&mock, D0), stream(&mock, D0));
    let pinned = pinned_filled(&mock, 64, 3);
    begin(&mock, s, CaptureMode::Relaxed).unwrap();
    // SAFETY: a live stream of this mock's device 0.
    let p = unsafe { mock.allocate_async(Device, D0, 64, 64, s) }.unwrap();
    // The capture's own copy into it: captured.
    // SAFETY: `p` and `pinned` are live disjoint blocks of 64 bytes.
    unsafe { mock.copy_async(p, pinned, 64, s, D0) }.unwrap();
    // Another stream, during the capture; another capture's stream.
    begin(&mock, capturing, CaptureMode::Relaxed).unwrap();
    let held = MockError::HeldByGraph {
        addr: addr(p),
        len: 64,
    };
    // SAFETY: live blocks; the mock refuses the graph's before a byte moves.
    let during = unsafe {
        [
            mock.copy_async(pinned, p, 64, other, D0),
            mock.copy_async(p, pinned, 64, capturing, D0),
        ]
    };
    assert_eq!(during, [Err(held.clone()), Err(held.clone())]);
    assert_eq!(
        mock.use_memory(capturing, p.as_ptr(), 64),
        Err(held.clone())
    );
    mock.end_capture(capturing).unwrap();
    let graph = mock.end_capture(s).unwrap();
    assert_eq!(graph.node_count(), 2, "the allocation and the copy");

    // After the capture, the graph alive: on the origin, on another stream.
    // SAFETY: as above.
    let after = unsafe {
        [
            mock.copy_async(pinned, p, 64, s, D0),
            mock.copy_async(p, pinned, 64, other, D0),
        ]
    };
    assert_eq!(after, [Err(held.clone()), Err(held.clone())]);
    assert_eq!(mock.use_memory(other, p.as_ptr(), 8).unwrap_err(), {
        MockError::HeldByGraph {
            addr: addr(p),
            len: 8,
        }
    });
    assert_eq!(
        hazard_kinds(&mock),
        [
            (HazardKind::HeldByGraph, Some(capturing)),
            (HazardKind::HeldByGraph, Some(other)),
        ]
    );
    mock.clear_hazards();
    // The graph's launches may use it.
    mock.launch_graph(&graph, other).unwrap();
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());

    // Dropped while its launch runs: freed, not yet reclaimed; then reclaimed.
    drop(graph);
    // SAFETY: as above.
    let freed = unsafe { mock.copy_async(pinned, p, 64, s, D0) };
    assert_eq!(freed, Err(invalid_range(p, 64)));
    mock.complete_all(other).unwrap();
    assert_eq!(mock.quarantined_blocks(), 1);
    // SAFETY: as above.
    let reclaimed = unsafe { mock.copy_async(pinned, p, 64, s, D0) };
    assert_eq!(
        reclaimed,
        Err(MockError::UseAfterFree {
            addr: addr(p),
            len: 64
        })
    );
    let errors: Vec<MockError> = mock.misuses().into_iter().map(|m| m.error).collect();
    assert_eq!(errors.len(), 6, "{errors:?}");
    assert!(mock.misuses().iter().all(|m| m.call == CallKind::CopyAsync));
    assert_eq!(mock.pending_work(s), Ok(0));
    assert_eq!(mock.pending_work(other), Ok(0));
    nothing_copied_then_free(&mock, pinned, 3);
}

/// A device scratchpad made inside a capture whose slices are used after
/// it: a simulated kernel on the graph's allocation outside the graph is
/// refused (a hazard, the kernel not run); once the graph is dropped, a use
/// after free.
#[test]
fn a_kernel_on_a_scratchpad_made_in_a_capture_is_refused_after_it() {
    let (mock, s) = mock_with_stream(1);
    let t = stream(&mock, D0);
    // SAFETY: live streams of this mock on device 0, never destroyed.
    let (order, elsewhere) = unsafe {
        (
            AccessOrder::from_raw_capturable(&mock, s, D0),
            AccessOrder::from_raw(&mock, t, D0),
        )
    };
    begin(&mock, s, CaptureMode::Relaxed).unwrap();
    let scratch = Scratchpad::new(&mock, order).unwrap();
    let x = scratch.device::<u32>(16).unwrap();
    let y = scratch.device::<u32>(16).unwrap();
    mock.launch_map(&order, &x, &y, |v| v + 1).unwrap(); // captured
    let graph = mock.end_capture(s).unwrap();

    let mut ran = false;
    let mut kernel = |v: u32| {
        ran = true;
        v
    };
    let held = MockError::HeldByGraph {
        addr: x.addr(),
        len: x.byte_len(),
    };
    assert_eq!(
        mock.launch_map(&order, &x, &y, &mut kernel),
        Err(held.clone())
    );
    assert_eq!(mock.launch_map(&elsewhere, &x, &y, &mut kernel), Err(held));
    drop(graph);
    let freed = MockError::UseAfterFree {
        addr: x.addr(),
        len: x.byte_len(),
    };
    assert_eq!(mock.launch_map(&elsewhere, &x, &y, &mut kernel), Err(freed));
    assert!(!ran, "no kernel ran");
    assert_eq!(
        hazard_kinds(&mock),
        [
            (HazardKind::HeldByGraph, Some(s)),
            (HazardKind::HeldByGraph, Some(t)),
            (HazardKind::UsedAfterFree, Some(t)),
        ]
    );
    assert_eq!((mock.pending_work(s), mock.pending_work(t)), (Ok(0), Ok(0)));
    assert!(mock.misuses().is_empty(), "{:?}", mock.misuses());
    // The scratchpad gives the graph's blocks back as memory of an ended
    // capture (the graph freed them already): no misuse, nothing left.
    drop(scratch);
    assert!(mock.misuses().is_empty(), "{:?}", mock.misuses());
    assert_eq!(mock.live_blocks(), 0);
}
