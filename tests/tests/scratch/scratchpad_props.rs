//! Mock-only (the mock is the upstream, its live bytes the measure): property
//! tests of the scratchpad's monotonic resources (proptest): random sequences
//! of (kind, size, alignment) give blocks that are aligned, lie inside the
//! upstream blocks, never overlap another live allocation, and whose upstream
//! total is bounded by the bytes requested.
//!
//! The bound. Issue #3 asks for "within 2× the requested bytes plus the first
//! block", but the growth policy the same issue (and DALI) fixes — double until
//! the request fits, then double again — cannot meet it:
//! `doubling_growth_can_exceed_twice_the_requested_bytes` below is a
//! counterexample (1 B, 64 KiB, 64 KiB + 1 in a 64 KiB first block reserve
//! 448 KiB for 128 KiB + 2 requested). What the policy does guarantee, and what
//! is checked here: with blocks S1..Sn and requests placed u1..un,
//! - a block is abandoned only when the next request does not fit its rest, so
//!   `u(k-1) + u(k) > S(k-1)`, hence the blocks before the last sum to < 2R;
//! - the last block is at most twice the larger of the block before it
//!   (< R, by the same inequality) and the request that opened it (≤ R);
//!
//! So the total is below 4R, or at most max(F, 2R) with one block: **total ≤
//! 4R + F**. With alignment above 1, each request counts its worst-case padding
//! (`align - 1`) in R.
use gpupool_core::{AccessOrder, MemoryKind, Scratchpad};
use gpupool_mock::MockBackend;
use gpupool_tests::mock;
use proptest::prelude::*;

/// Streams straight from the mock (see `MockStream`).
use gpupool_tests::MockStream as Stream;

fn request() -> impl Strategy<Value = (usize, usize, u32)> {
    // (kind index, size, log2 alignment); sizes up to 300 KiB, skewed small.
    (
        0usize..4,
        prop_oneof![0usize..64, 64usize..4096, 4096usize..300_000],
        0u32..13,
    )
}

/// Checks the bound (module documentation): each kind's upstream total is
/// at most four times `requested` (padding included) plus its first block.
fn within_the_bound(
    scratch: &Scratchpad<'_, MockBackend>,
    requested: [usize; 4],
) -> Result<(), TestCaseError> {
    let stats = scratch.stats();
    for kind in MemoryKind::ALL {
        let (k, first) = (kind.index(), scratch.first_block_size(kind));
        prop_assert!(
            stats.reserved[k] <= 4 * requested[k] + first,
            "{:?}: reserved {} for {} requested",
            kind,
            stats.reserved[k],
            requested[k]
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

    #[test]
    fn unaligned_requests_stay_within_four_times_the_requested_bytes_plus_the_first_block(
        reqs in proptest::collection::vec((0usize..4, prop_oneof![0usize..64, 64usize..4096, 4096usize..300_000]), 1..60)
    ) {
        let gpu = mock(1);
        let s = Stream::new(&gpu);
        let scratch = Scratchpad::new(&gpu, s.order()).unwrap();
        let mut requested = [0usize; 4];
        for (k, size) in reqs {
            scratch.alloc(MemoryKind::ALL[k], size, 1).unwrap();
            requested[k] += size;
        }
        within_the_bound(&scratch, requested)?;
    }

    #[test]
    fn allocations_are_aligned_inside_blocks_disjoint_and_bounded(
        reqs in proptest::collection::vec(request(), 1..60)
    ) {
        let gpu = mock(1);
        let s = Stream::new(&gpu);
        let scratch = Scratchpad::new(&gpu, s.order()).unwrap();
        let mut live: Vec<Vec<(usize, usize)>> = vec![Vec::new(); 4];
        let mut requested = [0usize; 4];
        for (k, size, log_align) in reqs {
            let kind = MemoryKind::ALL[k];
            let align = 1usize << log_align;
            match scratch.alloc(kind, size, align).unwrap() {
                None => prop_assert_eq!(size, 0),
                Some(p) => {
                    let addr = p.as_ptr() as usize;
                    prop_assert_eq!(addr % align, 0, "misaligned");
                    let blocks = scratch.blocks(kind);
                    prop_assert!(
                        blocks.iter().any(|&(b, len)| addr >= b && addr + size <= b + len),
                        "allocation outside every upstream block"
                    );
                    for &(a, n) in &live[k] {
                        prop_assert!(addr + size <= a || a + n <= addr, "overlap");
                    }
                    live[k].push((addr, size));
                    requested[k] += size + (align - 1);
                }
            }
        }
        within_the_bound(&scratch, requested)?;
        let stats = scratch.stats();
        for kind in MemoryKind::ALL {
            prop_assert_eq!(gpu.live_bytes(kind), stats.reserved[kind.index()]);
        }
        drop(scratch);
        gpu.complete_everything();
        for kind in MemoryKind::ALL {
            prop_assert_eq!(gpu.live_bytes(kind), 0);
        }
    }
}

#[test]
fn doubling_growth_can_exceed_twice_the_requested_bytes() {
    let gpu = mock(1);
    let scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
    let k = 1024;
    for size in [1, 64 * k, 64 * k + 1] {
        scratch.alloc(MemoryKind::Host, size, 1).unwrap();
    }
    let requested = 128 * k + 2;
    let reserved = scratch.stats().reserved[0];
    assert_eq!(reserved, (64 + 128 + 256) * k);
    assert!(reserved > 2 * requested + 64 * k);
    assert!(reserved <= 4 * requested + 64 * k);
}
