//! Each thread's own blocks: stream groups proven by one query, host-ordered
//! frees, exited threads' orphans, forget and drain.

use super::*;

#[test]
fn stream_frees_wait_for_a_full_batch_and_one_idle_query_frees_them() {
    let (_probe, pool, shards, [shard]) = threads_probe_on(4, true);
    let mut mine = shard.lock();
    let blocks = take_n(&pool, &mut mine, &shards, 4, PAGE);
    free_on(&pool, &mut mine, &shards, &blocks[..3], PAGE, S);
    assert_eq!(queries(&pool), 0, "no query before the batch is full");
    let other = pool.take_local(&mut mine, &shards, D, PAGE).unwrap();
    assert!(
        !blocks.contains(&other),
        "pending blocks are not handed out"
    );
    assert_eq!(pool.tallies().upstream_allocations, 5);
    drop(mine);
    assert_eq!(pool.local_counts(&shards).pending_blocks, 3);
    let mut mine = shard.lock();
    free_on(&pool, &mut mine, &shards, &blocks[3..], PAGE, S);
    assert_eq!(queries(&pool), 1, "one query for the batch");
    let again = take_n(&pool, &mut mine, &shards, 4, PAGE);
    assert_eq!(sorted(again), sorted(blocks));
    assert_eq!(pool.tallies().upstream_allocations, 5, "no allocation");
    assert_eq!(queries(&pool), 1, "and no query");
    assert!(pool.upstream().st().fences.is_empty(), "nor a fence");
    assert_eq!(
        pool.counts(),
        PoolCounts::default(),
        "the shared lists untouched"
    );
    drop(mine);
    let c = pool.local_counts(&shards);
    assert_eq!((c.free_blocks, c.pending_blocks, c.reuses), (0, 0, 4));
}

#[test]
fn a_group_holding_a_batch_of_bytes_is_proven_before_the_block_count() {
    let (_probe, pool, shards, [shard]) = threads_probe_on(QUERY_BATCH_BLOCKS, true);
    let mut mine = shard.lock();
    let half = QUERY_BATCH_BYTES / 2;
    let blocks = take_n(&pool, &mut mine, &shards, 2, half);
    free_on(&pool, &mut mine, &shards, &blocks[..1], half, S);
    assert_eq!(queries(&pool), 0);
    free_on(&pool, &mut mine, &shards, &blocks[1..], half, S);
    assert_eq!(queries(&pool), 1, "two blocks, but a batch of bytes");
    let again = take_n(&pool, &mut mine, &shards, 2, half);
    assert_eq!(sorted(again), sorted(blocks));
    assert_eq!(pool.tallies().upstream_allocations, 2);
}

#[test]
fn a_busy_answer_parks_the_group_behind_a_fence_each_until_they_complete() {
    let (_probe, pool, shards, [shard]) = threads_probe_on(3, false);
    let mut mine = shard.lock();
    let blocks = take_and_free_on(&pool, &mut mine, &shards, 3, PAGE, S);
    assert_eq!(pool.counts().parked_blocks, 3);
    assert_eq!(recorded_fences(&pool), 3, "one fence recorded per block");
    // The batch's one query: a group found busy is parked without a second
    // question.
    assert_eq!(queries(&pool), 1);
    let other = pool.take_local(&mut mine, &shards, D, PAGE).unwrap();
    assert!(!blocks.contains(&other), "their fences are pending");
    complete_fences(&pool);
    let again = take_n(&pool, &mut mine, &shards, 3, PAGE);
    assert_eq!(sorted(again), sorted(blocks));
    let t = pool.tallies();
    assert_eq!(
        (t.upstream_allocations, t.reuses),
        (4, 3),
        "from the shared lists"
    );
    drop(mine);
    assert_eq!(pool.local_counts(&shards), LocalCounts::default());
}

#[test]
fn the_groups_of_two_streams_are_proven_apart() {
    let (_probe, pool, shards, [shard]) = threads_probe_on(2, true);
    let mut mine = shard.lock();
    let b = take_n(&pool, &mut mine, &shards, 4, PAGE);
    free_on(&pool, &mut mine, &shards, &b[0..1], PAGE, S);
    free_on(&pool, &mut mine, &shards, &b[1..2], PAGE, S2);
    assert_eq!(queries(&pool), 0, "one block in each group");
    free_on(&pool, &mut mine, &shards, &b[2..3], PAGE, S);
    assert_eq!(queries(&pool), 1);
    let again = take_n(&pool, &mut mine, &shards, 2, PAGE);
    assert_eq!(sorted(again), sorted(vec![b[0], b[2]]), "S's group only");
    let c = pool.take_local(&mut mine, &shards, D, PAGE).unwrap();
    assert!(!b.contains(&c), "S2's block still waits");
    drop(mine);
    assert_eq!(pool.local_counts(&shards).pending_blocks, 1);
    // A busy answer for S2 parks S2's group, and leaves S's alone.
    pool.upstream().st().stream_idle = false;
    let mut mine = shard.lock();
    free_on(&pool, &mut mine, &shards, &b[3..4], PAGE, S);
    free_on(&pool, &mut mine, &shards, &[c], PAGE, S2);
    assert_eq!(pool.counts().parked_blocks, 2, "b[1] and c");
    drop(mine);
    assert_eq!(pool.local_counts(&shards).pending_blocks, 1, "b[3] on S");
}

#[test]
fn a_host_ordered_free_is_reusable_at_once_and_the_excess_spills() {
    let (pool, shards, [shard]) = threads(QUERY_BATCH_BLOCKS, false);
    let mut mine = shard.lock();
    let small = pool.take_local(&mut mine, &shards, D, PAGE).unwrap();
    free_now(&pool, &mut mine, small, PAGE);
    assert_eq!(pool.take_local(&mut mine, &shards, D, PAGE), Ok(small));
    free_now(&pool, &mut mine, small, PAGE);
    // Big blocks up to the bound, the small one (older) included: the
    // last one takes the thread past it, by the small one.
    let big = 4 << 20;
    let n = THREAD_FREE_BYTES / big;
    let bigs = take_n(&pool, &mut mine, &shards, n, big);
    for &addr in &bigs[..n - 1] {
        free_now(&pool, &mut mine, addr, big);
    }
    assert_eq!(pool.counts(), PoolCounts::default(), "within the bound");
    free_now(&pool, &mut mine, bigs[n - 1], big);
    let spilled = PoolCounts {
        parked_blocks: 0,
        free_blocks: 1,
        free_bytes: big,
    };
    assert_eq!(pool.counts(), spilled);
    assert_eq!(queries(&pool), 0);
    drop(mine);
    let c = pool.local_counts(&shards);
    assert_eq!((c.free_blocks, c.free_bytes), (n, (n - 1) * big + PAGE));
    assert_eq!(c.reuses, 1);
    assert_eq!(
        pool.take(D, big),
        Ok(bigs[0]),
        "the oldest of the largest class"
    );
    assert_eq!(pool.tallies().upstream_allocations, 1 + n as u64);
}

#[test]
fn an_exited_threads_blocks_are_adopted_and_its_group_freed_by_a_query_of_its_stream() {
    let (_probe, pool, shards, [a, b]) = threads_probe_on(2, true);
    let (x, y) = {
        let mut mine = a.lock();
        let t = take_n(&pool, &mut mine, &shards, 3, PAGE);
        free_now(&pool, &mut mine, t[0], PAGE);
        free_on(&pool, &mut mine, &shards, &t[1..2], PAGE, S);
        free_on(&pool, &mut mine, &shards, &t[2..3], PAGE, S2);
        (t[0], t[1])
    };
    shards.retire(&a);
    assert_eq!(shards.threads(), 1);
    let c = pool.local_counts(&shards);
    assert_eq!(
        (c.free_blocks, c.pending_blocks),
        (1, 2),
        "all kept, by the orphans"
    );
    assert!(shards.may_have_orphans());
    assert_eq!(queries(&pool), 0, "an exit asks nothing");
    let mut mine = b.lock();
    assert_eq!(
        pool.take_local(&mut mine, &shards, D, PAGE),
        Ok(x),
        "adopted"
    );
    let z = pool.take_local(&mut mine, &shards, D, PAGE).unwrap();
    assert_eq!(pool.tallies().upstream_allocations, 4, "x adopted, z new");
    // B has no free block left and the orphans hold a group of S: its first
    // free on S proves its group and the orphans' at once, with one query,
    // before its batch is full.
    free_on(&pool, &mut mine, &shards, &[x], PAGE, S);
    assert_eq!(queries(&pool), 1);
    let again = take_n(&pool, &mut mine, &shards, 2, PAGE);
    assert_eq!(sorted(again), sorted(vec![x, y]));
    assert_eq!(pool.tallies().upstream_allocations, 4);
    // No orphans of S left: `z` waits for B's batch.
    free_on(&pool, &mut mine, &shards, &[z], PAGE, S);
    assert_eq!(queries(&pool), 1);
    drop(mine);
    let c = pool.local_counts(&shards);
    assert_eq!(
        (c.free_blocks, c.pending_blocks, c.reuses),
        (0, 2, 3),
        "z on S, t[2] on S2"
    );
    assert!(shards.may_have_orphans(), "S2's group stays with them");
}

#[test]
fn a_busy_query_parks_the_orphans_group_of_the_stream_too() {
    let (_probe, pool, shards, [a, b]) = threads_probe_on(2, false);
    take_and_free_on(&pool, &mut a.lock(), &shards, 1, PAGE, S);
    shards.retire(&a);
    let mut mine = b.lock();
    let t = take_n(&pool, &mut mine, &shards, 2, PAGE);
    // B has no free block and the orphans hold a group of S: its first free
    // settles at once, and the stream is busy.
    free_on(&pool, &mut mine, &shards, &t[..1], PAGE, S);
    assert_eq!(pool.counts().parked_blocks, 2, "B's first and the orphan");
    assert_eq!(recorded_fences(&pool), 2);
    assert_eq!(queries(&pool), 1);
    assert!(!shards.may_have_orphans());
    free_on(&pool, &mut mine, &shards, &t[1..], PAGE, S);
    drop(mine);
    assert_eq!(
        pool.local_counts(&shards).pending_blocks,
        1,
        "B's batch is not full"
    );
}

/// The fake upstream, running a hook the next time a stream is queried:
/// what another thread does while the driver answers.
#[derive(Default)]
struct Hooked {
    fake: Fake,
    on_query: core::cell::RefCell<Option<Box<dyn FnOnce()>>>,
}

impl Upstream for Hooked {
    type Error = &'static str;
    type Fence = usize;

    fn invalid_size(&self) -> &'static str {
        self.fake.invalid_size()
    }
    fn allocate(&self, d: DeviceId, bytes: usize) -> Result<usize, &'static str> {
        self.fake.allocate(d, bytes)
    }
    unsafe fn free(&self, d: DeviceId, addr: usize) -> Result<(), &'static str> {
        // SAFETY: the caller's contract, which is the fake's.
        unsafe { self.fake.free(d, addr) }
    }
    fn create_fence(&self, d: DeviceId) -> Result<usize, &'static str> {
        self.fake.create_fence(d)
    }
    fn record_fence(&self, f: usize, s: StreamHandle, d: DeviceId) -> Result<(), &'static str> {
        self.fake.record_fence(f, s, d)
    }
    fn query_fence(&self, f: usize, d: DeviceId) -> Result<Completion, &'static str> {
        self.fake.query_fence(f, d)
    }
    fn destroy_fence(&self, f: usize, d: DeviceId) -> Result<(), &'static str> {
        self.fake.destroy_fence(f, d)
    }
    fn synchronize(&self, s: StreamHandle, d: DeviceId) -> Result<(), &'static str> {
        self.fake.synchronize(s, d)
    }
    fn query_stream(&self, s: StreamHandle, d: DeviceId) -> Result<Completion, &'static str> {
        let hook = self.on_query.borrow_mut().take();
        if let Some(hook) = hook {
            hook();
        }
        self.fake.query_stream(s, d)
    }
    fn stream_id(&self, s: StreamHandle, d: DeviceId) -> Option<u64> {
        self.fake.stream_id(s, d)
    }
}

#[test]
fn the_orphans_group_is_taken_before_the_query() {
    let _probe = probe_on();
    // Leaked: the hook, kept by the pool, refers to the pool.
    let pool: &'static Pool<Hooked> =
        Box::leak(Box::new(Pool::new(Hooked::default()).with_query_batch(2)));
    let shards: &'static Shards<ThreadBlocks> = Box::leak(Box::new(Shards::new()));
    pool.upstream().fake.st().stream_idle = true;
    let (a, b) = (shards.register(), shards.register());
    let late = take_n(pool, &mut b.lock(), shards, 1, PAGE)[0];
    // While A's query is out, B frees `late` on S (after the query was
    // issued: the idle answer does not cover it) and exits.
    *pool.upstream().on_query.borrow_mut() = Some(Box::new(move || {
        free_on(pool, &mut b.lock(), shards, &[late], PAGE, S);
        shards.retire(&b);
    }));
    let mut mine = a.lock();
    let blocks = take_n(pool, &mut mine, shards, 2, PAGE);
    free_on(pool, &mut mine, shards, &blocks, PAGE, S);
    drop(mine);
    assert!(pool.upstream().on_query.borrow().is_none(), "the hook ran");
    let c = pool.local_counts(shards);
    assert_eq!(
        (c.free_blocks, c.pending_blocks),
        (2, 1),
        "`late` still waits"
    );
    assert!(shards.may_have_orphans());
    let mut mine = a.lock();
    let again = take_n(pool, &mut mine, shards, 3, PAGE);
    assert!(!again.contains(&late));
}

#[test]
fn forget_gives_every_threads_and_the_orphans_group_of_the_stream_to_the_shared_lists() {
    let (_probe, pool, shards, [a, b, c]) = threads_probe_on(QUERY_BATCH_BLOCKS, false);
    {
        let mut mine = a.lock();
        let t = take_n(&pool, &mut mine, &shards, 3, PAGE);
        free_on(&pool, &mut mine, &shards, &t[..2], PAGE, S);
        free_on(&pool, &mut mine, &shards, &t[2..], PAGE, S2);
    }
    for shard in [&b, &c] {
        take_and_free_on(&pool, &mut shard.lock(), &shards, 1, PAGE, S);
    }
    shards.retire(&c);
    assert_eq!(pool.local_counts(&shards).pending_blocks, 5);
    assert_eq!(queries(&pool), 0);
    // SAFETY: S is a fake stream that only the fake upstream sees.
    assert_eq!(unsafe { pool.forget_stream_local(&shards, D, S) }, 4);
    assert_eq!(
        pool.counts().parked_blocks,
        4,
        "in S's order, behind fences"
    );
    assert_eq!(recorded_fences(&pool), 4);
    assert_eq!(
        pool.local_counts(&shards).pending_blocks,
        1,
        "S2's group stays"
    );
    assert!(!shards.may_have_orphans(), "the orphans' group went too");
    // SAFETY: as above.
    assert_eq!(unsafe { pool.forget_stream_local(&shards, D, S) }, 0);
    // SAFETY: the null stream is never given to a driver here.
    let n = unsafe { pool.forget_stream_local(&shards, D, StreamHandle::NULL) };
    assert_eq!(n, 0, "a special stream has no group");
}

#[test]
fn a_block_forget_cannot_hand_over_waits_among_the_orphans() {
    let (_probe, pool, shards, [a]) = threads_probe_on(QUERY_BATCH_BLOCKS, false);
    take_and_free_on(&pool, &mut a.lock(), &shards, 1, PAGE, S);
    {
        let mut st = pool.upstream().st();
        st.fail_record = true;
        st.fail_sync = true;
    }
    // SAFETY: S is a fake stream that only the fake upstream sees.
    assert_eq!(unsafe { pool.forget_stream_local(&shards, D, S) }, 1);
    assert_eq!(pool.counts(), PoolCounts::default(), "refused");
    assert_eq!(pool.local_counts(&shards).pending_blocks, 1, "kept");
    assert!(shards.may_have_orphans(), "by the orphans");
    {
        let mut st = pool.upstream().st();
        st.fail_record = false;
        st.fail_sync = false;
    }
    // SAFETY: as above.
    assert_eq!(unsafe { pool.forget_stream_local(&shards, D, S) }, 1);
    assert_eq!(pool.counts().parked_blocks, 1);
    assert!(!shards.may_have_orphans());
}

#[test]
fn drain_returns_the_pending_blocks_and_gives_the_free_ones_to_the_shared_lists() {
    let (_probe, pool, shards, [a, c]) = threads_probe_on(2, true);
    let mut pending = Vec::new();
    {
        let mut mine = a.lock();
        let t = take_n(&pool, &mut mine, &shards, 2, PAGE);
        let two = pool.take_local(&mut mine, &shards, D, 2 * PAGE).unwrap();
        free_now(&pool, &mut mine, t[0], PAGE);
        free_now(&pool, &mut mine, two, 2 * PAGE);
        assert_eq!(pool.take_local(&mut mine, &shards, D, PAGE), Ok(t[0]));
        free_now(&pool, &mut mine, t[0], PAGE);
        free_on(&pool, &mut mine, &shards, &t[1..], PAGE, S);
        pending.push(t[1]);
    }
    {
        let mut mine = c.lock();
        let t = take_n(&pool, &mut mine, &shards, 2, PAGE);
        free_now(&pool, &mut mine, t[0], PAGE);
        free_on(&pool, &mut mine, &shards, &t[1..], PAGE, S2);
        pending.push(t[1]);
    }
    shards.retire(&c);
    let before = LocalCounts {
        free_blocks: 3,
        free_bytes: 4 * PAGE,
        pending_blocks: 2,
        reuses: 1,
    };
    assert_eq!(
        pool.local_counts(&shards),
        before,
        "a thread's and the orphans'"
    );
    let drained = pool.drain_local(&shards);
    assert_eq!(
        sorted(drained.iter().map(|&(_, a)| a).collect()),
        sorted(pending)
    );
    let shared = PoolCounts {
        parked_blocks: 0,
        free_blocks: 3,
        free_bytes: 4 * PAGE,
    };
    assert_eq!(pool.counts(), shared);
    let after = LocalCounts {
        reuses: 1,
        ..LocalCounts::default()
    };
    assert_eq!(pool.local_counts(&shards), after);
    assert!(!shards.may_have_orphans());
    assert_eq!(queries(&pool), 0, "no driver call");
    // What a failed synchronization keeps: no query of any stream proves it.
    // SAFETY: the pending blocks `drain_local` returned, kept once.
    unsafe { pool.keep_pending(&shards, drained) };
    assert_eq!(pool.local_counts(&shards).pending_blocks, 2);
    assert!(shards.may_have_orphans());
    take_and_free_on(&pool, &mut a.lock(), &shards, 2, PAGE, S);
    assert_eq!(queries(&pool), 1);
    assert_eq!(pool.local_counts(&shards).pending_blocks, 2, "still kept");
    let drained = pool.drain_local(&shards);
    assert_eq!(drained.len(), 2);
    // SAFETY: pool blocks, given once; "a synchronization" has passed.
    unsafe { pool.give_all(drained) };
    // Four pages and one of two: the last two taken came from the shared
    // lists.
    assert_eq!(pool.trim(D), Ok(6 * PAGE));
    assert!(pool.upstream().st().live.is_empty(), "nothing lost");
}

#[test]
fn a_free_on_a_special_stream_goes_to_the_shared_lists() {
    let (_probe, pool, shards, [a]) = threads_probe_on(QUERY_BATCH_BLOCKS, true);
    take_and_free_on(&pool, &mut a.lock(), &shards, 1, PAGE, StreamHandle::NULL);
    assert_eq!(pool.counts().free_blocks, 1, "idle: free at once, shared");
    assert_eq!(queries(&pool), 1, "`give_after`'s probe");
    assert_eq!(pool.local_counts(&shards), LocalCounts::default());
}

#[test]
fn with_the_idle_probe_off_a_stream_free_goes_straight_to_give_after() {
    /// Turns the probe back on when the test ends, failed or not.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            CudaBackend::new().set_idle_probe(true);
        }
    }
    // Alone: no test that needs the probe on runs meanwhile.
    let _alone = PROBE.write().unwrap_or_else(|p| p.into_inner());
    CudaBackend::new().set_idle_probe(false);
    let _restore = Restore;
    let (pool, shards, [a]) = threads(QUERY_BATCH_BLOCKS, true);
    take_and_free_on(&pool, &mut a.lock(), &shards, 1, PAGE, S);
    assert_eq!(
        pool.counts().parked_blocks,
        1,
        "behind a fence, idle or not"
    );
    assert_eq!(recorded_fences(&pool), 1);
    assert_eq!(queries(&pool), 0);
    assert_eq!(pool.local_counts(&shards), LocalCounts::default());
}

#[test]
fn sizes_no_class_holds_are_refused_before_anything_moves() {
    let (pool, shards, [a]) = threads(1, true);
    let mut mine = a.lock();
    let refused = pool.take_local(&mut mine, &shards, D, usize::MAX);
    assert_eq!(refused, Err("invalid size"));
    // SAFETY: refused before the pool touches anything.
    let refused = unsafe { pool.give_local(&mut mine, 1, usize::MAX) };
    assert_eq!(refused, Err("invalid size"));
    // SAFETY: as above.
    let refused = unsafe { pool.give_after_local(&mut mine, &shards, D, 1, usize::MAX, S) };
    assert_eq!(refused, Err("invalid size"));
    drop(mine);
    assert_eq!(pool.local_counts(&shards), LocalCounts::default());
    assert_eq!(pool.counts(), PoolCounts::default());
    assert_eq!(queries(&pool), 0);
}
