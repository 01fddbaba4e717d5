//! The backend traits' forwarding impls: a reference, an `Arc` or a `Box` of
//! a backend is that backend, every call passed through unchanged.

use core::ptr::NonNull;

use super::traits::{
    Backend, CaptureBackend, EventBackend, MemoryBackend, MemoryKind, StreamBackend,
};
use super::{
    BackendId, CaptureMode, CaptureStatus, Completion, DeviceId, EventFlags, EventHandle,
    StreamHandle, StreamOptions,
};

macro_rules! forward_backend {
    ($($ptr:ty),*) => {$(
        // SAFETY: the pointee's id and handles, unchanged.
        unsafe impl<B: Backend + ?Sized> Backend for $ptr {
            type Error = B::Error;
            fn id(&self) -> BackendId { (**self).id() }
            fn device_count(&self) -> Result<u32, Self::Error> { (**self).device_count() }
            fn current_device(&self) -> Result<DeviceId, Self::Error> { (**self).current_device() }
        }
        // SAFETY (every forwarded `unsafe fn` below): the caller's guarantees
        // are about the handles and the backend's id, which the pointee shares.
        impl<B: StreamBackend + ?Sized> StreamBackend for $ptr {
            fn create_stream(&self, d: DeviceId, o: StreamOptions) -> Result<StreamHandle, Self::Error> {
                (**self).create_stream(d, o)
            }
            unsafe fn destroy_stream(&self, s: StreamHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).destroy_stream(s, d) }
            }
            unsafe fn query_stream(&self, s: StreamHandle, d: DeviceId) -> Result<Completion, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).query_stream(s, d) }
            }
            unsafe fn synchronize_stream(&self, s: StreamHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).synchronize_stream(s, d) }
            }
            unsafe fn stream_wait_event(&self, s: StreamHandle, d: DeviceId, e: EventHandle) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).stream_wait_event(s, d, e) }
            }
            unsafe fn stream_device(&self, s: StreamHandle) -> Result<DeviceId, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).stream_device(s) }
            }
            unsafe fn capture_status(&self, s: StreamHandle, d: DeviceId) -> Result<CaptureStatus, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).capture_status(s, d) }
            }
            unsafe fn capture_id(&self, s: StreamHandle, d: DeviceId) -> Result<Option<u64>, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).capture_id(s, d) }
            }
            unsafe fn stream_id(&self, s: StreamHandle, d: DeviceId) -> Result<Option<u64>, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).stream_id(s, d) }
            }
        }
        impl<B: EventBackend + ?Sized> EventBackend for $ptr {
            fn create_event(&self, d: DeviceId, f: EventFlags) -> Result<EventHandle, Self::Error> {
                (**self).create_event(d, f)
            }
            unsafe fn destroy_event(&self, e: EventHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).destroy_event(e, d) }
            }
            unsafe fn record_event(&self, e: EventHandle, s: StreamHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).record_event(e, s, d) }
            }
            unsafe fn query_event(&self, e: EventHandle, d: DeviceId) -> Result<Completion, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).query_event(e, d) }
            }
            unsafe fn synchronize_event(&self, e: EventHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).synchronize_event(e, d) }
            }
            fn prepare_query_thread(&self) {
                (**self).prepare_query_thread()
            }
            fn relaxed_queries(&self, queries: &mut dyn FnMut()) {
                (**self).relaxed_queries(queries)
            }
        }
    )*};
}

forward_backend!(&B, alloc::sync::Arc<B>, alloc::boxed::Box<B>);

macro_rules! forward_capture {
    ($($ptr:ty),*) => {$(
        // SAFETY (the forwarded `unsafe fn`s): the caller's guarantees are
        // about the handles and the backend's id, which the pointee shares.
        impl<B: CaptureBackend + ?Sized> CaptureBackend for $ptr {
            type Graph = B::Graph;
            unsafe fn begin_capture(&self, s: StreamHandle, d: DeviceId, m: CaptureMode) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).begin_capture(s, d, m) }
            }
            unsafe fn end_capture(&self, s: StreamHandle, d: DeviceId) -> Result<Self::Graph, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).end_capture(s, d) }
            }
        }
    )*};
}

forward_capture!(&B, alloc::sync::Arc<B>, alloc::boxed::Box<B>);

macro_rules! forward_memory {
    ($($ptr:ty),*) => {$(
        impl<B: MemoryBackend + ?Sized> MemoryBackend for $ptr {
            fn allocate(&self, k: MemoryKind, d: DeviceId, size: usize, align: usize) -> Result<NonNull<u8>, Self::Error> {
                (**self).allocate(k, d, size, align)
            }
            unsafe fn deallocate(&self, k: MemoryKind, d: DeviceId, p: NonNull<u8>, size: usize, align: usize) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).deallocate(k, d, p, size, align) }
            }
            unsafe fn allocate_async(&self, k: MemoryKind, d: DeviceId, size: usize, align: usize, s: StreamHandle) -> Result<NonNull<u8>, Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).allocate_async(k, d, size, align, s) }
            }
            unsafe fn deallocate_async(&self, k: MemoryKind, d: DeviceId, p: NonNull<u8>, size: usize, align: usize, s: StreamHandle) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).deallocate_async(k, d, p, size, align, s) }
            }
            unsafe fn copy_async(&self, dst: NonNull<u8>, src: NonNull<u8>, size: usize, s: StreamHandle, d: DeviceId) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).copy_async(dst, src, size, s, d) }
            }
            unsafe fn keep_for_graph(&self, k: MemoryKind, d: DeviceId, p: NonNull<u8>, size: usize, align: usize, s: StreamHandle, c: u64) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).keep_for_graph(k, d, p, size, align, s, c) }
            }
            unsafe fn keep_for_ended_captures(&self, k: MemoryKind, d: DeviceId, p: NonNull<u8>, size: usize, align: usize) -> Result<(), Self::Error> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).keep_for_ended_captures(k, d, p, size, align) }
            }
            fn batches_host_reuse(&self) -> bool {
                (**self).batches_host_reuse()
            }
        }
    )*};
}

forward_memory!(&B, alloc::sync::Arc<B>, alloc::boxed::Box<B>);
