//! The shared lists: blocks parked behind fences, trimmed, returned on idle
//! or busy streams, sizes no class holds.

use super::*;

#[test]
fn a_parked_block_is_reused_only_after_its_fence_completes() {
    let pool = Pool::new(Fake::default());
    let a = pool.take(D, 5000).unwrap();
    // SAFETY: taken above with the same size; only "work on S" uses it.
    unsafe { pool.give_after(D, a, 5000, S) }.unwrap();
    assert_eq!(pool.counts().parked_blocks, 1);
    let b = pool.take(D, 8192).unwrap();
    assert_ne!(a, b, "the fence is pending");
    let fence = *pool.upstream().st().fences.keys().next().unwrap();
    *pool.upstream().st().fences.get_mut(&fence).unwrap() = Some(true);
    assert_eq!(pool.take(D, 6000).unwrap(), a, "same class, fence complete");
    // SAFETY: both taken above, unused.
    unsafe { pool.give(a, 6000).unwrap() };
    // SAFETY: as above.
    unsafe { pool.give(b, 8192).unwrap() };
    let t = pool.tallies();
    assert_eq!((t.upstream_allocations, t.reuses), (2, 1));
    assert_eq!(pool.trim(D), Ok(2 * 8192));
    let st = pool.upstream().st();
    assert!(st.live.is_empty() && st.fences.is_empty());
}

#[test]
fn a_failed_record_destroys_the_fence_and_synchronizes_instead() {
    let pool = Pool::new(Fake::default());
    let a = pool.take(D, 4096).unwrap();
    pool.upstream().st().fail_record = true;
    // SAFETY: taken above; only work on S uses it.
    unsafe { pool.give_after(D, a, 4096, S) }.unwrap();
    {
        let st = pool.upstream().st();
        assert!(st.fences.is_empty(), "the unrecorded fence is destroyed");
        assert_eq!(st.synchronized, 1);
    }
    assert_eq!(pool.counts().free_blocks, 1);
    assert_eq!(pool.take(D, 4096).unwrap(), a);
    // Record and synchronize both failing: the record's error, block kept
    // by the caller.
    pool.upstream().st().fail_sync = true;
    // SAFETY: as above.
    let refused = unsafe { pool.give_after(D, a, 4096, S) };
    assert_eq!(refused, Err("record failed"));
    assert_eq!(pool.counts(), PoolCounts::default());
    assert!(pool.upstream().st().live.contains(&a), "still the caller's");
}

#[test]
fn trim_keeps_pending_blocks_and_blocks_the_upstream_refuses() {
    let pool = Pool::new(Fake::default());
    let (a, b) = (pool.take(D, 4096).unwrap(), pool.take(D, 4096).unwrap());
    // SAFETY: taken above; only work on S uses `a`; nothing uses `b`.
    unsafe {
        pool.give_after(D, a, 4096, S).unwrap();
        pool.give(b, 4096).unwrap();
    }
    pool.upstream().st().fail_free = true;
    assert_eq!(pool.trim(D), Err("free failed"));
    let c = pool.counts();
    assert_eq!((c.parked_blocks, c.free_blocks), (1, 1));
    pool.upstream().st().fail_free = false;
    assert_eq!(pool.trim(D), Ok(4096));
    assert_eq!(pool.counts().parked_blocks, 1, "its fence is pending");
    for f in pool.upstream().st().fences.values_mut() {
        *f = Some(true);
    }
    assert_eq!(pool.trim(D), Ok(4096));
    assert_eq!(pool.counts(), PoolCounts::default());
    assert_eq!(pool.tallies().upstream_frees, 2);
    let st = pool.upstream().st();
    assert!(st.live.is_empty() && st.fences.is_empty());
}

#[test]
fn a_return_on_an_idle_stream_is_free_at_once_and_a_busy_one_backs_off() {
    let _probe = probe_on();
    let pool = Pool::new(Fake::default());
    pool.upstream().st().stream_idle = true;
    let a = pool.take(D, 4096).unwrap();
    // SAFETY: taken above with the same size; only "work on S" uses it.
    unsafe { pool.give_after(D, a, 4096, S) }.unwrap();
    assert_eq!(pool.counts().free_blocks, 1, "free at once");
    assert!(pool.upstream().st().fences.is_empty(), "no fence");
    assert_eq!(pool.take(D, 4096).unwrap(), a);
    // Busy: fenced, and the next seven returns do not ask.
    pool.upstream().st().stream_idle = false;
    let mut asked = Vec::new();
    for _ in 0..9 {
        let before = pool.upstream().st().stream_queries;
        // SAFETY: as above (the block is taken again right after).
        unsafe { pool.give_after(D, a, 4096, S) }.unwrap();
        asked.push(pool.upstream().st().stream_queries - before);
        assert_eq!(pool.counts().parked_blocks, 1, "parked behind its fence");
        let fence = *pool.upstream().st().fences.keys().next().unwrap();
        *pool.upstream().st().fences.get_mut(&fence).unwrap() = Some(true);
        assert_eq!(pool.take(D, 4096).unwrap(), a);
    }
    assert_eq!(asked, [1, 0, 0, 0, 0, 0, 0, 0, 1]);
    // SAFETY: taken above, unused.
    unsafe { pool.give(a, 4096).unwrap() };
    assert_eq!(pool.trim(D), Ok(4096));
}

#[test]
fn a_size_no_class_holds_is_refused() {
    let pool = Pool::new(Fake::default());
    assert_eq!(pool.take(D, usize::MAX), Err("invalid size"));
    // SAFETY: refused before the pool touches anything.
    assert_eq!(unsafe { pool.give(1, usize::MAX) }, Err("invalid size"));
}
