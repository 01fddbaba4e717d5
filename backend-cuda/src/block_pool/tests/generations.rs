//! Generations of threads taking over their predecessors' streams.

use super::*;

/// Generations of `threads` threads, one per stream, that run `rounds`
/// scratch rounds side by side (round-robin, one round each in turn: every
/// thread is in the middle of its work while the others are) and then exit:
/// the first round grows 64, 128, 256 KiB as a new scratchpad does, the next
/// ones take one 256 KiB block, as a learned one does. Deterministic: the
/// threads are shards driven from this thread. Returns the upstream
/// allocations and stream queries of each generation.
fn generations(
    pool: &Pool<Fake>,
    threads: usize,
    rounds: usize,
    count: usize,
) -> Vec<(u64, usize)> {
    let shards = Shards::new();
    let stream = |t: usize| {
        // SAFETY: a fake stream, only ever given to the fake upstream.
        unsafe { StreamHandle::from_raw(0x10_000 + 0x100 * t) }
    };
    (0..count)
        .map(|_| {
            let (allocs, asked) = (pool.tallies().upstream_allocations, queries(pool));
            let generation: Vec<_> = (0..threads).map(|_| shards.register()).collect();
            for r in 0..rounds {
                let sizes: &[usize] = if r == 0 {
                    &[64 << 10, 128 << 10, 256 << 10]
                } else {
                    &[256 << 10]
                };
                for (t, shard) in generation.iter().enumerate() {
                    let mut mine = shard.lock();
                    let blocks: Vec<(usize, usize)> = sizes
                        .iter()
                        .map(|&size| (pool.take_local(&mut mine, &shards, D, size).unwrap(), size))
                        .collect();
                    for &(addr, size) in blocks.iter().rev() {
                        free_on(pool, &mut mine, &shards, &[addr], size, stream(t));
                    }
                }
            }
            for shard in &generation {
                shards.retire(shard);
            }
            (
                pool.tallies().upstream_allocations - allocs,
                queries(pool) - asked,
            )
        })
        .collect()
}

/// A thread that takes over an exited thread's stream gets that thread's
/// blocks back at its first free (its group, from the orphans), and the
/// blocks the exited threads left free serve every thread's misses: from the
/// second generation on, no thread takes a new block. (Keeping an exited
/// thread's free blocks with the group of its last stream instead, for its
/// successor alone, fails this: the threads that take blocks before their
/// first free empty other streams' groups, 28 new blocks per generation.)
#[test]
fn threads_that_take_over_their_predecessors_streams_need_no_new_blocks() {
    let _probe = probe_on();
    let pool = local_pool(QUERY_BATCH_BLOCKS, true);
    let per_generation = generations(&pool, 16, 100, 4);
    let first = per_generation[0].0;
    assert!(first > 0, "the first generation allocates its blocks");
    for (g, &(allocs, _)) in per_generation.iter().enumerate().skip(1) {
        assert_eq!(allocs, 0, "generation {g} allocated: {per_generation:?}");
    }
    // One query per batch of 32 frees (and one early one per takeover).
    for &(_, asked) in &per_generation[1..] {
        assert!(
            asked <= 16 * (100 / QUERY_BATCH_BLOCKS + 2),
            "{per_generation:?}"
        );
    }
}
