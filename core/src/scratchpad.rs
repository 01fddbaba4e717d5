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
//! Typed data goes to device memory with [`to_device`](Scratchpad::to_device)
//! (or packed, [`to_contiguous_device`](Scratchpad::to_contiguous_device))
//! and comes back with [`to_host`](Scratchpad::to_host) /
//! [`copy_to_host`](Scratchpad::copy_to_host), both in the device order and
//! with no `unsafe` on the caller's side.
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

mod capture;
mod config;
mod copy;
mod fence;
mod kind;
mod rounds;
mod sizes;
mod slice;
mod stats;
mod typed;

pub use self::config::ScratchpadConfig;
pub use self::copy::{KernelContext, Packed, PackedDevice};
pub use self::sizes::ScratchSizes;
pub use self::slice::DeviceSlice;
pub use self::stats::ScratchStats;

use alloc::vec::Vec;
use core::cell::Cell;
use core::fmt;
use core::ptr::NonNull;

use crate::backend::{BackendId, DeviceId, EventBackend, MemoryBackend, MemoryKind, StreamBackend};
use crate::error::{BackendOp, Error};
use crate::monotonic::{check_request, FixedOrder};
use crate::order::AccessOrder;

use self::capture::Watch;
use self::kind::KindState;
use self::rounds::FirstError;
use self::stats::Counting;

/// What a scratchpad needs of its backend: memory, and streams and events for
/// stream-ordered reuse. Implemented for every such backend.
pub trait ScratchBackend: MemoryBackend + StreamBackend + EventBackend {}
impl<B: MemoryBackend + StreamBackend + EventBackend + ?Sized> ScratchBackend for B {}

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
/// let mut scratch = Scratchpad::new(&gpu, stream.order()).unwrap();
/// for _round in 0..3 {
///     let staging = scratch.pinned::<f32>(1024).unwrap(); // &mut [MaybeUninit<f32>]
///     staging.iter_mut().for_each(|x| { x.write(1.0); });
///     let on_gpu = scratch.device::<f32>(1024).unwrap();  // DeviceSlice<f32>
///     assert_eq!(on_gpu.len(), 1024);
///     gpu.complete_everything();        // (on a GPU: the kernels of this round run)
///     scratch.reset().unwrap();         // stream-ordered: blocks kept for the next round
/// }
/// ```
///
/// The scratchpad borrows its backend and the streams of its orders for
/// `'b`: it cannot outlive a lease whose order it was built on.
pub struct Scratchpad<'b, B: ScratchBackend> {
    backend: &'b B,
    /// `backend.id()`, read once: the owner its device slices carry.
    id: BackendId,
    /// Like every order in `config`: of `backend` (or host order, or a
    /// special stream), and, for a stream, on `device` once that is known
    /// (checked at construction).
    device_order: AccessOrder<'b>,
    config: ScratchpadConfig<'b>,
    /// Per kind, indexed by [`MemoryKind::index`].
    kinds: [KindState; 4],
    /// Bit `i` set: kind `i` holds at least one block. What `reset` visits.
    held: Cell<u8>,
    /// Bit `i` set: kind `i` has held a block at some time (a superset of
    /// `held`, never cleared before the release): only such a kind can
    /// have a fence, a round to learn or blocks, so the release visits only
    /// these.
    touched: Cell<u8>,
    /// Bit `i` set: a block of kind `i` kept by `reset` is fenced (host-visible
    /// memory released in stream order). Fixed at construction.
    fenced: u8,
    /// The resolved device, once known.
    device: Cell<Option<DeviceId>>,
    upstream_allocations: Cell<usize>,
    upstream_releases: Cell<usize>,
    /// Where the peak of each kind is recorded on release, if anywhere.
    sizes: Option<&'b ScratchSizes>,
    /// What the scratchpad watches of its orders' graph captures.
    watch: Watch<'b>,
    /// Blocks given to graphs (or kept for ended captures), over its life.
    kept_for_graphs: Cell<usize>,
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
    ///
    /// Errors: [`Error::ForeignHandle`] when `device_order` is a stream of
    /// another backend; [`Error::PerThreadStream`] for the per-thread
    /// default stream (another stream on each thread, and a scratchpad may
    /// move between threads); [`Error::DeviceOutOfRange`] for a special
    /// stream of a device that does not exist; a backend failure asking
    /// whether a stream that was in a graph capture still is.
    ///
    /// ```
    /// use gpupool_core::{MemoryKind, Scratchpad, StreamPool};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let streams = StreamPool::new(gpu.clone());
    /// let stream = streams.get(0)?;
    /// let scratch = Scratchpad::new(&gpu, stream.order())?; // allocates nothing yet
    /// assert!(scratch.alloc(MemoryKind::Device, 256, 64)?.is_some());
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    #[inline(always)]
    pub fn new(backend: &'b B, device_order: AccessOrder<'b>) -> Result<Self, Error<B::Error>> {
        Self::check_order(backend, &device_order)?;
        let config = ScratchpadConfig::default();
        let watch = Self::first_round(backend, &device_order, &config)?;
        // Built in place, after the last way out (no copy of the
        // scratchpad into the result).
        Ok(Self::build(
            backend,
            device_order,
            config,
            device_order.device(),
            watch,
        ))
    }

    /// The watch of a scratchpad with these orders, its first round begun:
    /// by asking the backend where a stream of the orders may be capturing
    /// (cold), else quiet.
    #[inline(always)]
    fn first_round(
        backend: &B,
        device_order: &AccessOrder<'b>,
        config: &ScratchpadConfig<'b>,
    ) -> Result<Watch<'b>, Error<B::Error>> {
        let watch = Watch::new(
            device_order,
            config.pinned_release.as_ref(),
            config.managed_release.as_ref(),
        );
        if Watch::needs_asking_for(device_order, config) {
            return Self::begin_first_round_asking(
                watch,
                backend,
                stream_orders(device_order, config),
            );
        }
        Ok(watch)
    }

    /// [`first_round`](Self::first_round) where a stream may be capturing.
    /// Takes the watch by value and hands it back: a watch whose address
    /// escaped here would be kept in memory on the common path too, and its
    /// move into the scratchpad read it back in pieces that straddle the
    /// stores that wrote it (a failed store-to-load forward, a fifth of a
    /// scratchpad's construction).
    #[cold]
    #[inline(never)]
    fn begin_first_round_asking(
        watch: Watch<'b>,
        backend: &B,
        orders: [AccessOrder<'b>; 3],
    ) -> Result<Watch<'b>, Error<B::Error>> {
        watch.begin_round(backend, orders)?;
        Ok(watch)
    }

    /// The checks every order of a scratchpad passes.
    #[inline]
    fn check_order(backend: &B, order: &AccessOrder<'_>) -> Result<(), Error<B::Error>> {
        order.check_backend(backend)?;
        if order.is_per_thread() {
            return Err(Error::PerThreadStream);
        }
        Ok(())
    }

    /// A scratchpad with explicit release orders, first block sizes or device.
    ///
    /// Errors, with nothing allocated: [`Error::ForeignHandle`] when an order
    /// is a stream of another backend; [`Error::WrongDevice`] when a stream
    /// order is not on the scratchpad's device (see
    /// [`ScratchpadConfig::device`]).
    pub fn with_config(
        backend: &'b B,
        device_order: AccessOrder<'b>,
        config: ScratchpadConfig<'b>,
    ) -> Result<Self, Error<B::Error>> {
        let orders = [
            Some(device_order),
            config.pinned_release,
            config.managed_release,
        ];
        let mut device = config.device;
        for order in orders.iter().flatten() {
            Self::check_order(backend, order)?;
            match (device, order.device()) {
                (Some(given), Some(actual)) if given != actual => {
                    return Err(Error::WrongDevice { given, actual });
                }
                (None, Some(d)) => device = Some(d),
                _ => {}
            }
        }
        let watch = Self::first_round(backend, &device_order, &config)?;
        Ok(Self::build(backend, device_order, config, device, watch))
    }

    /// The scratchpad, once its orders are checked; `device` as resolved
    /// from the config and the orders.
    #[inline(always)]
    fn build(
        backend: &'b B,
        device_order: AccessOrder<'b>,
        config: ScratchpadConfig<'b>,
        device: Option<DeviceId>,
        watch: Watch<'b>,
    ) -> Self {
        // Host-visible kinds released in stream order keep fenced blocks.
        let pinned = config.pinned_release.unwrap_or(device_order);
        let managed = config.managed_release.unwrap_or(device_order);
        let fenced = (u8::from(!pinned.is_host()) << MemoryKind::Pinned.index())
            | (u8::from(!managed.is_host()) << MemoryKind::Managed.index());
        Scratchpad {
            backend,
            id: backend.id(),
            device_order,
            config,
            fenced,
            kinds: [
                KindState::new(config.initial_sizes[0]),
                KindState::new(config.initial_sizes[1]),
                KindState::new(config.initial_sizes[2]),
                KindState::new(config.initial_sizes[3]),
            ],
            held: Cell::new(0),
            touched: Cell::new(0),
            device: Cell::new(device),
            upstream_allocations: Cell::new(0),
            upstream_releases: Cell::new(0),
            sizes: None,
            watch,
            kept_for_graphs: Cell::new(0),
        }
    }

    /// The stream orders blocks are allocated or released in: the device
    /// order and the pinned and managed release orders (some may be the
    /// same, or host order).
    fn stream_orders(&self) -> [AccessOrder<'b>; 3] {
        stream_orders(&self.device_order, &self.config)
    }

    /// Starts each kind with one block the size `sizes` learned for it (when
    /// larger than the configured first block) and, when this scratchpad is
    /// released or dropped, records there the most it held of each kind. See
    /// [`ScratchSizes`].
    ///
    /// ```
    /// use gpupool_core::{AccessOrder, MemoryKind, ScratchSizes, Scratchpad};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let sizes = ScratchSizes::new();
    /// for _request in 0..2 {
    ///     let scratch = Scratchpad::new(&gpu, AccessOrder::host())?.learn_sizes(&sizes);
    ///     scratch.host::<u8>(100_000)?; // the first request learns 100 kB
    /// }
    /// assert!(sizes.get()[MemoryKind::Host.index()] >= 100_000);
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    // Inline: the scratchpad is moved in and out by value (hundreds of
    // bytes), which a call would copy twice.
    #[inline]
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
    pub fn device_order(&self) -> AccessOrder<'b> {
        self.device_order
    }

    /// The order blocks of `kind` are released in.
    pub fn release_order(&self, kind: MemoryKind) -> AccessOrder<'b> {
        match kind {
            MemoryKind::Host => AccessOrder::host(),
            MemoryKind::Pinned => self.config.pinned_release.unwrap_or(self.device_order),
            MemoryKind::Device => self.device_order,
            MemoryKind::Managed => self.config.managed_release.unwrap_or(self.device_order),
        }
    }

    /// The order blocks of `kind` are allocated in.
    fn alloc_order(&self, kind: MemoryKind) -> AccessOrder<'b> {
        match kind {
            MemoryKind::Device => self.device_order,
            _ => AccessOrder::host(),
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

    /// The upstream of `kind`. `device` is the scratchpad's device: every
    /// stream order is on it (checked at construction), which is the
    /// invariant `FixedOrder` needs.
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
        if self.kinds[kind.index()].res.block_count() > 0 {
            self.held.set(held | bit);
            self.touched.set(self.touched.get() | bit);
        } else {
            self.held.set(held & !bit);
        }
    }

    /// `bytes` of `kind` memory aligned to `align`: a raw pointer, or `None`
    /// for zero bytes (which touches nothing). The memory stays valid until
    /// [`reset`](Self::reset) or drop.
    ///
    /// Errors: an alignment that is not a nonzero power of two, a size past
    /// `isize::MAX`, a failed upstream; the scratchpad is unchanged by any of them.
    ///
    /// Device memory may be read back later as any `AnyBitPattern` type
    /// ([`to_host`](Self::to_host)), so whatever writes it through this
    /// pointer writes initialised bytes only (a kernel's output always is).
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
    /// a fence to settle. Graph captures matter only in a round that is not
    /// quiet (which stays so until it ends), and never to pageable host
    /// memory: such a round's allocations go to
    /// [`alloc_in_watched_round`](Self::alloc_in_watched_round), out of line.
    #[inline(never)]
    fn alloc_slow(
        &self,
        kind: MemoryKind,
        bytes: usize,
        align: usize,
    ) -> Result<Option<NonNull<u8>>, Error<B::Error>> {
        if !check_request(bytes, align)? {
            return Ok(None);
        }
        if kind != MemoryKind::Host && !self.watch.quiet() {
            return self.alloc_in_watched_round(kind, bytes, align);
        }
        self.alloc_from_upstream(kind, bytes, align, false)
    }

    /// `alloc_slow` in a round that a graph capture may have overlapped: the
    /// device kind's graph mode, and whether a kind's first block of the
    /// round comes after the capture (`capture.rs`).
    #[cold]
    #[inline(never)]
    fn alloc_in_watched_round(
        &self,
        kind: MemoryKind,
        bytes: usize,
        align: usize,
    ) -> Result<Option<NonNull<u8>>, Error<B::Error>> {
        if kind == MemoryKind::Device && self.graph_round_goes_on()? {
            if let Some(p) = self.graph_bump(bytes, align) {
                return Ok(Some(p));
            }
        }
        self.alloc_from_upstream(kind, bytes, align, true)
    }

    /// The common part of an allocation that the current block cannot
    /// serve: the kind's fence settled, then a block (or the current one)
    /// from upstream; with `watched`, the first block of a kind in a round
    /// that is not quiet is noted (see `note_first_block`).
    #[inline(always)]
    fn alloc_from_upstream(
        &self,
        kind: MemoryKind,
        bytes: usize,
        align: usize,
        watched: bool,
    ) -> Result<Option<NonNull<u8>>, Error<B::Error>> {
        let device = self.device_id()?;
        let up = self.counting(kind, device);
        let st = &self.kinds[kind.index()];
        let settled = self.settle_fence(st, &up);
        self.note_held(kind);
        settled?;
        if watched {
            self.note_first_block(kind)?;
        }
        let taken = self.upstream_allocations.get();
        let p = st.res.allocate(&up, bytes, align);
        self.note_held(kind);
        let p = p?;
        // Asked after the block is taken: a capture the device stream began
        // or joined before it moved a note (or counts as a wait under way)
        // by now, so the round is not quiet any more.
        if kind == MemoryKind::Device && !self.watch.quiet() {
            self.note_device_block(self.upstream_allocations.get() != taken)?;
        }
        st.high_water
            .set(st.high_water.get().max(st.res.reserved()));
        Ok(p)
    }

    /// Statistics per kind.
    pub fn stats(&self) -> ScratchStats {
        let mut s = ScratchStats {
            upstream_allocations: self.upstream_allocations.get(),
            upstream_releases: self.upstream_releases.get(),
            kept_for_graphs: self.kept_for_graphs.get(),
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

/// The stream orders of a scratchpad with this device order and config
/// (see [`Scratchpad::stream_orders`]).
fn stream_orders<'b>(
    device_order: &AccessOrder<'b>,
    config: &ScratchpadConfig<'b>,
) -> [AccessOrder<'b>; 3] {
    [
        *device_order,
        config.pinned_release.unwrap_or(*device_order),
        config.managed_release.unwrap_or(*device_order),
    ]
}
