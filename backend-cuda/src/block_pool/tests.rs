//! Unit tests of the block pool over a sequential fake upstream.

use std::collections::{HashMap, HashSet};

use super::*;

#[test]
fn classes_are_powers_of_two_from_one_page() {
    assert_eq!(class_of(0), Some(0));
    assert_eq!(class_of(1), Some(0));
    assert_eq!(class_of(4096), Some(0));
    assert_eq!(class_of(4097), Some(1));
    assert_eq!(class_of(64 * 1024), Some(4));
    assert_eq!(class_of(64 * 1024 + 1), Some(5));
    assert_eq!(class_size(class_of(2 << 20).unwrap()), 2 << 20);
    assert_eq!(class_of(1 << 63), Some(63 - 12));
    assert_eq!(class_of((1 << 63) + 1), None);
    assert_eq!(class_of(usize::MAX), None);
    for size in [1, 100, 4095, 4096, 5000, 65536, 1 << 20, (1 << 20) + 3] {
        let c = class_of(size).unwrap();
        assert!(class_size(c) >= size);
        assert!(c == 0 || class_size(c - 1) < size);
    }
}

#[test]
fn free_lists_count_blocks_and_bytes() {
    let mut l = Lists::<EventHandle>::default();
    assert_eq!(l.pop_free(3), None);
    l.push_free(3, 0x1000);
    l.push_free(0, 0x2000);
    l.push_free(3, 0x3000);
    assert_eq!((l.free_blocks, l.free_bytes), (3, 2 * 32768 + 4096));
    assert_eq!(l.pop_free(3), Some(0x3000), "newest first");
    assert_eq!(l.pop_free(1), None);
    assert_eq!(l.pop_free(3), Some(0x1000));
    assert_eq!(l.pop_free(0), Some(0x2000));
    assert_eq!((l.free_blocks, l.free_bytes), (0, 0));
}

#[test]
fn a_class_without_parked_blocks_reclaims_nothing_and_asks_no_driver() {
    let mut l = Lists::<EventHandle>::default();
    assert_eq!(l.reclaim_one(&PoolKind::Pinned, 2, DeviceId(0)), None);
    l.reclaim_all(&PoolKind::Pinned, DeviceId(0));
    assert_eq!(l.parked_blocks, 0);
}

/// A sequential upstream: fences complete when the test says so.
#[derive(Default)]
struct Fake(std::sync::Mutex<FakeState>);

#[derive(Default)]
struct FakeState {
    next_block: usize,
    live: HashSet<usize>,
    /// Live fences: `Some(complete)` once recorded.
    fences: HashMap<usize, Option<bool>>,
    next_fence: usize,
    fail_record: bool,
    fail_sync: bool,
    fail_free: bool,
    synchronized: usize,
    /// What a stream query answers (the tests' streams are busy unless
    /// they say otherwise).
    stream_idle: bool,
    stream_queries: usize,
}

impl Fake {
    fn st(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0.lock().unwrap()
    }
}

impl Upstream for Fake {
    type Error = &'static str;
    type Fence = usize;

    fn invalid_size(&self) -> &'static str {
        "invalid size"
    }
    fn allocate(&self, _: DeviceId, bytes: usize) -> Result<usize, &'static str> {
        let mut st = self.st();
        st.next_block += 1;
        let addr = st.next_block << 32 | bytes;
        st.live.insert(addr);
        Ok(addr)
    }
    unsafe fn free(&self, _: DeviceId, addr: usize) -> Result<(), &'static str> {
        let mut st = self.st();
        if st.fail_free {
            return Err("free failed");
        }
        assert!(st.live.remove(&addr), "freed twice or never allocated");
        Ok(())
    }
    fn create_fence(&self, _: DeviceId) -> Result<usize, &'static str> {
        let mut st = self.st();
        st.next_fence += 1;
        let f = st.next_fence;
        st.fences.insert(f, None);
        Ok(f)
    }
    fn record_fence(&self, f: usize, _: StreamHandle, _: DeviceId) -> Result<(), &'static str> {
        let mut st = self.st();
        if st.fail_record {
            return Err("record failed");
        }
        *st.fences.get_mut(&f).expect("a live fence") = Some(false);
        Ok(())
    }
    fn query_fence(&self, f: usize, _: DeviceId) -> Result<Completion, &'static str> {
        match self.st().fences[&f] {
            Some(false) => Ok(Completion::Pending),
            _ => Ok(Completion::Complete),
        }
    }
    fn destroy_fence(&self, f: usize, _: DeviceId) -> Result<(), &'static str> {
        self.st().fences.remove(&f).map(drop).ok_or("no such fence")
    }
    fn synchronize(&self, _: StreamHandle, _: DeviceId) -> Result<(), &'static str> {
        let mut st = self.st();
        if st.fail_sync {
            return Err("synchronize failed");
        }
        st.synchronized += 1;
        Ok(())
    }
    fn query_stream(&self, _: StreamHandle, _: DeviceId) -> Result<Completion, &'static str> {
        let mut st = self.st();
        st.stream_queries += 1;
        if st.stream_idle {
            Ok(Completion::Complete)
        } else {
            Ok(Completion::Pending)
        }
    }
    fn stream_id(&self, s: StreamHandle, _: DeviceId) -> Option<u64> {
        (!s.is_special()).then_some(s.as_raw() as u64)
    }
}

const D: DeviceId = DeviceId(0);
// SAFETY: a fake stream, only ever given to the fake upstream (which never
// reaches a driver).
const S: StreamHandle = unsafe { StreamHandle::from_raw(0x1000) };

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
