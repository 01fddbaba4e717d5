//! Mock-only (call counting, fault injection, hazard detection): scratchpads
//! built with `learn_sizes` start each kind with one block as large as the
//! most an earlier one held, and stay stream-order safe doing so.
use gpupool_core::{MemoryKind, ScratchSizes, Scratchpad, ScratchpadConfig, DEFAULT_FIRST_BLOCK};
use gpupool_mock::{CallKind, MockBackend};
use gpupool_tests::{with_mock_stream, MockStream, Rng};

/// The benchmark's round: 16 sizes from 1 B to 64 KiB.
const SIZES: [usize; 16] = [
    1, 64, 1000, 4096, 65_536, 300, 20_000, 8, 50_000, 2048, 32_768, 100, 60_000, 7, 16_384, 40_000,
];

const KINDS: [MemoryKind; 3] = [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Device];

/// The scratchpad's block size for a round of `used` bytes (its documented
/// rule: a sixteenth more, rounded up to 4 KiB).
fn fitted(used: usize) -> usize {
    (used + used / 16).next_multiple_of(4096)
}

/// A new scratchpad of `gpu` in `s`'s order, learning into `sizes`.
fn learning<'g>(
    gpu: &'g MockBackend,
    s: &MockStream<'g>,
    sizes: &'g ScratchSizes,
) -> Scratchpad<'g, MockBackend> {
    Scratchpad::new(gpu, s.order()).unwrap().learn_sizes(sizes)
}

/// One round of `kind` on a new scratchpad learning into `sizes`; returns the
/// blocks it took from upstream.
fn round(gpu: &MockBackend, s: &MockStream<'_>, sizes: &ScratchSizes, kind: MemoryKind) -> usize {
    let pad = learning(gpu, s, sizes);
    for &n in &SIZES {
        assert!(pad.alloc(kind, n, 8).unwrap().is_some());
    }
    pad.stats().upstream_allocations
}

/// Runs `test` with a fresh one-device mock and a stream of its device 0
/// ([`with_mock_stream`]), and sizes to learn into.
fn with_sizes(test: impl for<'g> FnOnce(&'g MockBackend, MockStream<'g>, &'g ScratchSizes)) {
    with_mock_stream(|gpu, s| test(gpu, s, &ScratchSizes::new()));
}

#[test]
fn after_one_round_every_new_scratchpad_takes_one_block_per_kind() {
    with_sizes(|gpu, s, sizes| {
        for kind in KINDS {
            // The first round grows block by block from 64 KiB.
            let first = round(gpu, &s, sizes, kind);
            assert!(first > 1, "{kind:?}: {first} blocks");
            let learned = sizes.get()[kind.index()];
            assert!(learned > DEFAULT_FIRST_BLOCK, "{kind:?}: {learned}");
            for _ in 0..5 {
                gpu.complete_everything();
                assert_eq!(round(gpu, &s, sizes, kind), 1, "{kind:?}");
                assert_eq!(sizes.get()[kind.index()], learned, "{kind:?}: stable");
            }
        }
        // What was learned is about one round: its bytes and their padding, a
        // sixteenth more, rounded up to 4 KiB.
        let total: usize = SIZES.iter().sum();
        for kind in KINDS {
            let learned = sizes.get()[kind.index()];
            assert!(learned >= total, "{kind:?}: {learned}");
            assert!(
                learned <= fitted(total + 8 * SIZES.len()),
                "{kind:?}: {learned}"
            );
        }
        gpu.complete_everything();
        assert_eq!(gpu.live_blocks(), 0);
    });
}

#[test]
fn sizes_only_grow_until_forgotten() {
    with_sizes(|gpu, s, sizes| {
        {
            let pad = learning(gpu, &s, sizes);
            pad.host::<u8>(1 << 20).unwrap();
        }
        let big = fitted(1 << 20);
        assert_eq!(sizes.get()[MemoryKind::Host.index()], big);
        {
            // A smaller run keeps the large first block, and learns nothing new.
            let pad = learning(gpu, &s, sizes);
            assert_eq!(pad.first_block_size(MemoryKind::Host), big);
            pad.host::<u8>(10).unwrap();
            assert_eq!(pad.stats().reserved[MemoryKind::Host.index()], big);
        }
        assert_eq!(sizes.get()[MemoryKind::Host.index()], big);
        // A kind a scratchpad did not use keeps its size; unused kinds stay 0.
        assert_eq!(sizes.get()[MemoryKind::Pinned.index()], 0);
        sizes.forget();
        assert_eq!(sizes.get(), [0; 4]);
        let pad = learning(gpu, &s, sizes);
        assert_eq!(pad.first_block_size(MemoryKind::Host), DEFAULT_FIRST_BLOCK);
    });
}

#[test]
fn a_larger_configured_first_block_wins_and_release_learns_too() {
    with_sizes(|gpu, s, sizes| {
        let pad = learning(gpu, &s, sizes);
        pad.pinned::<u8>(100_000).unwrap();
        pad.release().unwrap();
        assert_eq!(sizes.get()[MemoryKind::Pinned.index()], fitted(100_000));
        let mut config = ScratchpadConfig::default();
        config.initial_sizes[MemoryKind::Pinned.index()] = 1 << 20;
        let pad = Scratchpad::with_config(gpu, s.order(), config)
            .unwrap()
            .learn_sizes(sizes);
        assert_eq!(pad.first_block_size(MemoryKind::Pinned), 1 << 20);
        // A learned size larger than the configured one wins instead.
        config.initial_sizes[MemoryKind::Pinned.index()] = 4096;
        let pad = Scratchpad::with_config(gpu, s.order(), config)
            .unwrap()
            .learn_sizes(sizes);
        assert_eq!(pad.first_block_size(MemoryKind::Pinned), fitted(100_000));
    });
}

#[test]
fn threads_sharing_sizes_keep_the_largest() {
    with_sizes(|gpu, s, sizes| {
        std::thread::scope(|scope| {
            for t in 1..=4usize {
                scope.spawn(move || {
                    for _ in 0..if cfg!(miri) { 3 } else { 50 } {
                        let pad = learning(gpu, &s, sizes);
                        pad.host::<u8>(t * 100_000).unwrap();
                    }
                });
            }
        });
        // Each scratchpad asks for one request; the largest, 400,000 bytes, is
        // what every thread's largest round fits in.
        assert_eq!(sizes.get()[MemoryKind::Host.index()], fitted(400_000));
    });
}

#[test]
fn a_failed_learned_block_is_a_typed_error_and_changes_nothing() {
    with_sizes(|gpu, s, sizes| {
        round(gpu, &s, sizes, MemoryKind::Device);
        let learned = sizes.get();
        let pad = learning(gpu, &s, sizes);
        gpu.fail_nth(CallKind::AllocateAsync, 1);
        assert!(pad.device::<u8>(10).is_err());
        let st = pad.stats();
        assert_eq!((st.blocks, st.reserved), ([0; 4], [0; 4]));
        // The next request takes the learned block.
        pad.device::<u8>(10).unwrap();
        assert_eq!(
            pad.stats().reserved[MemoryKind::Device.index()],
            learned[MemoryKind::Device.index()]
        );
        drop(pad);
        assert_eq!(sizes.get(), learned);
        gpu.complete_everything();
        assert_eq!(gpu.live_blocks(), 0);
    });
}

#[test]
fn learned_rounds_with_a_lagging_gpu_report_no_hazard() {
    with_sizes(|gpu, s, sizes| {
        let mut rng = Rng::new(7);
        let rounds = if cfg!(miri) { 12 } else { 3_000 };
        for i in 0..rounds {
            let mut pad = learning(gpu, &s, sizes);
            for _ in 0..rng.below(3) + 1 {
                for _ in 0..rng.below(8) + 1 {
                    let kind = MemoryKind::ALL[rng.below(4) as usize];
                    let bytes = (rng.below(70_000) + 1) as usize;
                    let p = pad.alloc(kind, bytes, 8).unwrap().unwrap();
                    if kind.is_host_accessible() {
                        gpu.host_access(p.as_ptr(), bytes).unwrap();
                    }
                    if kind != MemoryKind::Host {
                        gpu.use_memory(s.get(), p.as_ptr(), bytes).unwrap();
                    }
                }
                pad.reset().unwrap();
            }
            drop(pad);
            match rng.below(3) {
                0 => {}
                1 => {
                    gpu.complete_one(s.get()).unwrap();
                }
                _ => gpu.complete_all(s.get()).unwrap(),
            }
            assert!(gpu.hazards().is_empty(), "round {i}: {:?}", gpu.hazards());
        }
        gpu.complete_everything();
        assert_eq!(gpu.live_blocks(), 0);
    });
}
