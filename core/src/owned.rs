//! [`OwnedStream`] and [`OwnedEvent`]: a stream or an event owned by the
//! caller, outside any pool. Both have one shape, written once by
//! `owned_handle!`: the handle, its device and the id of the backend that made
//! it, checked constructors, accessors and a checked `destroy`.

use crate::backend::{BackendId, DeviceId, EventBackend, EventHandle, StreamBackend, StreamHandle};
use crate::capture::CaptureNote;
use crate::error::{BackendOp, Error, Rejected};

/// Defines an owned-handle type: `$name` holds a `$handle` of a
/// `$backend`, refused at construction by `$check`, destroyed with
/// `$destroy` (reported as `BackendOp::$op`); `$what` names it in the docs.
macro_rules! owned_handle {
    (
        $(#[$doc:meta])*
        pub struct $name:ident($handle:ident of $backend:ident, $what:literal);
        check: $check:ident, destroy: $destroy:ident, $op:ident, before: $before:ident;
        state: $(#[$state_doc:meta])* $state:ident: $state_ty:ty = $state_init:expr;
        $(#[$from_doc:meta])*
        from_raw_parts;
    ) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            /// A live handle of `owner` on `device`, accepted by `$check`
            /// (checked by every constructor), owned by this value alone.
            pub(crate) handle: $handle,
            pub(crate) device: DeviceId,
            pub(crate) owner: BackendId,
            $(#[$state_doc])*
            pub(crate) $state: $state_ty,
        }

        /// Two are equal when they own the same handle of the same device
        /// and backend (which a program holds at most once).
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                (self.handle, self.device, self.owner) == (other.handle, other.device, other.owner)
            }
        }

        impl Eq for $name {}

        impl $name {
            $(#[$from_doc])*
            pub unsafe fn from_raw_parts<B: $backend>(
                backend: &B,
                handle: $handle,
                device: DeviceId,
            ) -> Result<Self, Error<B::Error>> {
                $check(handle)?;
                Ok($name {
                    handle,
                    device,
                    owner: backend.id(),
                    $state: $state_init,
                })
            }

            /// The raw handle.
            pub fn handle(&self) -> $handle {
                self.handle
            }

            #[doc = concat!("The device the ", $what, " belongs to.")]
            pub fn device(&self) -> DeviceId {
                self.device
            }

            #[doc = concat!("The backend the ", $what, " belongs to.")]
            pub fn backend_id(&self) -> BackendId {
                self.owner
            }

            /// Gives up ownership and returns the raw handle; the caller destroys it.
            pub fn into_raw(self) -> $handle {
                self.handle
            }

            #[doc = concat!("Destroys the ", $what, ". On failure (a backend of another")]
            /// [`BackendId`]: [`Error::ForeignHandle`], nothing called; a stream
            /// still in a graph capture: [`Error::StreamCapturing`]; a failed
            #[doc = concat!("destroy) the ", $what, " comes back with the error.")]
            pub fn destroy<B: $backend>(
                self,
                backend: &B,
            ) -> Result<(), Rejected<$name, B::Error>> {
                if backend.id() != self.owner {
                    return Err(Rejected {
                        value: self,
                        error: Error::ForeignHandle,
                    });
                }
                if let Err(error) = $before(&self, backend) {
                    return Err(Rejected { value: self, error });
                }
                // SAFETY: `self` owns a live handle of `device`, made by a
                // backend of this id (checked above), and is consumed here.
                match unsafe { backend.$destroy(self.handle, self.device) } {
                    Ok(()) => Ok(()),
                    Err(source) => Err(Rejected {
                        value: self,
                        error: Error::Backend {
                            op: BackendOp::$op,
                            source,
                        },
                    }),
                }
            }
        }

        static_assertions::assert_impl_all!($name: Send, Sync);
    };
}

owned_handle! {
    /// A stream owned by the caller, outside any pool: what
    /// [`StreamLease::detach`](crate::StreamLease::detach) hands out and
    /// [`StreamPool::put`](crate::StreamPool::put) takes back.
    ///
    /// It is not `Clone`, so one stream cannot be put into a pool twice through it.
    /// It knows the backend that made it ([`BackendId`]): a pool or backend of
    /// another id refuses it with [`Error::ForeignHandle`]. Dropping it neither
    /// destroys the stream nor returns it: pass it to
    /// [`StreamPool::put`](crate::StreamPool::put) or [`OwnedStream::destroy`].
    #[must_use = "dropping an OwnedStream leaks the stream: put it back or destroy it"]
    pub struct OwnedStream(StreamHandle of StreamBackend, "stream");
    check: check_poolable, destroy: destroy_stream, DestroyStream, before: not_capturing;
    state:
        /// What gpupool knows of the stream's graph captures (see
        /// `capture.rs`); an adopted stream starts as one that may be in a
        /// capture, since gpupool did not see its past.
        capture: CaptureNote = CaptureNote::with_epoch(2);
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
    from_raw_parts;
}

owned_handle! {
    /// An event owned by the caller, outside any pool: what
    /// [`EventLease::detach`](crate::EventLease::detach) hands out and
    /// [`EventPool::put`](crate::EventPool::put) takes back. Not `Clone`; dropping
    /// it neither destroys nor returns the event. It knows the backend that made it:
    /// a pool or backend of another [`BackendId`] refuses it with
    /// [`Error::ForeignHandle`].
    #[must_use = "dropping an OwnedEvent leaks the event: put it back or destroy it"]
    pub struct OwnedEvent(EventHandle of EventBackend, "event");
    check: check_not_null, destroy: destroy_event, DestroyEvent, before: nothing_before;
    state:
        /// The event's last record (through gpupool) was made on a
        /// capturing stream: it goes back to no pool (see
        /// [`Error::CapturedEvent`]). An adopted event's past is the
        /// caller's (its contract).
        captured: bool = false;
    /// Takes ownership of a raw event of `backend` created on `device` (CUDA
    /// cannot tell an event's device, so the caller says it). The null handle
    /// is refused.
    ///
    /// # Safety
    /// The caller hands the event over, as with `File::from_raw_fd`:
    /// 1. `handle` is a live event created on `device` by a backend with
    ///    `backend`'s [`id`](crate::Backend::id);
    /// 2. nothing else owns it or will use it as its own from now on (a pool
    ///    that took it twice would lease one event to two users).
    from_raw_parts;
}

impl OwnedStream {
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
            capture: CaptureNote::with_epoch(2),
        })
    }
}

/// Refuses to destroy a stream in a graph capture ([`Error::StreamCapturing`]:
/// destroying it would break the capture), asked only where it may be (its
/// note was ever bumped). The stream belongs to `backend` (checked before).
fn not_capturing<B: StreamBackend>(
    stream: &OwnedStream,
    backend: &B,
) -> Result<(), Error<B::Error>> {
    if !stream.capture.ever() {
        return Ok(());
    }
    // SAFETY: `stream` owns a live stream of `backend`'s id (checked by the
    // caller) on its device.
    match unsafe { backend.capture_status(stream.handle, stream.device) } {
        Ok(status) if status.is_capturing() => Err(Error::StreamCapturing),
        Ok(_) => Ok(()),
        Err(source) => Err(Error::Backend {
            op: BackendOp::CaptureStatus,
            source,
        }),
    }
}

/// Nothing to check before destroying an event (a captured one included:
/// the graph does not refer to the event itself).
fn nothing_before<B: EventBackend>(_: &OwnedEvent, _: &B) -> Result<(), Error<B::Error>> {
    Ok(())
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

/// Refuses the null event.
fn check_not_null<E>(handle: EventHandle) -> Result<(), Error<E>> {
    if handle.is_null() {
        Err(Error::NullHandle)
    } else {
        Ok(())
    }
}
