//! Models of the CUDA backend's pinned/managed block pool
//! (`gpupool_cuda::block_pool::Pool`, the code `BlockPool` runs) over a fake
//! upstream: blocks are numbers, streams are two counters (work queued, work
//! completed) and a fence is a recorded (stream, position) pair that is
//! complete once the stream's completed count reaches the position. A "GPU"
//! thread completes the streams' work while the pool's users take and return
//! blocks.
//!
//! The fake is also the oracle. It remembers where each block was last used
//! (stream and position) and asserts, when the pool hands a block out and
//! when the pool frees one upstream, that this use has completed; that a
//! fence is recorded again, or destroyed, only after a query saw its last
//! recording complete (so no parked block can still wait on it); that no
//! block is freed twice or lost (every block allocated is freed by the final
//! trim), and no fence leaked.
//!
//! `shards.rs` runs the blocks each thread keeps in front of the pool over
//! the same fake (hence the `pub(super)` items).

use std::collections::{HashMap, HashSet};

use gpupool_core::{Completion, DeviceId, StreamHandle};
use gpupool_cuda::block_pool::{Pool, PoolCounts, Upstream};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Mutex, MutexGuard};

use super::{model_deep, spawn_scoped};

pub(super) const D: DeviceId = DeviceId(0);
pub(super) const PAGE: usize = 4096;
pub(super) const STREAMS: usize = 2;

pub(super) fn stream(i: usize) -> StreamHandle {
    // SAFETY: the handle goes only to the fake upstream below, which takes it
    // for an index into its counters, never to a backend.
    unsafe { StreamHandle::from_raw(0x1000 + i) }
}

fn index(s: StreamHandle) -> usize {
    s.as_raw() - 0x1000
}

/// One simulated stream: work items queued and completed, in order.
struct FakeStream {
    queued: AtomicUsize,
    done: AtomicUsize,
}

#[derive(Debug, Default)]
pub(super) struct FenceState {
    /// (stream, position) of the last recording.
    recorded: Option<(usize, usize)>,
    /// Whether a query has seen that recording complete.
    seen_complete: bool,
}

impl FenceState {
    /// Checks that no parked block may wait on fence `f` (never recorded,
    /// or its recording seen complete) before it is `what` (the message).
    fn assert_unwaited(&self, f: usize, what: &str) {
        assert!(
            self.recorded.is_none() || self.seen_complete,
            "fence {f} {what} while a parked block may wait on it"
        );
    }
}

/// The fake's bookkeeping. Behind a loom mutex, not a std one: loom prunes
/// interleavings that differ only in the order of accesses it cannot see, and
/// a fence recorded after a taker's query (say) differs from one recorded
/// before it only here.
#[derive(Debug, Default)]
pub(super) struct Book {
    next_block: usize,
    /// Blocks allocated and not freed.
    pub(super) live: HashSet<usize>,
    /// Where each block was last used: (stream, position).
    last_use: HashMap<usize, (usize, usize)>,
    pub(super) fences: HashMap<usize, FenceState>,
    next_fence: usize,
    fail_record: bool,
}

pub(super) struct FakeGpu {
    streams: [FakeStream; STREAMS],
    book: Mutex<Book>,
}

impl FakeGpu {
    pub(super) fn new() -> Self {
        FakeGpu {
            streams: [(); STREAMS].map(|_| FakeStream {
                queued: AtomicUsize::new(0),
                done: AtomicUsize::new(0),
            }),
            book: Mutex::new(Book::default()),
        }
    }

    pub(super) fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap()
    }

    /// A kernel on stream `s` that uses `addr`.
    pub(super) fn use_block(&self, addr: usize, s: usize) {
        // AcqRel: stands for the ordering a launch has with the stream.
        let pos = self.streams[s].queued.fetch_add(1, Ordering::AcqRel) + 1;
        self.book().last_use.insert(addr, (s, pos));
    }

    /// The GPU finishes everything queued on `s` so far.
    pub(super) fn complete_all(&self, s: usize) {
        let st = &self.streams[s];
        // Acquire/Release: the GPU's completion publishes that the work is
        // done to whoever then observes `done` (a fence query, the oracle).
        let queued = st.queued.load(Ordering::Acquire);
        st.done.fetch_max(queued, Ordering::AcqRel);
    }

    fn reached(&self, s: usize, pos: usize) -> bool {
        // Acquire: pairs with the GPU's completion.
        self.streams[s].done.load(Ordering::Acquire) >= pos
    }

    /// The oracle: nothing may still be running that uses `addr`.
    pub(super) fn assert_unused(&self, addr: usize, what: &str) {
        let last = self.book().last_use.get(&addr).copied();
        if let Some((s, pos)) = last {
            assert!(
                self.reached(s, pos),
                "block {addr:#x} {what} while its last use (stream {s}, item {pos}) may still run"
            );
        }
    }
}

impl Upstream for FakeGpu {
    type Error = &'static str;
    type Fence = usize;

    fn invalid_size(&self) -> &'static str {
        "invalid size"
    }

    fn allocate(&self, _: DeviceId, bytes: usize) -> Result<usize, &'static str> {
        assert_eq!(bytes, PAGE);
        let mut book = self.book();
        book.next_block += 1;
        let addr = book.next_block * 0x10_0000;
        book.live.insert(addr);
        Ok(addr)
    }

    unsafe fn free(&self, _: DeviceId, addr: usize) -> Result<(), &'static str> {
        self.assert_unused(addr, "freed upstream");
        assert!(
            self.book().live.remove(&addr),
            "block {addr:#x} freed twice or never allocated"
        );
        Ok(())
    }

    fn create_fence(&self, _: DeviceId) -> Result<usize, &'static str> {
        let mut book = self.book();
        book.next_fence += 1;
        let f = book.next_fence;
        book.fences.insert(f, FenceState::default());
        Ok(f)
    }

    fn record_fence(&self, f: usize, s: StreamHandle, _: DeviceId) -> Result<(), &'static str> {
        let s = index(s);
        // Acquire: the recording thread's own launches are before it anyway.
        let pos = self.streams[s].queued.load(Ordering::Acquire);
        let mut book = self.book();
        if book.fail_record {
            return Err("record failed");
        }
        let fence = book
            .fences
            .get_mut(&f)
            .expect("record on a destroyed fence");
        fence.assert_unwaited(f, "recorded again");
        *fence = FenceState {
            recorded: Some((s, pos)),
            seen_complete: false,
        };
        Ok(())
    }

    fn query_fence(&self, f: usize, _: DeviceId) -> Result<Completion, &'static str> {
        let recorded = {
            let book = self.book();
            book.fences
                .get(&f)
                .expect("query of a destroyed fence")
                .recorded
        };
        let complete = recorded.is_none_or(|(s, pos)| self.reached(s, pos));
        if !complete {
            return Ok(Completion::Pending);
        }
        if let Some(fence) = self.book().fences.get_mut(&f) {
            fence.seen_complete = true;
        }
        Ok(Completion::Complete)
    }

    fn destroy_fence(&self, f: usize, _: DeviceId) -> Result<(), &'static str> {
        let fence = self
            .book()
            .fences
            .remove(&f)
            .expect("fence destroyed twice");
        fence.assert_unwaited(f, "destroyed");
        Ok(())
    }

    fn synchronize(&self, s: StreamHandle, _: DeviceId) -> Result<(), &'static str> {
        // The host waits: the stream finishes its work.
        self.complete_all(index(s));
        Ok(())
    }

    fn query_stream(&self, s: StreamHandle, _: DeviceId) -> Result<Completion, &'static str> {
        let st = &self.streams[index(s)];
        // Acquire: the asking thread's own launches are before it anyway; the
        // load of `done` pairs with the GPU's completion.
        let queued = st.queued.load(Ordering::Acquire);
        if st.done.load(Ordering::Acquire) >= queued {
            Ok(Completion::Complete)
        } else {
            Ok(Completion::Pending)
        }
    }

    fn stream_id(&self, s: StreamHandle, _: DeviceId) -> Option<u64> {
        Some(index(s) as u64)
    }
}

/// The pool, and the blocks its users hold (so a block handed to two of them
/// at once is caught).
struct Harness {
    pool: Pool<FakeGpu>,
    held: Mutex<HashSet<usize>>,
}

impl Harness {
    fn new() -> Self {
        Harness {
            pool: Pool::new(FakeGpu::new()),
            held: Mutex::new(HashSet::new()),
        }
    }

    fn gpu(&self) -> &FakeGpu {
        self.pool.upstream()
    }

    /// Takes a page, checks it, and holds it.
    fn take(&self) -> usize {
        let addr = self.pool.take(D, PAGE).unwrap();
        self.gpu().assert_unused(addr, "handed out");
        assert!(
            self.held.lock().unwrap().insert(addr),
            "block {addr:#x} handed to two takers"
        );
        addr
    }

    /// Stops holding `addr` and returns it in the order of stream `s`.
    fn give_after(&self, addr: usize, s: usize) {
        assert!(self.held.lock().unwrap().remove(&addr));
        // SAFETY: a page this harness took and holds; only work on stream `s`
        // (the fake's counters, no memory) may still use it.
        unsafe { self.pool.give_after(D, addr, PAGE, stream(s)) }.unwrap();
    }

    /// Uses `addr` on stream `s` (the fake GPU's next item there), then
    /// returns it in that stream's order ([`Harness::give_after`]).
    fn use_then_give_after(&self, addr: usize, s: usize) {
        self.gpu().use_block(addr, s);
        self.give_after(addr, s);
    }

    /// Stops holding `addr` and returns it for immediate reuse.
    fn give(&self, addr: usize) {
        assert!(self.held.lock().unwrap().remove(&addr));
        self.gpu()
            .assert_unused(addr, "given back for immediate reuse");
        // SAFETY: as above, and its last use has completed (checked).
        unsafe { self.pool.give(addr, PAGE) }.unwrap();
    }

    /// Completes every stream, trims, and checks that every block came back
    /// and was freed exactly once, and every fence was destroyed.
    fn finish(&self, takes: u64) {
        assert!(self.held.lock().unwrap().is_empty());
        for s in 0..STREAMS {
            self.gpu().complete_all(s);
        }
        let allocated = self.gpu().book().next_block;
        let freed_before = self.pool.tallies().upstream_frees as usize;
        let freed = self.pool.trim(D).unwrap();
        let t = self.pool.tallies();
        assert_eq!(freed, (allocated - freed_before) * PAGE, "a block was lost");
        assert_eq!(self.pool.counts(), PoolCounts::default());
        assert_eq!(t.upstream_allocations, allocated as u64);
        assert_eq!(t.upstream_frees, allocated as u64);
        assert_eq!(t.upstream_allocations + t.reuses, takes);
        let book = self.gpu().book();
        assert!(book.live.is_empty(), "blocks never freed: {:?}", book.live);
        assert!(book.fences.is_empty(), "fences leaked: {:?}", book.fences);
    }
}

/// [`model_deep`] of `execution` on a fresh harness each time.
fn model_on_a_harness(execution: impl Fn(&Harness) + Sync + Send + 'static) {
    model_deep(move || execution(&Harness::new()));
}

/// Two threads take a page while the block parked behind a pending fence
/// becomes free as the GPU completes its stream: neither gets it before the
/// fence completes, no block goes to both, each uses its page on its own
/// stream and returns it in that stream's order, and everything comes back.
#[test]
fn reuse_waits_for_the_fence() {
    model_on_a_harness(|h| {
        let a = h.take();
        h.use_then_give_after(a, 0); // parked behind a fence on stream 0
        let taker = |s: usize| {
            let b = h.take();
            h.use_then_give_after(b, s);
        };
        let gpu = spawn_scoped(|| {
            h.gpu().complete_all(0);
            h.gpu().complete_all(1);
        });
        let t = spawn_scoped(move || taker(1));
        taker(0);
        t.join();
        gpu.join();
        h.finish(3);
    });
}

/// A stream-ordered return races a trim, with the GPU completing the stream:
/// the return takes the pool's only idle fence (or makes one if the trim
/// destroyed it first), and the trim frees the free block and whatever parked
/// block it finds complete, never a block whose fence is pending, never a
/// fence a block waits on.
#[test]
fn give_after_races_trim() {
    model_on_a_harness(|h| {
        // Set up: one idle fence (seen complete), one free page, one held.
        let a = h.take();
        h.use_then_give_after(a, 0);
        h.gpu().complete_all(0);
        let a = h.take(); // the parked page again: its fence goes idle
        let b = h.take();
        h.give(b);
        let user = spawn_scoped(|| h.use_then_give_after(a, 0));
        let gpu = spawn_scoped(|| h.gpu().complete_all(0));
        let trimmed = h.pool.trim(D).unwrap();
        user.join();
        gpu.join();
        assert!(trimmed == PAGE || trimmed == 2 * PAGE, "trimmed {trimmed}");
        h.finish(3);
    });
}

/// A return whose fence cannot be recorded (the fence is destroyed, the
/// stream synchronized, the page freed at once) races a take: the taker gets
/// the page only after the synchronize, or a new one.
#[test]
fn failed_record_races_take() {
    model_on_a_harness(|h| {
        let a = h.take();
        h.gpu().book().fail_record = true;
        let user = spawn_scoped(|| h.use_then_give_after(a, 0));
        let b = h.take();
        h.gpu().use_block(b, 1);
        user.join();
        h.gpu().book().fail_record = false;
        h.give_after(b, 1);
        h.finish(2);
    });
}

/// A stream-ordered return that finds its stream idle frees the block at
/// once (no fence); here it races the GPU completing that stream and a taker
/// on another thread: the taker gets the block only once its use has
/// completed, never a block still in use, and a return that finds the stream
/// busy parks it behind a fence as before.
#[test]
fn idle_return_races_take() {
    model_on_a_harness(|h| {
        let a = h.take();
        h.gpu().use_block(a, 0);
        let gpu = spawn_scoped(|| h.gpu().complete_all(0));
        let user = spawn_scoped(|| h.give_after(a, 0));
        let b = h.take();
        h.use_then_give_after(b, 1);
        user.join();
        gpu.join();
        h.finish(2);
    });
}
