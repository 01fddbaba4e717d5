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

/// A block of the global allocator: every kind's memory, stream-ordered or
/// not (nothing runs on the bare backend's streams, so now is in order).
#[inline]
fn host_alloc(size: usize, align: usize) -> Result<NonNull<u8>, BareError> {
    // SAFETY: the layout's size is not zero.
    NonNull::new(unsafe { std::alloc::alloc(layout(size, align)?) }).ok_or(BareError)
}

/// Frees a block of [`host_alloc`].
///
/// # Safety
///
/// `ptr` came from `host_alloc` with this size and alignment, and is freed
/// once.
#[inline]
unsafe fn host_free(ptr: NonNull<u8>, size: usize, align: usize) -> Result<(), BareError> {
    // SAFETY: the caller's promise.
    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout(size, align)?) };
    Ok(())
}

/// Methods that do nothing and succeed, each written `fn name(the types of
/// its arguments) -> T = value;`: its arguments unused, it returns
/// `Ok(value)`.
macro_rules! succeed {
    ($(fn $name:ident($($arg:ty),*) -> $t:ty = $v:expr;)+) => {
        $(fn $name(&self, $(_: $arg),*) -> Result<$t, BareError> {
            Ok($v)
        })+
    };
    ($(unsafe fn $name:ident($($arg:ty),*) -> $t:ty = $v:expr;)+) => {
        $(unsafe fn $name(&self, $(_: $arg),*) -> Result<$t, BareError> {
            Ok($v)
        })+
    };
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
    succeed! {
        fn device_count() -> u32 = 1;
        fn current_device() -> DeviceId = DeviceId(0);
    }
}

impl StreamBackend for Bare {
    fn create_stream(&self, _: DeviceId, _: StreamOptions) -> Result<StreamHandle, BareError> {
        // SAFETY: a number no other stream of this backend has, never zero.
        Ok(unsafe { StreamHandle::from_raw(self.handle()) })
    }
    succeed! {
        unsafe fn destroy_stream(StreamHandle, DeviceId) -> () = ();
        unsafe fn query_stream(StreamHandle, DeviceId) -> Completion = Completion::Complete;
        unsafe fn synchronize_stream(StreamHandle, DeviceId) -> () = ();
        unsafe fn stream_wait_event(StreamHandle, DeviceId, EventHandle) -> () = ();
        unsafe fn stream_device(StreamHandle) -> DeviceId = DeviceId(0);
    }
}

impl EventBackend for Bare {
    fn create_event(&self, _: DeviceId, _: EventFlags) -> Result<EventHandle, BareError> {
        // SAFETY: a number no other event of this backend has, never zero.
        Ok(unsafe { EventHandle::from_raw(self.handle()) })
    }
    succeed! {
        unsafe fn destroy_event(EventHandle, DeviceId) -> () = ();
        unsafe fn record_event(EventHandle, StreamHandle, DeviceId) -> () = ();
        unsafe fn query_event(EventHandle, DeviceId) -> Completion = Completion::Complete;
        unsafe fn synchronize_event(EventHandle, DeviceId) -> () = ();
    }
}

/// `allocate` and `deallocate` (`$alloc`, `$free`), or their stream-ordered
/// twins, which take a stream after the same arguments: every kind and device
/// alike, [`host_alloc`] and [`host_free`]. Nothing runs on the bare
/// backend's streams, so a block is in its stream's order at once.
macro_rules! block_calls {
    ([$($safety:tt)?] $alloc:ident, $free:ident $(, $stream:ty)?) => {
        $($safety)? fn $alloc(
            &self, _: MemoryKind, _: DeviceId, size: usize, align: usize, $(_: $stream)?
        ) -> Result<NonNull<u8>, BareError> {
            host_alloc(size, align)
        }
        unsafe fn $free(
            &self, _: MemoryKind, _: DeviceId, ptr: NonNull<u8>, size: usize, align: usize,
            $(_: $stream)?
        ) -> Result<(), BareError> {
            // SAFETY: the trait's contract: `ptr` came from `allocate` or
            // `allocate_async`, so from `host_alloc`, with this size and
            // alignment.
            unsafe { host_free(ptr, size, align) }
        }
    };
}

impl MemoryBackend for Bare {
    block_calls!([] allocate, deallocate);
    block_calls!([unsafe] allocate_async, deallocate_async, StreamHandle);
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
