//! A backend with no GPU and (almost) no cost: host memory from the global
//! allocator for every kind, streams and events that are numbers, every query
//! complete. What a round costs on it is gpupool's own code (the core), so two
//! builds' core costs can be compared on any machine, to the nanosecond; the
//! mock's hazard detector and CUDA's driver calls would drown a few
//! nanoseconds. Compiled against each build's core (`gpupool_core` is that
//! build's). Not a model of a GPU: nothing here is ordered.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpupool_core::{
    Backend, BackendId, Completion, DeviceId, EventBackend, EventFlags, EventHandle, MemoryBackend,
    MemoryKind, StreamBackend, StreamHandle, StreamOptions,
};

/// The bare backend's one error: a bad layout, or the global allocator out of
/// memory.
#[derive(Debug)]
pub struct BareError;

impl std::fmt::Display for BareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bare backend: bad layout or out of memory")
    }
}

impl std::error::Error for BareError {}

/// The bare backend (see the module's docs): one device, every call
/// succeeds at once.
pub struct Bare {
    id: BackendId,
    next_handle: AtomicUsize,
}

impl Bare {
    /// A backend with an id of its own.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Bare {
            id: BackendId::unique(),
            next_handle: AtomicUsize::new(16),
        }
    }

    fn handle(&self) -> usize {
        // Relaxed: a counter; only uniqueness matters.
        self.next_handle.fetch_add(16, Ordering::Relaxed)
    }
}

fn layout(size: usize, align: usize) -> Result<Layout, BareError> {
    Layout::from_size_align(size.max(1), align).map_err(|_| BareError)
}

// SAFETY: `id` is a unique id made once per value and never changes; the
// handles and addresses it hands out (numbers that are never a special stream,
// memory of the global allocator) are what its own `unsafe fn`s accept, and
// no other backend has its id.
unsafe impl Backend for Bare {
    type Error = BareError;
    fn id(&self) -> BackendId {
        self.id
    }
    fn device_count(&self) -> Result<u32, BareError> {
        Ok(1)
    }
    fn current_device(&self) -> Result<DeviceId, BareError> {
        Ok(DeviceId(0))
    }
}

impl StreamBackend for Bare {
    fn create_stream(&self, _: DeviceId, _: StreamOptions) -> Result<StreamHandle, BareError> {
        // SAFETY: a number no other stream of this backend has, never zero.
        Ok(unsafe { StreamHandle::from_raw(self.handle()) })
    }
    unsafe fn destroy_stream(&self, _: StreamHandle, _: DeviceId) -> Result<(), BareError> {
        Ok(())
    }
    unsafe fn query_stream(&self, _: StreamHandle, _: DeviceId) -> Result<Completion, BareError> {
        Ok(Completion::Complete)
    }
    unsafe fn synchronize_stream(&self, _: StreamHandle, _: DeviceId) -> Result<(), BareError> {
        Ok(())
    }
    unsafe fn stream_wait_event(
        &self,
        _: StreamHandle,
        _: DeviceId,
        _: EventHandle,
    ) -> Result<(), BareError> {
        Ok(())
    }
    unsafe fn stream_device(&self, _: StreamHandle) -> Result<DeviceId, BareError> {
        Ok(DeviceId(0))
    }
}

impl EventBackend for Bare {
    fn create_event(&self, _: DeviceId, _: EventFlags) -> Result<EventHandle, BareError> {
        // SAFETY: a number no other event of this backend has, never zero.
        Ok(unsafe { EventHandle::from_raw(self.handle()) })
    }
    unsafe fn destroy_event(&self, _: EventHandle, _: DeviceId) -> Result<(), BareError> {
        Ok(())
    }
    unsafe fn record_event(
        &self,
        _: EventHandle,
        _: StreamHandle,
        _: DeviceId,
    ) -> Result<(), BareError> {
        Ok(())
    }
    unsafe fn query_event(&self, _: EventHandle, _: DeviceId) -> Result<Completion, BareError> {
        Ok(Completion::Complete)
    }
    unsafe fn synchronize_event(&self, _: EventHandle, _: DeviceId) -> Result<(), BareError> {
        Ok(())
    }
}

impl MemoryBackend for Bare {
    fn allocate(
        &self,
        _: MemoryKind,
        _: DeviceId,
        size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, BareError> {
        // SAFETY: the layout's size is not zero.
        NonNull::new(unsafe { std::alloc::alloc(layout(size, align)?) }).ok_or(BareError)
    }
    unsafe fn deallocate(
        &self,
        _: MemoryKind,
        _: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) -> Result<(), BareError> {
        // SAFETY: the trait's contract: `ptr` came from `allocate` (or
        // `allocate_async`) with this size and alignment.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), layout(size, align)?) };
        Ok(())
    }
    unsafe fn allocate_async(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        size: usize,
        align: usize,
        _: StreamHandle,
    ) -> Result<NonNull<u8>, BareError> {
        self.allocate(kind, device, size, align)
    }
    unsafe fn deallocate_async(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        _: StreamHandle,
    ) -> Result<(), BareError> {
        // SAFETY: the trait's contract; nothing runs on the bare backend's
        // streams, so the block is free now.
        unsafe { self.deallocate(kind, device, ptr, size, align) }
    }
    unsafe fn copy_async(
        &self,
        dst: NonNull<u8>,
        src: NonNull<u8>,
        size: usize,
        _: StreamHandle,
        _: DeviceId,
    ) -> Result<(), BareError> {
        // SAFETY: the trait's contract: both blocks hold `size` bytes.
        unsafe { std::ptr::copy(src.as_ptr(), dst.as_ptr(), size) };
        Ok(())
    }
}
