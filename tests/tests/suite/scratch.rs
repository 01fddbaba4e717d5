//! Generic suite: the scratchpad (DALI's `DynamicScratchpad`, and where gpupool
//! differs), observed through its own
//! API and statistics only, on the machine of this build.
//!
//! Written like the rest of the generic suite (only `gpu()`, `TestGpu`, the
//! backend traits and the scratchpad's API). On a GPU mind that allocating
//! pinned memory may wait for queued work, so a test that holds a gate
//! (`make_busy`) while allocating pinned memory can stall until the gate times
//! out. The mock-only scratchpad tests (hazards, upstream call kinds, injected
//! failures) are in `scratch/scratchpad.rs`.

use gpupool_core::{
    AccessOrder, DeviceId, MemoryBackend, MemoryKind, Scratchpad, ScratchpadConfig, StreamHandle,
    StreamPool,
};
use gpupool_tests::{assert_calls, gpu, Gpu, TestGpu};

const KINDS: [MemoryKind; 4] = MemoryKind::ALL;

type Backend = <Gpu as TestGpu>::Backend;

/// Runs `test` with the machine, a pooled stream of device 0 (and its device),
/// and a fresh scratchpad whose device order is that stream.
fn with_scratchpad(test: impl FnOnce(&Gpu, StreamHandle, DeviceId, &mut Scratchpad<'_, Backend>)) {
    let Some(gpu) = gpu(1) else { return };
    let backend = gpu.backend();
    let streams = StreamPool::new(gpu.backend());
    let lease = streams.get(0).unwrap();
    let mut scratch = Scratchpad::new(&backend, lease.order()).unwrap();
    test(&gpu, lease.handle(), lease.device(), &mut scratch);
}

#[test]
fn a_scratchpad_allocates_nothing_until_asked_and_zero_bytes_touch_nothing() {
    with_scratchpad(|gpu, _, _, scratch| {
        let calls = gpu.backend_calls();
        for kind in KINDS {
            assert_eq!(scratch.alloc(kind, 0, 16).unwrap(), None);
        }
        assert!(scratch.host::<u64>(0).unwrap().is_empty());
        assert!(scratch.device::<u64>(0).unwrap().is_empty());
        assert_eq!(scratch.stats().blocks, [0; 4]);
        scratch.reset().unwrap();
        assert_calls(gpu, calls, 0, "zero-byte allocations and a reset");
    });
}

#[test]
fn kinds_are_initialised_lazily_and_each_on_its_own() {
    with_scratchpad(|_, _, _, scratch| {
        scratch.pinned::<u8>(10).unwrap();
        assert_eq!(scratch.stats().blocks, [0, 1, 0, 0]);
        scratch.device::<u8>(10).unwrap();
        assert_eq!(scratch.stats().blocks, [0, 1, 1, 0]);
        scratch.host::<u8>(10).unwrap();
        scratch.managed::<u8>(10).unwrap();
        assert_eq!(scratch.stats().blocks, [1, 1, 1, 1]);
        assert_eq!(scratch.stats().upstream_allocations, 4);
    });
}

#[test]
fn initial_sizes_are_per_kind_and_zero_means_64_kib() {
    let Some(gpu) = gpu(1) else { return };
    let backend = gpu.backend();
    let config = ScratchpadConfig {
        initial_sizes: [1024, 0, 4096, 0],
        ..ScratchpadConfig::default()
    };
    let scratch = Scratchpad::with_config(&backend, AccessOrder::host(), config).unwrap();
    let sizes: Vec<usize> = KINDS.iter().map(|&k| scratch.first_block_size(k)).collect();
    assert_eq!(sizes, [1024, 64 * 1024, 4096, 64 * 1024]);
}

#[test]
fn allocations_are_aligned_and_packed_inside_a_block() {
    let Some(gpu) = gpu(1) else { return };
    let backend = gpu.backend();
    let scratch = Scratchpad::new(&backend, AccessOrder::host()).unwrap();
    let at = |bytes, align| {
        let p = scratch.alloc(MemoryKind::Host, bytes, align).unwrap();
        p.unwrap().as_ptr() as usize
    };
    let (a, b, c, d) = (at(3, 1), at(8, 8), at(1, 1), at(64, 256));
    assert_eq!(b % 8, 0);
    assert_eq!(
        b,
        (a + 3).next_multiple_of(8),
        "packed right after, aligned"
    );
    assert_eq!(c, b + 8);
    assert_eq!(d % 256, 0);
    assert_eq!(d, (c + 1).next_multiple_of(256));
    assert_eq!(scratch.stats().blocks[0], 1);
    let floats = scratch.host::<f64>(3).unwrap();
    assert_eq!(floats.as_ptr() as usize % std::mem::align_of::<f64>(), 0);
}

#[test]
fn reset_converges_to_one_block_per_kind_and_then_asks_upstream_for_nothing() {
    with_scratchpad(|gpu, s, d, scratch| {
        let mut warm = None; // the statistics after 3 rounds
        for n in 0..103 {
            if n == 3 {
                warm = Some(scratch.stats());
            }
            for (i, kind) in KINDS.into_iter().enumerate() {
                for j in 0..4 {
                    let bytes = 1000 * (i + 1) + 30_000 * j;
                    let p = scratch.alloc(kind, bytes, 64).unwrap().unwrap();
                    if kind.is_host_accessible() {
                        // SAFETY: `bytes` of host-visible scratch memory,
                        // ours until the reset below.
                        unsafe { p.as_ptr().write_bytes(0xA5, bytes) };
                    }
                }
            }
            // SAFETY: `with_scratchpad`'s lease holds this live stream of
            // device `d` while the test runs.
            unsafe {
                gpu.submit(s, d); // the round's kernels
                gpu.finish(s, d);
            }
            scratch.reset().unwrap();
        }
        let before = warm.unwrap();
        let after = scratch.stats();
        if gpu.backend().batches_host_reuse() {
            // The backend takes host-visible blocks back in stream order for
            // less than a question to the stream: each reset gives the one
            // pinned and the one managed block back (released in the
            // stream's order), and each round takes one of each again.
            assert_eq!(after.blocks, [1, 0, 1, 0], "host and device blocks kept");
            assert_eq!(
                (after.upstream_allocations, after.upstream_releases),
                (
                    before.upstream_allocations + 200,
                    before.upstream_releases + 200
                ),
                "one pinned and one managed block taken and given back per warm round"
            );
        } else {
            assert_eq!(after.blocks, [1, 1, 1, 1], "one block per kind");
            assert_eq!(
                (after.upstream_allocations, after.upstream_releases),
                (before.upstream_allocations, before.upstream_releases),
                "warm rounds took or gave back blocks"
            );
        }
    });
}

#[test]
fn a_pinned_block_comes_back_only_after_the_stream_has_passed_the_reset() {
    with_scratchpad(|gpu, s, d, scratch| {
        let p = scratch.pinned::<u8>(4096).unwrap().as_ptr() as usize;
        // SAFETY: `with_scratchpad`'s lease holds this live stream of device
        // `d` while the test runs.
        unsafe { gpu.make_busy(s, d) }; // a copy still reading it
        scratch.reset().unwrap();
        let q = scratch.pinned::<u8>(4096).unwrap().as_ptr() as usize;
        assert_ne!(q, p, "handed out while the stream may still read it");
        // SAFETY: as above.
        unsafe { gpu.finish(s, d) };
        scratch.reset().unwrap();
        let r = scratch.pinned::<u8>(4096).unwrap().as_ptr() as usize;
        if !gpu.backend().batches_host_reuse() {
            assert_eq!(r, q, "the stream passed the reset: reused");
            return;
        }
        // The reset gave `q` back in stream order: the backend proves such
        // blocks free in batches, with one question to the stream for many
        // frees, so `p` or `q` comes back once a batch is full (the stream
        // has passed every reset since the `finish`).
        let mut seen = vec![r];
        for _ in 0..200 {
            if seen.contains(&p) || seen.contains(&q) {
                break;
            }
            scratch.reset().unwrap();
            seen.push(scratch.pinned::<u8>(4096).unwrap().as_ptr() as usize);
        }
        assert!(
            seen.contains(&p) || seen.contains(&q),
            "the stream passed both resets, but neither block came back in {} rounds",
            seen.len()
        );
    });
}

#[test]
fn device_memory_is_reused_at_once_in_stream_order() {
    with_scratchpad(|gpu, s, d, scratch| {
        let p = scratch.device::<u32>(1024).unwrap().addr();
        // SAFETY: `with_scratchpad`'s lease holds this live stream of device
        // `d` while the test runs.
        unsafe { gpu.make_busy(s, d) }; // a kernel still using it
        scratch.reset().unwrap();
        let q = scratch.device::<u32>(1024).unwrap().addr();
        assert_eq!(q, p, "the next round's work runs after this round's");
        let stats = scratch.stats();
        assert_eq!(
            (stats.upstream_allocations, stats.upstream_releases),
            (1, 0)
        );
        // SAFETY: as above.
        unsafe { gpu.finish(s, d) };
    });
}
