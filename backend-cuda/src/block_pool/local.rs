//! Each thread's own blocks of a [`Pool`]: [`ThreadBlocks`], kept in a
//! [`Shard`](crate::shards::Shard) per thread, in front of the shared lists.
//!
//! A thread that makes a scratchpad per round takes and gives back the same
//! few blocks every round. Through the shared lists alone that is two visits
//! to the pool's lock and one completion query per block, and both
//! serialise: the lock is one cache line for every thread, and the driver
//! answers `cuStreamQuery` (and `cuEventQuery`, `cuEventRecord`) for one
//! thread at a time (8.5 µs per call per thread at 16 threads on an H200,
//! against 0.25 µs alone: `docs/scratch-scaling.md`). So each thread keeps:
//!
//! - **free blocks** per class, proven free, handed out with no lock shared
//!   with other threads and no driver call;
//! - **pending groups**: blocks freed in the order of a stream, by stream id,
//!   not yet proven free. A block becomes free only when a query of *its*
//!   stream, made after its free, says the stream has finished everything
//!   queued on it. That query is made during a free on the same stream (the
//!   one moment the stream is known live: the caller vouches for it) once the
//!   group holds [`QUERY_BATCH_BLOCKS`] blocks or [`QUERY_BATCH_BYTES`]
//!   bytes, and it proves the whole group at once.
//!
//! **Why one query per group is the floor.** The host writes a pinned block
//! the moment it is handed out, outside any stream order, so the same-stream
//! argument of the device cache does not hold: before reuse there must be
//! proof that the stream has passed the free. Every such proof is a driver
//! call that serialises (a stream query, or an event record plus an event
//! query). One query covers every block freed on the stream before it, so
//! asking once per group of K blocks costs 1/K query per free, at the price of
//! keeping up to K blocks per stream waiting. With K = 32, a round that frees
//! one block pays a thirty-second of a query.
//!
//! **A busy stream.** If the query finds the stream still working, the group
//! goes to the shared lists, each block parked behind a fence recorded now
//! (as a free on a busy stream always was), with no second question: the
//! group never grows past one batch.
//!
//! **Bounds.** Per thread and pool: at most one batch pending per stream the
//! thread frees on (a stream that never frees again keeps its group until
//! [`forget`](Pool::forget_stream_local) or [`trim`](Pool::drain_local),
//! like the device cache), and at most [`THREAD_FREE_BYTES`] free (the
//! oldest blocks beyond go to the shared lists).
//!
//! The orphans (what exited threads left) have no bound of their own: an
//! exited thread's pending groups stay until a thread frees on the same
//! stream (and adopts them), the stream is destroyed through the backend or
//! forgotten, or [`drain_local`](Pool::drain_local) (`trim_memory`) runs; its
//! free blocks serve any thread's misses meanwhile.
//!
//! **Other threads.** When a thread exits, its free blocks and pending
//! groups become the orphans of its [`Shards`] (no driver call). A thread
//! whose own free list is empty takes from the orphans' free blocks before the
//! shared lists; a thread that proves a stream free also frees the orphans'
//! group of that stream, and a thread with no free block left proves its
//! group at once (one query, before its batch is full) when the orphans hold
//! a group of the same stream, so a thread that takes over an exited thread's
//! stream gets its blocks back at its first free; forget and trim drain
//! every shard and the orphans.

use gpupool_core::{Completion, DeviceId, StreamHandle};

use super::{class_of, class_size, idle_probe, Pool, Upstream};
use crate::shards::{ShardState, Shards};

/// A pending group is proven (one stream query) once it holds this many
/// blocks...
pub const QUERY_BATCH_BLOCKS: usize = 32;

/// ... or this many bytes.
pub const QUERY_BATCH_BYTES: usize = 8 << 20;

/// The most bytes of free blocks a thread keeps per pool; beyond, its oldest
/// free blocks go to the shared lists.
pub const THREAD_FREE_BYTES: usize = 2 * QUERY_BATCH_BYTES;

/// The group of blocks that no stream query can prove free, only a trim's
/// synchronization (a synchronization for them failed). No stream has this
/// id: the driver counts ids up from small numbers.
const NO_STREAM: u64 = u64::MAX;

/// Blocks freed in the order of one stream, not yet proven free.
#[derive(Debug)]
struct Group {
    /// The stream's id (unique in the process, never reused).
    stream: u64,
    /// (class, address), oldest first.
    blocks: Vec<(usize, usize)>,
    bytes: usize,
}

/// One thread's blocks of a pool (or the orphans of the threads that
/// exited).
#[derive(Debug, Default)]
pub struct ThreadBlocks {
    /// Free blocks per class (addresses), newest last.
    free: Vec<Vec<usize>>,
    free_blocks: usize,
    free_bytes: usize,
    groups: Vec<Group>,
    pending_blocks: usize,
    /// Blocks handed out from here (or the orphans) without the shared
    /// lists.
    reuses: u64,
}

/// What the per-thread blocks of a pool hold and have done.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalCounts {
    /// Free blocks, all threads and the orphans together.
    pub free_blocks: usize,
    /// Their bytes.
    pub free_bytes: usize,
    /// Blocks waiting for a query of their stream.
    pub pending_blocks: usize,
    /// Blocks handed out without the shared lists.
    pub reuses: u64,
}

impl ThreadBlocks {
    fn push_free(&mut self, class: usize, addr: usize) {
        if self.free.len() <= class {
            self.free.resize_with(class + 1, Vec::new);
        }
        self.free[class].push(addr);
        self.free_blocks += 1;
        self.free_bytes += class_size(class);
    }

    fn pop_free(&mut self, class: usize) -> Option<usize> {
        let addr = self.free.get_mut(class)?.pop()?;
        self.free_blocks -= 1;
        self.free_bytes -= class_size(class);
        Some(addr)
    }

    /// Adds a block to the group of `stream`; returns the group's index.
    fn push_pending(&mut self, stream: u64, class: usize, addr: usize) -> usize {
        let i = match self.groups.iter().position(|g| g.stream == stream) {
            Some(i) => i,
            None => {
                self.groups.push(Group {
                    stream,
                    blocks: Vec::new(),
                    bytes: 0,
                });
                self.groups.len() - 1
            }
        };
        let g = &mut self.groups[i];
        g.blocks.push((class, addr));
        g.bytes += class_size(class);
        self.pending_blocks += 1;
        i
    }

    /// Takes out the group of `stream` (its blocks, oldest first).
    fn take_group(&mut self, stream: u64) -> Vec<(usize, usize)> {
        match self.groups.iter().position(|g| g.stream == stream) {
            Some(i) => {
                let g = self.groups.swap_remove(i);
                self.pending_blocks -= g.blocks.len();
                g.blocks
            }
            None => Vec::new(),
        }
    }

    /// Takes out every free block (class, address).
    fn take_free(&mut self) -> Vec<(usize, usize)> {
        let mut out = Vec::with_capacity(self.free_blocks);
        for (class, list) in self.free.iter_mut().enumerate() {
            out.extend(list.drain(..).map(|addr| (class, addr)));
        }
        self.free_blocks = 0;
        self.free_bytes = 0;
        out
    }

    /// Takes out every pending block (class, address), whatever its stream.
    fn take_pending(&mut self) -> Vec<(usize, usize)> {
        self.pending_blocks = 0;
        self.groups.drain(..).flat_map(|g| g.blocks).collect()
    }

    /// The free blocks beyond [`THREAD_FREE_BYTES`], oldest of the largest
    /// classes first, taken out.
    fn take_excess(&mut self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut class = self.free.len();
        while self.free_bytes > THREAD_FREE_BYTES && class > 0 {
            class -= 1;
            while self.free_bytes > THREAD_FREE_BYTES && !self.free[class].is_empty() {
                let addr = self.free[class].remove(0);
                self.free_blocks -= 1;
                self.free_bytes -= class_size(class);
                out.push((class, addr));
            }
        }
        out
    }
}

impl ShardState for ThreadBlocks {
    type Shared = ();

    fn is_empty(&self) -> bool {
        self.free_blocks == 0 && self.pending_blocks == 0
    }

    fn absorb(&mut self, from: &mut Self, (): &()) {
        for (class, addr) in from.take_free() {
            self.push_free(class, addr);
        }
        for g in core::mem::take(&mut from.groups) {
            for (class, addr) in g.blocks {
                self.push_pending(g.stream, class, addr);
            }
        }
        from.pending_blocks = 0;
        self.reuses += core::mem::take(&mut from.reuses);
    }
}

/// Whether the orphans hold a group of stream `id`: a thread that has no
/// free block left settles its own group early to adopt it (a new thread on a
/// stream an exited thread used gets that thread's blocks back at its first
/// free, instead of taking new ones for a whole batch).
fn orphans_wait_on(shards: &Shards<ThreadBlocks>, id: u64) -> bool {
    let Some(orphans) = shards.orphans() else {
        return false;
    };
    let waiting = orphans.groups.iter().any(|g| g.stream == id);
    shards.release_orphans(orphans);
    waiting
}

impl<U: Upstream> Pool<U> {
    /// [`take`](Self::take) for a thread whose blocks are `mine`: one of its
    /// free blocks, else one of the orphans', else the shared lists'.
    pub fn take_local(
        &self,
        mine: &mut ThreadBlocks,
        shards: &Shards<ThreadBlocks>,
        device: DeviceId,
        size: usize,
    ) -> Result<usize, U::Error> {
        let class = class_of(size).ok_or_else(|| self.upstream.invalid_size())?;
        if let Some(addr) = mine.pop_free(class) {
            mine.reuses += 1;
            return Ok(addr);
        }
        if let Some(mut orphans) = shards.orphans() {
            let adopted = orphans.pop_free(class);
            shards.release_orphans(orphans);
            if let Some(addr) = adopted {
                mine.reuses += 1;
                return Ok(addr);
            }
        }
        self.take(device, size)
    }

    /// [`give`](Self::give) for a thread whose blocks are `mine`: the block
    /// is free now, kept by the thread.
    ///
    /// # Safety
    /// As for [`give`](Self::give).
    pub unsafe fn give_local(
        &self,
        mine: &mut ThreadBlocks,
        addr: usize,
        size: usize,
    ) -> Result<(), U::Error> {
        let class = class_of(size).ok_or_else(|| self.upstream.invalid_size())?;
        mine.push_free(class, addr);
        self.spill_excess(mine);
        Ok(())
    }

    /// [`give_after`](Self::give_after) for a thread whose blocks are
    /// `mine`: the block joins the thread's group of `stream`, which is
    /// proven free by one query when it is full (see the
    /// [module documentation](self)). With the idle probe off, or on a
    /// stream without an id (a special stream), the shared lists take it.
    ///
    /// # Safety
    /// As for [`give_after`](Self::give_after).
    pub unsafe fn give_after_local(
        &self,
        mine: &mut ThreadBlocks,
        shards: &Shards<ThreadBlocks>,
        device: DeviceId,
        addr: usize,
        size: usize,
        stream: StreamHandle,
    ) -> Result<(), U::Error> {
        let class = class_of(size).ok_or_else(|| self.upstream.invalid_size())?;
        let id = if idle_probe() {
            self.upstream.stream_id(stream, device)
        } else {
            None
        };
        let Some(id) = id else {
            // SAFETY: the caller's contract.
            return unsafe { self.give_after(device, addr, size, stream) };
        };
        let i = mine.push_pending(id, class, addr);
        let g = &mine.groups[i];
        let full = g.blocks.len() >= self.query_batch_blocks || g.bytes >= QUERY_BATCH_BYTES;
        let refill = !full && mine.free_blocks == 0 && orphans_wait_on(shards, id);
        if !full && !refill {
            return Ok(());
        }
        // SAFETY: `stream` is the caller's usable stream of `device`, with id
        // `id`; every block of the group was freed in its order.
        unsafe { self.settle(mine, shards, device, id, stream) };
        Ok(())
    }

    /// Proves the group of stream `id` (`stream`) free with one query: free
    /// blocks of the thread if the stream has finished (the orphans' group
    /// of the stream too), otherwise parked in the shared lists behind a
    /// fence each. A block the shared lists cannot take (no fence could be
    /// recorded and the stream not synchronized) stays in the group.
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` whose id is `id`; the
    /// blocks of the thread's group `id` were freed in its order (the
    /// contract of [`give_after`](Self::give_after), each).
    unsafe fn settle(
        &self,
        mine: &mut ThreadBlocks,
        shards: &Shards<ThreadBlocks>,
        device: DeviceId,
        id: u64,
        stream: StreamHandle,
    ) {
        // The orphans' group of the stream first: its blocks were freed
        // before their thread exited, which happened before the orphans'
        // lock is taken here, so before the query below.
        let adopted = match shards.orphans() {
            Some(mut orphans) => {
                let group = orphans.take_group(id);
                shards.release_orphans(orphans);
                group
            }
            None => Vec::new(),
        };
        let mut blocks = mine.take_group(id);
        blocks.extend(adopted);
        if let Ok(Completion::Complete) = self.upstream.query_stream(stream, device) {
            // Everything queued on `stream` before the query has finished,
            // and only that work may use these blocks (each was freed in the
            // stream's order before now).
            for (class, addr) in blocks {
                mine.push_free(class, addr);
            }
            self.spill_excess(mine);
            return;
        }
        for (class, addr) in blocks {
            // SAFETY: freed in the order of `stream` (this function's
            // contract), a usable stream of `device`; the block is the
            // thread's alone (taken out of its group). The stream was just
            // found busy: no second question.
            if unsafe { self.park_after(device, addr, class, stream) }.is_err() {
                mine.push_pending(id, class, addr);
            }
        }
    }

    /// Gives the thread's free blocks beyond its bound to the shared lists.
    fn spill_excess(&self, mine: &mut ThreadBlocks) {
        if mine.free_bytes <= THREAD_FREE_BYTES {
            return;
        }
        let excess = mine.take_excess();
        self.push_all_free(excess);
    }

    /// Puts blocks (class, address) on the shared lists' free list, under
    /// one visit to their lock.
    fn push_all_free(&self, blocks: Vec<(usize, usize)>) {
        if blocks.is_empty() {
            return;
        }
        let mut lists = self.lock();
        for (class, addr) in blocks {
            lists.push_free(class, addr);
        }
    }

    /// Keeps blocks (class, address) in the orphans' group of stream `id`.
    fn keep_among_orphans(shards: &Shards<ThreadBlocks>, id: u64, blocks: Vec<(usize, usize)>) {
        if blocks.is_empty() {
            return;
        }
        let mut orphans = shards.lock_orphans();
        for (class, addr) in blocks {
            orphans.push_pending(id, class, addr);
        }
        shards.release_orphans(orphans);
    }

    /// Moves the blocks of every thread and of the orphans out: the free
    /// ones to the shared lists, and returns the pending ones (class,
    /// address), which only a synchronization of their streams' context can
    /// prove free now (their streams may be gone).
    pub fn drain_local(&self, shards: &Shards<ThreadBlocks>) -> Vec<(usize, usize)> {
        let mut free = Vec::new();
        let mut pending = Vec::new();
        shards.each(|t| {
            free.extend(t.take_free());
            pending.extend(t.take_pending());
        });
        self.push_all_free(free);
        pending
    }

    /// Hands blocks (class, address) to the shared lists' free list.
    ///
    /// # Safety
    /// Each block came from this pool, is given once, and nothing uses it
    /// any more.
    pub unsafe fn give_all(&self, blocks: Vec<(usize, usize)>) {
        self.push_all_free(blocks);
    }

    /// Keeps blocks (class, address) that wait for their stream among the
    /// orphans (a synchronization that would prove them free failed).
    ///
    /// # Safety
    /// Each block came from this pool (as [`drain_local`](Self::drain_local)
    /// returned it) and is kept once; work may still use it.
    pub unsafe fn keep_pending(&self, shards: &Shards<ThreadBlocks>, blocks: Vec<(usize, usize)>) {
        Self::keep_among_orphans(shards, NO_STREAM, blocks);
    }

    /// The stream `stream` (live, of `device`) is about to be destroyed or
    /// forgotten: gives the blocks every thread (and the orphans) hold
    /// pending on it to the shared lists in its order
    /// ([`give_after`](Self::give_after): free now if it is idle, else
    /// parked behind a fence). Returns how many.
    ///
    /// # Safety
    /// `stream` is a usable stream of `device`.
    pub unsafe fn forget_stream_local(
        &self,
        shards: &Shards<ThreadBlocks>,
        device: DeviceId,
        stream: StreamHandle,
    ) -> usize {
        let Some(id) = self.upstream.stream_id(stream, device) else {
            return 0;
        };
        let mut blocks = Vec::new();
        shards.each(|t| blocks.extend(t.take_group(id)));
        let n = blocks.len();
        let mut kept = Vec::new();
        for (class, addr) in blocks {
            // SAFETY: freed in the order of the stream with id `id`, which is
            // `stream` (ids are never reused), usable on `device`.
            if unsafe { self.give_after(device, addr, class_size(class), stream) }.is_err() {
                kept.push((class, addr));
            }
        }
        Self::keep_among_orphans(shards, id, kept);
        n
    }

    /// What the threads' blocks of this pool hold and have done.
    pub fn local_counts(&self, shards: &Shards<ThreadBlocks>) -> LocalCounts {
        let mut c = LocalCounts::default();
        shards.each(|t| {
            c.free_blocks += t.free_blocks;
            c.free_bytes += t.free_bytes;
            c.pending_blocks += t.pending_blocks;
            c.reuses += t.reuses;
        });
        c
    }
}
