//! [`MemoryBackend`] for [`MockBackend`]: each call on the machine's state
//! (`memory_calls.rs`), through the same call path as the other traits.

use super::*;

/// Memory: see the crate documentation's model. Every kind is host memory from
/// `std::alloc`; every check failure is logged as a misuse and has no effect.
///
/// Every method is sound for any handle and any address of a block: it
/// validates them and reports a misuse or returns an error; the `unsafe` is
/// the trait's, for real drivers. Two obligations stay with the caller, as the
/// mock cannot check memory it does not own (see [`MockBackend`'s safety
/// section](MockBackend#safety-of-the-trait-methods)): nothing uses a block
/// after a successful free, and a `copy_async` source outside every block of
/// the mock is valid for `size` bytes.
impl MemoryBackend for MockBackend {
    /// As set by [`MockBackend::set_batches_host_reuse`] (`false` by
    /// default).
    fn batches_host_reuse(&self) -> bool {
        read(&self.inner.state).batches_host_reuse
    }

    /// Checks the device, then the layout (a zero size or an alignment that
    /// is not a power of two is [`MockError::InvalidLayout`]).
    fn allocate(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, MockError> {
        self.call(CallKind::Allocate, |st| {
            st.allocate(kind, device, size, align, None)
        })
    }

    /// Frees at once. A free of a block that queued work still uses is
    /// recorded as a [`Hazard`](crate::Hazard) and goes ahead.
    unsafe fn deallocate(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) -> Result<(), MockError> {
        let given = BlockLayout::new(kind, device, size, align);
        self.call(CallKind::Deallocate, |st| st.deallocate(given, ptr))
    }

    /// As [`allocate`](Self::allocate), after checking that `stream` belongs
    /// to `device`. The block is usable at once. On a capturing stream it is
    /// a graph allocation of the capture, and the allocation an item of it
    /// (see [Capture](crate#capture)).
    unsafe fn allocate_async(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        size: usize,
        align: usize,
        stream: StreamHandle,
    ) -> Result<NonNull<u8>, MockError> {
        self.call(CallKind::AllocateAsync, |st| {
            st.allocate(kind, device, size, align, Some(stream))
        })
    }

    /// The block becomes free-pending at `stream`'s current position and goes
    /// back to `std::alloc` once the stream has passed it. On a capturing
    /// stream it is an item of the capture instead, and the block stays
    /// allocated, reserved for the graph, until the graph is dropped (device
    /// memory must be a graph allocation of that capture: see
    /// [Capture](crate#capture)).
    unsafe fn deallocate_async(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        stream: StreamHandle,
    ) -> Result<(), MockError> {
        let given = BlockLayout::new(kind, device, size, align);
        self.free_in_order(given, ptr, stream, false)
    }

    /// Gives the block to capture `capture` of `stream`: the capture's own
    /// allocation is freed by the graph (a free node), any other block held
    /// for the graph and freed when the graph is dropped (or when a failed
    /// capture ends). If `stream` is no longer in that capture, kept as by
    /// [`keep_for_ended_captures`](MemoryBackend::keep_for_ended_captures).
    unsafe fn keep_for_graph(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        stream: StreamHandle,
        capture: u64,
    ) -> Result<(), MockError> {
        let given = BlockLayout::new(kind, device, size, align);
        self.call_on(CallKind::KeepForGraph, &[stream.as_raw()], |st| {
            st.keep_for_graph(given, ptr, stream, capture)
        })
    }

    /// Keeps the block for the graphs that may use it: only graphs' work may
    /// touch it from now on, and it is freed once no live graph (nor an open
    /// capture) has an item that uses its range, at once if none has. A
    /// graph's own allocation is left to its graph. Refused like a free
    /// (a block that is not live, or of another layout).
    unsafe fn keep_for_ended_captures(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) -> Result<(), MockError> {
        let given = BlockLayout::new(kind, device, size, align);
        self.call(CallKind::KeepForGraph, |st| {
            st.keep_for_ended_captures(given, ptr)
        })
    }

    /// Copies the bytes **at once** (so a round trip is observable as soon as
    /// the call returns) and queues one work item on `stream` that uses both
    /// ranges until it completes. On a capturing stream, after the same
    /// checks, it is an item of the capture and copies nothing. `dst` must lie inside a live block; `src`
    /// inside a live block or outside every block (foreign host memory, not
    /// tracked); the ranges must not overlap. A range of a block the mock
    /// has freed (and still remembers), or of a graph's block outside the
    /// graph, is refused (see [Refusals](crate#refusals)).
    unsafe fn copy_async(
        &self,
        dst: NonNull<u8>,
        src: NonNull<u8>,
        size: usize,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<(), MockError> {
        self.call(CallKind::CopyAsync, |st| {
            let (to, from) = (dst.as_ptr().addr(), src.as_ptr().addr());
            if !st.copy_async(to, from, size, stream, device)? {
                // Captured into a graph: nothing runs now.
                return Ok(());
            }
            // SAFETY: the trait's contract makes `src` valid for reads and
            // `dst` valid for writes of `size` bytes (every kind is host
            // memory in this mock) until the copy has run, which is now. The
            // checks above found `dst` inside a live block of this mock, `src`
            // inside one or outside every block it tracks or remembers (so
            // never in memory the mock freed while it can tell), and the
            // ranges disjoint, which `copy_nonoverlapping` requires; we hold
            // the state's write lock, so no free of this mock can run
            // meanwhile.
            // `u8` needs no alignment.
            unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), size) };
            Ok(())
        })
    }
}
