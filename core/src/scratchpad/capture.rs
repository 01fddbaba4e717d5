//! A scratchpad across graph captures: what it watches of its orders'
//! captures ([`Watch`]), how it tells at the end of a round whether a graph
//! may use the round's memory ([`RoundEnd`]), and what it does with that
//! memory then. The rules it keeps are in `docs/graph-capture.md`.
//!
//! A round is the time between two resets (or construction and the first
//! reset, or the last reset and the drop). Memory handed out in a round is
//! used by the work the caller issues with it; if a stream of the
//! scratchpad's orders was in a graph capture at any time during the round,
//! some of that work may be the graph's, replayed whenever the graph is
//! launched, so the round's blocks must not be reused (nor freed to be
//! reused by others) while the graph can run:
//! - a round that ends while the capture is still open gives its blocks to
//!   that capture (freed in its stream's order, which keeps them for the
//!   graph, or [`keep_for_graph`](crate::MemoryBackend::keep_for_graph)):
//!   the graph holds them, and they come back once it is gone;
//! - a round that ends after the capture has ended cannot give them to its
//!   graph any more:
//!   [`keep_for_ended_captures`](crate::MemoryBackend::keep_for_ended_captures)
//!   keeps them from everybody (for the life of the process on CUDA).
//!
//! Whether a capture overlapped the round comes from the orders' capture
//! notes (`crate::capture`), whose epochs every gpupool way into a capture
//! bumps: the sum of the epochs at the start of the round and at its end
//! differ, or a stream was capturing at the start. The check at a reset is
//! that one comparison; a stream is asked (`capture_status`) only if its
//! note was ever bumped.
//!
//! Device memory taken from upstream on a capturing stream is the graph's
//! own allocation, valid only while the graph's work runs. While the device
//! kind holds such a block its cursor stays paused, so that every
//! allocation asks whether the capture goes on: once it has ended, the
//! kind's blocks are retired (kept, never handed out again) and a fresh
//! block is taken. This costs one backend question per allocation, only
//! while a capture is being recorded (once, before a graph's many replays).

use alloc::vec::Vec;
use core::cell::Cell;

use crate::backend::{DeviceId, MemoryKind, StreamHandle};
use crate::capture::CaptureNote;
use crate::error::{BackendOp, Error};
use crate::monotonic::Upstream;
use crate::order::AccessOrder;

use super::{FirstError, ScratchBackend, Scratchpad, ScratchpadConfig};

/// What a scratchpad watches of its orders' graph captures.
pub(super) struct Watch<'b> {
    /// The capture notes of its stream orders (the device order, the pinned
    /// and managed release orders), where they have one, each once.
    notes: [Option<&'b CaptureNote>; 3],
    /// An order's captures are unseen by gpupool
    /// ([`AccessOrder::from_raw_capturable`]): its stream is asked at every
    /// round's end.
    unseen: bool,
    /// No note and nothing unseen (host order, `from_raw` orders, the null
    /// and legacy streams): no round can overlap a capture, and every check
    /// is this one flag.
    passive: bool,
    /// The sum of the notes' epochs when the round began.
    start_epochs: Cell<u64>,
    /// A watched stream was capturing when the round began.
    start_captured: Cell<bool>,
    /// `start_epochs`, or [`NOT_QUIET`] when the round cannot be quiet
    /// (`start_captured` or `unseen`): what the reset's one comparison reads.
    start: Cell<u64>,
    /// While the device kind holds blocks that a graph capture allocated:
    /// the watched epochs when the first was taken, and how many blocks the
    /// kind held before it (the blocks after those are the graph's); the
    /// kind's cursor is paused meanwhile (module documentation).
    pub(super) graph: Cell<Option<(u64, usize)>>,
    /// Bit `i` set: in a round that is not quiet, kind `i` took its first
    /// block of the round once no watched stream was capturing any more and
    /// no note had moved since the round began, so none of its memory of
    /// this round can be a graph's. Cleared when a round begins.
    after_capture: Cell<u8>,
    /// The device blocks of a graph capture that ended during this round
    /// (start, end): slices into them may still exist, and are refused by
    /// the copies ([`Error::GraphMemory`]). Emptied when a round begins.
    retired: Cell<Vec<(usize, usize)>>,
}

/// Never a sum of three `u32` epochs.
const NOT_QUIET: u64 = u64::MAX;

impl<'b> Watch<'b> {
    /// The watch of a scratchpad with these stream orders; its first round
    /// begins with [`Scratchpad::begin_round`].
    ///
    /// Its first round is quiet, begun here, when no watched stream was ever
    /// in a capture (every stream of a program that never captures), so
    /// that nothing needs asking; otherwise [`Watch::needs_asking`] says the
    /// caller must begin it ([`Scratchpad::begin_round`]).
    #[inline(always)]
    pub(super) fn new(
        device: &AccessOrder<'b>,
        pinned: Option<&AccessOrder<'b>>,
        managed: Option<&AccessOrder<'b>>,
    ) -> Self {
        // Each note once: a note's bump must move the sum by one. (The
        // release orders are usually the device order: `None` here.)
        let same =
            |a: Option<&CaptureNote>, b: &CaptureNote| a.is_some_and(|a| core::ptr::eq(a, b));
        let n0 = device.capture_note();
        let n1 = pinned
            .and_then(|o| o.capture_note())
            .filter(|n| !same(n0, n));
        let n2 = managed
            .and_then(|o| o.capture_note())
            .filter(|n| !same(n0, n) && !same(n1, n));
        let unseen = device.captures_unseen()
            || pinned.is_some_and(|o| o.captures_unseen())
            || managed.is_some_and(|o| o.captures_unseen());
        let passive = n0.is_none() && n1.is_none() && n2.is_none() && !unseen;
        let w = Watch {
            notes: [n0, n1, n2],
            unseen,
            passive,
            start_epochs: Cell::new(0),
            start_captured: Cell::new(false),
            start: Cell::new(NOT_QUIET),
            graph: Cell::new(None),
            after_capture: Cell::new(0),
            retired: Cell::new(Vec::new()),
        };
        if !w.needs_asking() {
            w.start.set(0);
        }
        w
    }

    /// Whether beginning a round needs the watched streams asked: one may
    /// be capturing (a note was ever bumped, or gpupool cannot see).
    #[inline]
    pub(super) fn needs_asking(&self) -> bool {
        !self.passive && (self.unseen || self.epochs() != 0)
    }

    /// [`needs_asking`](Self::needs_asking) of the watch a scratchpad with
    /// these orders would have, before it is built.
    #[inline(always)]
    pub(super) fn needs_asking_for(device: &AccessOrder<'_>, config: &ScratchpadConfig<'_>) -> bool {
        let asks = |o: &AccessOrder<'_>| {
            o.captures_unseen() || o.capture_note().is_some_and(|n| n.ever())
        };
        asks(device)
            || config.pinned_release.as_ref().is_some_and(asks)
            || config.managed_release.as_ref().is_some_and(asks)
    }

    /// The sum of the watched notes' epochs now.
    #[inline]
    fn epochs(&self) -> u64 {
        self.notes
            .iter()
            .map(|n| n.map_or(0, |n| u64::from(n.epoch())))
            .sum()
    }

    /// Whether no watched stream can have been in a capture since the round
    /// began: none was capturing then, and no note was bumped since.
    #[inline]
    pub(super) fn quiet(&self) -> bool {
        self.passive || self.start.get() == self.epochs()
    }
}

/// How a round ended, as far as graph captures go.
#[derive(Copy, Clone)]
pub(super) enum RoundEnd<'b> {
    /// No capture overlapped it: its memory is reused as usual.
    Clean,
    /// One capture overlapped it and is still open, on this order's stream:
    /// its memory goes to that capture's graph.
    InCapture(AccessOrder<'b>),
    /// A capture overlapped it and may have ended: its memory is kept from
    /// everybody.
    AfterCapture,
}

impl<'b, B: ScratchBackend> Scratchpad<'b, B> {
    /// The scratchpad's distinct stream orders that may be capturing.
    fn capturable_orders(&self) -> impl Iterator<Item = AccessOrder<'b>> + '_ {
        let orders = self.stream_orders();
        (0..orders.len()).filter_map(move |i| {
            let o = orders[i];
            let first = !orders[..i].iter().any(|p| p == &o);
            (first && o.may_capture()).then_some(o)
        })
    }

    /// The first of the scratchpad's stream orders that is capturing now,
    /// if any (only those that may be are asked).
    fn capturing_order(&self) -> Result<Option<AccessOrder<'b>>, Error<B::Error>> {
        for o in self.capturable_orders() {
            // SAFETY: every order of the scratchpad is usable for its
            // backend for the scratchpad's whole life (checked at
            // construction; each borrows its stream).
            if unsafe { o.capturing(self.backend) }? {
                return Ok(Some(o));
            }
        }
        Ok(None)
    }

    /// Begins a round: notes the epochs, and asks whether a watched stream
    /// is capturing (only if one may be). A failure to ask counts as
    /// capturing (the round then cannot end quietly).
    pub(super) fn begin_round(&self) -> Result<(), Error<B::Error>> {
        let w = &self.watch;
        w.retired.set(Vec::new());
        w.after_capture.set(0);
        let epochs = w.epochs();
        let captured = if epochs == 0 && !w.unseen {
            Ok(false)
        } else {
            self.capturing_order().map(|o| o.is_some())
        };
        let start_captured = captured.as_ref().map_or(true, |c| *c);
        w.start_epochs.set(epochs);
        w.start_captured.set(start_captured);
        w.start.set(if start_captured || w.unseen {
            NOT_QUIET
        } else {
            epochs
        });
        captured.map(|_| ())
    }

    /// How the round ends (see [`RoundEnd`]). Precise only where it can be:
    /// the capture open now is the one that overlapped the round if the
    /// round began in it and no note moved since, or if it began outside and
    /// exactly one bump happened (the stream began or joined this capture).
    /// Anything else that is not quiet, or a stream that cannot be asked,
    /// is [`RoundEnd::AfterCapture`].
    pub(super) fn round_end(&self, errors: &mut FirstError<B::Error>) -> RoundEnd<'b> {
        let w = &self.watch;
        if w.quiet() {
            return RoundEnd::Clean;
        }
        let now = match self.capturing_order() {
            Ok(now) => now,
            Err(e) => {
                errors.push(e);
                return RoundEnd::AfterCapture;
            }
        };
        let moved = w.epochs() - w.start_epochs.get();
        let graph_mode = w.graph.get().is_some();
        match (now, w.start_captured.get(), moved) {
            (Some(o), true, 0) | (Some(o), false, 1) => RoundEnd::InCapture(o),
            // Only streams gpupool cannot see, asked at both ends, never
            // capturing: their contract excludes a capture begun and ended
            // in between (and the device kind says whether one allocated).
            (None, false, 0) if !graph_mode => RoundEnd::Clean,
            _ => RoundEnd::AfterCapture,
        }
    }

    /// The end of the round for `kind`: `end`, or [`RoundEnd::Clean`] if
    /// the kind took all its memory of this round after the capture that
    /// overlapped the round had ended (`KindState::after_capture`) and no
    /// note moved since the round began. Pageable host memory never reaches
    /// a graph: always clean.
    pub(super) fn kind_round_end(&self, kind: MemoryKind, end: RoundEnd<'b>) -> RoundEnd<'b> {
        let bit = 1 << kind.index();
        let after = self.watch.after_capture.get() & bit != 0
            && self.watch.epochs() == self.watch.start_epochs.get();
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
    pub(super) fn note_first_block(&self, kind: MemoryKind) -> Result<(), Error<B::Error>> {
        let w = &self.watch;
        let bit = 1 << kind.index();
        // Only a round that began in a capture can take memory after it
        // (one that began outside and saw a capture begin moved a note).
        if !w.start_captured.get()
            || kind == MemoryKind::Host
            || w.quiet()
            || w.after_capture.get() & bit != 0
            || self.kinds[kind.index()].res.block_count() > 0
            || w.epochs() != w.start_epochs.get()
        {
            return Ok(());
        }
        if self.capturing_order()?.is_none() {
            w.after_capture.set(w.after_capture.get() | bit);
        }
        Ok(())
    }

    /// Gives every block of `kind` away at the end of a round that a
    /// capture overlapped (`end` is not [`RoundEnd::Clean`]): to the open
    /// capture, or kept from everybody. A block that cannot be given is
    /// forgotten (the error says it is still allocated: never reused).
    pub(super) fn retire_kind(
        &self,
        kind: MemoryKind,
        device: DeviceId,
        end: RoundEnd<'b>,
        errors: &mut FirstError<B::Error>,
    ) {
        let st = &self.kinds[kind.index()];
        let fit = st.note_round();
        let up = self.counting(kind, device);
        // The newest blocks are the capture's own allocations, if any
        // (`take_blocks` hands them out newest first).
        let n = st.res.block_count();
        let own = match kind {
            MemoryKind::Device => self.watch.graph.get().map_or(0, |(_, before)| n - before),
            _ => 0,
        };
        for (i, block) in st.res.take_blocks(fit).into_iter().enumerate() {
            let given = match end {
                // The capture's own allocation, freed in the capture (the
                // device order's stream, capturing): the graph's free node.
                // SAFETY: the block came from this upstream and is
                // released once, in the kind's release order.
                RoundEnd::InCapture(_) if i < own => unsafe { up.release(block) },
                RoundEnd::InCapture(o) => {
                    let stream = o.stream_handle().unwrap_or(StreamHandle::NULL);
                    // SAFETY: the block came from this upstream with these
                    // arguments and is not used by gpupool again; `stream`
                    // is the stream of a scratchpad order (usable for the
                    // scratchpad's life), capturing now.
                    self.count_release(unsafe {
                        self.backend.keep_for_graph(
                            kind,
                            device,
                            block.ptr,
                            block.size,
                            block.align,
                            stream,
                        )
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
        if kind == MemoryKind::Device {
            self.watch.graph.set(None);
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
    pub(super) fn graph_round_goes_on(&self, device: DeviceId) -> Result<bool, Error<B::Error>> {
        let st = &self.kinds[MemoryKind::Device.index()];
        let Some((since, _)) = self.watch.graph.get() else {
            return Ok(false);
        };
        // SAFETY: the device order is usable for the backend for the
        // scratchpad's life (checked at construction; it borrows its stream).
        let capturing = unsafe { self.device_order.capturing(self.backend) }?;
        if capturing && self.watch.epochs() == since {
            return Ok(true);
        }
        // Slices into the graph's blocks may still exist (this is the
        // middle of a round): the copies refuse them from now on.
        let mut retired = self.watch.retired.take();
        retired.extend(
            st.res
                .blocks()
                .iter()
                .map(|b| (b.ptr.as_ptr().addr(), b.ptr.as_ptr().addr() + b.size)),
        );
        self.watch.retired.set(retired);
        let mut errors = FirstError::new();
        self.retire_kind(
            MemoryKind::Device,
            device,
            RoundEnd::AfterCapture,
            &mut errors,
        );
        errors.result().map(|()| false)
    }

    /// `Err(GraphMemory)` if `[addr, addr + len)` lies in a device block of
    /// a capture that ended during this round (see
    /// [`graph_round_goes_on`](Self::graph_round_goes_on), which is asked
    /// first, so that a capture that ended since the last allocation is
    /// seen).
    pub(super) fn check_not_retired(
        &self,
        addr: usize,
        len: usize,
        device: DeviceId,
    ) -> Result<(), Error<B::Error>> {
        self.graph_round_goes_on(device)?;
        let retired = self.watch.retired.take();
        let hit = retired.iter().any(|&(s, e)| addr < e && s < addr + len);
        self.watch.retired.set(retired);
        if hit {
            return Err(Error::GraphMemory);
        }
        Ok(())
    }

    /// After the device kind took `block` from upstream: if the device
    /// order is capturing, the block is the graph's allocation, and the
    /// kind enters graph mode (its cursor paused, see the module
    /// documentation). Asked only where the device order may capture.
    pub(super) fn note_device_block(&self, block_taken: bool) -> Result<(), Error<B::Error>> {
        let st = &self.kinds[MemoryKind::Device.index()];
        if block_taken {
            // A retired graph block that the backend freed (its graph is
            // gone) may come back as this one: its range is this block's now.
            if let Some(b) = st.res.blocks().last() {
                let (start, end) = (b.ptr.as_ptr().addr(), b.ptr.as_ptr().addr() + b.size);
                let mut retired = self.watch.retired.take();
                retired.retain(|&(s, e)| e <= start || end <= s);
                self.watch.retired.set(retired);
            }
        }
        if !block_taken || self.watch.graph.get().is_some() {
            if self.watch.graph.get().is_some() {
                st.res.pause();
            }
            return Ok(());
        }
        // SAFETY: as in `graph_round_goes_on`.
        if unsafe { self.device_order.capturing(self.backend) }? {
            let before = st.res.block_count() - 1;
            self.watch.graph.set(Some((self.watch.epochs(), before)));
            st.res.pause();
        }
        Ok(())
    }

    /// Bumps `bytes` in the device kind's current block in graph mode,
    /// where its cursor is paused.
    pub(super) fn graph_bump(&self, bytes: usize, align: usize) -> Option<core::ptr::NonNull<u8>> {
        let res = &self.kinds[MemoryKind::Device.index()].res;
        res.resume();
        let p = res.try_bump(bytes, align);
        res.pause();
        p
    }
}
