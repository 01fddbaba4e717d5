//! Models of the CUDA backend's per-thread shards (`gpupool_cuda::shards`)
//! and of the pinned/managed blocks each thread keeps in them
//! (`gpupool_cuda::block_pool::ThreadBlocks`, `Pool::take_local`,
//! `give_after_local`, `settle`, `drain_local`, `forget_stream_local`): the
//! code the CUDA pools run, over the fake upstream of `block_pool.rs`, whose
//! streams a simulated GPU thread completes and which is also the oracle (no
//! block handed out or freed upstream while its last use may still run).
//!
//! A model thread registers a shard ([`Shards::register`]) and retires it
//! when it "exits" ([`Shards::retire`]), as the backend's thread-local
//! (`LocalShards`) does, and locks its shard for each call, as
//! `LocalShards::with` does, so a trim or a forget can visit it between the
//! owner's calls.
//!
//! Each model over blocks ends with [`Harness::finish`]: every block
//! allocated is, at that moment, in exactly one place (held by a user, free
//! or pending in a shard or the orphans, free or parked in the shared lists:
//! the counts add up to the blocks the fake holds live); then, after the
//! streams complete, a trim as the backend's (`drain_local`, the context
//! synchronization, `give_all`, `Pool::trim`) frees every block exactly
//! once. The last model runs `Shards` alone, over numbered items.

use std::collections::{BTreeSet, HashSet};

use gpupool_cuda::block_pool::{LocalCounts, Pool, PoolCounts, ThreadBlocks};
use gpupool_cuda::shards::{Shard, ShardState, Shards};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};

use super::block_pool::{stream, FakeGpu, D, PAGE, STREAMS};
use super::thread_exit::Outcomes;
use super::{model_deep, spawn_scoped, Scoped};

/// A pool over the fake with its threads' shards, and the blocks the model's
/// users hold (so a block handed to two of them at once is caught).
struct Harness {
    pool: Pool<FakeGpu>,
    shards: Shards<ThreadBlocks>,
    held: Mutex<HashSet<usize>>,
}

impl Harness {
    /// A pool whose threads prove a stream's group free (one query) once it
    /// holds `batch` blocks.
    fn new(batch: usize) -> Self {
        Harness {
            pool: Pool::new(FakeGpu::new()).with_query_batch(batch),
            shards: Shards::new(),
            held: Mutex::new(HashSet::new()),
        }
    }

    fn gpu(&self) -> &FakeGpu {
        self.pool.upstream()
    }

    /// The calling thread's shard (its first memory call).
    fn register(&self) -> Arc<Shard<ThreadBlocks>> {
        self.shards.register()
    }

    /// The thread of `shard` exits.
    fn retire(&self, shard: Arc<Shard<ThreadBlocks>>) {
        self.shards.retire(&shard);
    }

    /// Takes a page for the thread of `shard`, checks it, and holds it.
    fn take(&self, shard: &Shard<ThreadBlocks>) -> usize {
        let addr = self
            .pool
            .take_local(&mut shard.lock(), &self.shards, D, PAGE)
            .unwrap();
        self.gpu().assert_unused(addr, "handed out");
        assert!(
            self.held.lock().unwrap().insert(addr),
            "block {addr:#x} handed to two takers"
        );
        addr
    }

    /// Stops holding `addr` and frees it in the order of stream `s`, from the
    /// thread of `shard`.
    fn give_after(&self, shard: &Shard<ThreadBlocks>, addr: usize, s: usize) {
        assert!(self.held.lock().unwrap().remove(&addr));
        // SAFETY: a page this harness took and holds; only work on stream `s`
        // (the fake's counters, no memory) may still use it.
        unsafe {
            self.pool
                .give_after_local(&mut shard.lock(), &self.shards, D, addr, PAGE, stream(s))
        }
        .unwrap();
    }

    /// Stops holding `addr` and frees it for immediate reuse, from the
    /// thread of `shard`.
    fn give(&self, shard: &Shard<ThreadBlocks>, addr: usize) {
        assert!(self.held.lock().unwrap().remove(&addr));
        self.gpu()
            .assert_unused(addr, "given back for immediate reuse");
        // SAFETY: as above, and its last use has completed (checked).
        unsafe { self.pool.give_local(&mut shard.lock(), addr, PAGE) }.unwrap();
    }

    /// The backend's `trim_memory` for one pool: the threads' blocks out
    /// (the pending ones proven free by a synchronization of the context,
    /// here every stream completing, *after* the drain), then the pool's trim.
    /// Returns how many pending blocks the drain found.
    fn trim(&self) -> usize {
        let pending = self.pool.drain_local(&self.shards);
        let n = pending.len();
        if n > 0 {
            for s in 0..STREAMS {
                self.gpu().complete_all(s);
            }
            // SAFETY: each block is one the drain took out of a shard (given
            // once), freed in the order of a stream that has since finished
            // all its work.
            unsafe { self.pool.give_all(pending) };
        }
        self.pool.trim(D).unwrap();
        n
    }

    /// Checks that every block is in one place only and nothing is lost:
    /// the blocks the fake holds live are as many as those held, kept by the
    /// threads and the orphans, and in the shared lists. Then completes the
    /// streams, trims, and checks that everything was freed exactly once (the
    /// fake asserts a double free) and no fence leaked. `takes`: how many
    /// blocks the users took in all.
    fn finish(&self, takes: u64) {
        let held = self.held.lock().unwrap().len();
        let local = self.pool.local_counts(&self.shards);
        let shared = self.pool.counts();
        let live = self.gpu().book().live.len();
        assert_eq!(
            held + local.free_blocks
                + local.pending_blocks
                + shared.free_blocks
                + shared.parked_blocks,
            live,
            "blocks lost or in two places: {held} held, {local:?}, {shared:?}, {live} live"
        );
        let t = self.pool.tallies();
        assert_eq!(
            t.upstream_allocations + t.reuses + local.reuses,
            takes,
            "takes miscounted"
        );
        assert_eq!(held, 0, "the model left a block held");
        for s in 0..STREAMS {
            self.gpu().complete_all(s);
        }
        self.trim();
        assert_eq!(
            self.pool.local_counts(&self.shards),
            LocalCounts {
                reuses: local.reuses,
                ..LocalCounts::default()
            }
        );
        assert_eq!(self.pool.counts(), PoolCounts::default());
        let t = self.pool.tallies();
        assert_eq!(t.upstream_frees, t.upstream_allocations);
        let book = self.gpu().book();
        assert!(book.live.is_empty(), "blocks never freed: {:?}", book.live);
        assert!(book.fences.is_empty(), "fences leaked: {:?}", book.fences);
        assert!(!self.shards.may_have_orphans(), "orphans hint left raised");
    }
}

/// Adoption from an exited thread. Thread A frees a block in the order of
/// stream 0 and one in the order of stream 1 (each pending in its shard: the
/// batch is two) and one for immediate reuse, then exits (its shard's
/// contents go to the orphans, the free block with the group of its last
/// stream, 1, where any thread's miss may take it). This thread, B, takes
/// two pages (possibly A's free one, from the orphans), uses them on stream
/// 0 and frees them in its order. A free settles B's group of stream 0 when
/// the group is full (the second free) or, earlier, when B has no free block
/// and the orphans hold a group of stream 0 (the first, if A is gone by
/// then): the settle adopts the orphans' group of stream 0 (only that one:
/// stream 1's work never completes before the final trim) and proves it with
/// B's own in one query, which must cover A's use (A's free, and so its use,
/// happened before its exit, which happened before B took the orphans'
/// lock, before the query). Then B takes a page again. A GPU thread
/// completes stream 0 once, at any point.
///
/// The oracle: no page handed out while its last use may run. Every block
/// is in one place at the end and freed once. Both outcomes must be reached:
/// B's last take was served A's block from its own free list, adopted and
/// proven by a settle, and it was not. Three threads and a dozen memory
/// calls: explored with the suite's bound (2), not `model_deep`'s (3 takes
/// about a minute).
#[test]
fn adoption_from_an_exited_thread() {
    Outcomes::model(|| {
        let h = &Harness::new(2);
        let exiting = spawn_scoped(move || {
            let mine = h.register();
            let x = h.take(&mine);
            let z = h.take(&mine);
            let w = h.take(&mine);
            h.gpu().use_block(x, 0);
            h.give_after(&mine, x, 0);
            h.gpu().use_block(z, 1);
            h.give_after(&mine, z, 1);
            h.give(&mine, w);
            h.retire(mine);
            x
        });
        let gpu = spawn_scoped(move || h.gpu().complete_all(0));
        let mine = h.register();
        let y1 = h.take(&mine);
        let y2 = h.take(&mine);
        h.gpu().use_block(y1, 0);
        h.gpu().use_block(y2, 0);
        h.give_after(&mine, y1, 0);
        h.give_after(&mine, y2, 0); // may settle
        let again = h.take(&mine);
        let x = exiting.join();
        gpu.join();
        // A's block reaches the shared lists only through B's settle (a
        // busy answer) and nothing else does before it: served A's block
        // with no shared-list reuse, B's own free list had it, adopted.
        let adopted = again == x && h.pool.tallies().reuses == 0;
        h.give_after(&mine, again, 0);
        h.retire(mine);
        h.finish(6);
        adopted
    });
}

/// The owner's part of the trim and forget models: takes two pages, uses them
/// on stream 0, frees them in its order (with a batch of two, the second
/// settles the group) and takes a page again, which it returns.
fn two_on_stream_0_then_one(h: &Harness, mine: &Shard<ThreadBlocks>) -> usize {
    let x = h.take(mine);
    let y = h.take(mine);
    h.gpu().use_block(x, 0);
    h.gpu().use_block(y, 0);
    h.give_after(mine, x, 0);
    h.give_after(mine, y, 0);
    h.take(mine)
}

/// Spawns the owner of the trim and forget models: it registers, runs
/// [`two_on_stream_0_then_one`], frees the page it took last with
/// `free_last` and retires.
fn spawn_owner(h: &Harness, free_last: fn(&Harness, &Shard<ThreadBlocks>, usize)) -> Scoped<()> {
    spawn_scoped(move || {
        let mine = h.register();
        let z = two_on_stream_0_then_one(h, &mine);
        free_last(h, &mine, z);
        h.retire(mine);
    })
}

/// A trim racing an owner. The owner (A) takes two pages, uses them on
/// stream 0 and frees them in its order (batch two: the first waits in its
/// group, the second settles the group), takes a page again and frees it for
/// reuse; meanwhile B runs the backend's trim (`drain_local`, which takes
/// A's free and pending blocks out of its shard between A's calls, then the
/// context synchronization, `give_all` and the pool's trim). The pending
/// blocks the drain takes must not be handed out before the synchronization
/// (the oracle), and the group A settles is only what is still in its shard.
///
/// Both outcomes must be reached: the drain found a pending block, and it
/// found none.
#[test]
fn trim_races_an_owner() {
    Outcomes::model_deep(|| {
        let h = &Harness::new(2);
        let owner = spawn_owner(h, |h, mine, z| h.give(mine, z));
        let drained = h.trim();
        owner.join();
        h.finish(3);
        drained > 0
    });
}

/// A forget racing an owner. As in `trim_races_an_owner`, the owner frees
/// two pages in the order of stream 0 (the second settles its group) and
/// takes one again, while B forgets stream 0 (`forget_stream_local`: every
/// shard's group of the stream to the shared lists, each block free only if
/// a query finds the stream idle, else parked behind a fence), and a GPU
/// thread completes the stream once. Nothing is handed out before its use
/// completed; every block in one place; both outcomes reached (the forget
/// found a block, and none).
#[test]
fn forget_races_an_owner() {
    Outcomes::model_deep(|| {
        let h = &Harness::new(2);
        let owner = spawn_owner(h, |h, mine, z| h.give_after(mine, z, 0));
        let gpu = spawn_scoped(move || h.gpu().complete_all(0));
        // SAFETY: stream 0 of the fake, usable throughout.
        let forgotten = unsafe { h.pool.forget_stream_local(&h.shards, D, stream(0)) };
        owner.join();
        gpu.join();
        h.finish(3);
        forgotten > 0
    });
}

/// What a shard of the registry model holds: numbered items.
#[derive(Debug, Default)]
struct Items(Vec<u32>);

impl ShardState for Items {
    type Shared = ();

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn absorb(&mut self, from: &mut Self, (): &()) {
        self.0.append(&mut from.0);
    }
}

/// The registry itself (`Shards`), with the relaxed hint that lets a miss
/// skip the orphans' lock. Thread A puts item 1 in its shard and exits
/// (`retire`); thread B puts item 2 in its shard and takes whatever the
/// orphans hold if the hint says they may hold something (a miss; B exits
/// after the checks below); this thread visits every shard and the orphans
/// (`each`, as a trim does), takes what it finds, and then puts item 3 among
/// the orphans (locked without the hint, as a trim whose synchronization
/// failed does: `keep_pending`).
///
/// - The visit finds every item put before it began (the putter's flag
///   seen) unless B took it already: whatever a shard held is, at every
///   moment, in that shard or in the orphans, a retire in progress included.
/// - Once A and B are done the hint is exact (raised if and only if the
///   orphans hold something: a hint left down over orphans would hide them
///   from every later miss).
/// - Nothing is lost or found twice: every item is found exactly once by B,
///   the visit, or a final visit after B's exit.
#[test]
fn retire_races_an_orphans_reader() {
    model_deep(|| {
        let shards: Shards<Items> = Shards::new();
        let found = Mutex::new(Vec::new());
        // Whether items 1 and 2 are in their threads' shards (Release after
        // the put, Acquire before the visit).
        let put = [AtomicBool::new(false), AtomicBool::new(false)];
        let (shards, found, put) = (&shards, &found, &put);
        let a = spawn_scoped(move || {
            let mine = shards.register();
            mine.lock().0.push(1);
            put[0].store(true, Ordering::Release);
            shards.retire(&mine);
        });
        let b = spawn_scoped(move || {
            let mine = shards.register();
            mine.lock().0.push(2);
            put[1].store(true, Ordering::Release);
            if let Some(mut orphans) = shards.orphans() {
                // Under the orphans' lock: a visit after this finds them in
                // `found`.
                found.lock().unwrap().append(&mut orphans.0);
                shards.release_orphans(orphans);
            }
            mine
        });
        let before = put.each_ref().map(|p| p.load(Ordering::Acquire));
        shards.each(|t| found.lock().unwrap().append(&mut t.0));
        for (item, was_put) in [1, 2].into_iter().zip(before) {
            let found = found.lock().unwrap();
            assert!(
                !was_put || found.contains(&item),
                "item {item}, put before the visit, was in no shard and not among the orphans: found {:?}",
                *found
            );
        }
        let mut orphans = shards.lock_orphans();
        orphans.0.push(3);
        shards.release_orphans(orphans);
        a.join();
        let b_shard = b.join();
        assert_eq!(shards.threads(), 1, "A's shard still registered");
        {
            let orphans = shards.lock_orphans();
            assert_eq!(
                shards.may_have_orphans(),
                !orphans.is_empty(),
                "the hint is wrong once A and B are done: orphans {:?}",
                orphans.0
            );
        }
        shards.retire(&b_shard);
        drop(b_shard);
        shards.each(|t| found.lock().unwrap().append(&mut t.0));
        let found: Vec<u32> = found.lock().unwrap().clone();
        let set: BTreeSet<u32> = found.iter().copied().collect();
        assert_eq!(found.len(), set.len(), "an item found twice: {found:?}");
        assert_eq!(set, BTreeSet::from([1, 2, 3]), "an item lost: {found:?}");
        assert!(!shards.may_have_orphans());
    });
}
