//! What the benchmarks measure gpupool against, over the same backend traits:
//!
//! - [`DaliStreamPool`] and [`DaliEventPool`]: DALI's `CUDAStreamPool` and
//!   `CUDAEventPool` as DALI's sources have them: one spinlock
//!   (DALI's `yielding_spinlock<100>`, see [`lock_yielding`]) over per-device
//!   singly linked lists of boxed nodes, emptied nodes recycled through an
//!   `unused` list, a new node allocated outside the lock only when that list
//!   is empty. The stream pool queries a stream on return (before the lock),
//!   sorts it into a ready or a busy list, pops the ready list on `get`, else
//!   scans the busy list newest first under the lock, else creates a stream
//!   outside the lock; its leases count themselves in an atomic, as DALI's do.
//! - [`MutexVecStreamPool`] and [`MutexVecEventPool`]: the pool anyone would
//!   write first, a `std::sync::Mutex<Vec<_>>` per device; no query on return.
//! - [`stream_create_destroy`] and [`event_create_destroy`]: no pool at all.
//! - [`DaliScratchpad`]: DALI's `DynamicScratchpad`: one
//!   monotonic resource per kind, created lazily, 64 KiB first block, the
//!   doubling growth with its 32-byte footer on host-accessible kinds, blocks
//!   freed newest first when it drops (device memory in the device order).
//! - [`raw_round`] and [`bumpalo_round`]: a round of allocations made with the
//!   plain calls (every allocation its own upstream call), and with bumpalo.
//!
//! Device ids are explicit everywhere (the benchmarks pass the lease's own
//! device, as DALI's leases do); an id out of range panics on the index, where
//! DALI has undefined behaviour. Backend errors are returned as DALI throws
//! them; a failure in a lease's drop panics, where DALI calls
//! `std::terminate`.
//!
//! The baselines check nothing a benchmark round would pay for: what DALI
//! leaves to its caller (a handle handed back is one the pool gave out; a
//! scratchpad's order is a stream of its backend and device) is the `# Safety`
//! contract of the `unsafe fn`s here ([`DaliStreamPool::put`],
//! [`DaliEventPool::put`], the `Mutex<Vec>` pools' `put`,
//! [`DaliScratchpad::new`], [`raw_round`]).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use gpupool_core::{
    AccessOrder, Completion, DeviceId, EventBackend, EventFlags, EventHandle, MemoryBackend,
    MemoryKind, StreamBackend, StreamHandle, StreamOptions,
};

/// Takes `lock` the way DALI's `yielding_spinlock<100>` does: try with a
/// relaxed load and then an acquiring exchange; after 100 failed tries,
/// `sched_yield` and start counting again.
pub fn lock_yielding<T>(lock: &spin::Mutex<T>) -> spin::MutexGuard<'_, T> {
    const MAX_SPIN: u32 = 100;
    let mut spins = 0;
    loop {
        if !lock.is_locked() {
            if let Some(guard) = lock.try_lock() {
                return guard;
            }
        }
        spins += 1;
        if spins >= MAX_SPIN {
            std::thread::yield_now();
            spins = 0;
        } else {
            core::hint::spin_loop();
        }
    }
}

/// A list node: a raw handle (0 when the node is unused) and the next node.
struct Node {
    handle: usize,
    next: Option<Box<Node>>,
}

/// An intrusive singly linked LIFO list of boxed nodes, as DALI's pools keep.
#[derive(Default)]
struct List {
    head: Option<Box<Node>>,
}

impl List {
    fn push(&mut self, mut node: Box<Node>) {
        node.next = self.head.take();
        self.head = Some(node);
    }

    fn pop(&mut self) -> Option<Box<Node>> {
        let mut node = self.head.take()?;
        self.head = node.next.take();
        Some(node)
    }

    /// Walks from the head and unlinks the first node whose handle `pred`
    /// accepts; an error from `pred` stops the walk with the list unchanged.
    fn unlink_first<E>(
        &mut self,
        mut pred: impl FnMut(usize) -> Result<bool, E>,
    ) -> Result<Option<Box<Node>>, E> {
        let mut cur = &mut self.head;
        loop {
            let hit = match cur.as_deref() {
                None => return Ok(None),
                Some(node) => pred(node.handle)?,
            };
            if hit {
                break;
            }
            cur = &mut cur.as_mut().expect("a node was just seen here").next;
        }
        let mut node = cur.take().expect("a node was just seen here");
        *cur = node.next.take();
        Ok(Some(node))
    }
}

impl Drop for List {
    /// Iteratively, so that a long list cannot overflow the stack.
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

/// Takes a node from `unused` under the lock; when there is none, lets the
/// lock go, allocates one and takes the lock again (DALI's `Put`).
fn take_node<'a, L>(
    lock: &'a spin::Mutex<L>,
    mut guard: spin::MutexGuard<'a, L>,
    unused: impl Fn(&mut L) -> &mut List,
) -> (spin::MutexGuard<'a, L>, Box<Node>) {
    if let Some(node) = unused(&mut guard).pop() {
        return (guard, node);
    }
    drop(guard);
    let node = Box::new(Node {
        handle: 0,
        next: None,
    });
    (lock_yielding(lock), node)
}

/// The stream pool's lists: per device a ready and a busy list, and the
/// recycled nodes.
#[derive(Default)]
struct StreamLists {
    ready: Vec<List>,
    busy: Vec<List>,
    unused: List,
}

/// DALI's `CUDAStreamPool` over any [`StreamBackend`].
///
/// Lazy like DALI's: the first `get` or `put` counts the devices under the
/// lock (the per-device vectors are reserved for 128 devices up front, so that
/// count allocates nothing while the lock is held).
pub struct DaliStreamPool<B: StreamBackend> {
    backend: B,
    options: StreamOptions,
    lists: spin::Mutex<StreamLists>,
    lease_count: AtomicIsize,
}

impl<B: StreamBackend> DaliStreamPool<B> {
    /// An empty pool creating non-blocking streams with default options. Calls
    /// nothing.
    pub fn new(backend: B) -> Self {
        DaliStreamPool {
            backend,
            options: StreamOptions::default(),
            lists: spin::Mutex::new(StreamLists {
                ready: Vec::with_capacity(128),
                busy: Vec::new(),
                unused: List::default(),
            }),
            lease_count: AtomicIsize::new(0),
        }
    }

    /// DALI's `Init`: sizes the per-device lists on first use.
    fn init(&self, lists: &mut StreamLists) -> Result<(), B::Error> {
        if lists.ready.is_empty() {
            let n = self.backend.device_count()? as usize;
            lists.ready.resize_with(n, List::default);
            lists.busy.resize_with(n, List::default);
        }
        Ok(())
    }

    /// Leases a stream on `device`: the ready list's head; else the first
    /// finished stream of the busy list, newest first, queried under the lock;
    /// else a new stream, created outside the lock.
    pub fn get(&self, device: DeviceId) -> Result<DaliStreamLease<'_, B>, B::Error> {
        let found = {
            let mut guard = lock_yielding(&self.lists);
            self.init(&mut guard)?;
            let lists = &mut *guard;
            let d = device.index();
            let node = match lists.ready[d].pop() {
                Some(node) => Some(node),
                None => lists.busy[d].unlink_first(|h| {
                    // SAFETY: the pool owns every stream in its lists: each is a
                    // live stream of the list's device (`device`), created by
                    // this backend (`put`'s contract, or `create_stream` here).
                    let state = unsafe {
                        self.backend
                            .query_stream(StreamHandle::from_raw(h), device)?
                    };
                    Ok(state == Completion::Complete)
                })?,
            };
            node.map(|mut node| {
                let handle = std::mem::take(&mut node.handle);
                lists.unused.push(node);
                // SAFETY: a stream the pool owned (see above); the lease takes
                // it over.
                unsafe { StreamHandle::from_raw(handle) }
            })
        };
        let stream = match found {
            Some(s) => s,
            None => self.backend.create_stream(device, self.options)?,
        };
        self.lease_count.fetch_add(1, Ordering::SeqCst);
        Ok(DaliStreamLease {
            pool: self,
            stream,
            device,
        })
    }

    /// Takes a stream into the pool: queried before the lock, then pushed onto
    /// the head of the device's ready list (finished) or busy list (pending).
    /// On a failed query the stream stays the caller's.
    ///
    /// # Panics
    /// On a null stream (DALI throws `std::invalid_argument`).
    ///
    /// # Safety
    /// `stream` is a live, non-special stream of `device`, created by this
    /// pool's backend (or one with its [`id`](gpupool_core::Backend::id)), and
    /// the caller hands it over: nothing else owns or uses it from now on
    /// (unless the query fails, when it stays the caller's).
    pub unsafe fn put(&self, stream: StreamHandle, device: DeviceId) -> Result<(), B::Error> {
        assert!(!stream.is_null(), "Cannot put a null stream in the pool.");
        // SAFETY: the caller's contract: a live stream of `device` of this
        // backend.
        let state = unsafe { self.backend.query_stream(stream, device)? };
        let mut guard = lock_yielding(&self.lists);
        self.init(&mut guard)?;
        let (mut guard, mut node) = take_node(&self.lists, guard, |l| &mut l.unused);
        node.handle = stream.as_raw();
        let lists = &mut *guard;
        match state {
            Completion::Complete => lists.ready[device.index()].push(node),
            Completion::Pending => lists.busy[device.index()].push(node),
        }
        Ok(())
    }

    /// Leases that are out now.
    pub fn live_leases(&self) -> isize {
        self.lease_count.load(Ordering::SeqCst)
    }

    /// Destroys every pooled stream, ready or busy, under the lock, and frees
    /// every node. Returns how many streams were destroyed; stops at the first
    /// failed destroy (that stream is then lost, as in DALI).
    pub fn purge(&self) -> Result<usize, B::Error> {
        let mut guard = lock_yielding(&self.lists);
        let lists = &mut *guard;
        lists.unused = List::default();
        let mut destroyed = 0;
        for (d, (ready, busy)) in lists.ready.iter_mut().zip(&mut lists.busy).enumerate() {
            for list in [ready, busy] {
                while let Some(node) = list.pop() {
                    let device = DeviceId(d as u32);
                    // SAFETY: the pool owns every stream in its lists, a live
                    // stream of the list's device created by this backend;
                    // the node is dropped, so nothing uses it after this.
                    unsafe {
                        self.backend
                            .destroy_stream(StreamHandle::from_raw(node.handle), device)?;
                    }
                    destroyed += 1;
                }
            }
        }
        Ok(destroyed)
    }
}

impl<B: StreamBackend> Drop for DaliStreamPool<B> {
    /// Purges; an error is dropped (DALI would terminate).
    fn drop(&mut self) {
        let _ = self.purge();
    }
}

/// A stream leased from a [`DaliStreamPool`]; returned to it on drop.
pub struct DaliStreamLease<'p, B: StreamBackend> {
    pool: &'p DaliStreamPool<B>,
    stream: StreamHandle,
    device: DeviceId,
}

impl<B: StreamBackend> DaliStreamLease<'_, B> {
    /// The leased stream.
    pub fn handle(&self) -> StreamHandle {
        self.stream
    }

    /// Its device.
    pub fn device(&self) -> DeviceId {
        self.device
    }
}

impl<B: StreamBackend> Drop for DaliStreamLease<'_, B> {
    /// `Put`s the stream back with the lease's device, then counts the lease
    /// out.
    ///
    /// # Panics
    /// When the put fails (DALI's lease destructor calls `std::terminate`).
    fn drop(&mut self) {
        // SAFETY: the lease holds the stream its pool gave out (from its lists
        // or created by its backend on `device`) and hands it back here; the
        // lease ends with this drop.
        if let Err(e) = unsafe { self.pool.put(self.stream, self.device) } {
            panic!("returning a stream to the DALI-style pool failed: {e}");
        }
        self.pool.lease_count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The event pool's lists: one per device, and the recycled nodes.
#[derive(Default)]
struct EventLists {
    events: Vec<List>,
    unused: List,
}

/// DALI's `CUDAEventPool` over any [`EventBackend`]: eager,
/// no lease, no query.
pub struct DaliEventPool<B: EventBackend> {
    backend: B,
    flags: EventFlags,
    lists: spin::Mutex<EventLists>,
}

impl<B: EventBackend> DaliEventPool<B> {
    /// A pool of events with `flags`; counts the devices now, as DALI's
    /// constructor does.
    pub fn new(backend: B, flags: EventFlags) -> Result<Self, B::Error> {
        let n = backend.device_count()? as usize;
        Ok(DaliEventPool {
            backend,
            flags,
            lists: spin::Mutex::new(EventLists {
                events: (0..n).map(|_| List::default()).collect(),
                unused: List::default(),
            }),
        })
    }

    /// Pops the head of `device`'s list, else creates an event outside the
    /// lock. A pooled event may still be pending.
    pub fn get(&self, device: DeviceId) -> Result<EventHandle, B::Error> {
        {
            let mut guard = lock_yielding(&self.lists);
            let lists = &mut *guard;
            if let Some(mut node) = lists.events[device.index()].pop() {
                let handle = std::mem::take(&mut node.handle);
                lists.unused.push(node);
                // SAFETY: the pool owned this event (a live event of `device`
                // made by this backend, `put`'s contract); the caller takes it
                // over.
                return Ok(unsafe { EventHandle::from_raw(handle) });
            }
        }
        self.backend.create_event(device, self.flags)
    }

    /// Pushes `event` onto the head of `device`'s list.
    ///
    /// # Safety
    /// `event` is a live event of `device`, created by this pool's backend (or
    /// one with its [`id`](gpupool_core::Backend::id)), and the caller hands it
    /// over: nothing else owns or uses it from now on.
    pub unsafe fn put(&self, event: EventHandle, device: DeviceId) {
        let guard = lock_yielding(&self.lists);
        let (mut guard, mut node) = take_node(&self.lists, guard, |l| &mut l.unused);
        node.handle = event.as_raw();
        guard.events[device.index()].push(node);
    }

    /// Destroys every pooled event and frees every node; stops at the first
    /// failed destroy.
    pub fn purge(&self) -> Result<usize, B::Error> {
        let mut guard = lock_yielding(&self.lists);
        let lists = &mut *guard;
        lists.unused = List::default();
        let mut destroyed = 0;
        for (d, list) in lists.events.iter_mut().enumerate() {
            while let Some(node) = list.pop() {
                // SAFETY: the pool owns every event in its lists, a live event
                // of the list's device created by this backend; the node is
                // dropped, so nothing uses it after this.
                unsafe {
                    self.backend
                        .destroy_event(EventHandle::from_raw(node.handle), DeviceId(d as u32))?;
                }
                destroyed += 1;
            }
        }
        Ok(destroyed)
    }
}

impl<B: EventBackend> Drop for DaliEventPool<B> {
    /// Purges; an error is dropped.
    fn drop(&mut self) {
        let _ = self.purge();
    }
}

fn lock_vec<T>(m: &Mutex<Vec<T>>) -> MutexGuard<'_, Vec<T>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A `std::sync::Mutex<Vec<_>>` of streams per device: pop or create, push
/// back. No query on return, so a stream returned with work still queued is
/// handed out again as it is.
pub struct MutexVecStreamPool<B: StreamBackend> {
    backend: B,
    lists: Vec<Mutex<Vec<StreamHandle>>>,
}

impl<B: StreamBackend> MutexVecStreamPool<B> {
    /// A pool for `devices` devices.
    pub fn new(backend: B, devices: u32) -> Self {
        MutexVecStreamPool {
            backend,
            lists: (0..devices).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// The last stream returned on `device`, else a new one.
    pub fn get(&self, device: DeviceId) -> Result<StreamHandle, B::Error> {
        if let Some(s) = lock_vec(&self.lists[device.index()]).pop() {
            return Ok(s);
        }
        self.backend.create_stream(device, StreamOptions::default())
    }

    /// Returns `stream` to `device`'s list.
    ///
    /// # Safety
    /// `stream` is a live, non-special stream of `device`, created by this
    /// pool's backend (or one with its [`id`](gpupool_core::Backend::id)), and
    /// the caller hands it over: nothing else owns or uses it from now on.
    pub unsafe fn put(&self, stream: StreamHandle, device: DeviceId) {
        lock_vec(&self.lists[device.index()]).push(stream);
    }

    /// Destroys every pooled stream; stops at the first failure.
    pub fn purge(&self) -> Result<usize, B::Error> {
        let mut destroyed = 0;
        for (d, list) in self.lists.iter().enumerate() {
            for s in std::mem::take(&mut *lock_vec(list)) {
                // SAFETY: the pool owns every stream in its lists, a live
                // stream of the list's device created by this backend; it was
                // taken out of the list, so nothing uses it after this.
                unsafe { self.backend.destroy_stream(s, DeviceId(d as u32))? };
                destroyed += 1;
            }
        }
        Ok(destroyed)
    }
}

/// A `std::sync::Mutex<Vec<_>>` of events per device: pop or create, push back.
pub struct MutexVecEventPool<B: EventBackend> {
    backend: B,
    flags: EventFlags,
    lists: Vec<Mutex<Vec<EventHandle>>>,
}

impl<B: EventBackend> MutexVecEventPool<B> {
    /// A pool of events with `flags` for `devices` devices.
    pub fn new(backend: B, flags: EventFlags, devices: u32) -> Self {
        MutexVecEventPool {
            backend,
            flags,
            lists: (0..devices).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// The last event returned on `device`, else a new one.
    pub fn get(&self, device: DeviceId) -> Result<EventHandle, B::Error> {
        if let Some(e) = lock_vec(&self.lists[device.index()]).pop() {
            return Ok(e);
        }
        self.backend.create_event(device, self.flags)
    }

    /// Returns `event` to `device`'s list.
    ///
    /// # Safety
    /// `event` is a live event of `device`, created by this pool's backend (or
    /// one with its [`id`](gpupool_core::Backend::id)), and the caller hands it
    /// over: nothing else owns or uses it from now on.
    pub unsafe fn put(&self, event: EventHandle, device: DeviceId) {
        lock_vec(&self.lists[device.index()]).push(event);
    }

    /// Destroys every pooled event; stops at the first failure.
    pub fn purge(&self) -> Result<usize, B::Error> {
        let mut destroyed = 0;
        for (d, list) in self.lists.iter().enumerate() {
            for e in std::mem::take(&mut *lock_vec(list)) {
                // SAFETY: the pool owns every event in its lists, a live event
                // of the list's device created by this backend; it was taken
                // out of the list, so nothing uses it after this.
                unsafe { self.backend.destroy_event(e, DeviceId(d as u32))? };
                destroyed += 1;
            }
        }
        Ok(destroyed)
    }
}

/// No pool: creates a non-blocking stream on `device` and destroys it.
pub fn stream_create_destroy<B: StreamBackend>(
    backend: &B,
    device: DeviceId,
) -> Result<(), B::Error> {
    let s = backend.create_stream(device, StreamOptions::default())?;
    // SAFETY: created just above on `device` by this backend, used by nothing
    // else.
    unsafe { backend.destroy_stream(s, device) }
}

/// No pool: creates an event with `flags` on `device` and destroys it.
pub fn event_create_destroy<B: EventBackend>(
    backend: &B,
    device: DeviceId,
    flags: EventFlags,
) -> Result<(), B::Error> {
    let e = backend.create_event(device, flags)?;
    // SAFETY: created just above on `device` by this backend, used by nothing
    // else.
    unsafe { backend.destroy_event(e, device) }
}

/// DALI's first block size for every kind of a `DynamicScratchpad` (an
/// initial size of 0 becomes this).
pub const DALI_FIRST_BLOCK: usize = 0x10000;

/// The size of the footer DALI keeps at the end of each host-accessible block.
const FOOTER: usize = 32;

/// DALI's footer sentinel.
const SENTINEL: u64 = 0xABCD_ABCD_ABCD_ABCD;

/// A block an upstream gave: its address, size and alignment.
#[derive(Copy, Clone)]
struct Record {
    base: NonNull<u8>,
    size: usize,
    align: usize,
}

/// The blocks of one kind, newest last: eight inline (DALI's
/// `SmallVector<…, 8>`), the rest spilled to the heap.
struct Records {
    inline: [Option<Record>; 8],
    len: usize,
    spill: Vec<Record>,
}

impl Records {
    const fn new() -> Self {
        Records {
            inline: [None; 8],
            len: 0,
            spill: Vec::new(),
        }
    }

    fn push(&mut self, r: Record) {
        if self.len < self.inline.len() {
            self.inline[self.len] = Some(r);
        } else {
            self.spill.push(r);
        }
        self.len += 1;
    }

    fn pop(&mut self) -> Option<Record> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        if self.len >= self.inline.len() {
            self.spill.pop()
        } else {
            self.inline[self.len].take()
        }
    }
}

/// One kind's `monotonic_memory_resource`, with DALI's growth rule.
struct Monotonic {
    /// Whether `InitResource` ran (DALI resolves the upstream on first use).
    initialised: bool,
    /// The bump pointer and the end of the current block's usable part (the
    /// footer's address on host-accessible kinds), as addresses; 0 before the
    /// first block.
    curr: usize,
    limit: usize,
    /// The current block's base, to derive pointers from (keeps provenance).
    block: Option<NonNull<u8>>,
    next: usize,
    first: usize,
    records: Records,
}

impl Monotonic {
    const fn new(first: usize) -> Self {
        Monotonic {
            initialised: false,
            curr: 0,
            limit: 0,
            block: None,
            next: first,
            first,
            records: Records::new(),
        }
    }
}

/// DALI's `DynamicScratchpad` over any [`MemoryBackend`]: for a
/// benchmark round, make one, allocate, drop it.
///
/// Upstreams, as DALI's defaults: host memory from the system allocator
/// (`malloc_memory_resource`); pinned and managed memory allocated
/// synchronously and released in the device order; device memory allocated
/// and released in the device order (synchronously when that is the host
/// order). Blocks are released newest first when the scratchpad drops, kinds
/// in the order libstdc++ destroys DALI's tuple: host, pinned, device,
/// managed. Errors there are dropped.
pub struct DaliScratchpad<'b, B: MemoryBackend> {
    backend: &'b B,
    device: DeviceId,
    /// A stream of `backend` on `device`, or host order (`new`'s contract).
    device_order: AccessOrder<'b>,
    kinds: [Monotonic; 4],
}

impl<'b, B: MemoryBackend> DaliScratchpad<'b, B> {
    /// A scratchpad whose device, pinned and managed memory follows
    /// `device_order`, for `device`. Allocates nothing.
    ///
    /// # Safety
    /// `device_order` is host order or a stream of `device` made by `backend`
    /// (or a backend with its [`id`](gpupool_core::Backend::id)), or one of
    /// `device`'s special streams. (The order keeps the stream alive; DALI
    /// does not check whose it is, and neither does this baseline.)
    pub unsafe fn new(backend: &'b B, device: DeviceId, device_order: AccessOrder<'b>) -> Self {
        DaliScratchpad {
            backend,
            device,
            device_order,
            kinds: [
                Monotonic::new(DALI_FIRST_BLOCK),
                Monotonic::new(DALI_FIRST_BLOCK),
                Monotonic::new(DALI_FIRST_BLOCK),
                Monotonic::new(DALI_FIRST_BLOCK),
            ],
        }
    }

    /// `bytes` of `kind` memory aligned to `align` (a power of two); `None`
    /// for zero bytes.
    pub fn alloc(
        &mut self,
        kind: MemoryKind,
        bytes: usize,
        align: usize,
    ) -> Result<Option<NonNull<u8>>, B::Error> {
        assert!(align.is_power_of_two(), "alignment must be a power of two");
        if bytes == 0 {
            return Ok(None);
        }
        let (backend, device, order) = (self.backend, self.device, self.device_order);
        let m = &mut self.kinds[kind.index()];
        m.initialised = true;
        // align_up(curr, align) = curr + ((align - 1) & -curr)
        let ret = m.curr + ((align - 1) & m.curr.wrapping_neg());
        if let Some(block) = m.block {
            if ret.checked_add(bytes).is_some_and(|end| end <= m.limit) {
                m.curr = ret + bytes;
                return Ok(Some(block.with_addr(
                    std::num::NonZeroUsize::new(ret).expect("inside a block"),
                )));
            }
        }
        // A new block.
        let host = kind.is_host_accessible();
        let need = if host { bytes + FOOTER } else { bytes };
        if m.next == 0 {
            m.next = align;
        }
        while m.next < need {
            m.next *= 2;
        }
        let size = m.next;
        let block_align = align.max(if host { 8 } else { 16 });
        // SAFETY: `order` is host order or a usable stream of `backend` on
        // `device` (`new`'s contract; the order borrows its stream for `'b`).
        let base = unsafe { upstream_alloc(backend, kind, device, order, size, block_align)? };
        m.records.push(Record {
            base,
            size,
            align: block_align,
        });
        let usable = if host { size - FOOTER } else { size };
        if host {
            let prev = m.limit as u64;
            // SAFETY: the block is `size >= FOOTER` bytes of host-accessible
            // memory just allocated for this resource; its last 32 bytes hold
            // the footer and nothing else.
            unsafe {
                base.as_ptr()
                    .add(usable)
                    .cast::<[u64; 4]>()
                    .write_unaligned([SENTINEL, prev, usable as u64, block_align as u64]);
            }
        }
        m.block = Some(base);
        m.curr = base.as_ptr().addr();
        m.limit = m.curr + usable;
        m.next *= 2;
        let ret = m.curr;
        m.curr += bytes;
        Ok(Some(base.with_addr(
            std::num::NonZeroUsize::new(ret).expect("a block's base"),
        )))
    }

    /// DALI's `free_all` for one kind: every block, newest first.
    fn free_all(&mut self, kind: MemoryKind) {
        let (backend, device, order) = (self.backend, self.device, self.device_order);
        let m = &mut self.kinds[kind.index()];
        while let Some(r) = m.records.pop() {
            // SAFETY: each record is a block this resource took from that
            // upstream with this size and alignment and has not released; the
            // borrows handed out of it ended with `&mut self`; device work
            // that may still use it is ordered before the release by the
            // device order it is released in, a usable stream of `backend` on
            // `device` or host order (`new`'s contract).
            let _ = unsafe { upstream_release(backend, kind, device, order, r) };
        }
        m.curr = 0;
        m.limit = 0;
        m.block = None;
        m.next = m.first;
    }
}

impl<B: MemoryBackend> Drop for DaliScratchpad<'_, B> {
    fn drop(&mut self) {
        for kind in [
            MemoryKind::Host,
            MemoryKind::Pinned,
            MemoryKind::Device,
            MemoryKind::Managed,
        ] {
            if self.kinds[kind.index()].initialised {
                self.free_all(kind);
            }
        }
    }
}

/// A block from `kind`'s upstream: host from the system allocator; device in
/// `order` (synchronously when it is the host order); pinned and managed
/// synchronously.
///
/// # Safety
/// `order` is host order or a usable stream of `device` for `backend` (see
/// [`Backend`](gpupool_core::Backend)'s handle contracts).
unsafe fn upstream_alloc<B: MemoryBackend>(
    backend: &B,
    kind: MemoryKind,
    device: DeviceId,
    order: AccessOrder<'_>,
    size: usize,
    align: usize,
) -> Result<NonNull<u8>, B::Error> {
    match (kind, order.stream_handle()) {
        (MemoryKind::Host, _) => {
            let layout = Layout::from_size_align(size, align).expect("a valid layout");
            // SAFETY: `size` is nonzero (callers never ask for 0 bytes).
            let p = unsafe { std::alloc::alloc(layout) };
            Ok(NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout)))
        }
        (MemoryKind::Device, Some(stream)) => {
            // SAFETY: a usable stream of `device` for `backend` (the caller's
            // contract).
            unsafe { backend.allocate_async(kind, device, size, align, stream) }
        }
        _ => backend.allocate(kind, device, size, align),
    }
}

/// Gives a block back to where [`upstream_alloc`] took it: host to the system
/// allocator; the others in `order` (synchronously when it is the host order).
///
/// # Safety
/// `r` came from `upstream_alloc` with the same `kind`, `device` and `order`
/// and is not released yet; nothing uses it after this point of `order`;
/// `order` is still host order or a usable stream of `device` for `backend`
/// (`upstream_alloc`'s contract).
unsafe fn upstream_release<B: MemoryBackend>(
    backend: &B,
    kind: MemoryKind,
    device: DeviceId,
    order: AccessOrder<'_>,
    r: Record,
) -> Result<(), B::Error> {
    match (kind, order.stream_handle()) {
        (MemoryKind::Host, _) => {
            let layout = Layout::from_size_align(r.size, r.align).expect("a valid layout");
            // SAFETY: allocated by the system allocator with this layout
            // (the caller's contract).
            unsafe { std::alloc::dealloc(r.base.as_ptr(), layout) };
            Ok(())
        }
        (_, Some(stream)) => {
            // SAFETY: the caller's contract; work on `stream` before this
            // point may still use it, as the call allows.
            unsafe { backend.deallocate_async(kind, device, r.base, r.size, r.align, stream) }
        }
        // SAFETY: the caller's contract; host order means nothing is pending.
        (_, None) => unsafe { backend.deallocate(kind, device, r.base, r.size, r.align) },
    }
}

/// A round without a scratchpad: one upstream allocation per size (host from
/// the system allocator; the other kinds from the backend, in `order`:
/// stream-ordered when it is a stream, synchronous when it is the host order),
/// all of them live together, then all freed the same way. `blocks` is working
/// space, left empty.
///
/// # Safety
/// As for [`DaliScratchpad::new`]: `order` is host order or a stream of
/// `device` made by `backend` (or a backend with its
/// [`id`](gpupool_core::Backend::id)), or one of `device`'s special streams.
pub unsafe fn raw_round<B: MemoryBackend>(
    backend: &B,
    kind: MemoryKind,
    device: DeviceId,
    order: AccessOrder<'_>,
    sizes: &[usize],
    align: usize,
    blocks: &mut Vec<NonNull<u8>>,
) -> Result<(), B::Error> {
    let mut result = Ok(());
    for &size in sizes {
        // SAFETY: the caller's contract on `order`.
        match unsafe { upstream_alloc(backend, kind, device, order, size, align) } {
            Ok(p) => blocks.push(std::hint::black_box(p)),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    for (base, &size) in blocks.drain(..).zip(sizes) {
        let r = Record { base, size, align };
        // SAFETY: allocated just above with this kind, device, order, size and
        // alignment; nothing used it; `order` as the caller's contract says.
        let freed = unsafe { upstream_release(backend, kind, device, order, r) };
        if let (Err(e), Ok(())) = (freed, &result) {
            result = Err(e);
        }
    }
    result
}

/// A round with bumpalo: one allocation per size, then a reset.
pub fn bumpalo_round(bump: &mut bumpalo::Bump, sizes: &[usize], align: usize) {
    for &size in sizes {
        let layout = Layout::from_size_align(size, align).expect("a valid layout");
        std::hint::black_box(bump.alloc_layout(layout));
    }
    bump.reset();
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpupool_mock::MockBackend;

    #[test]
    fn dali_stream_pool_reuses_ready_then_finished_busy_then_creates() {
        let gpu = MockBackend::new(1);
        let pool = DaliStreamPool::new(gpu.clone());
        let d = DeviceId(0);
        let a = pool.get(d).unwrap();
        let b = pool.get(d).unwrap();
        let (sa, sb) = (a.handle(), b.handle());
        assert_eq!(pool.live_leases(), 2);
        gpu.enqueue_work(sa).unwrap();
        gpu.enqueue_work(sb).unwrap();
        drop(a); // busy
        drop(b); // busy, newer
        assert_eq!(gpu.live_streams(), 2);
        gpu.complete_all(sa).unwrap();
        // Ready list empty: the busy scan finds `sa` (`sb` is still pending).
        let c = pool.get(d).unwrap();
        assert_eq!(c.handle(), sa);
        // Nothing ready, `sb` pending: a new stream.
        let e = pool.get(d).unwrap();
        assert_ne!(e.handle(), sb);
        assert_eq!(gpu.live_streams(), 3);
        drop(c); // idle: ready
        let f = pool.get(d).unwrap();
        assert_eq!(f.handle(), sa);
        drop((e, f));
        assert_eq!(pool.live_leases(), 0);
        gpu.complete_all(sb).unwrap();
        assert_eq!(pool.purge().unwrap(), 3);
        assert_eq!(gpu.live_streams(), 0);
    }

    #[test]
    fn dali_event_pool_is_lifo_and_recycles_nodes() {
        let gpu = MockBackend::new(2);
        let pool = DaliEventPool::new(gpu.clone(), EventFlags::DISABLE_TIMING).unwrap();
        let e1 = pool.get(DeviceId(1)).unwrap();
        let e2 = pool.get(DeviceId(1)).unwrap();
        // SAFETY: (each put) events this pool gave out on device 1, handed
        // back once and not used again.
        unsafe {
            pool.put(e1, DeviceId(1));
            pool.put(e2, DeviceId(1));
        }
        assert_eq!(pool.get(DeviceId(1)).unwrap(), e2);
        // SAFETY: as above.
        unsafe { pool.put(e2, DeviceId(1)) };
        assert_eq!(gpu.live_events(), 2);
        drop(pool);
        assert_eq!(gpu.live_events(), 0);
    }

    #[test]
    fn mutex_vec_pools_and_create_destroy_leave_nothing_behind() {
        let gpu = MockBackend::new(1);
        let d = DeviceId(0);
        let streams = MutexVecStreamPool::new(gpu.clone(), 1);
        let events = MutexVecEventPool::new(gpu.clone(), EventFlags::DISABLE_TIMING, 1);
        let s = streams.get(d).unwrap();
        // SAFETY: (each put) a stream or event its pool gave out on `d`,
        // handed back once before it is taken again.
        unsafe { streams.put(s, d) };
        assert_eq!(streams.get(d).unwrap(), s);
        // SAFETY: as above.
        unsafe { streams.put(s, d) };
        let e = events.get(d).unwrap();
        // SAFETY: as above.
        unsafe { events.put(e, d) };
        assert_eq!(events.get(d).unwrap(), e);
        // SAFETY: as above.
        unsafe { events.put(e, d) };
        stream_create_destroy(&gpu, d).unwrap();
        event_create_destroy(&gpu, d, EventFlags::DISABLE_TIMING).unwrap();
        assert_eq!(streams.purge().unwrap(), 1);
        assert_eq!(events.purge().unwrap(), 1);
        assert_eq!(gpu.live_streams(), 0);
        assert_eq!(gpu.live_events(), 0);
    }

    #[test]
    fn dali_scratchpad_grows_by_doubling_and_frees_everything() {
        let gpu = MockBackend::new(1);
        let d = DeviceId(0);
        let s = gpu.create_stream(d, StreamOptions::default()).unwrap();
        // SAFETY: a stream of `gpu` on `d`, destroyed only at the end of the
        // test, after the last use of the order.
        let order = unsafe { AccessOrder::from_raw(&gpu, s, d) };
        let sizes = [1, 24, 100, 512, 4096, 65536, 17, 3000, 8192, 40000];
        for kind in [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Device] {
            // SAFETY: `order` is a stream of `gpu` on `d`.
            let mut pad = unsafe { DaliScratchpad::new(&gpu, d, order) };
            let mut last_end = 0;
            for &n in &sizes {
                let p = pad.alloc(kind, n, 8).unwrap().unwrap();
                assert_eq!(p.as_ptr().addr() % 8, 0);
                last_end = p.as_ptr().addr() + n;
            }
            assert!(last_end > 0);
            assert_eq!(pad.alloc(kind, 0, 8).unwrap(), None);
            // 64 KiB, then 128 KiB for the 64 KiB request (and the rest).
            assert_eq!(pad.kinds[kind.index()].records.len, 2, "{kind:?}");
            drop(pad);
            let mut blocks = Vec::new();
            // SAFETY: as above.
            unsafe { raw_round(&gpu, kind, d, order, &sizes, 8, &mut blocks) }.unwrap();
        }
        // SAFETY: the test owns `s`, a live stream of `gpu` on `d`.
        unsafe { gpu.synchronize_stream(s, d) }.unwrap();
        assert!(gpu.misuses().is_empty(), "{:?}", gpu.misuses());
        // SAFETY: as above; nothing uses `s` after this.
        unsafe { gpu.destroy_stream(s, d) }.unwrap();
        let mut bump = bumpalo::Bump::new();
        bumpalo_round(&mut bump, &sizes, 8);
    }
}
