//! Unit tests of the block pool over a sequential fake upstream.

use std::collections::{HashMap, HashSet};

use super::*;
use crate::shards::{Shard, Shards};
use crate::sync::Arc;

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

// Each thread's own blocks (`local.rs`): free blocks, pending groups by
// stream, the orphans of exited threads. A "thread" here is a shard from
// `Shards::register`, locked by the test.

/// The idle probe ([`CudaBackend::set_idle_probe`]) is one switch for the
/// whole test process: the tests whose outcome depends on it hold this
/// shared ([`probe_on`]), the one that turns it off holds it alone.
static PROBE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A test's shared hold on [`PROBE`]: the idle probe stays on while it lives.
type ProbeGuard = std::sync::RwLockReadGuard<'static, ()>;

/// Keeps the idle probe on for the calling test (until the guard drops).
fn probe_on() -> ProbeGuard {
    let guard = PROBE.read().unwrap_or_else(|p| p.into_inner());
    assert!(idle_probe(), "turned off only under the exclusive lock");
    guard
}

// SAFETY: as for `S`: a fake stream, only ever given to the fake upstream.
const S2: StreamHandle = unsafe { StreamHandle::from_raw(0x2000) };

const PAGE: usize = MIN_BLOCK;

/// A pool over the fake upstream that proves a thread's group of a stream
/// at `batch` blocks, whose streams answer `idle` to a query.
fn local_pool(batch: usize, idle: bool) -> Pool<Fake> {
    let pool = Pool::new(Fake::default()).with_query_batch(batch);
    pool.upstream().st().stream_idle = idle;
    pool
}

/// A thread of the tests: a shard of the registry, which the test locks for
/// the thread's blocks.
type Thread = Arc<Shard<ThreadBlocks>>;

/// A pool as [`local_pool`] makes it, the registry of its threads' blocks,
/// and `N` threads registered there in turn.
fn threads<const N: usize>(
    batch: usize,
    idle: bool,
) -> (Pool<Fake>, Shards<ThreadBlocks>, [Thread; N]) {
    let pool = local_pool(batch, idle);
    let shards = Shards::new();
    let threads = std::array::from_fn(|_| shards.register());
    (pool, shards, threads)
}

/// The idle probe's guard from [`probe_on`], then [`threads`]: the set-up
/// of a test whose outcome depends on the probe (on until the guard drops).
fn threads_probe_on<const N: usize>(
    batch: usize,
    idle: bool,
) -> (ProbeGuard, Pool<Fake>, Shards<ThreadBlocks>, [Thread; N]) {
    let probe = probe_on();
    let (pool, shards, threads) = threads(batch, idle);
    (probe, pool, shards, threads)
}

/// `n` blocks of `size` bytes for the thread whose blocks are `mine`.
fn take_n<U: Upstream<Error = &'static str>>(
    pool: &Pool<U>,
    mine: &mut ThreadBlocks,
    shards: &Shards<ThreadBlocks>,
    n: usize,
    size: usize,
) -> Vec<usize> {
    (0..n)
        .map(|_| pool.take_local(mine, shards, D, size).unwrap())
        .collect()
}

/// The thread whose blocks are `mine` frees `blocks` (each taken from
/// `pool` with `size`, not freed since) in the order of `stream`.
fn free_on<U: Upstream<Error = &'static str>>(
    pool: &Pool<U>,
    mine: &mut ThreadBlocks,
    shards: &Shards<ThreadBlocks>,
    blocks: &[usize],
    size: usize,
    stream: StreamHandle,
) {
    for &addr in blocks {
        // SAFETY: the callers pass blocks of `pool` taken with `size` and
        // freed once here; only "work on `stream`" (fake) may use them.
        unsafe { pool.give_after_local(mine, shards, D, addr, size, stream) }.unwrap();
    }
}

/// The thread whose blocks are `mine` takes `n` blocks of `size` bytes and
/// frees them all in the order of `stream` ([`take_n`], then [`free_on`]);
/// returns them.
fn take_and_free_on(
    pool: &Pool<Fake>,
    mine: &mut ThreadBlocks,
    shards: &Shards<ThreadBlocks>,
    n: usize,
    size: usize,
    stream: StreamHandle,
) -> Vec<usize> {
    let blocks = take_n(pool, mine, shards, n, size);
    free_on(pool, mine, shards, &blocks, size, stream);
    blocks
}

/// The thread whose blocks are `mine` frees `addr` (taken from `pool` with
/// `size`, not freed since) in host order.
fn free_now(pool: &Pool<Fake>, mine: &mut ThreadBlocks, addr: usize, size: usize) {
    // SAFETY: the callers' block, freed once, used by nothing.
    unsafe { pool.give_local(mine, addr, size) }.unwrap();
}

/// Stream queries so far.
fn queries(pool: &Pool<Fake>) -> usize {
    pool.upstream().st().stream_queries
}

/// Fences recorded and not seen complete: one per block parked since.
fn recorded_fences(pool: &Pool<Fake>) -> usize {
    let st = pool.upstream().st();
    st.fences.values().filter(|f| **f == Some(false)).count()
}

/// The stream work behind every recorded fence finishes.
fn complete_fences(pool: &Pool<Fake>) {
    for f in pool.upstream().st().fences.values_mut() {
        *f = Some(true);
    }
}

/// `v`, sorted (blocks come back newest first).
fn sorted(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v
}

mod generations;
mod local;
mod shared_lists;
