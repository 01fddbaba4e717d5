//! [`Scratchpad`]: monotonic, stream-ordered scratch memory in four kinds
//! (host, pinned, device, managed), safe by construction.
//!
//! Each kind has its own monotonic (bump) resource over a
//! fixed-order upstream, which takes its first block on the kind's first
//! non-empty allocation:
//!
//! | kind | allocated in | released in |
//! |---|---|---|
//! | host | host order | host order |
//! | pinned | host order | the pinned release order (default: the device order) |
//! | device | the device order | the device order |
//! | managed | host order | the managed release order (default: the device order) |
//!
//! Host-visible allocations come back as `&mut [MaybeUninit<T>]` and device
//! allocations as a [`DeviceSlice`]; both borrow the scratchpad, so no scratch
//! memory can be touched through them after [`reset`](Scratchpad::reset) or
//! drop, which need `&mut self` or ownership.
//!
//! # Reuse across iterations
//!
//! DALI's scratchpad must be short-lived: kept, it grows without bound (its
//! #4790). This one can be [`reset`](Scratchpad::reset) and reused:
//! - a kind that used more than one block releases them all (in its release
//!   order) and next time takes one block that holds the largest round so far
//!   (the bytes handed out, alignment padding included, plus a sixteenth,
//!   rounded up to 4 KiB), so a loop converges to one block per kind, about
//!   the size of what a round asks for;
//! - a kind that used one block keeps it. Device memory is reused at once: it is
//!   allocated and released in the device order, so the next round's work on
//!   that stream runs after the last round's. Pinned and managed memory is
//!   written by the host as soon as it is handed out, so when their release
//!   order is a stream, reset asks whether that stream is idle (everything
//!   queued on it has finished): if so, the block is reusable at once.
//!   Otherwise reset records an event there and the block is handed out again
//!   only once the event has completed; if it has not when the next round
//!   needs the block, the block is released in stream order and a fresh one
//!   taken instead. A stream found busy is not asked again for the next seven
//!   resets of that kind (a loop that resets while its kernels still run gains
//!   nothing from the question).
//!
//! In a steady loop whose rounds need the same memory and whose streams keep
//! up, resets ask upstream for nothing.
//!
//! # Cost
//!
//! An allocation that fits the current block of its kind is a bump of a
//! per-kind cursor held in `Cell`s: no borrow flag, no `Option`, no fence check
//! (a kept block waiting on its fence pauses its cursor instead). Everything
//! else (the first block, growth, a fence to settle, a bad request) takes the
//! slow path. A reset visits only the kinds that hold blocks.
//!
//! # Errors in drop
//!
//! Dropping a scratchpad releases every block and destroys its events, never
//! panics, and reports each failure it meets (every one, not just the first)
//! through [`lost_errors`](crate::lost_errors) and the
//! [`set_lost_error_hook`](crate::set_lost_error_hook) hook: there is no
//! owner left to return it to. [`release`](Scratchpad::release) is the
//! fallible form. A call that meets several failures ([`reset`](Scratchpad::reset),
//! [`release`](Scratchpad::release)) returns the first and reports the others
//! the same way, so none is dropped silently.

use alloc::vec::Vec;
use core::cell::Cell;
use core::fmt;
use core::marker::PhantomData;
use core::mem::{size_of, MaybeUninit};
use core::ops::Range;
use core::ptr::NonNull;
// Plain atomics, under loom too: `ScratchSizes` holds independent relaxed
// hints that order nothing, and its constructor is `const`.
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::backend::{
    Completion, DeviceId, EventBackend, EventFlags, EventHandle, MemoryBackend, MemoryKind,
    StreamBackend, StreamHandle,
};
use crate::error::{BackendOp, Error};
use crate::monotonic::{check_request, Block, FixedOrder, MonotonicResource, Upstream};
use crate::order::AccessOrder;

/// What a scratchpad needs of its backend: memory, and streams and events for
/// stream-ordered reuse. Implemented for every such backend.
pub trait ScratchBackend: MemoryBackend + StreamBackend + EventBackend {}
impl<B: MemoryBackend + StreamBackend + EventBackend + ?Sized> ScratchBackend for B {}

/// How a [`Scratchpad`] is set up besides its device order.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct ScratchpadConfig {
    /// The order pinned blocks are released in; `None`: the device order.
    pub pinned_release: Option<AccessOrder>,
    /// The order managed blocks are released in; `None`: the device order.
    pub managed_release: Option<AccessOrder>,
    /// The first block size per kind, indexed by [`MemoryKind::index`]; 0 means
    /// 64 KiB.
    pub initial_sizes: [usize; 4],
    /// The device memory is allocated for; `None`: the device order's device,
    /// or for host order the current device (resolved on first use).
    pub device: Option<DeviceId>,
}

/// First block sizes learned from earlier scratchpads: a runtime that makes a
/// new scratchpad for every run of an operation keeps one `ScratchSizes` for
/// that operation and builds each scratchpad with
/// [`learn_sizes`](Scratchpad::learn_sizes).
///
/// A scratchpad made that way starts each kind with one block that holds the
/// largest round any earlier one handed out of that kind (the bytes, alignment
/// padding included, plus a sixteenth, rounded up to 4 KiB; or its configured
/// first block, if larger), and records its own largest round when it is
/// released or dropped. A run that needs what the last one needed then takes one block per
/// kind from upstream instead of a chain of doubling blocks (a 16-allocation
/// round of 1 B – 64 KiB: one block instead of four). The sizes only grow:
/// one large run makes every later scratchpad start large (its blocks come
/// from the backend's pools, but are held while it lives);
/// [`forget`](Self::forget) starts over.
///
/// It is `Sync` (four relaxed atomic sizes), so scratchpads on several threads
/// may share one.
///
/// ```
/// use gpupool_core::{AccessOrder, MemoryKind, Scratchpad, ScratchSizes};
/// use gpupool_mock::MockBackend;
///
/// let gpu = MockBackend::new(1);
/// let sizes = ScratchSizes::new();
/// for _run in 0..3 {
///     let pad = Scratchpad::new(&gpu, AccessOrder::host()).learn_sizes(&sizes);
///     for n in [1000usize, 60_000, 60_000] {
///         pad.host::<u8>(n).unwrap();
///     }
/// } // the first run took two blocks (64 + 128 KiB); the others one of 128 KiB
/// assert_eq!(sizes.get()[MemoryKind::Host.index()], 128 * 1024);
/// ```
#[derive(Debug, Default)]
pub struct ScratchSizes {
    /// Per kind, indexed by [`MemoryKind::index`]; 0: nothing learned.
    sizes: [AtomicUsize; 4],
}

impl ScratchSizes {
    /// Nothing learned yet: scratchpads start with their configured first
    /// blocks.
    pub const fn new() -> Self {
        ScratchSizes {
            sizes: [
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
            ],
        }
    }

    /// The learned first block size per kind (indexed by
    /// [`MemoryKind::index`]; 0: none yet).
    pub fn get(&self) -> [usize; 4] {
        // Relaxed: each size is an independent hint; no other memory is
        // published through it.
        core::array::from_fn(|i| self.sizes[i].load(Ordering::Relaxed))
    }

    /// Forgets what was learned.
    pub fn forget(&self) {
        for s in &self.sizes {
            // Relaxed: as in `get`.
            s.store(0, Ordering::Relaxed);
        }
    }

    fn learn(&self, kind: MemoryKind, bytes: usize) {
        if bytes != 0 {
            // Relaxed: as in `get`; `fetch_max` keeps the largest of racing
            // scratchpads.
            self.sizes[kind.index()].fetch_max(bytes, Ordering::Relaxed);
        }
    }
}

/// A typed range of scratch device memory: its address, length and device. It
/// borrows the scratchpad, so it cannot outlive the memory. The host cannot
/// dereference it; pass [`as_ptr`](Self::as_ptr) to kernels and copies.
pub struct DeviceSlice<'a, T> {
    ptr: NonNull<T>,
    len: usize,
    device: DeviceId,
    _memory: PhantomData<&'a mut [T]>,
}

impl<T> DeviceSlice<'_, T> {
    /// The device address of the first element (dangling, well aligned, for an
    /// empty slice).
    #[inline]
    pub fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// The device address as an integer (a `CUdeviceptr` on CUDA).
    #[inline]
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr().addr()
    }

    /// Number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no element.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    #[inline]
    pub fn byte_len(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device the memory belongs to.
    #[inline]
    pub fn device(&self) -> DeviceId {
        self.device
    }
}

impl<T> fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSlice")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}

/// Per-kind statistics of a scratchpad.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ScratchStats {
    /// Bytes held from upstream, per kind.
    pub reserved: [usize; 4],
    /// Blocks held, per kind.
    pub blocks: [usize; 4],
    /// Bytes requested since the last reset, per kind.
    pub requested: [usize; 4],
    /// The most bytes held at once, per kind.
    pub high_water: [usize; 4],
    /// Blocks taken from upstream, over the scratchpad's life.
    pub upstream_allocations: usize,
    /// Blocks given back to upstream, over the scratchpad's life.
    pub upstream_releases: usize,
}

/// The one block that holds a round of `used` bytes again: a sixteenth more
/// (alignment padding may fall differently in one block than across
/// several), rounded up to 4 KiB.
fn fitted(used: usize) -> usize {
    let with_slack = used.saturating_add(used / 16);
    with_slack
        .checked_next_multiple_of(4096)
        .unwrap_or(with_slack)
}

impl KindState {
    /// Records the bytes this round handed out; returns the block size that
    /// holds the largest round so far.
    fn note_round(&self) -> usize {
        let peak = self.peak_used.get().max(self.res.used());
        self.peak_used.set(peak);
        fitted(peak)
    }
}

/// How many resets of a kind skip the idle-stream question after it was
/// answered "busy".
const PROBE_BACKOFF: u8 = 7;

/// The event that fences a kept block of a host-visible kind.
#[derive(Copy, Clone)]
struct Fence {
    event: EventHandle,
    device: DeviceId,
    /// Whether the kept block waits for the event (its cursor is paused
    /// meanwhile, so the fast path cannot hand it out).
    armed: bool,
}

/// One kind's resource and what goes with it. Every field is usable through
/// `&self`.
struct KindState {
    res: MonotonicResource,
    fence: Cell<Option<Fence>>,
    /// Resets left before `reset` asks the release stream whether it is idle
    /// again (0: ask at the next one). See `reset_kind`.
    skip_probes: Cell<u8>,
    high_water: Cell<usize>,
    /// The most bytes one round handed out (alignment padding included),
    /// recorded at each reset and at release: what one block must hold.
    peak_used: Cell<usize>,
}

impl KindState {
    const fn new(first_block: usize) -> Self {
        KindState {
            res: MonotonicResource::new(first_block),
            fence: Cell::new(None),
            skip_probes: Cell::new(0),
            high_water: Cell::new(0),
            peak_used: Cell::new(0),
        }
    }
}

/// The errors of a call that may meet several: the first is returned, each
/// later one is reported as lost (the caller sees only one).
struct FirstError<E: fmt::Display> {
    first: Option<Error<E>>,
}

impl<E: fmt::Display> FirstError<E> {
    const fn new() -> Self {
        FirstError { first: None }
    }

    fn push(&mut self, e: Error<E>) {
        match self.first {
            None => self.first = Some(e),
            Some(_) => crate::lost::report(&e),
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn result(self) -> Result<(), Error<E>> {
        self.first.map_or(Ok(()), Err)
    }
}

/// Scratch memory in four kinds. See the [module documentation](self).
///
/// ```
/// use gpupool_core::{AccessOrder, DeviceId, StreamPool};
/// use gpupool_core::scratchpad::Scratchpad;
/// use gpupool_mock::MockBackend;
///
/// let gpu = MockBackend::new(1);
/// let streams = StreamPool::new(gpu.clone());
/// let stream = streams.get(0).unwrap();
/// let mut scratch = Scratchpad::new(&gpu, stream.order());
/// for _round in 0..3 {
///     let staging = scratch.pinned::<f32>(1024).unwrap(); // &mut [MaybeUninit<f32>]
///     staging.iter_mut().for_each(|x| { x.write(1.0); });
///     let on_gpu = scratch.device::<f32>(1024).unwrap();  // DeviceSlice<f32>
///     assert_eq!(on_gpu.len(), 1024);
///     gpu.complete_everything();        // (on a GPU: the kernels of this round run)
///     scratch.reset().unwrap();         // stream-ordered: blocks kept for the next round
/// }
/// ```
pub struct Scratchpad<'b, B: ScratchBackend> {
    backend: &'b B,
    device_order: AccessOrder,
    config: ScratchpadConfig,
    /// Per kind, indexed by [`MemoryKind::index`].
    kinds: [KindState; 4],
    /// Bit `i` set: kind `i` holds at least one block. What `reset` visits.
    held: Cell<u8>,
    /// Bit `i` set: a block of kind `i` kept by `reset` is fenced (host-visible
    /// memory released in stream order). Fixed at construction.
    fenced: u8,
    /// The resolved device, once known.
    device: Cell<Option<DeviceId>>,
    upstream_allocations: Cell<usize>,
    upstream_releases: Cell<usize>,
    /// Where the peak of each kind is recorded on release, if anywhere.
    sizes: Option<&'b ScratchSizes>,
}

// SAFETY: the scratchpad owns its blocks (raw pointers into memory nobody else
// frees) and its bookkeeping; moving it to another thread moves that ownership.
// The backend is only reached through `&B`, which is `Send` because `B: Sync`
// (every `Backend` is). It is not `Sync`: allocation goes through `Cell`s and
// a `RefCell`, unsynchronised.
unsafe impl<B: ScratchBackend> Send for Scratchpad<'_, B> {}

impl<B: ScratchBackend> fmt::Debug for Scratchpad<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scratchpad")
            .field("device_order", &self.device_order)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<'b, B: ScratchBackend> Scratchpad<'b, B> {
    /// A scratchpad whose device memory follows `device_order` (and pinned and
    /// managed memory is released in it). Allocates nothing yet.
    pub fn new(backend: &'b B, device_order: AccessOrder) -> Self {
        Self::with_config(backend, device_order, ScratchpadConfig::default())
    }

    /// A scratchpad with explicit release orders, first block sizes or device.
    pub fn with_config(
        backend: &'b B,
        device_order: AccessOrder,
        config: ScratchpadConfig,
    ) -> Self {
        let mut scratch = Scratchpad {
            backend,
            device_order,
            config,
            fenced: 0,
            kinds: [
                KindState::new(config.initial_sizes[0]),
                KindState::new(config.initial_sizes[1]),
                KindState::new(config.initial_sizes[2]),
                KindState::new(config.initial_sizes[3]),
            ],
            held: Cell::new(0),
            device: Cell::new(config.device.or(device_order.device())),
            upstream_allocations: Cell::new(0),
            upstream_releases: Cell::new(0),
            sizes: None,
        };
        for kind in MemoryKind::ALL {
            if kind.is_host_accessible() && !scratch.release_order(kind).is_host() {
                scratch.fenced |= 1 << kind.index();
            }
        }
        scratch
    }

    /// Starts each kind with one block the size `sizes` learned for it (when
    /// larger than the configured first block) and, when this scratchpad is
    /// released or dropped, records there the most it held of each kind. See
    /// [`ScratchSizes`].
    pub fn learn_sizes(mut self, sizes: &'b ScratchSizes) -> Self {
        let learned = sizes.get();
        for (st, size) in self.kinds.iter_mut().zip(learned) {
            // Nothing is allocated before the scratchpad is returned to the
            // caller, so every kind is still empty.
            st.res.raise_first_block(size);
        }
        self.sizes = Some(sizes);
        self
    }

    /// The order device memory is allocated and released in.
    pub fn device_order(&self) -> AccessOrder {
        self.device_order
    }

    /// The order blocks of `kind` are released in.
    pub fn release_order(&self, kind: MemoryKind) -> AccessOrder {
        match kind {
            MemoryKind::Host => AccessOrder::Host,
            MemoryKind::Pinned => self.config.pinned_release.unwrap_or(self.device_order),
            MemoryKind::Device => self.device_order,
            MemoryKind::Managed => self.config.managed_release.unwrap_or(self.device_order),
        }
    }

    /// The order blocks of `kind` are allocated in.
    fn alloc_order(&self, kind: MemoryKind) -> AccessOrder {
        match kind {
            MemoryKind::Device => self.device_order,
            _ => AccessOrder::Host,
        }
    }

    /// The device the memory is for (resolved once).
    pub fn device_id(&self) -> Result<DeviceId, Error<B::Error>> {
        if let Some(d) = self.device.get() {
            return Ok(d);
        }
        let d = self
            .backend
            .current_device()
            .map_err(Error::backend(BackendOp::CurrentDevice))?;
        self.device.set(Some(d));
        Ok(d)
    }

    fn upstream(&self, kind: MemoryKind, device: DeviceId) -> FixedOrder<'b, B> {
        FixedOrder {
            backend: self.backend,
            kind,
            device,
            alloc: self.alloc_order(kind),
            release: self.release_order(kind),
        }
    }

    /// The upstream of `kind`, counted.
    fn counting(&self, kind: MemoryKind, device: DeviceId) -> Counting<'_, FixedOrder<'b, B>> {
        Counting {
            inner: self.upstream(kind, device),
            allocations: &self.upstream_allocations,
            releases: &self.upstream_releases,
        }
    }

    /// Records whether `kind` holds blocks, for `reset`.
    fn note_held(&self, kind: MemoryKind) {
        let bit = 1u8 << kind.index();
        let held = self.held.get();
        self.held
            .set(if self.kinds[kind.index()].res.block_count() > 0 {
                held | bit
            } else {
                held & !bit
            });
    }

    /// `bytes` of `kind` memory aligned to `align`: a raw pointer, or `None`
    /// for zero bytes (which touches nothing). The memory stays valid until
    /// [`reset`](Self::reset) or drop.
    ///
    /// Errors: an alignment that is not a nonzero power of two, a size past
    /// `isize::MAX`, a failed upstream; the scratchpad is unchanged by any of them.
    #[inline]
    pub fn alloc(
        &self,
        kind: MemoryKind,
        bytes: usize,
        align: usize,
    ) -> Result<Option<NonNull<u8>>, Error<B::Error>> {
        // Fast path: room in the current block of the kind. The cursor fails
        // every request when the kind has no block or its kept block waits on
        // its fence, and a request past `isize::MAX` never fits; bad
        // alignments and zero sizes are left to the slow path, which checks.
        if bytes != 0 && align.is_power_of_two() {
            if let Some(p) = self.kinds[kind.index()].res.try_bump(bytes, align) {
                return Ok(Some(p));
            }
        }
        self.alloc_slow(kind, bytes, align)
    }

    /// Everything `alloc`'s fast path leaves: checks, the first block, growth,
    /// a fence to settle.
    #[inline(never)]
    fn alloc_slow(
        &self,
        kind: MemoryKind,
        bytes: usize,
        align: usize,
    ) -> Result<Option<NonNull<u8>>, Error<B::Error>> {
        check_request(bytes, align)?;
        if bytes == 0 {
            return Ok(None);
        }
        let device = self.device_id()?;
        let up = self.counting(kind, device);
        let st = &self.kinds[kind.index()];
        let settled = self.settle_fence(st, &up);
        self.note_held(kind);
        settled?;
        let p = st.res.allocate(&up, bytes, align);
        self.note_held(kind);
        let p = p?;
        st.high_water
            .set(st.high_water.get().max(st.res.reserved()));
        Ok(p)
    }

    /// If the kept block of a kind waits on its fence: hand it out again if the
    /// event completed; otherwise release it in its stream order, so the next
    /// allocation takes a fresh block. A block whose release fails is kept,
    /// still fenced, and the error returned.
    fn settle_fence<U: Upstream<Error = B::Error>>(
        &self,
        st: &KindState,
        up: &U,
    ) -> Result<(), Error<B::Error>> {
        let Some(mut fence) = st.fence.get() else {
            return Ok(());
        };
        if !fence.armed {
            return Ok(());
        }
        if let Ok(Completion::Complete) = self.backend.query_event(fence.event, fence.device) {
            fence.armed = false;
            st.fence.set(Some(fence));
            st.res.resume();
            return Ok(());
        }
        // Still in use (or unknown): do not reuse; release in stream order.
        let next = st.res.reserved();
        let mut errors = FirstError::new();
        for block in st.res.take_blocks(next) {
            // SAFETY: the block came from this upstream and is forgotten by the
            // resource; the release order is a stream (fences exist only then),
            // so work still using it finishes first.
            if let Err(e) = unsafe { up.release(block) } {
                st.res.keep_block(block, true);
                errors.push(e);
            }
        }
        if errors.is_empty() {
            fence.armed = false;
            st.fence.set(Some(fence));
        }
        errors.result()
    }

    fn alloc_typed<T>(
        &self,
        kind: MemoryKind,
        count: usize,
    ) -> Result<NonNull<T>, Error<B::Error>> {
        let bytes = count
            .checked_mul(size_of::<T>())
            .ok_or(Error::SizeOverflow)?;
        match self.alloc(kind, bytes, core::mem::align_of::<T>())? {
            Some(p) => Ok(p.cast()),
            None => Ok(NonNull::dangling()),
        }
    }

    /// `count` uninitialised `T`s of a host-visible kind (host, pinned, managed).
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn uninit<T>(
        &self,
        kind: MemoryKind,
        count: usize,
    ) -> Result<&mut [MaybeUninit<T>], Error<B::Error>> {
        if !kind.is_host_accessible() {
            return Err(Error::NotHostAccessible);
        }
        let p = self.alloc_typed::<T>(kind, count)?;
        // SAFETY: `p` is aligned for `T` and valid for `count` elements of a
        // host-accessible block (or dangling with `count * size_of::<T>() == 0`).
        // The range was handed out by this call only and lives until `reset` or
        // drop, which need `&mut self` or ownership and so end this borrow first.
        Ok(unsafe { core::slice::from_raw_parts_mut(p.as_ptr().cast::<MaybeUninit<T>>(), count) })
    }

    /// `count` uninitialised `T`s of pageable host memory.
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn host<T>(&self, count: usize) -> Result<&mut [MaybeUninit<T>], Error<B::Error>> {
        self.uninit(MemoryKind::Host, count)
    }

    /// `count` uninitialised `T`s of pinned host memory.
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn pinned<T>(&self, count: usize) -> Result<&mut [MaybeUninit<T>], Error<B::Error>> {
        self.uninit(MemoryKind::Pinned, count)
    }

    /// `count` uninitialised `T`s of managed memory.
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn managed<T>(&self, count: usize) -> Result<&mut [MaybeUninit<T>], Error<B::Error>> {
        self.uninit(MemoryKind::Managed, count)
    }

    /// `count` `T`s of device memory.
    pub fn device_slice<T>(&self, count: usize) -> Result<DeviceSlice<'_, T>, Error<B::Error>> {
        let ptr = self.alloc_typed::<T>(MemoryKind::Device, count)?;
        Ok(DeviceSlice {
            ptr,
            len: count,
            device: self.device_id()?,
            _memory: PhantomData,
        })
    }

    /// Shorthand for [`device_slice`](Self::device_slice).
    pub fn device<T>(&self, count: usize) -> Result<DeviceSlice<'_, T>, Error<B::Error>> {
        self.device_slice(count)
    }

    /// A copy of `src` in host-visible `kind` memory (DALI's `ToHost`,
    /// `ToPinned`, `ToManaged`).
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn copy_of<T: Copy>(
        &self,
        kind: MemoryKind,
        src: &[T],
    ) -> Result<&mut [T], Error<B::Error>> {
        let dst = self.uninit::<T>(kind, src.len())?;
        for (d, s) in dst.iter_mut().zip(src) {
            d.write(*s);
        }
        // SAFETY: every element was just initialised.
        Ok(unsafe { &mut *(dst as *mut [MaybeUninit<T>] as *mut [T]) })
    }

    /// `src` packed one after another into one block of host-visible `kind`
    /// memory, and the range each part occupies.
    // A bump allocator: every call hands out a fresh region, disjoint from all
    // others, so `&self` may return `&mut` (as bumpalo's `alloc` does).
    #[allow(clippy::mut_from_ref)]
    pub fn to_contiguous_host<T: Copy>(
        &self,
        kind: MemoryKind,
        parts: &[&[T]],
    ) -> Result<Packed<'_, T>, Error<B::Error>> {
        let (total, ranges) = pack_ranges(parts)?;
        let dst = self.uninit::<T>(kind, total)?;
        for (part, r) in parts.iter().zip(&ranges) {
            for (d, s) in dst[r.clone()].iter_mut().zip(part.iter()) {
                d.write(*s);
            }
        }
        // SAFETY: the ranges cover `0..total` exactly, so every element was
        // just initialised.
        Ok((
            unsafe { &mut *(dst as *mut [MaybeUninit<T>] as *mut [T]) },
            ranges,
        ))
    }

    /// A device copy of `src`, copied on `stream` (of the scratchpad's device):
    /// DALI's `ToGPU`. `src` may be reused as soon as this returns.
    pub fn to_device<T: Copy>(
        &self,
        stream: StreamHandle,
        src: &[T],
    ) -> Result<DeviceSlice<'_, T>, Error<B::Error>> {
        let dst = self.device_slice::<T>(src.len())?;
        let bytes = dst.byte_len();
        if bytes > 0 {
            // SAFETY: `dst` is `bytes` of fresh device memory, `src` is a live
            // slice of `bytes`; they do not overlap. The backend's contract lets
            // a pageable source be reused once the call returns.
            unsafe {
                self.backend
                    .copy_async(
                        dst.ptr.cast(),
                        NonNull::from(src).cast(),
                        bytes,
                        stream,
                        dst.device,
                    )
                    .map_err(Error::backend(BackendOp::CopyAsync))?;
            }
        }
        Ok(dst)
    }

    /// `parts` packed into one block of device memory with a single copy on
    /// `stream`, through a pinned staging block that is released in the order
    /// of `stream` once the copy has been issued (DALI's `ToContiguousGPU`).
    pub fn to_contiguous_device<T: Copy>(
        &self,
        stream: StreamHandle,
        parts: &[&[T]],
    ) -> Result<PackedDevice<'_, T>, Error<B::Error>> {
        let (total, ranges) = pack_ranges(parts)?;
        let dst = self.device_slice::<T>(total)?;
        let bytes = dst.byte_len();
        if bytes == 0 {
            return Ok((dst, ranges));
        }
        let device = dst.device;
        let align = core::mem::align_of::<T>().max(256);
        let staging = self
            .backend
            .allocate(MemoryKind::Pinned, device, bytes, align)
            .map_err(Error::backend(BackendOp::Allocate))?;
        let base = staging.as_ptr().cast::<T>();
        for (part, r) in parts.iter().zip(&ranges) {
            // SAFETY: the staging block holds `total` `T`s, aligned; `r` lies in
            // `0..total`; `part` has `r.len()` elements and is a different object.
            unsafe { core::ptr::copy_nonoverlapping(part.as_ptr(), base.add(r.start), r.len()) };
        }
        // SAFETY: both blocks are live and `bytes` long; they do not overlap.
        let copied = unsafe {
            self.backend
                .copy_async(dst.ptr.cast(), staging, bytes, stream, device)
        };
        let freed = match copied {
            // SAFETY: the staging block came from `allocate` with these
            // arguments; the copy that reads it is ordered before this free on
            // `stream`, and nothing else uses it.
            Ok(()) => unsafe {
                self.backend
                    .deallocate_async(MemoryKind::Pinned, device, staging, bytes, align, stream)
                    .map_err(Error::backend(BackendOp::DeallocateAsync))
            },
            // SAFETY: as above; no copy was issued, so nothing uses it.
            Err(_) => unsafe {
                self.backend
                    .deallocate(MemoryKind::Pinned, device, staging, bytes, align)
                    .map_err(Error::backend(BackendOp::Deallocate))
            },
        };
        // Both may fail: the copy's error is returned, the free's reported.
        let mut errors = FirstError::new();
        if let Err(e) = copied {
            errors.push(Error::backend(BackendOp::CopyAsync)(e));
        }
        if let Err(e) = freed {
            errors.push(e);
        }
        errors.result()?;
        Ok((dst, ranges))
    }

    /// Ends the round: every allocation is over (the `&mut` proves no slice is
    /// left), and the memory is reused in stream order (module documentation).
    /// Visits only the kinds that hold blocks.
    ///
    /// On error the kind concerned releases what it can (a block whose release
    /// fails is forgotten: the error says it is still allocated); the
    /// scratchpad stays usable. The first error is returned, any further one
    /// reported through [`lost_errors`](crate::lost_errors).
    #[inline]
    pub fn reset(&mut self) -> Result<(), Error<B::Error>> {
        // Fast path, inline: a kind that holds one block, not waiting on a
        // fence, and needs no fence (host memory, device memory, or a release
        // in host order) is rewound, and that is all.
        let held = self.held.get();
        let mut slow = held & self.fenced;
        let quick = held & !self.fenced;
        for i in 0..4 {
            if quick & (1 << i) != 0 {
                // No fence: nothing can be waiting on one.
                let res = &mut self.kinds[i].res;
                if res.block_count_mut() == 1 {
                    res.rewind();
                } else {
                    slow |= 1 << i;
                }
            }
        }
        if slow == 0 {
            return Ok(());
        }
        self.reset_slow(slow)
    }

    /// The kinds of `reset` (a bit each) that the fast path left.
    #[inline(never)]
    fn reset_slow(&mut self, kinds: u8) -> Result<(), Error<B::Error>> {
        let Some(device) = self.device.get() else {
            return Ok(()); // nothing was ever allocated (a kind holds blocks only once it is known)
        };
        let mut errors = FirstError::new();
        for kind in MemoryKind::ALL {
            if kinds & (1 << kind.index()) != 0 {
                self.reset_kind(kind, device, &mut errors);
            }
        }
        errors.result()
    }

    fn reset_kind(&self, kind: MemoryKind, device: DeviceId, errors: &mut FirstError<B::Error>) {
        let st = &self.kinds[kind.index()];
        let n = st.res.block_count();
        let fence = st.fence.get();
        if n == 0 {
            return;
        }
        let fit = st.note_round();
        if n > 1 || fence.is_some_and(|f| f.armed) {
            // Release everything; next time one block that holds the largest
            // round (not the sum of the blocks: their unused tails and the
            // doubling are not needed again).
            let up = self.counting(kind, device);
            for block in st.res.take_blocks(fit) {
                // SAFETY: each block came from this upstream and is released
                // once, in the kind's release order.
                if let Err(e) = unsafe { up.release(block) } {
                    errors.push(e);
                }
            }
            if let Some(f) = fence {
                st.fence.set(Some(Fence { armed: false, ..f }));
            }
            self.note_held(kind);
            return;
        }
        st.res.rewind();
        if !kind.is_host_accessible() {
            return; // device memory: allocated and released on the device order
        }
        let AccessOrder::Stream {
            stream,
            device: release_device,
        } = self.release_order(kind)
        else {
            return; // host order: reusable now
        };
        // One question first: if the stream has finished everything queued on
        // it so far (the work of the rounds that used the block included), the
        // block is reusable now and needs no fence. A stream found busy is
        // not asked again for the next `PROBE_BACKOFF` resets (a loop that
        // resets while its kernels still run would pay the query for nothing
        // on every round); the fence is recorded straight away meanwhile.
        let skip = st.skip_probes.get();
        if skip == 0 {
            if let Ok(Completion::Complete) = self.backend.query_stream(stream, release_device) {
                return;
            }
            st.skip_probes.set(PROBE_BACKOFF);
        } else {
            st.skip_probes.set(skip - 1);
        }
        self.fence_kept(kind, device, stream, release_device, errors);
    }

    /// Fences the kept block of a host-visible kind with an event recorded on
    /// its release stream; if that fails, releases the block instead.
    fn fence_kept(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        stream: StreamHandle,
        release_device: DeviceId,
        errors: &mut FirstError<B::Error>,
    ) {
        let st = &self.kinds[kind.index()];
        let fence = match st.fence.take() {
            Some(f) if f.device == release_device => f,
            other => {
                if let Some(old) = other {
                    if let Err(source) = self.backend.destroy_event(old.event, old.device) {
                        errors.push(Error::Backend {
                            op: BackendOp::DestroyEvent,
                            source,
                        });
                    }
                }
                match self
                    .backend
                    .create_event(release_device, EventFlags::DISABLE_TIMING)
                {
                    Ok(event) => Fence {
                        event,
                        device: release_device,
                        armed: false,
                    },
                    Err(source) => {
                        errors.push(Error::Backend {
                            op: BackendOp::CreateEvent,
                            source,
                        });
                        self.drop_kept(kind, device, errors);
                        return;
                    }
                }
            }
        };
        match self
            .backend
            .record_event(fence.event, stream, release_device)
        {
            Ok(()) => {
                st.fence.set(Some(Fence {
                    armed: true,
                    ..fence
                }));
                st.res.pause();
            }
            Err(source) => {
                st.fence.set(Some(fence));
                errors.push(Error::Backend {
                    op: BackendOp::RecordEvent,
                    source,
                });
                self.drop_kept(kind, device, errors);
            }
        }
    }

    /// Releases a kept block that could not be fenced (a failed release
    /// forgets the block: the error says it is still allocated).
    fn drop_kept(&self, kind: MemoryKind, device: DeviceId, errors: &mut FirstError<B::Error>) {
        let up = self.counting(kind, device);
        let st = &self.kinds[kind.index()];
        let total = st.res.reserved();
        for block in st.res.take_blocks(total) {
            // SAFETY: the block came from this upstream; released once, in the
            // kind's (stream) release order.
            if let Err(e) = unsafe { up.release(block) } {
                errors.push(e);
            }
        }
        self.note_held(kind);
    }

    /// Releases everything now (every block, every event), carrying on past
    /// failures, and returns the first; any further one is reported through
    /// [`lost_errors`](crate::lost_errors). Dropping does the same and reports
    /// every failure that way.
    pub fn release(mut self) -> Result<(), Error<B::Error>> {
        let mut errors = FirstError::new();
        self.release_all(&mut |e| errors.push(e));
        // The drop that follows finds nothing left to release.
        errors.result()
    }

    /// Releases every block and destroys every event, handing each failure to
    /// `sink` and carrying on. A block whose release fails is forgotten.
    fn release_all(&mut self, sink: &mut dyn FnMut(Error<B::Error>)) {
        let device = self.device.get();
        for kind in MemoryKind::ALL {
            let st = &self.kinds[kind.index()];
            let fit = st.note_round();
            if let Some(sizes) = self.sizes {
                if st.peak_used.get() > 0 {
                    sizes.learn(kind, fit);
                }
            }
            // A kind holds blocks only once the device is resolved.
            if let Some(device) = device {
                let up = self.counting(kind, device);
                for block in st.res.take_blocks(0) {
                    // SAFETY: each block came from this upstream and is released
                    // once, newest first, in the kind's release order.
                    if let Err(e) = unsafe { up.release(block) } {
                        sink(e);
                    }
                }
            }
            if let Some(f) = st.fence.take() {
                if let Err(source) = self.backend.destroy_event(f.event, f.device) {
                    sink(Error::Backend {
                        op: BackendOp::DestroyEvent,
                        source,
                    });
                }
            }
        }
        self.held.set(0);
    }

    /// Statistics per kind.
    pub fn stats(&self) -> ScratchStats {
        let mut s = ScratchStats {
            upstream_allocations: self.upstream_allocations.get(),
            upstream_releases: self.upstream_releases.get(),
            ..ScratchStats::default()
        };
        for (i, st) in self.kinds.iter().enumerate() {
            s.reserved[i] = st.res.reserved();
            s.blocks[i] = st.res.block_count();
            s.requested[i] = st.res.requested();
            s.high_water[i] = st.high_water.get();
        }
        s
    }

    /// The blocks held for `kind` (address, size), oldest first: for tests.
    #[doc(hidden)]
    pub fn blocks(&self, kind: MemoryKind) -> Vec<(usize, usize)> {
        self.kinds[kind.index()]
            .res
            .blocks()
            .iter()
            .map(|b| (b.ptr.as_ptr().addr(), b.size))
            .collect()
    }

    /// The first block size of `kind`.
    pub fn first_block_size(&self, kind: MemoryKind) -> usize {
        self.kinds[kind.index()].res.first_block()
    }
}

impl<B: ScratchBackend> Drop for Scratchpad<'_, B> {
    fn drop(&mut self) {
        // Never panics, and releases everything it can. There is no owner left
        // to return a failure to: each one is counted by `lost_errors` and
        // handed to the hook.
        self.release_all(&mut |e| crate::lost::report(&e));
    }
}

/// Counts the upstream calls a scratchpad makes.
struct Counting<'c, U> {
    inner: U,
    allocations: &'c Cell<usize>,
    releases: &'c Cell<usize>,
}

impl<U: Upstream> Upstream for Counting<'_, U> {
    type Error = U::Error;

    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, Error<U::Error>> {
        let p = self.inner.allocate(size, align)?;
        self.allocations.set(self.allocations.get() + 1);
        Ok(p)
    }

    unsafe fn release(&self, block: Block) -> Result<(), Error<U::Error>> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.inner.release(block)? };
        self.releases.set(self.releases.get() + 1);
        Ok(())
    }
}

/// Packed parts: the block, and the range of each part in it.
pub type Packed<'a, T> = (&'a mut [T], Vec<Range<usize>>);

/// Parts packed in device memory: the slice, and the range of each part in it.
pub type PackedDevice<'a, T> = (DeviceSlice<'a, T>, Vec<Range<usize>>);

/// The total length of `parts` and the range each occupies when packed.
fn pack_ranges<T, E>(parts: &[&[T]]) -> Result<(usize, Vec<Range<usize>>), Error<E>> {
    let mut total = 0usize;
    let mut ranges = Vec::with_capacity(parts.len());
    for p in parts {
        let end = total.checked_add(p.len()).ok_or(Error::SizeOverflow)?;
        ranges.push(total..end);
        total = end;
    }
    Ok((total, ranges))
}

/// What a kernel needs to run: the order it runs in and, optionally, a
/// scratchpad for its temporary memory (DALI's `KernelContext`).
pub struct KernelContext<'s, 'b, B: ScratchBackend> {
    /// The stream (or host) order the kernel runs in.
    pub order: AccessOrder,
    /// Scratch memory for the kernel, borrowed.
    pub scratchpad: Option<&'s Scratchpad<'b, B>>,
}

impl<'s, 'b, B: ScratchBackend> KernelContext<'s, 'b, B> {
    /// A context running in `order` with no scratchpad.
    pub fn new(order: AccessOrder) -> Self {
        KernelContext {
            order,
            scratchpad: None,
        }
    }

    /// A context running in `order` with `scratchpad`.
    pub fn with_scratchpad(order: AccessOrder, scratchpad: &'s Scratchpad<'b, B>) -> Self {
        KernelContext {
            order,
            scratchpad: Some(scratchpad),
        }
    }
}
