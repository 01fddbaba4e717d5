//! [`StreamPool`]: per-device pools of streams, handed out as exclusive
//! [`StreamLease`]s.
//!
//! Each device has a *ready* list (streams known to be idle; a lock-free LIFO stack)
//! and a *busy* list (streams returned with work still pending; a lock-free push-and-take-all stack).
//!
//! - `get` pops the ready list. Only when it is empty does it scan the busy list,
//!   oldest first, querying at most [`StreamPoolConfig::scan_limit`] streams; the
//!   first finished one is leased, and the finished ones right after it are
//!   *promoted* to the ready list (up to [`StreamPoolConfig::promote_limit`],
//!   stopping at the first pending one), so they are never queried again. When
//!   nothing is free, a new non-blocking stream is created.
//! - Returning a stream queries it once: idle goes to the ready list, pending to
//!   the busy list.
//! - With `std`, an idle returned stream goes first to a cell of the returning
//!   thread (up to four per device), and that thread's next `get` (or
//!   `get_in`) takes it from there: no epoch pin, no shared line, one query
//!   per lease as before. Purge and drop reach every cell; a thread that
//!   exits leaves its idle streams to the next thread that registers with
//!   the pool.
//! - [`StreamPoolConfig::same_thread_reuse`] (opt-in) skips the query as well.
//!
//! Differences from DALI's `CUDAStreamPool`, on purpose: no lock; typed errors
//! for out-of-range and mismatched devices and null handles; the busy list is
//! scanned oldest first (the stream returned most recently is the one most
//! likely still busy) and finished streams are promoted; a lease borrows its
//! pool; `Drop` never panics (an error there is parked, see
//! [`StreamPool::take_error`]).

use core::fmt;
use core::mem::ManuallyDrop;

use crate::backend::{
    BackendId, Completion, DeviceId, DeviceSelector, StreamBackend, StreamHandle, StreamOptions,
};
use crate::epoch::Pinning;
use crate::error::{BackendOp, Error, Rejected};
use crate::order::AccessOrder;
use crate::stack::{Bag, Chain, Stack};
use crate::stats::{Counters, ParkedError, PoolStats};
use crate::sync::epoch::{self, Collector, Guard};
use crate::table::{DeviceSlot, DeviceTable};
#[cfg(all(feature = "std", not(loom)))]
use crate::thread_cache::ThreadCache;

/// How a [`StreamPool`] creates streams and scans its busy list.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StreamPoolConfig {
    /// Options for the streams the pool creates.
    pub stream: StreamOptions,
    /// At most this many busy streams are queried in search of a finished one
    /// before `get` gives up and creates a new stream. Bounds the driver calls a
    /// `get` can make. At least 1.
    pub scan_limit: usize,
    /// After a scan finds a finished stream, at most this many of the streams
    /// after it are queried and, while they are finished, moved to the ready list.
    pub promote_limit: usize,
    /// Same-thread reuse (`std` only; off by default). A returned stream is kept
    /// for the thread that returned it, *without querying it*, and that
    /// thread's next `get` on the device takes it back: no driver call and no
    /// shared line on either side. The price, which is why it must be chosen:
    /// the stream may still be running that same thread's earlier work, so new
    /// work queues behind it.
    /// Never another thread's work: a kept stream goes to no other thread
    /// (purge and drop destroy it, and a thread that exits leaves its streams
    /// to the busy list, where a query must find them idle before anyone
    /// leases them again); a lease that ends on another thread than the one
    /// that took it is queried like any default return.
    pub same_thread_reuse: bool,
}

impl Default for StreamPoolConfig {
    fn default() -> Self {
        StreamPoolConfig {
            stream: StreamOptions::default(),
            scan_limit: 16,
            promote_limit: 8,
            same_thread_reuse: false,
        }
    }
}

/// A stream owned by the caller, outside any pool: what
/// [`StreamLease::detach`] hands out and [`StreamPool::put`] takes back.
///
/// It is not `Clone`, so one stream cannot be put into a pool twice through it.
/// It knows the backend that made it ([`BackendId`]): a pool or backend of
/// another id refuses it with [`Error::ForeignHandle`]. Dropping it neither
/// destroys the stream nor returns it: pass it to [`StreamPool::put`] or
/// [`OwnedStream::destroy`].
#[must_use = "dropping an OwnedStream leaks the stream: put it back or destroy it"]
#[derive(Debug, PartialEq, Eq)]
pub struct OwnedStream {
    /// A live stream of `owner` on `device`, never special (checked by every
    /// constructor), owned by this value alone.
    handle: StreamHandle,
    device: DeviceId,
    owner: BackendId,
}

impl OwnedStream {
    /// Takes ownership of a raw stream of `backend` that belongs to `device`.
    /// The null handle and CUDA's other special streams are refused.
    ///
    /// # Safety
    /// The caller hands the stream over, as with `File::from_raw_fd`:
    /// 1. `handle` is a live stream of `device`, created by a backend with
    ///    `backend`'s [`id`](crate::Backend::id);
    /// 2. nothing else owns it or will use it as its own from now on (a pool
    ///    that took it twice would lease one stream to two users, and stream
    ///    order is what keeps scratch memory from being reused while a kernel
    ///    still reads it).
    pub unsafe fn from_raw_parts<B: StreamBackend>(
        backend: &B,
        handle: StreamHandle,
        device: DeviceId,
    ) -> Result<Self, Error<B::Error>> {
        check_poolable(handle)?;
        Ok(OwnedStream {
            handle,
            device,
            owner: backend.id(),
        })
    }

    /// Takes ownership of a raw stream of `backend`, asking the backend which
    /// device it belongs to. The null handle and CUDA's other special streams
    /// are refused.
    ///
    /// # Safety
    /// As for [`from_raw_parts`](Self::from_raw_parts), except that the backend
    /// supplies the device: `handle` is a live stream of `backend` that nothing
    /// else owns from now on.
    pub unsafe fn adopt<B: StreamBackend>(
        backend: &B,
        handle: StreamHandle,
    ) -> Result<Self, Error<B::Error>> {
        check_poolable(handle)?;
        // SAFETY: the caller's guarantee 1: a live stream of this backend.
        let device = unsafe { backend.stream_device(handle) }
            .map_err(Error::backend(BackendOp::StreamDevice))?;
        Ok(OwnedStream {
            handle,
            device,
            owner: backend.id(),
        })
    }

    /// The raw handle.
    pub fn handle(&self) -> StreamHandle {
        self.handle
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// The backend the stream belongs to.
    pub fn backend_id(&self) -> BackendId {
        self.owner
    }

    /// The stream as an access order, borrowing it (so the stream cannot be
    /// put back or destroyed while the order is in use).
    pub fn order(&self) -> AccessOrder<'_> {
        AccessOrder::of_held(self.handle, self.device, self.owner)
    }

    /// Gives up ownership and returns the raw handle; the caller destroys it.
    pub fn into_raw(self) -> StreamHandle {
        self.handle
    }

    /// Destroys the stream. On failure (a backend of another
    /// [`BackendId`]: [`Error::ForeignHandle`], nothing called; a failed
    /// destroy) the stream comes back with the error.
    pub fn destroy<B: StreamBackend>(
        self,
        backend: &B,
    ) -> Result<(), Rejected<OwnedStream, B::Error>> {
        if backend.id() != self.owner {
            return Err(Rejected {
                value: self,
                error: Error::ForeignHandle,
            });
        }
        // SAFETY: `self` owns a live, non-special stream of `device`, made by a
        // backend of this id (checked above), and is consumed here.
        match unsafe { backend.destroy_stream(self.handle, self.device) } {
            Ok(()) => Ok(()),
            Err(e) => Err(Rejected {
                value: self,
                error: Error::Backend {
                    op: BackendOp::DestroyStream,
                    source: e,
                },
            }),
        }
    }
}

/// Refuses the handles no pool may hold.
fn check_poolable<E>(handle: StreamHandle) -> Result<(), Error<E>> {
    if handle.is_null() {
        Err(Error::NullHandle)
    } else if handle.is_special() {
        Err(Error::SpecialHandle)
    } else {
        Ok(())
    }
}

/// One device's lists.
struct StreamSlot {
    /// Streams known idle when they were returned. LIFO.
    ready: Stack<StreamHandle>,
    /// Streams returned with work pending. Never popped one at a time.
    busy: Bag<StreamHandle>,
    /// Streams a backend call failed on (query, destroy): never leased again;
    /// purge and drop try to destroy them.
    quarantine: Bag<StreamHandle>,
    counters: Counters,
}

impl DeviceSlot for StreamSlot {
    fn new() -> Self {
        StreamSlot {
            ready: Stack::new(),
            busy: Bag::new(),
            quarantine: Bag::new(),
            counters: Counters::default(),
        }
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// Per-device pools of streams. See the [module documentation](self).
///
/// ```
/// use gpupool_core::{DeviceId, StreamPool};
/// use gpupool_mock::MockBackend;
///
/// let mock = MockBackend::new(2);
/// let pool = StreamPool::new(mock.clone()); // no backend call yet
/// let a = pool.get(1).unwrap();              // a new stream on device 1
/// let s = a.handle();
/// drop(a);                                   // idle: back to device 1's ready list
/// let b = pool.get(1).unwrap();
/// assert_eq!(b.handle(), s);                 // reused, LIFO
/// assert_eq!(pool.stats(DeviceId(1)).unwrap().reused, 1);
/// ```
pub struct StreamPool<B: StreamBackend> {
    backend: B,
    /// `backend.id()`, read once at construction (it never changes).
    id: BackendId,
    config: StreamPoolConfig,
    pinning: Pinning,
    devices: DeviceTable<StreamSlot>,
    parked: ParkedError<Error<B::Error>>,
    /// Streams kept for same-thread reuse (`std` only, when configured).
    #[cfg(all(feature = "std", not(loom)))]
    cache: ThreadCache,
}

impl<B: StreamBackend> fmt::Debug for StreamPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamPool")
            .field("config", &self.config)
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

impl<B: StreamBackend> StreamPool<B> {
    /// A pool over `backend` with the default configuration, using
    /// crossbeam-epoch's global collector. Makes no backend call.
    #[cfg(feature = "std")]
    pub fn new(backend: B) -> Self {
        Self::build(backend, StreamPoolConfig::default(), Pinning::global())
    }

    /// A pool with `config`, using crossbeam-epoch's global collector.
    #[cfg(feature = "std")]
    pub fn with_config(backend: B, config: StreamPoolConfig) -> Self {
        Self::build(backend, config, Pinning::global())
    }

    /// A pool whose stacks use `collector`: the constructor for `no_std`, where
    /// each worker registers once with [`StreamPool::collector`] and passes its
    /// guard to the `*_in` calls.
    pub fn with_collector(backend: B, config: StreamPoolConfig, collector: Collector) -> Self {
        Self::build(backend, config, Pinning::with(collector))
    }

    fn build(backend: B, mut config: StreamPoolConfig, pinning: Pinning) -> Self {
        config.scan_limit = config.scan_limit.max(1);
        StreamPool {
            id: backend.id(),
            backend,
            config,
            pinning,
            devices: DeviceTable::new(),
            parked: ParkedError::new(),
            #[cfg(all(feature = "std", not(loom)))]
            // Idle-at-return streams may go to whichever thread adopts an
            // exited thread's cell; unqueried ones may not.
            cache: ThreadCache::with_adoption(!config.same_thread_reuse),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The configuration.
    pub fn config(&self) -> &StreamPoolConfig {
        &self.config
    }

    /// The epoch collector the pool's stacks use; guards passed to the `*_in`
    /// calls must be pinned in it.
    pub fn collector(&self) -> &Collector {
        self.pinning.collector()
    }

    /// Leases a stream on `device` (see the [module documentation](self)).
    #[cfg(feature = "std")]
    pub fn get(
        &self,
        device: impl Into<DeviceSelector>,
    ) -> Result<StreamLease<'_, B>, Error<B::Error>> {
        let device = device.into();
        // This thread's own kept stream first: no driver call, no shared line.
        // A cell in the memo was registered after its device was checked, so a
        // hit needs no table lookup.
        #[cfg(not(loom))]
        if let DeviceSelector::Id(d) = device {
            if let Some(c) = self.cache.memo(d.index()) {
                if let Some(h) = c.take() {
                    // SAFETY: cells hold only handles of streams this pool
                    // created on `d` (the cell's device) and owns.
                    let stream = unsafe { StreamHandle::from_raw(h) };
                    return Ok(self.lease(stream, d, self.origin_in(c)));
                }
            }
        }
        let (device, slot) = self.slot(device)?;
        #[cfg(not(loom))]
        if let Some(lease) = self.take_cached(device) {
            return Ok(lease);
        }
        self.pinning.pin(|g| self.get_from(device, slot, g))
    }

    /// The calling thread's kept stream of `device` (its cell, registered if
    /// need be), if it has one; with same-thread reuse, the streams left by
    /// exited threads go to the busy list first.
    #[cfg(all(feature = "std", not(loom)))]
    fn take_cached(&self, device: DeviceId) -> Option<StreamLease<'_, B>> {
        if let Some(Some((h, origin))) = self
            .cache
            .with_cell(device.index(), |c| c.take().map(|h| (h, self.origin_in(c))))
        {
            // SAFETY: cells hold only handles of streams this pool created on
            // the cell's device (`device`) and owns.
            return Some(self.lease(unsafe { StreamHandle::from_raw(h) }, device, origin));
        }
        if self.config.same_thread_reuse {
            // Streams left by exited threads may run their work: busy list.
            for (d, h) in self.cache.take_orphans() {
                if let Some(s) = self.devices.slot_of(DeviceId(d as u32)) {
                    // SAFETY: as above: a stream of this pool's, of device `d`.
                    s.busy.push(unsafe { StreamHandle::from_raw(h) });
                }
            }
        }
        None
    }

    /// A lease of `stream` (owned by the pool, of `device`) to the calling
    /// thread; `origin` as in [`StreamLease`]'s field.
    #[inline]
    fn lease(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        #[allow(unused_variables)] origin: usize,
    ) -> StreamLease<'_, B> {
        StreamLease {
            pool: self,
            stream,
            device,
            #[cfg(all(feature = "std", not(loom)))]
            origin,
        }
    }

    /// The origin a lease taken by the owner of `cell` records: the cell's
    /// owner mark when the pool keeps streams for same-thread reuse, else 0.
    #[cfg(all(feature = "std", not(loom)))]
    #[inline]
    fn origin_in(&self, cell: &crate::thread_cache::Cell) -> usize {
        if self.config.same_thread_reuse {
            cell.owner_mark()
        } else {
            0
        }
    }

    /// The origin a lease taken by the calling thread records, looked up
    /// (the slow paths: a lease from the shared lists or a new stream).
    #[inline]
    fn origin_here(&self, #[allow(unused_variables)] device: DeviceId) -> usize {
        #[cfg(all(feature = "std", not(loom)))]
        if self.config.same_thread_reuse {
            return self
                .cache
                .with_cell(device.index(), |c| c.owner_mark())
                .unwrap_or(0);
        }
        0
    }

    /// [`get`](Self::get) with a guard the caller pinned in [`collector`](Self::collector).
    ///
    /// With `std`, like `get`, it takes the calling thread's kept stream
    /// first (the cell its returns fill), so `get_in`/drop cycles reuse one
    /// stream instead of creating a new one while the cell fills. Without
    /// `std` there are no cells: it uses the shared lists.
    pub fn get_in(
        &self,
        device: impl Into<DeviceSelector>,
        guard: &Guard,
    ) -> Result<StreamLease<'_, B>, Error<B::Error>> {
        if !self.pinning.owns(guard) {
            return Err(Error::ForeignGuard);
        }
        let (device, slot) = self.slot(device.into())?;
        #[cfg(all(feature = "std", not(loom)))]
        if let Some(lease) = self.take_cached(device) {
            return Ok(lease);
        }
        self.get_from(device, slot, guard)
    }

    /// Pops `device`'s ready list, else scans its busy list, else creates.
    fn get_from<'p>(
        &'p self,
        device: DeviceId,
        slot: &StreamSlot,
        guard: &Guard,
    ) -> Result<StreamLease<'p, B>, Error<B::Error>> {
        let stream = if let Some(s) = slot.ready.pop(guard) {
            Counters::bump(&slot.counters.reused);
            s
        } else if let Some(s) = self.scan_busy(device, slot) {
            Counters::bump(&slot.counters.busy_hits);
            s
        } else {
            let s = self
                .backend
                .create_stream(device, self.config.stream)
                .map_err(Error::backend(BackendOp::CreateStream))?;
            Counters::bump(&slot.counters.created);
            s
        };
        Ok(self.lease(stream, device, self.origin_here(device)))
    }

    /// Takes a stream into the pool. `device` names the device it belongs to, or
    /// `None` for the stream's own. The stream is queried once: idle goes to the
    /// ready list, pending to the busy list.
    ///
    /// On a stream of another backend ([`Error::ForeignHandle`]), a wrong or
    /// out-of-range device or a failed query the stream comes back in the
    /// error, still the caller's, and the pool is unchanged.
    pub fn put(
        &self,
        stream: OwnedStream,
        device: Option<DeviceId>,
    ) -> Result<(), Rejected<OwnedStream, B::Error>> {
        if stream.owner != self.id {
            return Err(Rejected {
                value: stream,
                error: Error::ForeignHandle,
            });
        }
        if let Some(given) = device {
            if given != stream.device {
                let actual = stream.device;
                return Err(Rejected {
                    value: stream,
                    error: Error::WrongDevice { given, actual },
                });
            }
        }
        let slot = match self.slot(DeviceSelector::Id(stream.device)) {
            Ok((_, slot)) => slot,
            Err(error) => {
                return Err(Rejected {
                    value: stream,
                    error,
                })
            }
        };
        // SAFETY: `stream` owns a live stream of this backend (id checked) on
        // its device, and the pool has not taken it yet.
        let completion = unsafe { self.backend.query_stream(stream.handle, stream.device) };
        if completion.is_ok() {
            // Taken in, wherever it goes below.
            Counters::bump(&slot.counters.put);
        }
        match completion {
            Ok(Completion::Complete) => {
                // Idle: like a returned lease, the calling thread's cell first,
                // so that its next `get` takes the stream put last.
                #[cfg(all(feature = "std", not(loom)))]
                if !self.config.same_thread_reuse
                    && self
                        .cache
                        .with_cell(stream.device.index(), |c| c.keep(stream.handle.as_raw()))
                        == Some(true)
                {
                    return Ok(());
                }
                slot.ready.push(stream.handle)
            }
            Ok(Completion::Pending) => slot.busy.push(stream.handle),
            Err(e) => {
                return Err(Rejected {
                    value: stream,
                    error: Error::Backend {
                        op: BackendOp::QueryStream,
                        source: e,
                    },
                })
            }
        }
        Ok(())
    }

    /// Destroys every stream in the pool, ready or busy (CUDA lets pending work
    /// finish). Leases that are out are untouched and come back normally later;
    /// so does a stream another thread's `get` is scanning at this moment.
    ///
    /// Returns how many streams were destroyed. A failed destroy does not stop
    /// the purge: that stream stays in the pool (so it is not lost and the next
    /// purge tries again) but is never leased again; the first error is
    /// returned, later ones are parked.
    #[cfg(feature = "std")]
    pub fn purge(&self) -> Result<usize, Error<B::Error>> {
        self.pinning.pin(|g| self.purge_in(g))
    }

    /// [`purge`](Self::purge) with a guard the caller pinned in [`collector`](Self::collector).
    pub fn purge_in(&self, guard: &Guard) -> Result<usize, Error<B::Error>> {
        if !self.pinning.owns(guard) {
            return Err(Error::ForeignGuard);
        }
        self.flush_caches();
        let mut first_error = None;
        let mut destroyed = 0;
        for (i, slot) in self.devices.get().unwrap_or(&[]).iter().enumerate() {
            let device = DeviceId(i as u32);
            let mut busy = slot.busy.take_all();
            let mut quarantined = slot.quarantine.take_all();
            let ready = slot.ready.drain(guard);
            let doomed = ready
                .into_iter()
                .chain(core::iter::from_fn(|| busy.pop_first()))
                .chain(core::iter::from_fn(|| quarantined.pop_first()));
            for s in doomed {
                // SAFETY: every stream in the lists was created by this pool's
                // backend on `device` and is owned by the pool alone; it was
                // just taken out of the lists, so nothing else can reach it.
                match unsafe { self.backend.destroy_stream(s, device) } {
                    Ok(()) => {
                        destroyed += 1;
                        Counters::bump(&slot.counters.destroyed);
                    }
                    Err(e) => {
                        // Not destroyed: set it aside (never leased again) for the
                        // next purge or the pool's drop.
                        slot.quarantine.push(s);
                        Counters::bump(&slot.counters.quarantined);
                        let e = Error::Backend {
                            op: BackendOp::DestroyStream,
                            source: e,
                        };
                        if first_error.is_none() {
                            first_error = Some(e);
                        } else {
                            self.parked.park(e);
                        }
                    }
                }
            }
        }
        match first_error {
            None => Ok(destroyed),
            Some(e) => Err(e),
        }
    }

    /// Tallies for one device, or `None` before the pool has met the backend or
    /// for a device out of range.
    pub fn stats(&self, device: DeviceId) -> Option<PoolStats> {
        self.devices.stats(device, || {
            #[cfg(all(feature = "std", not(loom)))]
            return self.cache.counts(device.index());
            #[cfg(not(all(feature = "std", not(loom))))]
            (0, 0)
        })
    }

    /// Tallies summed over all devices.
    pub fn total_stats(&self) -> PoolStats {
        self.devices.total_of(|d| self.stats(d))
    }

    /// Moves every stream the per-thread cells hold to the shared lists, so
    /// that purge and drop reach them: to the ready lists when they were idle
    /// on return, to the busy lists when kept unqueried for same-thread reuse.
    fn flush_caches(&self) {
        #[cfg(all(feature = "std", not(loom)))]
        for (d, h) in self.cache.drain() {
            if let Some(slot) = self.devices.slot_of(DeviceId(d as u32)) {
                // SAFETY: cells hold only streams of this pool, of device `d`.
                let h = unsafe { StreamHandle::from_raw(h) };
                if self.config.same_thread_reuse {
                    slot.busy.push(h);
                } else {
                    slot.ready.push(h);
                }
            }
        }
    }

    /// Leases out right now, over all devices.
    pub fn live_leases(&self) -> usize {
        self.total_stats().live_leases
    }

    /// The number of devices, once the pool has asked the backend.
    pub fn device_count(&self) -> Option<usize> {
        self.devices.len()
    }

    /// Takes the first error met where none could be returned (a lease's
    /// `Drop`, a failed query during a scan, a purge's second failure), if any.
    pub fn take_error(&self) -> Option<Error<B::Error>> {
        self.parked.take()
    }

    /// How many errors were dropped because one was already parked.
    pub fn dropped_errors(&self) -> usize {
        self.parked.dropped()
    }

    /// The device a call is about, and its slot. Resolves "current" once, builds
    /// the table on first use, checks the range.
    fn slot(&self, device: DeviceSelector) -> Result<(DeviceId, &StreamSlot), Error<B::Error>> {
        self.devices.resolve(&self.backend, device)
    }

    /// Looks for a finished stream in the busy list (module documentation).
    /// Everything not leased goes back where it belongs. A stream whose query
    /// fails is quarantined and the error parked; the scan goes on, so one
    /// broken stream cannot stop `get` from serving the device.
    fn scan_busy(&self, device: DeviceId, slot: &StreamSlot) -> Option<StreamHandle> {
        if slot.busy.is_empty() {
            return None;
        }
        let mut rest = slot.busy.take_all();
        rest.reverse(); // oldest first
        let mut pending = Chain::empty();
        let mut found = None;
        let mut queried = 0;
        while let Some(&s) = rest.first() {
            if queried == self.config.scan_limit {
                break;
            }
            queried += 1;
            // SAFETY: a stream of the busy list: created by this pool's backend
            // on `device`, owned by the pool, taken out of the list by this
            // scan (so no purge can destroy it meanwhile).
            match unsafe { self.backend.query_stream(s, device) } {
                Ok(Completion::Complete) => {
                    found = rest.pop_first();
                    break;
                }
                Ok(Completion::Pending) => {
                    rest.move_first_to(&mut pending);
                }
                Err(e) => self.quarantine_first(&mut rest, slot, e),
            }
        }
        if found.is_some() {
            let mut promoted = 0;
            while promoted < self.config.promote_limit {
                let Some(&s) = rest.first() else { break };
                // SAFETY: as above.
                match unsafe { self.backend.query_stream(s, device) } {
                    Ok(Completion::Complete) => {
                        slot.ready.push_from(&mut rest);
                        promoted += 1;
                    }
                    Ok(Completion::Pending) => {
                        rest.move_first_to(&mut pending);
                        break;
                    }
                    Err(e) => {
                        // The lease is served; the error is reported later.
                        self.quarantine_first(&mut rest, slot, e);
                        break;
                    }
                }
            }
            Counters::add(&slot.counters.promoted, promoted);
        }
        // Unqueried streams go back below the pending ones, so the next scan
        // (oldest first) reaches them before re-querying these. Streams other
        // threads returned meanwhile end up below both and are scanned first
        // next time, although they are the newest: a bag only grows on top.
        rest.reverse();
        slot.busy.put_back(rest);
        slot.busy.put_back(pending);
        found
    }

    /// Moves the first stream of `chain` to the quarantine and parks `e`.
    fn quarantine_first(&self, chain: &mut Chain<StreamHandle>, slot: &StreamSlot, e: B::Error) {
        if let Some(s) = chain.pop_first() {
            slot.quarantine.push(s);
            Counters::bump(&slot.counters.quarantined);
        }
        self.parked.park(Error::Backend {
            op: BackendOp::QueryStream,
            source: e,
        });
    }

    /// Returns a leased stream (lease `Drop` and `return_to_pool`). The
    /// lease's device is the stream's own, so nothing is checked. `origin` is
    /// the owner mark of the cell of the thread that took the lease
    /// (`same_thread_reuse`), or 0.
    /// On a failed query the stream is quarantined (kept for purge, never
    /// leased again) and the error returned.
    fn give_back(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        #[allow(unused_variables)] origin: usize,
    ) -> Result<(), Error<B::Error>> {
        let Some(slot) = self.devices.slot_of(device) else {
            // A lease exists only after its slot was found, and the table lives
            // as long as the pool the lease borrows. (No assertion: this runs
            // in a lease's drop, which never panics; the error is parked.)
            return Err(Error::NoDevice);
        };
        // Kept unqueried only for the thread that took the lease: a lease
        // moved to another thread ends there like a default return (queried),
        // so that thread is never served the first thread's pending work.
        #[cfg(all(feature = "std", not(loom)))]
        if self.config.same_thread_reuse
            && origin != 0
            && self.cache.with_cell(device.index(), |c| {
                c.owner_mark() == origin && c.give(stream.as_raw())
            }) == Some(true)
        {
            return Ok(());
        }
        // SAFETY: the lease owned this stream of the pool's backend on
        // `device` until now; it is in no list yet, so nothing can destroy it.
        match unsafe { self.backend.query_stream(stream, device) } {
            Ok(Completion::Complete) => {
                // Idle: the returning thread's cell first (it counts the
                // return), else the shared ready list.
                #[cfg(all(feature = "std", not(loom)))]
                if self
                    .cache
                    .with_cell(device.index(), |c| c.give(stream.as_raw()))
                    == Some(true)
                {
                    return Ok(());
                }
                Counters::bump(&slot.counters.returned);
                slot.ready.push(stream);
                Ok(())
            }
            Ok(Completion::Pending) => {
                Counters::bump(&slot.counters.returned);
                slot.busy.push(stream);
                Ok(())
            }
            Err(e) => {
                Counters::bump(&slot.counters.returned);
                slot.quarantine.push(stream);
                Counters::bump(&slot.counters.quarantined);
                Err(Error::Backend {
                    op: BackendOp::QueryStream,
                    source: e,
                })
            }
        }
    }

    /// Marks a lease as released (no longer live, not returned to the pool:
    /// its stream left the pool).
    fn forget_lease(&self, device: DeviceId) {
        if let Some(slot) = self.devices.slot_of(device) {
            Counters::bump(&slot.counters.returned);
            Counters::bump(&slot.counters.detached);
        }
    }
}

impl<B: StreamBackend> Drop for StreamPool<B> {
    fn drop(&mut self) {
        self.flush_caches();
        // An error parked and never taken has nobody left to take it now.
        if let Some(e) = self.parked.take() {
            crate::lost::report(&e);
        }
        // No lease can be out (each borrows the pool), and no other thread can be
        // inside a method. Destroy everything; an error has no owner left to park
        // it with, so it goes to `lost_errors` and the hook.
        if let Some(table) = self.devices.take() {
            // SAFETY: `&mut self` excludes every concurrent reader of the stacks,
            // so their nodes may be freed at once, which the unprotected guard does.
            let guard = unsafe { epoch::unprotected() };
            for (i, slot) in table.iter().enumerate() {
                let device = DeviceId(i as u32);
                let mut busy = slot.busy.take_all();
                let mut quarantined = slot.quarantine.take_all();
                let doomed = slot
                    .ready
                    .drain(guard)
                    .into_iter()
                    .chain(core::iter::from_fn(|| {
                        busy.pop_first().or_else(|| quarantined.pop_first())
                    }));
                for s in doomed {
                    // SAFETY: streams of the lists: this backend's, of
                    // `device`, owned by the pool alone (no lease is out).
                    if let Err(source) = unsafe { self.backend.destroy_stream(s, device) } {
                        crate::lost::report(&Error::<B::Error>::Backend {
                            op: BackendOp::DestroyStream,
                            source,
                        });
                    }
                }
            }
        }
    }
}

/// An exclusive lease of a pooled stream. Returns the stream to its pool when
/// dropped.
///
/// Exclusive: no other lease of any pool holds the same stream while this one
/// lives. It borrows the pool, so it cannot outlive it.
#[must_use = "dropping a lease returns the stream at once"]
pub struct StreamLease<'p, B: StreamBackend> {
    pool: &'p StreamPool<B>,
    /// A live stream of the pool's backend on `device`, held by this lease
    /// alone until it ends.
    stream: StreamHandle,
    device: DeviceId,
    /// When the pool keeps streams for same-thread reuse: the owner mark of
    /// the taking thread's cell (marks are never reused, and an adopted cell
    /// gets a new one, so a match at the end proves the lease ends on the
    /// thread that took it); 0 otherwise.
    #[cfg(all(feature = "std", not(loom)))]
    origin: usize,
}

impl<B: StreamBackend> StreamLease<'_, B> {
    #[inline]
    fn origin(&self) -> usize {
        #[cfg(all(feature = "std", not(loom)))]
        return self.origin;
        #[cfg(not(all(feature = "std", not(loom))))]
        0
    }
}

impl<B: StreamBackend> fmt::Debug for StreamLease<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamLease")
            .field("stream", &self.stream)
            .field("device", &self.device)
            .finish()
    }
}

impl<'p, B: StreamBackend> StreamLease<'p, B> {
    /// The raw stream handle, for the backend's own calls (valid while the
    /// lease lives).
    #[inline]
    pub fn handle(&self) -> StreamHandle {
        self.stream
    }

    /// The device the stream belongs to.
    #[inline]
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// The pool the stream returns to.
    #[inline]
    pub fn pool(&self) -> &'p StreamPool<B> {
        self.pool
    }

    /// The stream as an access order, borrowing the lease: the order cannot
    /// be used after the lease ends.
    #[inline]
    pub fn order(&self) -> AccessOrder<'_> {
        AccessOrder::of_held(self.stream, self.device, self.pool.id)
    }

    /// Ends the lease without returning the stream: the caller owns it now.
    pub fn detach(self) -> OwnedStream {
        let this = ManuallyDrop::new(self);
        this.pool.forget_lease(this.device);
        OwnedStream {
            handle: this.stream,
            device: this.device,
            owner: this.pool.id,
        }
    }

    /// Returns the stream to the pool now, reporting a failure (which `Drop`
    /// would park). On a failed query the stream is quarantined by the pool:
    /// not lost, destroyed by the next purge, never leased again.
    pub fn return_to_pool(self) -> Result<(), Error<B::Error>> {
        let this = ManuallyDrop::new(self);
        this.pool.give_back(this.stream, this.device, this.origin())
    }
}

impl<'l, B: StreamBackend> From<&'l StreamLease<'_, B>> for AccessOrder<'l> {
    fn from(l: &'l StreamLease<'_, B>) -> AccessOrder<'l> {
        l.order()
    }
}

impl<B: StreamBackend> Drop for StreamLease<'_, B> {
    fn drop(&mut self) {
        if let Err(e) = self.pool.give_back(self.stream, self.device, self.origin()) {
            self.pool.parked.park(e);
        }
    }
}
