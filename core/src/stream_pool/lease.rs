//! [`StreamLease`]: an exclusive lease of a pooled stream, and what it does
//! with its stream (orders, captures, the return).

use core::fmt;
use core::mem::ManuallyDrop;

use super::StreamPool;
use crate::backend::{
    BackendId, CaptureBackend, CaptureMode, DeviceId, StreamBackend, StreamHandle,
};
use crate::capture::CaptureNote;
use crate::error::{BackendOp, Error};
use crate::owned::OwnedStream;
use crate::pool::fmt_lease;

/// An exclusive lease of a pooled stream. Returns the stream to its pool when
/// dropped.
///
/// Exclusive: no other lease of any pool holds the same stream while this one
/// lives. It borrows the pool, so it cannot outlive it.
#[must_use = "dropping a lease returns the stream at once"]
pub struct StreamLease<'p, B: StreamBackend> {
    pub(super) pool: &'p StreamPool<B>,
    /// A live stream of the pool's backend on `device`, held by this lease
    /// alone until it ends.
    pub(super) stream: StreamHandle,
    pub(super) device: DeviceId,
    /// When the pool keeps streams for same-thread reuse: the owner mark of
    /// the taking thread's cell (marks are never reused, and an adopted cell
    /// gets a new one, so a match at the end proves the lease ends on the
    /// thread that took it); 0 otherwise.
    pub(super) origin: usize,
    /// Set when the stream may have joined a graph capture (see
    /// [`note_capture`](Self::note_capture)): the return asks first.
    pub(super) capture: CaptureNote,
}

impl<B: StreamBackend> StreamLease<'_, B> {
    /// The id of the backend the stream belongs to (the pool's).
    #[inline]
    pub(crate) fn backend_id(&self) -> BackendId {
        self.pool.inner.id
    }
}

impl<B: StreamBackend> fmt::Debug for StreamLease<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_lease(f, "StreamLease", "stream", &self.stream, self.device)
    }
}

impl<'p, B: StreamBackend> StreamLease<'p, B> {
    /// The raw stream handle, for the backend's own calls (valid while the
    /// lease lives).
    ///
    /// ```
    /// use gpupool_core::StreamPool;
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let streams = StreamPool::new(gpu.clone());
    /// let lease = streams.get(0)?;
    /// gpu.enqueue_work(lease.handle()).unwrap(); // the backend's own call on the stream
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
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

    /// Ends the lease without returning the stream: the caller owns it now.
    ///
    /// ```
    /// use gpupool_core::StreamPool;
    /// use gpupool_mock::MockBackend;
    ///
    /// let streams = StreamPool::new(MockBackend::new(1));
    /// let owned = streams.get(0)?.detach(); // no longer the pool's
    /// streams.put(owned, None).map_err(|rejected| rejected.error)?; // until put back
    /// assert_eq!(streams.total_stats().created, 1);
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn detach(self) -> OwnedStream {
        let this = ManuallyDrop::new(self);
        // Released: no longer live, and its stream left the pool.
        this.pool.inner.count_detached(this.device, true);
        // The capture state goes with the stream (it may be in a capture).
        OwnedStream {
            handle: this.stream,
            device: this.device,
            owner: this.pool.inner.id,
            capture: CaptureNote::with_epoch(this.capture.epoch()),
        }
    }

    /// Returns the stream to the pool now, reporting a failure (which `Drop`
    /// would park). On a failed query the stream is quarantined by the pool:
    /// not lost, destroyed by the next purge, never leased again.
    ///
    /// ```
    /// use gpupool_core::StreamPool;
    /// use gpupool_mock::MockBackend;
    ///
    /// let streams = StreamPool::new(MockBackend::new(1));
    /// streams.get(0)?.return_to_pool()?; // as a drop, with the error in hand
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn return_to_pool(self) -> Result<(), Error<B::Error>> {
        let this = ManuallyDrop::new(self);
        this.pool
            .give_back(this.stream, this.device, this.origin, this.capture.ever())
    }

    /// Tells gpupool that the stream has begun or joined a graph capture
    /// through calls gpupool did not make (the raw [`handle`](Self::handle)
    /// with the driver's own `cuStreamBeginCapture`, or a wait on an event
    /// recorded in a capture). Whoever does that through the raw handle (an
    /// `unsafe` call) must call this right after, before any other gpupool
    /// call on the lease, its orders or a scratchpad on them: gpupool's
    /// promises about scratch memory rest on it (see `docs/safety.md`).
    /// [`begin_capture`](Self::begin_capture), [`AccessOrder::wait`](crate::AccessOrder::wait)
    /// and [`wait_event`](crate::AccessOrder::wait_event) note it
    /// themselves.
    ///
    /// From then on the lease's return asks the backend whether the stream
    /// is still capturing before it queries it (which would break the
    /// capture), and keeps a capturing stream from every `get` until its
    /// capture has ended; scratchpads on the lease's order give the memory of
    /// a round that overlapped the capture to its graph instead of reusing
    /// it. Costs one backend call at the return (`cuStreamIsCapturing` on
    /// CUDA) and one per scratchpad round on the lease.
    #[inline]
    pub fn note_capture(&self) {
        self.capture.bump();
    }

    /// The lease's capture note, for its orders.
    #[inline]
    pub(crate) fn capture_note(&self) -> &CaptureNote {
        &self.capture
    }
}

impl<'p, B: CaptureBackend> StreamLease<'p, B> {
    /// Begins a graph capture on the leased stream (CUDA's
    /// `cuStreamBeginCapture` in `mode`): work issued on it from now on is
    /// recorded into a graph, not run, until [`end_capture`](Self::end_capture).
    /// Other leases join it with [`AccessOrder::wait`](crate::AccessOrder::wait)
    /// on this lease's order (the fork) and must be joined back (this
    /// order's wait on theirs) before it ends.
    ///
    /// What gpupool does with it (see `docs/graph-capture.md`): the lease's
    /// return while the capture is open keeps the stream out of the pool
    /// until the capture has ended; scratch memory used in the capture is
    /// kept for the graph's replays, never reused while the graph can run;
    /// the host's waits on the stream are refused
    /// ([`Error::StreamCapturing`]).
    ///
    /// Errors, with nothing begun: [`Error::CaptureState`] if the stream is
    /// already in a capture; a backend failure (a capture in global mode
    /// needs the device's memory pool made beforehand, see the docs).
    ///
    /// ```
    /// use gpupool_core::{CaptureMode, StreamPool};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let streams = StreamPool::new(gpu.clone());
    /// let lease = streams.get(0)?;
    /// lease.begin_capture(CaptureMode::Global)?;
    /// gpu.enqueue_work(lease.handle()).unwrap(); // recorded, not run
    /// let graph = lease.end_capture()?;
    /// assert_eq!(graph.node_count(), 1);
    /// gpu.launch_graph(&graph, lease.handle()).unwrap();
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<(), Error<B::Error>> {
        let backend = &self.pool.inner.backend;
        if self.capture.ever() {
            // SAFETY: the lease holds this live stream of the pool's backend
            // on `device`.
            let status = unsafe { backend.capture_status(self.stream, self.device) }
                .map_err(Error::backend(BackendOp::CaptureStatus))?;
            if status.is_capturing() {
                return Err(Error::CaptureState);
            }
        }
        // Noted before the capture begins: a wait on another thread that
        // records on this stream after the beginning sees the note (and so
        // asks), and one that read it before recorded before (see
        // `AccessOrder::wait`). A failed beginning leaves the note moved:
        // only a cost (one question at the return and per round).
        self.capture.begin_half();
        // SAFETY: as above; a created stream (pools hold no special one),
        // not in a capture: asked above, or never in one (its note).
        let begun = unsafe { backend.begin_capture(self.stream, self.device, mode) }
            .map_err(Error::backend(BackendOp::BeginCapture));
        // And noted again once it has begun (or failed to): a scratchpad
        // round that began on another thread between the two halves read the
        // first and found the stream not capturing yet; the second tells its
        // end that a capture may have overlapped it.
        self.capture.begin_half();
        begun
    }

    /// Ends the capture this lease's stream began and returns its graph
    /// (CUDA's `cuStreamEndCapture`). Every stream that joined leaves the
    /// capture, whatever the outcome.
    ///
    /// Errors: [`Error::CaptureState`] (nothing called) if the stream is not
    /// capturing, or another thread is beginning a capture on this lease
    /// right now; a backend failure (the capture was invalidated, or a
    /// stream that joined was not joined back): the capture has ended all
    /// the same, with no graph.
    pub fn end_capture(&self) -> Result<B::Graph, Error<B::Error>> {
        let backend = &self.pool.inner.backend;
        // Never while another thread is beginning a capture on this lease:
        // the capture it begins must be noted as a whole before it can end.
        if !self.capture.ever() || self.capture.beginning() {
            return Err(Error::CaptureState);
        }
        // SAFETY: the lease holds this live stream of the pool's backend on
        // `device`.
        let status = unsafe { backend.capture_status(self.stream, self.device) }
            .map_err(Error::backend(BackendOp::CaptureStatus))?;
        if !status.is_capturing() {
            return Err(Error::CaptureState);
        }
        // SAFETY: as above.
        unsafe { backend.end_capture(self.stream, self.device) }
            .map_err(Error::backend(BackendOp::EndCapture))
    }
}

impl<B: StreamBackend> Drop for StreamLease<'_, B> {
    fn drop(&mut self) {
        let noted = self.capture.ever();
        if let Err(e) = self
            .pool
            .give_back(self.stream, self.device, self.origin, noted)
        {
            self.pool.inner.parked.park(e);
        }
    }
}
