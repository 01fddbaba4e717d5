//! The end of a round that a capture may have overlapped: what the
//! scratchpad's streams are capturing now, how the round ended
//! ([`RoundEnd`]), and where its memory goes then.

use crate::backend::{DeviceId, MemoryKind, StreamHandle};
use crate::error::{BackendOp, Error};
use crate::order::AccessOrder;

use super::super::{FirstError, ScratchBackend, Scratchpad};

/// What the scratchpad's streams are capturing now.
#[derive(Copy, Clone)]
pub(super) enum Capturing<'b> {
    /// Nothing.
    None,
    /// One capture (this order's stream is in it, with this id).
    One(AccessOrder<'b>, u64),
    /// Different captures, or captures a backend cannot tell apart.
    Several,
}

/// The capture `orders` are in now (only those that may be are asked, each
/// once): `Ok(None)` if none is, [`Capturing::One`] if every one that is
/// capturing is in the same capture (the order one of them), and
/// [`Capturing::Several`] if they are in different captures.
pub(super) fn capturing_now<'b, B: ScratchBackend>(
    backend: &B,
    orders: [AccessOrder<'b>; 3],
) -> Result<Capturing<'b>, Error<B::Error>> {
    let mut found = Capturing::None;
    for (i, o) in orders.iter().enumerate() {
        if orders[..i].contains(o) || !o.may_capture() {
            continue;
        }
        // SAFETY: every order of a scratchpad is usable for its backend for
        // the scratchpad's whole life (checked at construction, before this
        // is first asked; each borrows its stream).
        let Some(id) = (unsafe { o.capture(backend) })? else {
            continue;
        };
        found = match found {
            Capturing::None => Capturing::One(*o, id),
            Capturing::One(first, first_id) if first_id == id && id != 0 => {
                Capturing::One(first, first_id)
            }
            _ => Capturing::Several,
        };
    }
    Ok(found)
}

/// How a round ended, as far as graph captures go.
#[derive(Copy, Clone)]
pub(in crate::scratchpad) enum RoundEnd<'b> {
    /// No capture overlapped it: its memory is reused as usual.
    Clean,
    /// One capture overlapped it and is still open, on this order's stream,
    /// with this id ([`capture_id`](crate::StreamBackend::capture_id)): its
    /// memory goes to that capture's graph.
    InCapture(AccessOrder<'b>, u64),
    /// A capture overlapped it and may have ended: its memory is kept from
    /// everybody.
    AfterCapture,
}

impl<'b, B: ScratchBackend> Scratchpad<'b, B> {
    /// The capture the scratchpad's stream orders are in now (see
    /// [`capturing_now`]).
    fn capturing_now(&self) -> Result<Capturing<'b>, Error<B::Error>> {
        capturing_now(self.backend, self.stream_orders())
    }

    /// Begins a round (see [`Watch::begin_round`]).
    pub(in crate::scratchpad) fn begin_round(&self) -> Result<(), Error<B::Error>> {
        self.watch.begin_round(self.backend, self.stream_orders())
    }

    /// How the round ends (see [`RoundEnd`]). Precise only where it can be:
    /// the capture open now is the one that overlapped the round if the
    /// round began in it and no note moved since, or if it began outside and
    /// exactly one bump happened (the stream began or joined this capture).
    /// Anything else that is not quiet, or a stream that cannot be asked,
    /// is [`RoundEnd::AfterCapture`].
    pub(in crate::scratchpad) fn round_end(
        &self,
        errors: &mut FirstError<B::Error>,
    ) -> RoundEnd<'b> {
        let w = &self.watch;
        if self.watch.quiet() {
            return RoundEnd::Clean;
        }
        let now = match self.capturing_now() {
            Ok(now) => now,
            Err(e) => {
                errors.push(e);
                return RoundEnd::AfterCapture;
            }
        };
        let (start_epochs, start_captured, start_capture, start_beginning, graph_mode) =
            w.read(|st| {
                (
                    st.start_epochs,
                    st.start_captured,
                    st.start_capture,
                    st.start_beginning,
                    st.graph.is_some(),
                )
            });
        let moved = self
            .watch
            .epochs()
            .and_then(|e| e.checked_sub(start_epochs));
        match (now, start_captured, moved) {
            // The capture the round began in, still open, and no other
            // began or was joined since.
            (Capturing::One(o, id), true, Some(0)) if start_capture == Some(id) => {
                RoundEnd::InCapture(o, id)
            }
            // The round began outside, and since then one capture was
            // joined, or begun (both halves of its note), from a start where
            // none was being begun: the one open now. Or one half only: the
            // beginning under way when the round began, or under way now
            // (the stream asked capturing: begun).
            (Capturing::One(o, id), false, Some(2)) if !start_beginning => {
                RoundEnd::InCapture(o, id)
            }
            (Capturing::One(o, id), false, Some(1)) => RoundEnd::InCapture(o, id),
            // Only streams gpupool cannot see, asked at both ends, never
            // capturing: their contract excludes a capture begun and ended
            // in between (and the device kind says whether one allocated).
            (Capturing::None, false, Some(0)) if !graph_mode => RoundEnd::Clean,
            _ => RoundEnd::AfterCapture,
        }
    }

    /// The end of the round for `kind`: `end`, or [`RoundEnd::Clean`] if
    /// the kind took all its memory of this round after the capture that
    /// overlapped the round had ended (`KindState::after_capture`) and no
    /// note moved since the round began. Pageable host memory never reaches
    /// a graph: always clean.
    pub(in crate::scratchpad) fn kind_round_end(
        &self,
        kind: MemoryKind,
        end: RoundEnd<'b>,
    ) -> RoundEnd<'b> {
        let bit = 1 << kind.index();
        let (after_capture, start_epochs) =
            self.watch.read(|st| (st.after_capture, st.start_epochs));
        let after = after_capture & bit != 0 && self.watch.settled_epochs() == Some(start_epochs);
        match end {
            _ if kind == MemoryKind::Host => RoundEnd::Clean,
            RoundEnd::AfterCapture if after => RoundEnd::Clean,
            end => end,
        }
    }

    /// Before `kind` takes a block from upstream in a round that is not
    /// quiet while it holds none: if no watched stream is capturing any
    /// more and no note moved since the round began, nothing of this round
    /// of `kind` was handed out during the capture (it held no memory), so
    /// its memory of the round is clean (`KindState::after_capture`). Asks
    /// the watched streams once per kind and round, only in such a round.
    pub(in crate::scratchpad) fn note_first_block(
        &self,
        kind: MemoryKind,
    ) -> Result<(), Error<B::Error>> {
        let w = &self.watch;
        let bit = 1 << kind.index();
        // Only a round that began in a capture can take memory after it
        // (one that began outside and saw a capture begin moved a note); a
        // quiet round has no state.
        if kind == MemoryKind::Host || self.watch.quiet() {
            return Ok(());
        }
        let (start_captured, after_capture, start_epochs) =
            w.read(|st| (st.start_captured, st.after_capture, st.start_epochs));
        if !start_captured
            || after_capture & bit != 0
            || self.kinds[kind.index()].res.block_count() > 0
            || self.watch.settled_epochs() != Some(start_epochs)
        {
            return Ok(());
        }
        if matches!(self.capturing_now()?, Capturing::None) {
            w.with_state(|st| st.after_capture |= bit);
        }
        Ok(())
    }

    /// Gives every block of `kind` away at the end of a round that a
    /// capture overlapped (`end` is not [`RoundEnd::Clean`]): to the open
    /// capture, or kept from everybody. A block that cannot be given is
    /// forgotten (the error says it is still allocated: never reused).
    pub(in crate::scratchpad) fn retire_kind(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        end: RoundEnd<'b>,
        errors: &mut FirstError<B::Error>,
    ) {
        let st = &self.kinds[kind.index()];
        let fit = st.note_round();
        for block in st.res.take_blocks(fit) {
            let given = match end {
                // The backend frees the capture's own allocations in the
                // capture (free nodes) and keeps the rest for its graph, if
                // the stream is still in that capture; else keeps them all.
                RoundEnd::InCapture(o, capture) => {
                    let stream = o.stream_handle().unwrap_or(StreamHandle::NULL);
                    // SAFETY: the block came from this upstream with these
                    // arguments and is not used by gpupool again; `stream`
                    // is the stream of a scratchpad order (usable for the
                    // scratchpad's life), of the scratchpad's device.
                    self.count_release(unsafe {
                        block.keep_for_graph(self.backend, kind, device, stream, capture)
                    })
                }
                // SAFETY: the block came from this upstream with these
                // arguments and is not used by gpupool again.
                _ => self.count_release(unsafe {
                    self.backend.keep_for_ended_captures(
                        kind,
                        device,
                        block.ptr,
                        block.size,
                        block.align,
                    )
                }),
            };
            if let Err(e) = given {
                errors.push(e);
            }
        }
        if let Some(f) = st.fence.get() {
            st.fence.set(Some(f.disarmed()));
        }
        if kind == MemoryKind::Device && self.watch.graph().is_some() {
            self.watch.with_state(|st| st.graph = None);
        }
        self.note_held(kind);
    }

    /// Counts a block given away outside the upstream (kept for graphs).
    fn count_release(&self, given: Result<(), B::Error>) -> Result<(), Error<B::Error>> {
        given.map_err(Error::backend(BackendOp::KeepForGraph))?;
        self.upstream_releases.set(self.upstream_releases.get() + 1);
        self.kept_for_graphs.set(self.kept_for_graphs.get() + 1);
        Ok(())
    }

    /// The device kind in graph mode (it holds a block the capture
    /// allocated): whether that capture goes on. If it has ended (or a note
    /// moved, so that gpupool cannot tell), the kind's blocks are retired
    /// and graph mode ends.
    pub(in crate::scratchpad) fn graph_round_goes_on(&self) -> Result<bool, Error<B::Error>> {
        let Some((since, before, capture)) = self.watch.graph() else {
            return Ok(false);
        };
        // SAFETY: the device order is usable for the backend for the
        // scratchpad's life (checked at construction; it borrows its stream).
        let now = unsafe { self.device_order.capture(self.backend) }?;
        if now == Some(capture) && self.watch.settled_epochs() == Some(since) {
            return Ok(true);
        }
        // The capture has ended (or gpupool cannot tell that it goes on):
        // the graph's own blocks are never handed out again, and slices
        // into them (this is the middle of a round) are refused by the
        // copies from now on. The kind's cursor stays paused, so its next
        // allocation takes a fresh block; every block of the kind is given
        // away when the round ends (it is not quiet).
        let st = &self.kinds[MemoryKind::Device.index()];
        let blocks = st.res.blocks();
        self.watch.with_state(|state| {
            state.retired.extend(
                blocks[before.min(blocks.len())..]
                    .iter()
                    .map(|b| (b.ptr.as_ptr().addr(), b.ptr.as_ptr().addr() + b.size)),
            );
            state.graph = None;
        });
        st.res.pause();
        Ok(false)
    }

    /// `Err(GraphMemory)` if `[addr, addr + len)` lies in a device block of
    /// a capture that ended during this round (see
    /// [`graph_round_goes_on`](Self::graph_round_goes_on), which is asked
    /// first, so that a capture that ended since the last allocation is
    /// seen).
    pub(in crate::scratchpad) fn check_not_retired(
        &self,
        addr: usize,
        len: usize,
        device: DeviceId,
    ) -> Result<(), Error<B::Error>> {
        let _ = device;
        self.graph_round_goes_on()?;
        let hit = self
            .watch
            .read(|st| st.retired.iter().any(|&(s, e)| addr < e && s < addr + len));
        if hit {
            return Err(Error::GraphMemory);
        }
        Ok(())
    }

    /// After the device kind took `block` from upstream: if the device
    /// order is capturing, the block is the graph's allocation, and the
    /// kind enters graph mode (its cursor paused, see the module
    /// documentation). Asked only where the device order may capture.
    #[cold]
    #[inline(never)]
    pub(in crate::scratchpad) fn note_device_block(
        &self,
        block_taken: bool,
    ) -> Result<(), Error<B::Error>> {
        let st = &self.kinds[MemoryKind::Device.index()];
        if block_taken {
            // A retired graph block that the backend freed (its graph is
            // gone) may come back as this one: its range is this block's now.
            if let Some(b) = st.res.blocks().last() {
                let (start, end) = (b.ptr.as_ptr().addr(), b.ptr.as_ptr().addr() + b.size);
                if self.watch.read(|st| !st.retired.is_empty()) {
                    self.watch
                        .with_state(|st| st.retired.retain(|&(s, e)| e <= start || end <= s));
                }
            }
        }
        if !block_taken || self.watch.graph().is_some() {
            if self.watch.graph().is_some() {
                st.res.pause();
            }
            return Ok(());
        }
        // SAFETY: as in `graph_round_goes_on`.
        if let Some(capture) = unsafe { self.device_order.capture(self.backend) }? {
            let before = st.res.block_count() - 1;
            // (A saturated note ends graph mode at the next allocation.)
            let epochs = self.watch.settled_epochs().unwrap_or(u64::MAX);
            self.watch
                .with_state(|st| st.graph = Some((epochs, before, capture)));
            st.res.pause();
        }
        Ok(())
    }

    /// Bumps `bytes` in the device kind's current block in graph mode,
    /// where its cursor is paused.
    pub(in crate::scratchpad) fn graph_bump(
        &self,
        bytes: usize,
        align: usize,
    ) -> Option<core::ptr::NonNull<u8>> {
        let res = &self.kinds[MemoryKind::Device.index()].res;
        res.resume();
        let p = res.try_bump(bytes, align);
        res.pause();
        p
    }
}
