//! Memory and graph captures: which device blocks a capture allocated (the
//! graph's allocation nodes), and the blocks freed in the order of a
//! capturing stream that a replay of the graph may still use, held by the
//! graph through a CUDA user object until it is gone. The rules are in
//! `docs/graph-capture.md` and in the documentation of
//! `MemoryStats::kept_for_graphs`.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::sys;
use gpupool_core::{DeviceId, MemoryKind, StreamHandle};

use super::kinds::BlockLayout;
pub(super) use super::state::GiveBack;
use super::state::{DeviceMemory, GraphAllocation, GraphHeld, KeptForGraphs};
use crate::backend::CudaBackend;
use crate::driver::Driver;
use crate::error::CudaError;
use crate::graph::no_capture_ends;
use crate::raw;

impl DeviceMemory {
    /// The id of the capture `stream` is in ([`current_capture`]), or
    /// `None`.
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (live, or special).
    pub(super) unsafe fn capture_of(
        drv: &Driver,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<Option<u64>, CudaError> {
        drv.on_stream(stream, device, || {
            // SAFETY: the caller's contract; `on_stream` made the right
            // context current for a special stream (as `capture_status` of
            // the backend does, which checks the device first: done by the
            // callers here).
            unsafe { current_capture(stream) }.map(|c| c.map(|c| c.id))
        })
    }

    fn graph_allocations(
        &self,
    ) -> MutexGuard<'_, std::collections::BTreeMap<usize, GraphAllocation>> {
        // A panic while the lock was held left the set whole (each change is
        // one insert or remove): go on with it.
        self.graphs
            .allocations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a device block the driver allocated on a stream in capture
    /// `capture` (its id; 0 where the driver cannot tell): an allocation
    /// node of the graph being captured.
    pub(super) fn note_graph_allocation(&self, addr: usize, size: usize, capture: u64) {
        let mut set = self.graph_allocations();
        set.insert(addr, GraphAllocation { size, capture });
        // Release, with the Acquire of `forget_graph_allocation`: a free
        // that sees the count sees the entry (the address was handed out
        // after this store).
        self.graphs
            .allocations_len
            .store(set.len(), Ordering::Release);
    }

    /// The capture that allocated `addr`, if it is a device block allocated
    /// on a capturing stream and not freed yet; forgets it (it is being
    /// freed).
    #[inline]
    pub(super) fn forget_graph_allocation(&self, addr: usize) -> Option<u64> {
        // Acquire: see `note_graph_allocation`. Zero (the case of every
        // program that never captures): no lock.
        if self.graphs.allocations_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.forget_listed_graph_allocation(addr)
    }

    /// [`forget_graph_allocation`](Self::forget_graph_allocation) once the
    /// list may hold something.
    #[cold]
    fn forget_listed_graph_allocation(&self, addr: usize) -> Option<u64> {
        let mut set = self.graph_allocations();
        let found = set.remove(&addr).map(|a| a.capture);
        self.graphs
            .allocations_len
            .store(set.len(), Ordering::Release);
        found
    }

    /// Whether the device block handed out at `addr` (over-aligned or not)
    /// is an allocation node of capture `capture`, not freed yet.
    pub(super) fn allocated_in_capture(&self, addr: usize, capture: u64) -> bool {
        // Acquire: see `note_graph_allocation`.
        if self.graphs.allocations_len.load(Ordering::Acquire) == 0 {
            return false;
        }
        // Acquire: an over-aligned block's entry was stored before its
        // address was handed out.
        let raw = if self.overaligned_len.load(Ordering::Acquire) > 0 {
            self.overaligned().get(&addr).copied().unwrap_or(addr)
        } else {
            addr
        };
        self.graph_allocations()
            .get(&raw)
            .is_some_and(|a| a.capture == capture)
    }

    /// The capture that allocated the device block `[addr, addr + len)`
    /// reaches into, if it reaches into one allocated on a capturing stream
    /// and not freed (a graph's own allocation). Zero graph allocations
    /// (every program that never captures): no lock.
    pub(super) fn graph_allocation_touched(&self, addr: usize, len: usize) -> Option<u64> {
        // Acquire: see `note_graph_allocation`.
        if len == 0 || self.graphs.allocations_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let end = addr.saturating_add(len);
        let set = self.graph_allocations();
        // The last block starting before the range's end is the only one
        // that can reach into it from the left; any starting inside it does.
        set.range(..end)
            .next_back()
            .filter(|(&start, a)| start.saturating_add(a.size) > addr)
            .map(|(_, a)| a.capture)
    }

    /// Keeps a block that was freed in the order of `stream` while `stream`
    /// was in capture `capture` (or, `stream` `None`, a block of a capture
    /// that has ended): the graph's replays may use it whenever they run,
    /// so it is never handed out again while the graph can run. Where the
    /// graph being captured can be told (`cuStreamGetCaptureInfo`) and the
    /// stream is still in capture `capture`, the graph is given a reference
    /// to a CUDA user object for the block, whose
    /// destructor (run by CUDA once that graph, every executable graph made
    /// from it and their launches are done) marks the block for
    /// [`give_back_graphs_blocks`](Self::give_back_graphs_blocks); otherwise
    /// the block is kept for the life of the process. Counted in
    /// `MemoryStats::kept_for_graphs` until given back.
    ///
    /// `how` says how the block is given back: at the level it was freed at.
    ///
    /// # Safety
    /// `stream`, if any, is a usable stream of `device`, with `device`'s
    /// primary context current if it is a special stream;
    /// the block is not used by gpupool again, and only the graph's work uses
    /// it.
    pub(super) unsafe fn keep_for_graphs(
        &'static self,
        device: DeviceId,
        kind: MemoryKind,
        addr: usize,
        size: usize,
        how: GiveBack,
        stream: Option<(StreamHandle, u64)>,
    ) {
        {
            let mut kept = self.kept();
            kept.blocks[kind.index()] += 1;
            kept.bytes[kind.index()] += size;
        }
        let held = GraphHeld {
            mem: self,
            device,
            kind,
            addr,
            size,
            how,
        };
        let held = match stream {
            // SAFETY: the caller's contract.
            Some((s, capture)) => match unsafe { hold_in_graph(s, capture, held) } {
                Ok(()) => return,
                Err(held) => held,
            },
            None => held,
        };
        self.kept().forever.push((held.kind, held.addr, held.size));
    }

    fn kept(&self) -> MutexGuard<'_, KeptForGraphs> {
        // A panic while the lock was held left the lists whole (each change
        // is one push or one take): go on with them.
        self.graphs.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives back the blocks whose graphs are gone (see
    /// [`keep_for_graphs`](Self::keep_for_graphs)): when there are any,
    /// synchronizes the device's primary context (work issued before a
    /// capture may still use a block), then frees each the way it would have
    /// been without the capture, in host order. Not while a capture gpupool
    /// began is open (the synchronization would break it): the blocks wait
    /// for a later call then. Returns the host and device
    /// bytes given back (pinned and managed blocks go to their pools). A
    /// block whose free fails is kept for a later call, and the first error
    /// returned.
    pub(super) fn give_back_graphs_blocks(&'static self, drv: &Driver) -> Result<usize, CudaError> {
        // A context synchronization would break a capture still open on the
        // device (in any mode): the blocks wait for a later call.
        if crate::graph::captures_open() {
            return Ok(0);
        }
        let released = std::mem::take(&mut self.kept().released);
        let Some(device) = released.first().map(|h| h.device) else {
            return Ok(0);
        };
        // The graphs are done with the blocks, but work issued on their
        // streams before the captures began (which the graphs do not wait
        // for) may still use them: wait for all of the device's work first.
        // Waits for the work of the current context, `device`'s primary one.
        let synced = drv.with_context(device, |_| raw::ctx_synchronize());
        if let Err(e) = synced {
            self.kept().released.extend(released);
            return Err(e);
        }
        let mut freed = 0;
        let mut first_error = None;
        for held in released {
            let done = match (held.how, std::ptr::NonNull::new(held.addr as *mut u8)) {
                // SAFETY: the block was freed at this level by the caller of
                // `keep_for_graphs` and never handed out since; the graphs
                // that used it are destroyed and their work done, and the
                // device's other work has finished (synchronized above).
                (GiveBack::Block { align }, Some(ptr)) => unsafe {
                    let b = BlockLayout::new(held.kind, held.device, held.size, align);
                    self.deallocate(drv, b, ptr, None)
                },
                // (A block handed out at this level is never at address 0.)
                (GiveBack::Block { .. }, None) => Ok(()),
                // SAFETY: as above, at the device memory's own level.
                (GiveBack::DeviceBlock, _) => unsafe {
                    self.device_free(drv, held.device, held.addr, held.size, None)
                },
            };
            match done {
                Ok(()) => {
                    // Pinned and managed blocks go to their pools, whose trim
                    // counts what it frees.
                    if matches!(held.kind, MemoryKind::Host | MemoryKind::Device) {
                        freed += held.size;
                    }
                    let mut kept = self.kept();
                    kept.blocks[held.kind.index()] -= 1;
                    kept.bytes[held.kind.index()] -= held.size;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    self.kept().released.push(held);
                }
            }
        }
        first_error.map_or(Ok(freed), Err)
    }

    /// How many blocks of each kind are kept for graphs, and their bytes.
    pub(super) fn kept_for_graphs(&self) -> ([usize; 4], [usize; 4]) {
        let kept = self.kept();
        (kept.blocks, kept.bytes)
    }
}

/// Gives the graph being captured on `stream` in capture `capture` a
/// reference to a user object for `held`; `Err(held)` if the stream is not
/// in that capture (any more), the graph cannot be told, or the driver
/// refuses.
///
/// # Safety
/// `stream` is a usable stream, with its context current if it is a
/// special stream.
unsafe fn hold_in_graph(
    stream: StreamHandle,
    capture: u64,
    held: GraphHeld,
) -> Result<(), GraphHeld> {
    // No capture that gpupool ends (`StreamLease::end_capture`) ends while
    // this call holds the graph's handle: the graph stays the one being
    // captured, and alive, until the reference is moved to it.
    // SAFETY: the caller's contract.
    no_capture_ends(|| unsafe { hold_in_graph_now(stream, capture, held) })
}

/// [`hold_in_graph`], under [`no_capture_ends`].
///
/// # Safety
/// As for `hold_in_graph`.
unsafe fn hold_in_graph_now(
    stream: StreamHandle,
    capture: u64,
    held: GraphHeld,
) -> Result<(), GraphHeld> {
    // SAFETY: the caller's contract.
    let graph = match unsafe { current_capture(stream) } {
        // Id 0: the driver cannot tell captures apart; the graph is not
        // known to be the one the block was used in.
        Ok(Some(now)) if now.active && now.id == capture && capture != 0 => now.graph,
        _ => None,
    };
    let Some(graph) = graph else {
        return Err(held);
    };
    let held = Box::into_raw(Box::new(held));
    // SAFETY: `held` is a live allocation that the destructor takes back
    // (once: the object's one destructor call), on any thread, making no
    // CUDA call (`graph_done`). The flag is the one the driver requires.
    let made = unsafe {
        raw::user_object_create(
            held.cast(),
            Some(graph_done),
            1,
            sys::CUuserObject_flags_enum::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32,
        )
    };
    let object = match made {
        Ok(object) => object,
        Err(_) => {
            // SAFETY: made by `Box::into_raw` above; no object took it.
            return Err(*unsafe { Box::from_raw(held) });
        }
    };
    // CUDA does not synchronize calls on one graph: two threads whose streams
    // are joined in one capture may free into it at once. (Not the `kept`
    // lock, which the destructor takes.)
    static RETAIN: Mutex<()> = Mutex::new(());
    let moved = {
        let _one_at_a_time = RETAIN.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `graph` is the graph being captured on `stream`, live
        // while the capture is: no capture gpupool ends can end meanwhile
        // (`CAPTURES_ENDING`, read above), and one ended through the raw
        // handle is that `unsafe` call's contract (see `docs/safety.md`);
        // no other gpupool call on it runs now (`RETAIN`); the move gives it
        // the one reference this call owns.
        unsafe {
            raw::graph_retain_user_object(
                graph,
                object,
                1,
                sys::CUuserObjectRetain_flags_enum::CU_GRAPH_USER_OBJECT_MOVE as u32,
            )
        }
    };
    if moved.is_err() {
        // Taken to be still this call's reference (CUDA documents no partial
        // move on failure). Releasing it would run the destructor, which
        // gives the block back while the graph may use it: the reference is
        // never released, and the block stays kept for the life of the
        // process (`GraphHeld` is leaked with it; a copy of its fields goes
        // to the caller).
        // SAFETY: `held` is live (no destructor can run: the reference is
        // never released).
        let h = unsafe { &*held };
        return Err(GraphHeld { ..*h });
    }
    Ok(())
}

/// The destructor of a kept block's user object: CUDA calls it once, on one
/// of its own threads, when the last graph or executable graph holding the
/// object is gone and its launches are done. It may make no CUDA call: it
/// moves the block to the released list, for `trim_memory`.
unsafe extern "C" fn graph_done(held: *mut std::ffi::c_void) {
    // SAFETY: `held` is the pointer `hold_in_graph` gave the user object,
    // made by `Box::into_raw` and taken back only here, once (CUDA calls a
    // user object's destructor once).
    let held = unsafe { Box::from_raw(held.cast::<GraphHeld>()) };
    let mem = held.mem;
    mem.kept().released.push(*held);
}

/// The capture a stream is in, as the driver tells it.
#[derive(Copy, Clone, Debug)]
pub(crate) struct CaptureNow {
    /// Active (not invalidated).
    pub(crate) active: bool,
    /// The capture's id, unique in the process.
    pub(crate) id: u64,
    /// The graph being captured, where the driver gave it.
    pub(crate) graph: Option<sys::CUgraph>,
}

/// The capture `stream` is in (`cuStreamGetCaptureInfo`), or `None` when
/// it is in none. Where the driver exports no `cuStreamGetCaptureInfo`
/// (before CUDA 11.3), from `cuStreamIsCapturing`, with id 0 and no graph.
/// Like `cuStreamIsCapturing`, allowed in every capture mode and breaking
/// no capture.
///
/// # Safety
/// `stream` is a usable stream, with its context current if it is a special
/// stream.
pub(crate) unsafe fn current_capture(
    stream: StreamHandle,
) -> Result<Option<CaptureNow>, CudaError> {
    // SAFETY: the caller's contract.
    let Some(info) = (unsafe { raw::stream_get_capture_info(stream) }) else {
        // SAFETY: the caller's contract.
        let status = unsafe { CudaBackend::raw_capture_status(stream) }?;
        return Ok(status.is_capturing().then_some(CaptureNow {
            active: status == gpupool_core::CaptureStatus::Active,
            id: 0,
            graph: None,
        }));
    };
    let (status, id, graph) = info?;
    if status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Ok(None);
    }
    Ok(Some(CaptureNow {
        active: status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        id,
        graph: (!graph.is_null()).then_some(graph),
    }))
}
