//! Where the scratchpads' blocks come from (host: the system allocator; the
//! other kinds: the backend), and the rounds made without a scratchpad: one
//! plain call per buffer, and bumpalo.

use std::alloc::Layout;
use std::ptr::NonNull;

use gpupool_core::{AccessOrder, DeviceId, MemoryBackend, MemoryKind};

/// A block an upstream gave: its address, size and alignment.
#[derive(Copy, Clone)]
pub(super) struct Record {
    pub(super) base: NonNull<u8>,
    pub(super) size: usize,
    pub(super) align: usize,
}

/// A block from `kind`'s upstream: host from the system allocator; device in
/// `order` (synchronously when it is the host order); pinned and managed
/// synchronously.
///
/// # Safety
/// `order` is host order or a usable stream of `device` for `backend` (see
/// [`Backend`](gpupool_core::Backend)'s handle contracts).
pub(super) unsafe fn upstream_alloc<B: MemoryBackend>(
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
pub(super) unsafe fn upstream_release<B: MemoryBackend>(
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
/// As for [`DaliScratchpad::new`](super::DaliScratchpad::new): `order` is host order or a stream of
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
