//! [`MonotonicResource`]: a bump allocator over blocks from an upstream, with
//! its bookkeeping kept outside the memory it manages (device memory cannot hold
//! a footer), and [`FixedOrder`], the upstream that allocates and releases in
//! fixed access orders.
//!
//! Growth: an allocation is bumped, aligned, inside the current block. When it
//! does not fit, a new block is taken from upstream: its size is the next block
//! size (the first block size to begin with), doubled until the request fits;
//! the next block size then doubles again. The unused tail of the old block is
//! left unused. A zero-byte request returns no pointer and touches nothing.

use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::ptr::NonNull;

use crate::backend::{DeviceId, MemoryBackend, MemoryKind, StreamBackend, StreamHandle};
use crate::error::{BackendOp, Error};
use crate::order::AccessOrder;

/// The first block size when none is given: 64 KiB, as in DALI.
pub const DEFAULT_FIRST_BLOCK: usize = 64 * 1024;

/// The smallest alignment of a block taken from upstream.
const MIN_BLOCK_ALIGN: usize = 16;

/// Where a [`MonotonicResource`] gets and returns its blocks.
pub(crate) trait Upstream {
    /// The backend's error.
    type Error;
    /// A block of `size` bytes aligned to `align`.
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, Error<Self::Error>>;
    /// Returns a block.
    ///
    /// # Safety
    /// `block` came from `allocate` of this upstream and is returned once; in
    /// the upstream's release order nothing uses it afterwards.
    unsafe fn release(&self, block: Block) -> Result<(), Error<Self::Error>>;
}

/// A block taken from upstream.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Its address.
    pub ptr: NonNull<u8>,
    /// Its size in bytes.
    pub size: usize,
    /// The alignment it was allocated with.
    pub align: usize,
}

impl Block {
    /// Gives the block to [`MemoryBackend::keep_for_graph`]: used in capture
    /// `capture` of `stream`, never reused while a graph may use it.
    ///
    /// # Safety
    /// The contract of `keep_for_graph` for this block, allocated by
    /// `backend` with its size and alignment, `kind` and `device`.
    pub(crate) unsafe fn keep_for_graph<B: MemoryBackend>(
        self,
        backend: &B,
        kind: MemoryKind,
        device: DeviceId,
        stream: StreamHandle,
        capture: u64,
    ) -> Result<(), B::Error> {
        // SAFETY: the caller's contract.
        unsafe {
            backend.keep_for_graph(
                kind, device, self.ptr, self.size, self.align, stream, capture,
            )
        }
    }
}

/// Checks an alignment and a size the way every allocation path does, and
/// says whether there is anything to allocate: `Ok(false)` for zero bytes.
pub(crate) fn check_request<E>(bytes: usize, align: usize) -> Result<bool, Error<E>> {
    if align == 0 || !align.is_power_of_two() {
        return Err(Error::InvalidAlignment { align });
    }
    if bytes > isize::MAX as usize {
        return Err(Error::SizeOverflow);
    }
    Ok(bytes != 0)
}

/// The bump position in a resource's current block, kept in `Cell`s so that an
/// allocation through `&self` needs no borrow flag and no `Option`: the
/// scratchpad's fast path is [`try_bump`](Self::try_bump) and nothing else.
///
/// Addresses are plain integers; the pointer handed out is `base` moved to the
/// new address (`<*mut u8>::with_addr`, no integer-to-pointer cast), so a host
/// block's provenance carries over (strict provenance) and a device address,
/// which has none, stays an address.
#[derive(Debug)]
pub(crate) struct Cursor {
    /// The current block's start (dangling when there is no block). Every
    /// pointer handed out derives from it.
    base: Cell<NonNull<u8>>,
    /// Where the next allocation may start: the current block's start plus
    /// the bytes handed out of it so far (alignment padding included).
    pos: Cell<usize>,
    /// Where handing out must stop: the current block's end, or 0 while there
    /// is no block or bumping is paused (every bump then fails, since a
    /// nonzero request ends past 0).
    limit: Cell<usize>,
    /// Bytes requested since the last reset (for statistics).
    requested: Cell<usize>,
}

impl Cursor {
    const fn new() -> Self {
        Cursor {
            base: Cell::new(NonNull::dangling()),
            pos: Cell::new(0),
            limit: Cell::new(0),
            requested: Cell::new(0),
        }
    }

    /// Bumps `bytes` (nonzero) aligned to `align` (a power of two) inside the
    /// current block, if they fit and bumping is not paused.
    #[inline(always)]
    fn try_bump(&self, bytes: usize, align: usize) -> Option<NonNull<u8>> {
        debug_assert!(bytes != 0 && align.is_power_of_two());
        let start = self.pos.get().checked_add(align - 1)? & !(align - 1);
        let end = start.checked_add(bytes)?;
        if end > self.limit.get() {
            return None;
        }
        // `start` lies inside the current block (`pos <= start < end <= limit`,
        // the block's end), so `base` moved there stays in its allocation; it
        // is not null because the block does not start at address 0.
        let p = NonNull::new(self.base.get().as_ptr().with_addr(start))?;
        self.pos.set(end);
        self.requested.set(self.requested.get() + bytes);
        Some(p)
    }

    /// Makes `block` current with its first `used` bytes handed out, or clears
    /// the cursor with `None`. `paused`: no bumping until
    /// [`resume`](MonotonicResource::resume). Leaves `requested` alone.
    fn set(&self, block: Option<&Block>, used: usize, paused: bool) {
        match block {
            Some(b) => {
                let start = b.ptr.as_ptr().addr();
                self.base.set(b.ptr);
                self.pos.set(start + used);
                self.limit.set(if paused { 0 } else { start + b.size });
            }
            None => {
                self.base.set(NonNull::dangling());
                self.pos.set(0);
                self.limit.set(0);
            }
        }
    }
}

/// A monotonic (bump) resource of one memory kind. Usable through `&self`:
/// the bump position is a [`Cursor`] of `Cell`s; the blocks, touched only when
/// one is taken or given back, sit in a `RefCell` that is never borrowed
/// across a call out (so its borrows cannot fail).
#[derive(Debug)]
pub(crate) struct MonotonicResource {
    /// The current block's bump position.
    cursor: Cursor,
    /// The size of the first block; also where `next_block` restarts when all
    /// blocks are released.
    first_block: usize,
    /// The size the next block from upstream starts doubling from. Never 0.
    next_block: Cell<usize>,
    /// Bytes held from upstream: the sum of the blocks' sizes.
    reserved: Cell<usize>,
    /// Bytes handed out (alignment padding included) of the blocks before
    /// the current one, since the blocks were last rewound or taken: with the
    /// current block's, what one block would have needed ([`used`](Self::used)).
    spent: Cell<usize>,
    /// Every block held, oldest first; the last one is the current block (the
    /// cursor's).
    blocks: RefCell<Blocks>,
}

/// A resource's blocks, oldest first: the first inline, the rest in a `Vec`.
/// A scratchpad made for one request mostly holds one block of a kind; a
/// `Vec` alone would cost each such round a heap allocation and its free
/// (with the C library's lock, once the process has threads).
#[derive(Debug, Default)]
pub(crate) struct Blocks {
    /// The oldest block; `None` only while `rest` is empty too.
    first: Option<Block>,
    rest: Vec<Block>,
}

impl Blocks {
    #[inline]
    const fn new() -> Self {
        Blocks {
            first: None,
            rest: Vec::new(),
        }
    }

    #[inline]
    fn push(&mut self, block: Block) {
        match self.first {
            None => self.first = Some(block),
            Some(_) => self.rest.push(block),
        }
    }

    #[inline]
    fn last(&self) -> Option<&Block> {
        self.rest.last().or(self.first.as_ref())
    }

    #[inline]
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn to_vec(&self) -> Vec<Block> {
        self.first.iter().chain(&self.rest).copied().collect()
    }
}

/// Newest first (the order blocks are released in).
impl IntoIterator for Blocks {
    type Item = Block;
    type IntoIter = core::iter::Chain<
        core::iter::Rev<alloc::vec::IntoIter<Block>>,
        core::option::IntoIter<Block>,
    >;

    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.rest.into_iter().rev().chain(self.first)
    }
}

impl MonotonicResource {
    /// An empty resource whose first block will be `first_block` bytes (0 means
    /// [`DEFAULT_FIRST_BLOCK`]). Allocates nothing.
    pub(crate) const fn new(first_block: usize) -> Self {
        let first_block = if first_block == 0 {
            DEFAULT_FIRST_BLOCK
        } else {
            first_block
        };
        MonotonicResource {
            cursor: Cursor::new(),
            first_block,
            next_block: Cell::new(first_block),
            reserved: Cell::new(0),
            spent: Cell::new(0),
            blocks: RefCell::new(Blocks::new()),
        }
    }

    /// Makes the first block at least `size` bytes. Only while no block is
    /// held (the caller's construction). Inline, so that a scratchpad's
    /// address does not escape between its construction and
    /// [`learn_sizes`](crate::Scratchpad::learn_sizes)'s return: it is then
    /// built where the caller keeps it, not built and copied.
    #[inline]
    pub(crate) fn raise_first_block(&mut self, size: usize) {
        debug_assert!(self.blocks.get_mut().is_empty());
        let size = size.min(isize::MAX as usize);
        if size > self.first_block {
            self.first_block = size;
            self.next_block.set(size);
        }
    }

    /// Bumps `bytes` (nonzero, unchecked otherwise: a request past `isize::MAX`
    /// never fits) aligned to `align` (a power of two) inside the current
    /// block, if they fit and bumping is not paused. The fast path.
    #[inline(always)]
    pub(crate) fn try_bump(&self, bytes: usize, align: usize) -> Option<NonNull<u8>> {
        self.cursor.try_bump(bytes, align)
    }

    /// `bytes` aligned to `align` (a nonzero power of two, checked), or `None`
    /// for zero bytes. On error nothing changed. Takes a new block if the
    /// request does not fit (or bumping is paused: the caller settles a pause
    /// before calling this).
    pub(crate) fn allocate<U: Upstream>(
        &self,
        upstream: &U,
        bytes: usize,
        align: usize,
    ) -> Result<Option<NonNull<u8>>, Error<U::Error>> {
        if !check_request(bytes, align)? {
            return Ok(None);
        }
        if let Some(p) = self.try_bump(bytes, align) {
            return Ok(Some(p));
        }
        let mut size = self.next_block.get();
        while size < bytes {
            size = size.checked_mul(2).ok_or(Error::SizeOverflow)?;
        }
        if size > isize::MAX as usize {
            return Err(Error::SizeOverflow);
        }
        let block_align = align.max(MIN_BLOCK_ALIGN);
        // No borrow is held here: the upstream is a call out.
        let ptr = upstream.allocate(size, block_align)?;
        let block = Block {
            ptr,
            size,
            align: block_align,
        };
        self.spent.set(self.used());
        self.blocks.borrow_mut().push(block);
        self.reserved.set(self.reserved.get() + size);
        self.cursor.set(Some(&block), bytes, false);
        // Counted since the last reset, across blocks.
        self.cursor
            .requested
            .set(self.cursor.requested.get() + bytes);
        self.next_block
            .set(size.saturating_mul(2).min(isize::MAX as usize));
        Ok(Some(ptr))
    }

    /// Stops bumping in the current block until [`resume`](Self::resume).
    pub(crate) fn pause(&self) {
        self.cursor.limit.set(0);
    }

    /// Bumps in the current block again, if there is one.
    pub(crate) fn resume(&self) {
        if let Some(b) = self.blocks.borrow().last() {
            self.cursor.limit.set(b.ptr.as_ptr().addr() + b.size);
        }
    }

    /// Empties the current (only) block for reuse, keeping it (and its pause).
    #[inline]
    pub(crate) fn rewind(&self) {
        debug_assert!(self.blocks.borrow().len() <= 1);
        self.cursor.pos.set(self.cursor.base.get().as_ptr().addr());
        self.cursor.requested.set(0);
        // `spent` is 0 already: it counts blocks before the current one, and
        // a resource with one block has none (it is set when a second block
        // is taken, and cleared whenever the blocks are taken or one kept).
    }

    /// Bytes handed out since the blocks were last rewound or taken,
    /// alignment padding included but not the unused tails of earlier blocks:
    /// about what one block would have needed for the same requests.
    pub(crate) fn used(&self) -> usize {
        let current = if self.blocks.borrow().is_empty() {
            0 // no current block: the cursor's base is a placeholder
        } else {
            self.cursor.pos.get() - self.cursor.base.get().as_ptr().addr()
        };
        self.spent.get() + current
    }

    /// How many blocks are held.
    #[inline]
    pub(crate) fn block_count(&self) -> usize {
        self.blocks.borrow().len()
    }

    /// How many blocks are held, through `&mut` (no borrow flag).
    #[inline]
    pub(crate) fn block_count_mut(&mut self) -> usize {
        self.blocks.get_mut().len()
    }

    /// The blocks held, oldest first (a copy).
    pub(crate) fn blocks(&self) -> Vec<Block> {
        self.blocks.borrow().to_vec()
    }

    /// Bytes held from upstream.
    pub(crate) fn reserved(&self) -> usize {
        self.reserved.get()
    }

    /// Bytes requested since the last reset.
    pub(crate) fn requested(&self) -> usize {
        self.cursor.requested.get()
    }

    /// Forgets the blocks (the caller releases or keeps them) and returns them
    /// (they iterate newest first); the next block size restarts at `next`.
    pub(crate) fn take_blocks(&self, next: usize) -> Blocks {
        self.cursor.set(None, 0, false);
        self.cursor.requested.set(0);
        self.reserved.set(0);
        self.spent.set(0);
        self.next_block.set(next.max(self.first_block));
        self.blocks.take()
    }

    /// Takes `block` back (one `take_blocks` handed out and that could not be
    /// released) as the current block, empty; `paused` as in
    /// [`pause`](Self::pause).
    pub(crate) fn keep_block(&self, block: Block, paused: bool) {
        self.blocks.borrow_mut().push(block);
        self.reserved.set(self.reserved.get() + block.size);
        self.cursor.set(Some(&block), 0, paused);
        self.cursor.requested.set(0);
        self.spent.set(0);
    }

    /// The first block size.
    pub(crate) fn first_block(&self) -> usize {
        self.first_block
    }
}

/// An upstream that allocates in one access order and releases in another:
/// host order calls the backend's synchronous functions, a stream order its
/// stream-ordered ones on that stream.
///
/// Invariant (set up by the scratchpad, which checks it at construction): a
/// stream of `alloc` or `release` is a usable stream of `device` for
/// `backend` for all of `'b` (the orders borrow their streams for `'b`, and
/// their owner is `backend`'s id), so every block is allocated and freed
/// under the one device it belongs to.
pub(crate) struct FixedOrder<'b, B> {
    pub(crate) backend: &'b B,
    pub(crate) kind: MemoryKind,
    pub(crate) device: DeviceId,
    pub(crate) alloc: AccessOrder<'b>,
    pub(crate) release: AccessOrder<'b>,
}

impl<B: MemoryBackend + StreamBackend> Upstream for FixedOrder<'_, B> {
    type Error = B::Error;

    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, Error<B::Error>> {
        match self.alloc.stream_handle() {
            None => self
                .backend
                .allocate(self.kind, self.device, size, align)
                .map_err(Error::backend(BackendOp::Allocate)),
            // SAFETY: the struct's invariant: a usable stream of `device`.
            Some(stream) => unsafe {
                self.backend
                    .allocate_async(self.kind, self.device, size, align, stream)
            }
            .map_err(Error::backend(BackendOp::AllocateAsync)),
        }
    }

    unsafe fn release(&self, block: Block) -> Result<(), Error<B::Error>> {
        match self.release.stream_handle() {
            // SAFETY: the caller's contract: the block came from `allocate` with
            // this size and alignment, and nothing uses it any more in host order.
            None => unsafe {
                self.backend
                    .deallocate(self.kind, self.device, block.ptr, block.size, block.align)
                    .map_err(Error::backend(BackendOp::Deallocate))
            },
            // SAFETY: as above, in the order of `stream`, a usable stream of
            // `device` (the struct's invariant, which `self.release` names),
            // the device the block was allocated for.
            Some(stream) => unsafe {
                release_in_order(
                    self.backend,
                    &self.release,
                    self.kind,
                    self.device,
                    block,
                    stream,
                )
            },
        }
    }
}

/// Frees a block in the order of `stream`, the stream of `order`:
/// `deallocate_async`; but a host-visible block whose stream is capturing a
/// graph may be read or written by every replay of the graph, whenever it
/// runs, so it goes to the backend's `keep_for_graph` instead (never reused).
/// The capture status is asked only where the stream may be capturing
/// ([`AccessOrder::capturing`]).
///
/// # Safety
/// The contract of [`MemoryBackend::deallocate_async`] for `block` (allocated
/// with its size and alignment, `kind` and `device`) on `stream`, which is
/// `order`'s stream, of `device`; `backend` may be handed `order`'s stream.
pub(crate) unsafe fn release_in_order<B: MemoryBackend + StreamBackend>(
    backend: &B,
    order: &AccessOrder<'_>,
    kind: MemoryKind,
    device: DeviceId,
    block: Block,
    stream: StreamHandle,
) -> Result<(), Error<B::Error>> {
    if kind.is_host_accessible() {
        // SAFETY: the caller's contract: `backend` may be handed `order`'s
        // stream.
        if let Some(capture) = unsafe { order.capture(backend) }? {
            // SAFETY: the caller's contract; `stream` was in `capture` just
            // now (the backend checks that it still is).
            return unsafe { block.keep_for_graph(backend, kind, device, stream, capture) }
                .map_err(Error::backend(BackendOp::KeepForGraph));
        }
    }
    // SAFETY: the caller's contract.
    unsafe { backend.deallocate_async(kind, device, block.ptr, block.size, block.align, stream) }
        .map_err(Error::backend(BackendOp::DeallocateAsync))
}
