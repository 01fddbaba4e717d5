//! [`BusyStreams`]: the stream pool's lists of streams returned with work
//! pending and of streams returned while capturing a graph.

use crate::backend::StreamHandle;
use crate::pool::BusyList;
use crate::stack::{Bag, Chain};

/// The stream kind's other lists: streams returned with work pending, which
/// `get` scans (queries) for a finished one, and streams returned while they
/// were capturing a graph, held unqueried until their capture has ended
/// (a query would break the capture, and work issued on them would go into
/// its graph).
pub(crate) struct BusyStreams {
    pending: Bag<StreamHandle>,
    pub(super) capturing: Bag<StreamHandle>,
}

impl BusyStreams {
    /// Adds a stream returned with work pending.
    #[inline]
    pub(super) fn push(&self, stream: StreamHandle) {
        self.pending.push(stream);
    }

    /// Adds a stream returned while capturing.
    pub(super) fn hold_for_capture(&self, stream: StreamHandle) {
        self.capturing.push(stream);
    }

    /// Whether no stream with pending work looked present (a hint).
    pub(super) fn no_pending(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes the streams with pending work (not the held ones).
    pub(super) fn take_pending(&self) -> Chain<StreamHandle> {
        self.pending.take_all()
    }

    /// Puts streams back among those with pending work.
    pub(super) fn put_back_pending(&self, chain: Chain<StreamHandle>) {
        self.pending.put_back(chain);
    }
}

impl BusyList<StreamHandle> for BusyStreams {
    fn new() -> Self {
        BusyStreams {
            pending: Bag::new(),
            capturing: Bag::new(),
        }
    }

    /// Everything, held streams included.
    fn take_all(&self) -> Chain<StreamHandle> {
        self.pending.put_back(self.capturing.take_all());
        self.pending.take_all()
    }

    /// The pending streams: a purge leaves the streams held for a capture
    /// (destroying one would break the capture it is in), as it leaves
    /// leases that are out; the next purge after the capture has ended and
    /// a `get` has found it ended takes them.
    fn take_for_purge(&self) -> Chain<StreamHandle> {
        self.take_pending()
    }

    /// The streams held for a capture (the pool's drop asks each).
    fn take_held(&self) -> Chain<StreamHandle> {
        self.capturing.take_all()
    }
}
