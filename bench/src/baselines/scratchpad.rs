//! DALI's `DynamicScratchpad`: one monotonic resource per kind, with DALI's
//! first block, growth rule and footer.

use std::ptr::NonNull;

use gpupool_core::{AccessOrder, DeviceId, MemoryBackend, MemoryKind};

use super::upstream::{upstream_alloc, upstream_release, Record};

/// DALI's first block size for every kind of a `DynamicScratchpad` (an
/// initial size of 0 becomes this).
pub const DALI_FIRST_BLOCK: usize = 0x10000;

/// The size of the footer DALI keeps at the end of each host-accessible block.
const FOOTER: usize = 32;

/// DALI's footer sentinel.
const SENTINEL: u64 = 0xABCD_ABCD_ABCD_ABCD;
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::tests::D;
    use crate::baselines::{bumpalo_round, raw_round};
    use gpupool_core::{StreamBackend, StreamOptions};
    use gpupool_mock::MockBackend;

    #[test]
    fn dali_scratchpad_grows_by_doubling_and_frees_everything() {
        let gpu = MockBackend::new(1);
        let s = gpu.create_stream(D, StreamOptions::default()).unwrap();
        // SAFETY: a stream of `gpu` on `D`, destroyed only at the end of the
        // test, after the last use of the order.
        let order = unsafe { AccessOrder::from_raw(&gpu, s, D) };
        let sizes = [1, 24, 100, 512, 4096, 65536, 17, 3000, 8192, 40000];
        for kind in [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Device] {
            // SAFETY: `order` is a stream of `gpu` on `D`.
            let mut pad = unsafe { DaliScratchpad::new(&gpu, D, order) };
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
            unsafe { raw_round(&gpu, kind, D, order, &sizes, 8, &mut blocks) }.unwrap();
        }
        // SAFETY: the test owns `s`, a live stream of `gpu` on `D`.
        unsafe { gpu.synchronize_stream(s, D) }.unwrap();
        assert!(gpu.misuses().is_empty(), "{:?}", gpu.misuses());
        // SAFETY: as above; nothing uses `s` after this.
        unsafe { gpu.destroy_stream(s, D) }.unwrap();
        let mut bump = bumpalo::Bump::new();
        bumpalo_round(&mut bump, &sizes, 8);
    }
}
