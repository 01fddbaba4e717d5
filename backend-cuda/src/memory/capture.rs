//! Memory and graph captures: which device blocks a capture allocated (the
//! graph's allocation nodes), and the blocks freed in the order of a
//! capturing stream that a replay of the graph may still use. The rules are
//! in the parent module's documentation ("Graph capture") and in
//! `docs/graph-capture.md`.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use gpupool_core::{DeviceId, MemoryKind, StreamHandle};

use super::state::DeviceMemory;
use crate::backend::CudaBackend;
use crate::driver::Driver;
use crate::error::CudaError;

impl DeviceMemory {
    /// Whether `stream` is capturing a graph (`cuStreamIsCapturing`, which
    /// every capture mode allows and which breaks no capture).
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (live, or special).
    pub(super) unsafe fn capturing(
        drv: &Driver,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<bool, CudaError> {
        drv.on_stream(stream, device, || {
            // SAFETY: the caller's contract; `on_stream` made the right
            // context current for a special stream (as `capture_status` of
            // the backend does, which checks the device first: done by the
            // callers here).
            unsafe { CudaBackend::raw_capture_status(stream) }.map(|s| s.is_capturing())
        })
    }

    fn graph_allocations(&self) -> MutexGuard<'_, std::collections::HashSet<usize>> {
        // A panic while the lock was held left the set whole (each change is
        // one insert or remove): go on with it.
        self.graphs
            .allocations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a device block the driver allocated on a capturing stream: an
    /// allocation node of the graph being captured.
    pub(super) fn note_graph_allocation(&self, addr: usize) {
        let mut set = self.graph_allocations();
        set.insert(addr);
        // Release, with the Acquire of `forget_graph_allocation`: a free
        // that sees the count sees the entry (the address was handed out
        // after this store).
        self.graphs
            .allocations_len
            .store(set.len(), Ordering::Release);
    }

    /// Whether `addr` is a device block allocated on a capturing stream and
    /// not freed yet; forgets it (it is being freed).
    pub(super) fn forget_graph_allocation(&self, addr: usize) -> bool {
        // Acquire: see `note_graph_allocation`. Zero (the case of every
        // program that never captures): no lock.
        if self.graphs.allocations_len.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut set = self.graph_allocations();
        let found = set.remove(&addr);
        self.graphs
            .allocations_len
            .store(set.len(), Ordering::Release);
        found
    }

    /// Keeps a block that was freed in the order of a capturing stream: the
    /// graph's replays may use it whenever they run, for as long as the
    /// graph exists, which gpupool cannot see; so it is never handed out
    /// again nor given back (counted in `MemoryStats::kept_for_graphs`).
    pub(super) fn keep_for_graphs(&self, kind: MemoryKind, addr: usize, size: usize) {
        self.graphs
            .kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((kind, addr, size));
    }

    /// How many blocks of each kind are kept for graphs, and their bytes.
    pub(super) fn kept_for_graphs(&self) -> ([usize; 4], [usize; 4]) {
        let kept = self.graphs.kept.lock().unwrap_or_else(|e| e.into_inner());
        let (mut blocks, mut bytes) = ([0; 4], [0; 4]);
        for &(kind, _, size) in kept.iter() {
            blocks[kind.index()] += 1;
            bytes[kind.index()] += size;
        }
        (blocks, bytes)
    }
}
