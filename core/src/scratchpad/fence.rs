//! The fence of a kept host-visible block: [`Fence`], the idle-stream probe's
//! backoff, and the parts of `alloc` and `reset` that settle, record and drop fences.

use crate::backend::{Completion, DeviceId, EventFlags, EventHandle, MemoryKind, StreamHandle};
use crate::error::{BackendOp, Error};
use crate::monotonic::Upstream;

use super::{FirstError, KindState, ScratchBackend, Scratchpad};

/// How many resets of a kind skip the idle-stream question after it was
/// answered "busy".
const PROBE_BACKOFF: u8 = 7;

/// The event that fences a kept block of a host-visible kind. The event was
/// created by the scratchpad's backend on `device` and is owned by the
/// scratchpad alone (destroyed by it, never handed out).
#[derive(Copy, Clone)]
pub(super) struct Fence {
    pub(super) event: EventHandle,
    pub(super) device: DeviceId,
    /// Whether the kept block waits for the event (its cursor is paused
    /// meanwhile, so the fast path cannot hand it out).
    armed: bool,
}

impl Fence {
    /// The same event, with no block waiting on it.
    pub(super) fn disarmed(self) -> Fence {
        Fence {
            armed: false,
            ..self
        }
    }
}

impl<'b, B: ScratchBackend> Scratchpad<'b, B> {
    /// If the kept block of a kind waits on its fence: hand it out again if the
    /// event completed; otherwise release it in its stream order, so the next
    /// allocation takes a fresh block. A block whose release fails is kept,
    /// still fenced, and the error returned.
    #[inline]
    pub(super) fn settle_fence<U: Upstream<Error = B::Error>>(
        &self,
        st: &KindState,
        up: &U,
    ) -> Result<(), Error<B::Error>> {
        match st.fence.get() {
            Some(fence) if fence.armed => self.settle_armed_fence(st, up, fence),
            _ => Ok(()),
        }
    }

    /// [`settle_fence`](Self::settle_fence) of an armed fence (a reset
    /// round's path, not a new scratchpad's).
    #[inline(never)]
    fn settle_armed_fence<U: Upstream<Error = B::Error>>(
        &self,
        st: &KindState,
        up: &U,
        mut fence: Fence,
    ) -> Result<(), Error<B::Error>> {
        // SAFETY: the fence's event is the scratchpad's own (see `Fence`).
        let done = unsafe { self.backend.query_event(fence.event, fence.device) };
        if let Ok(Completion::Complete) = done {
            fence.armed = false;
            st.fence.set(Some(fence));
            st.res.resume();
            return Ok(());
        }
        // Still in use (or unknown): do not reuse; release in stream order.
        let next = st.res.reserved();
        let mut errors = FirstError::new();
        for block in st.res.take_blocks(next) {
            // SAFETY: the block came from this upstream and is forgotten by the
            // resource; the release order is a stream (fences exist only then),
            // so work still using it finishes first.
            if let Err(e) = unsafe { up.release(block) } {
                st.res.keep_block(block, true);
                errors.push(e);
            }
        }
        if errors.is_empty() {
            fence.armed = false;
            st.fence.set(Some(fence));
        }
        errors.result()
    }

    pub(super) fn reset_kind(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        errors: &mut FirstError<B::Error>,
    ) {
        let st = &self.kinds[kind.index()];
        let n = st.res.block_count();
        let fence = st.fence.get();
        if n == 0 {
            return;
        }
        let fit = st.note_round();
        let armed = fence.is_some_and(|f| f.armed);
        if n == 1 && !armed && st.res.used() == 0 {
            // Nothing was handed out of the block since the last reset, which
            // left it reusable: no work can have used it since, so there is
            // nothing to rewind, ask or fence.
            return;
        }
        // The stream a host-visible kind's block is released on: its reuse
        // needs that stream to have passed the reset. (Device memory is
        // allocated and released on the device order; host order is
        // reusable at once.)
        let release_stream = if kind.is_host_accessible() {
            self.release_order(kind).stream_and_device()
        } else {
            None
        };
        // A backend that proves host-visible blocks free in batches takes a
        // block back in stream order for less than one question to the
        // stream costs (`MemoryBackend::batches_host_reuse`).
        let batched = release_stream.is_some() && self.backend.batches_host_reuse();
        // (A round that a graph capture may have overlapped never comes
        // here: `reset` gives its blocks away instead, see `capture.rs`; so
        // the release stream is not capturing, and may be asked and fenced.)
        if n > 1 || armed || batched {
            // Release everything; next time one block that holds the largest
            // round (not the sum of the blocks: their unused tails and the
            // doubling are not needed again).
            let up = self.counting(kind, device);
            for block in st.res.take_blocks(fit) {
                // SAFETY: each block came from this upstream and is released
                // once, in the kind's release order.
                if let Err(e) = unsafe { up.release(block) } {
                    errors.push(e);
                }
            }
            if let Some(f) = fence {
                st.fence.set(Some(Fence { armed: false, ..f }));
            }
            self.note_held(kind);
            return;
        }
        st.res.rewind();
        let Some((stream, release_device)) = release_stream else {
            return; // device memory, or a host order: reusable now
        };
        // One question first: if the stream has finished everything queued on
        // it so far (the work of the rounds that used the block included), the
        // block is reusable now and needs no fence. A stream found busy is
        // not asked again for the next `PROBE_BACKOFF` resets (a loop that
        // resets while its kernels still run would pay the query for nothing
        // on every round); the fence is recorded straight away meanwhile.
        let skip = st.skip_probes.get();
        if skip == 0 {
            // SAFETY: the release order's stream is usable for the backend for
            // the scratchpad's whole life (checked at construction; the order
            // borrows its stream).
            let idle = unsafe { self.backend.query_stream(stream, release_device) };
            if let Ok(Completion::Complete) = idle {
                return;
            }
            st.skip_probes.set(PROBE_BACKOFF);
        } else {
            st.skip_probes.set(skip - 1);
        }
        self.fence_kept(kind, device, stream, release_device, errors);
    }

    /// Fences the kept block of a host-visible kind with an event recorded on
    /// its release stream; if that fails, releases the block instead.
    fn fence_kept(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        stream: StreamHandle,
        release_device: DeviceId,
        errors: &mut FirstError<B::Error>,
    ) {
        let st = &self.kinds[kind.index()];
        let fence = match st.fence.take() {
            Some(f) if f.device == release_device => f,
            other => {
                if let Some(old) = other {
                    // SAFETY: the old fence's event is the scratchpad's own,
                    // taken out of its cell here, never used again.
                    let destroyed = unsafe { self.backend.destroy_event(old.event, old.device) };
                    if let Err(source) = destroyed {
                        errors.push(Error::Backend {
                            op: BackendOp::DestroyEvent,
                            source,
                        });
                    }
                }
                match self
                    .backend
                    .create_event(release_device, EventFlags::DISABLE_TIMING)
                {
                    Ok(event) => Fence {
                        event,
                        device: release_device,
                        armed: false,
                    },
                    Err(source) => {
                        errors.push(Error::Backend {
                            op: BackendOp::CreateEvent,
                            source,
                        });
                        self.drop_kept(kind, device, errors);
                        return;
                    }
                }
            }
        };
        // SAFETY: the fence's event is the scratchpad's own, of
        // `release_device`; the stream is usable (see `reset_kind`).
        match unsafe {
            self.backend
                .record_event(fence.event, stream, release_device)
        } {
            Ok(()) => {
                st.fence.set(Some(Fence {
                    armed: true,
                    ..fence
                }));
                st.res.pause();
            }
            Err(source) => {
                st.fence.set(Some(fence));
                errors.push(Error::Backend {
                    op: BackendOp::RecordEvent,
                    source,
                });
                self.drop_kept(kind, device, errors);
            }
        }
    }

    /// Releases a kept block that could not be fenced (a failed release
    /// forgets the block: the error says it is still allocated).
    fn drop_kept(&self, kind: MemoryKind, device: DeviceId, errors: &mut FirstError<B::Error>) {
        let up = self.counting(kind, device);
        let st = &self.kinds[kind.index()];
        let total = st.res.reserved();
        for block in st.res.take_blocks(total) {
            // SAFETY: the block came from this upstream; released once, in the
            // kind's (stream) release order.
            if let Err(e) = unsafe { up.release(block) } {
                errors.push(e);
            }
        }
        self.note_held(kind);
    }
}
