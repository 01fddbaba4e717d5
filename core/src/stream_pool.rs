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

use crate::backend::{Completion, DeviceId, StreamBackend, StreamHandle, StreamOptions};
use crate::capture::CaptureNote;
use crate::epoch::Pinning;
use crate::error::{BackendOp, Error, Rejected};
pub use crate::owned::OwnedStream;
use crate::pool::{shared_pool_methods, Pool, PoolKind, Slot};
use crate::stats::Counters;
use crate::sync::epoch::{Collector, Guard};
use crate::thread_cache::Cell;

mod busy;
mod lease;
use busy::BusyStreams;
pub use lease::StreamLease;

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

/// The stream kind of [`Pool`]: a device keeps a busy list besides its
/// ready list (streams returned with work pending; never popped one at a
/// time).
pub(crate) struct Streams;

impl<B: StreamBackend> PoolKind<B> for Streams {
    type Handle = StreamHandle;
    type Busy = BusyStreams;
    type Config = StreamPoolConfig;
    const CREATE: BackendOp = BackendOp::CreateStream;
    const DESTROY: BackendOp = BackendOp::DestroyStream;

    #[inline]
    fn create(
        backend: &B,
        device: DeviceId,
        config: &StreamPoolConfig,
    ) -> Result<StreamHandle, B::Error> {
        backend.create_stream(device, config.stream)
    }

    #[inline]
    unsafe fn destroy(backend: &B, handle: StreamHandle, device: DeviceId) -> Result<(), B::Error> {
        // SAFETY: the caller's guarantee (`PoolKind::destroy`).
        unsafe { backend.destroy_stream(handle, device) }
    }

    /// Streams kept unqueried for same-thread reuse may still run work: busy
    /// list; streams found idle on return: ready list.
    /// A stream held because it was returned while capturing is destroyed
    /// at the pool's drop only if its capture has ended: destroying it
    /// would break the capture its owner is still recording. Otherwise it
    /// is leaked ([`Error::StreamCapturing`], reported as lost).
    unsafe fn may_destroy_held(
        backend: &B,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), Error<B::Error>> {
        // SAFETY: the caller's guarantee: a live stream of `device`, the
        // pool's.
        match unsafe { backend.capture_status(stream, device) } {
            Ok(status) if status.is_capturing() => Err(Error::StreamCapturing),
            Ok(_) => Ok(()),
            Err(source) => Err(Error::Backend {
                op: BackendOp::CaptureStatus,
                source,
            }),
        }
    }

    unsafe fn flushed(config: &StreamPoolConfig, slot: &StreamSlot, raw: usize) {
        // SAFETY: the caller's guarantee: the raw word of a live stream.
        let handle = unsafe { StreamHandle::from_raw(raw) };
        if config.same_thread_reuse {
            slot.busy.push(handle);
        } else {
            slot.ready.push(handle);
        }
    }
}

/// One device's lists: ready, busy (with the streams held for a capture),
/// quarantine.
type StreamSlot = Slot<StreamHandle, BusyStreams>;

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
    /// The lists, tallies, parked error and (`std`) the per-thread cells,
    /// which keep streams found idle on return or, with same-thread reuse,
    /// streams kept unqueried for their thread.
    inner: Pool<B, Streams>,
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
        // Idle-at-return streams may go to whichever thread adopts an exited
        // thread's cell; unqueried ones may not.
        let adopt = !config.same_thread_reuse;
        StreamPool {
            inner: Pool::new(backend, config, pinning, adopt),
        }
    }

    shared_pool_methods! {
        StreamLease, "stream";
        // The slow path stays inline: the stream pool's `get` is one body.
        get: [
            ///
            /// ```
            /// use gpupool_core::StreamPool;
            /// use gpupool_mock::MockBackend;
            ///
            /// let streams = StreamPool::new(MockBackend::new(1));
            /// let lease = streams.get(0)?; // device 0 (or `DeviceSelector::Current`)
            /// let raw = lease.handle();    // for the backend's own calls
            /// drop(lease);                 // back to the pool, queried once
            /// assert_eq!(streams.get(0)?.handle(), raw); // the same stream again
            /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
            /// ```
        ], get_slow: [#[inline]];
        /// Destroys every stream in the pool, ready or busy (CUDA lets pending work
        /// finish). Leases that are out are untouched and come back normally later;
        /// so does a stream another thread's `get` is scanning at this moment,
        /// and so do streams held because they were returned while capturing a
        /// graph (destroying one would break its capture).
        ///
        /// Returns how many streams were destroyed. A failed destroy does not stop
        /// the purge: that stream stays in the pool (so it is not lost and the next
        /// purge tries again) but is never leased again; the first error is
        /// returned, later ones are parked. (On Linux a purge runs one
        /// `membarrier` call to take the streams other threads keep; where the
        /// kernel refuses it, those stay pooled for a later purge or the drop.)
        ///
        /// ```
        /// use gpupool_core::StreamPool;
        /// use gpupool_mock::MockBackend;
        ///
        /// let streams = StreamPool::new(MockBackend::new(1));
        /// let kept = streams.get(0)?;
        /// drop(streams.get(0)?);             // an idle stream in the pool
        /// assert_eq!(streams.purge()?, 1);   // destroyed; `kept` is untouched
        /// drop(kept);                        // and comes back normally
        /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
        /// ```
    }

    /// The configuration.
    pub fn config(&self) -> &StreamPoolConfig {
        &self.inner.config
    }

    /// A lease of the stream in the calling thread's memoised `cell` of
    /// `device`, if it holds one.
    #[cfg(feature = "std")] // only `get` (std) reads the memo
    #[inline]
    fn take_memo<'p>(&'p self, device: DeviceId, cell: &'p Cell) -> Option<StreamLease<'p, B>> {
        let h = cell.take()?;
        // SAFETY: cells hold only handles of streams this pool created on the
        // cell's device (`device`) and owns.
        let stream = unsafe { StreamHandle::from_raw(h) };
        Some(self.lease(stream, device, self.origin_in(cell)))
    }

    /// The calling thread's kept stream of `device` (its cell, registered if
    /// need be), if it has one; with same-thread reuse, the streams left by
    /// exited threads go to the busy list first.
    fn take_cached(&self, device: DeviceId) -> Option<StreamLease<'_, B>> {
        if let Some(Some((h, origin))) = self
            .inner
            .cache
            .with_cell(device.index(), |c| c.take().map(|h| (h, self.origin_in(c))))
        {
            // SAFETY: cells hold only handles of streams this pool created on
            // the cell's device (`device`) and owns.
            return Some(self.lease(unsafe { StreamHandle::from_raw(h) }, device, origin));
        }
        if self.inner.config.same_thread_reuse {
            // Streams left by exited threads may run their work: busy list.
            for (d, h) in self.inner.cache.take_orphans() {
                if let Some(s) = self.inner.devices.slot_of(DeviceId(d as u32)) {
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
    fn lease(&self, stream: StreamHandle, device: DeviceId, origin: usize) -> StreamLease<'_, B> {
        StreamLease {
            pool: self,
            stream,
            device,
            origin,
            capture: CaptureNote::new(),
        }
    }

    /// The origin a lease taken by the owner of `cell` records: the cell's
    /// owner mark when the pool keeps streams for same-thread reuse, else 0.
    #[inline]
    fn origin_in(&self, cell: &Cell) -> usize {
        if self.inner.config.same_thread_reuse {
            cell.owner_mark()
        } else {
            0
        }
    }

    /// The origin a lease taken by the calling thread records, looked up
    /// (the slow paths: a lease from the shared lists or a new stream).
    #[inline]
    fn origin_here(&self, device: DeviceId) -> usize {
        if self.inner.config.same_thread_reuse {
            self.inner
                .cache
                .with_cell(device.index(), |c| c.owner_mark())
                .unwrap_or(0)
        } else {
            0
        }
    }

    /// Pops `device`'s ready list, else scans its busy list, else creates.
    fn get_from<'p>(
        &'p self,
        device: DeviceId,
        slot: &StreamSlot,
        guard: &Guard,
    ) -> Result<StreamLease<'p, B>, Error<B::Error>> {
        let stream = self
            .inner
            .pop_or_create(device, slot, guard, || self.scan_busy(device, slot))?;
        Ok(self.lease(stream, device, self.origin_here(device)))
    }

    /// Takes a stream into the pool. `device` names the device it belongs to, or
    /// `None` for the stream's own. The stream is asked whether it is
    /// capturing a graph, then queried once: idle goes to the ready list,
    /// pending to the busy list.
    ///
    /// On a stream of another backend ([`Error::ForeignHandle`]), a wrong or
    /// out-of-range device, a stream in a graph capture
    /// ([`Error::StreamCapturing`]) or a failed call the stream comes back in
    /// the error, still the caller's, and the pool is unchanged.
    ///
    /// ```
    /// use gpupool_core::StreamPool;
    /// use gpupool_mock::MockBackend;
    ///
    /// let streams = StreamPool::new(MockBackend::new(1));
    /// let owned = streams.get(0)?.detach(); // the caller's own stream now
    /// let raw = owned.handle();
    /// streams.put(owned, None).map_err(|r| r.error)?; // taken back in
    /// assert_eq!(streams.get(0)?.handle(), raw);      // and leased again
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn put(
        &self,
        stream: OwnedStream,
        device: Option<DeviceId>,
    ) -> Result<(), Rejected<OwnedStream, B::Error>> {
        let slot = match self.inner.admit(stream.owner, stream.device, device) {
            Ok(slot) => slot,
            Err(error) => {
                return Err(Rejected {
                    value: stream,
                    error,
                })
            }
        };
        // SAFETY: `stream` owns a live stream of this backend (id checked) on
        // its device, and the pool has not taken it yet.
        match unsafe {
            self.inner
                .backend
                .capture_status(stream.handle, stream.device)
        } {
            Ok(status) if !status.is_capturing() => {}
            Ok(_) => {
                return Err(Rejected {
                    value: stream,
                    error: Error::StreamCapturing,
                })
            }
            Err(source) => {
                return Err(Rejected {
                    value: stream,
                    error: Error::Backend {
                        op: BackendOp::CaptureStatus,
                        source,
                    },
                })
            }
        }
        // SAFETY: as above.
        let completion = unsafe {
            self.inner
                .backend
                .query_stream(stream.handle, stream.device)
        };
        if completion.is_ok() {
            // Taken in, wherever it goes below.
            Counters::bump(&slot.counters.put);
        }
        match completion {
            Ok(Completion::Complete) => {
                // Idle: like a returned lease, the calling thread's cell first,
                // so that its next `get` takes the stream put last.
                if !self.inner.config.same_thread_reuse
                    && self
                        .inner
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

    /// Returns a leased stream (lease `Drop` and `return_to_pool`). The
    /// lease's device is the stream's own, so nothing is checked. `origin` is
    /// the owner mark of the cell of the thread that took the lease
    /// (`same_thread_reuse`), or 0.
    /// On a failed query the stream is quarantined (kept for purge, never
    /// leased again) and the error returned. `noted`: the lease's capture
    /// note is set, so the stream may be capturing: asked first, and a
    /// capturing stream is set aside (`held_by_capture`) unqueried.
    fn give_back(
        &self,
        stream: StreamHandle,
        device: DeviceId,
        origin: usize,
        noted: bool,
    ) -> Result<(), Error<B::Error>> {
        let Some(slot) = self.inner.devices.slot_of(device) else {
            // A lease exists only after its slot was found, and the table lives
            // as long as the pool the lease borrows. (No assertion: this runs
            // in a lease's drop, which never panics; the error is parked.)
            return Err(Error::NoDevice);
        };
        if noted {
            // SAFETY: the lease owned this stream of the pool's backend on
            // `device` until now; it is in no list yet.
            match unsafe { self.inner.backend.capture_status(stream, device) } {
                Ok(status) if !status.is_capturing() => {}
                Ok(_) => {
                    Counters::bump(&slot.counters.returned);
                    slot.busy.hold_for_capture(stream);
                    return Ok(());
                }
                Err(e) => {
                    // Not known not to be capturing: held like a capturing
                    // stream (never queried, leased or destroyed until a
                    // later question says its capture has ended), and the
                    // error returned.
                    Counters::bump(&slot.counters.returned);
                    slot.busy.hold_for_capture(stream);
                    return Err(Error::Backend {
                        op: BackendOp::CaptureStatus,
                        source: e,
                    });
                }
            }
        }
        // Kept unqueried only for the thread that took the lease: a lease
        // moved to another thread ends there like a default return (queried),
        // so that thread is never served the first thread's pending work.
        if self.inner.config.same_thread_reuse
            && origin != 0
            && self.inner.cache.with_cell(device.index(), |c| {
                c.owner_mark() == origin && c.give(stream.as_raw())
            }) == Some(true)
        {
            return Ok(());
        }
        // SAFETY: the lease owned this stream of the pool's backend on
        // `device` until now; it is in no list yet, so nothing can destroy it.
        match unsafe { self.inner.backend.query_stream(stream, device) } {
            Ok(Completion::Complete) => {
                // Idle: the returning thread's cell first (it counts the
                // return), else the shared ready list.
                if self
                    .inner
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
            Err(e) => Err(self.quarantine_returned(slot, stream, BackendOp::QueryStream, e)),
        }
    }
}

impl<B: StreamBackend> fmt::Debug for StreamPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt_as(f, "StreamPool", "config")
    }
}
