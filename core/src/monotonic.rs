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
use core::ptr::NonNull;

use crate::backend::{DeviceId, MemoryBackend, MemoryKind};
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

/// Checks an alignment and a size the way every allocation path does.
pub(crate) fn check_request<E>(bytes: usize, align: usize) -> Result<(), Error<E>> {
    if align == 0 || !align.is_power_of_two() {
        return Err(Error::InvalidAlignment { align });
    }
    if bytes > isize::MAX as usize {
        return Err(Error::SizeOverflow);
    }
    Ok(())
}

/// A monotonic (bump) resource of one memory kind.
#[derive(Debug)]
pub(crate) struct MonotonicResource {
    /// The size of the first block; also where `next_block` restarts when all
    /// blocks are released.
    first_block: usize,
    /// The size the next block from upstream starts doubling from. Never 0.
    next_block: usize,
    /// Every block held, oldest first; the last one is the current block.
    blocks: Vec<Block>,
    /// Bytes of the current block handed out (including alignment padding).
    /// Invariant: `used <= blocks.last().size`, and 0 when there is no block.
    used: usize,
    /// Bytes requested since the last reset (for statistics).
    requested: usize,
}

impl MonotonicResource {
    /// An empty resource whose first block will be `first_block` bytes (0 means
    /// [`DEFAULT_FIRST_BLOCK`]).
    pub(crate) fn new(first_block: usize) -> Self {
        let first_block = if first_block == 0 {
            DEFAULT_FIRST_BLOCK
        } else {
            first_block
        };
        MonotonicResource {
            first_block,
            next_block: first_block,
            blocks: Vec::new(),
            used: 0,
            requested: 0,
        }
    }

    /// `bytes` aligned to `align` (a nonzero power of two, checked), or `None`
    /// for zero bytes. On error nothing changed.
    pub(crate) fn allocate<U: Upstream>(
        &mut self,
        upstream: &U,
        bytes: usize,
        align: usize,
    ) -> Result<Option<NonNull<u8>>, Error<U::Error>> {
        check_request(bytes, align)?;
        if bytes == 0 {
            return Ok(None);
        }
        if let Some(p) = self.try_bump(bytes, align) {
            return Ok(Some(p));
        }
        let mut size = self.next_block;
        while size < bytes {
            size = size.checked_mul(2).ok_or(Error::SizeOverflow)?;
        }
        if size > isize::MAX as usize {
            return Err(Error::SizeOverflow);
        }
        let block_align = align.max(MIN_BLOCK_ALIGN);
        let ptr = upstream.allocate(size, block_align)?;
        self.blocks.push(Block {
            ptr,
            size,
            align: block_align,
        });
        self.used = bytes;
        self.requested += bytes;
        self.next_block = size.saturating_mul(2).min(isize::MAX as usize);
        Ok(Some(ptr))
    }

    /// Bumps `bytes` (nonzero, at most `isize::MAX`) aligned to `align` (a
    /// power of two) inside the current block, if they fit.
    #[inline]
    pub(crate) fn try_bump(&mut self, bytes: usize, align: usize) -> Option<NonNull<u8>> {
        let cur = self.blocks.last()?;
        let base = cur.ptr.as_ptr() as usize;
        // Padding to reach `align` from the current position. `base + used`
        // cannot overflow: it lies inside (or one past) a live block.
        let pad = base.wrapping_add(self.used).wrapping_neg() & (align - 1);
        let offset = self.used + pad;
        let end = offset.checked_add(bytes)?;
        if end > cur.size {
            return None;
        }
        // `wrapping_add`: device addresses carry no provenance, so in-bounds
        // arithmetic (`add`) is not available for them; the result stays inside
        // the block either way, and host blocks keep their provenance.
        let ptr = NonNull::new(cur.ptr.as_ptr().wrapping_add(offset))?;
        self.used = end;
        self.requested += bytes;
        Some(ptr)
    }

    /// Empties the current (only) block for reuse, keeping it.
    pub(crate) fn rewind(&mut self) {
        debug_assert!(self.blocks.len() <= 1);
        self.used = 0;
        self.requested = 0;
    }

    /// The blocks held, oldest first.
    pub(crate) fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// Bytes held from upstream.
    pub(crate) fn reserved(&self) -> usize {
        self.blocks.iter().map(|b| b.size).sum()
    }

    /// Bytes requested since the last reset.
    pub(crate) fn requested(&self) -> usize {
        self.requested
    }

    /// Forgets the blocks (the caller releases or keeps them) and returns them,
    /// newest first; the next block size restarts at `next`.
    pub(crate) fn take_blocks(&mut self, next: usize) -> Vec<Block> {
        self.used = 0;
        self.requested = 0;
        self.next_block = next.max(self.first_block);
        let mut blocks = core::mem::take(&mut self.blocks);
        blocks.reverse();
        blocks
    }

    /// Makes `block` the current block again, empty.
    pub(crate) fn keep_block(&mut self, block: Block) {
        debug_assert!(self.blocks.is_empty());
        self.blocks.push(block);
        self.used = 0;
        self.requested = 0;
    }

    /// The first block size.
    pub(crate) fn first_block(&self) -> usize {
        self.first_block
    }
}

/// An upstream that allocates in one access order and releases in another:
/// host order calls the backend's synchronous functions, a stream order its
/// stream-ordered ones on that stream.
pub(crate) struct FixedOrder<'b, B> {
    pub(crate) backend: &'b B,
    pub(crate) kind: MemoryKind,
    pub(crate) device: DeviceId,
    pub(crate) alloc: AccessOrder,
    pub(crate) release: AccessOrder,
}

impl<B: MemoryBackend> Upstream for FixedOrder<'_, B> {
    type Error = B::Error;

    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, Error<B::Error>> {
        match self.alloc {
            AccessOrder::Host => self
                .backend
                .allocate(self.kind, self.device, size, align)
                .map_err(Error::backend(BackendOp::Allocate)),
            AccessOrder::Stream { stream, device } => self
                .backend
                .allocate_async(self.kind, device, size, align, stream)
                .map_err(Error::backend(BackendOp::AllocateAsync)),
        }
    }

    unsafe fn release(&self, block: Block) -> Result<(), Error<B::Error>> {
        match self.release {
            // SAFETY: the caller's contract: the block came from `allocate` with
            // this size and alignment, and nothing uses it any more in host order.
            AccessOrder::Host => unsafe {
                self.backend
                    .deallocate(self.kind, self.device, block.ptr, block.size, block.align)
                    .map_err(Error::backend(BackendOp::Deallocate))
            },
            // SAFETY: as above, in the order of `stream`.
            AccessOrder::Stream { stream, device } => unsafe {
                self.backend
                    .deallocate_async(
                        self.kind,
                        device,
                        block.ptr,
                        block.size,
                        block.align,
                        stream,
                    )
                    .map_err(Error::backend(BackendOp::DeallocateAsync))
            },
        }
    }
}
