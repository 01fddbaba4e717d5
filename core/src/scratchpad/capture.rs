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

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::cell::Cell;

use crate::capture::CaptureNote;
use crate::error::Error;
use crate::order::AccessOrder;

use super::{ScratchBackend, ScratchpadConfig};

mod end;
pub(super) use end::RoundEnd;
use end::{capturing_now, Capturing};

/// What a scratchpad watches of its orders' graph captures: the notes and
/// their values when the round began (all the quiet check reads), and the
/// rest, made only for a round that is not quiet ([`RoundState`]).
pub(super) struct Watch<'b> {
    /// The capture notes of its stream orders (the device order, the pinned
    /// and managed release orders), where they have one, each once, the
    /// ones it has first (so that the quiet check of a scratchpad without
    /// notes reads one word, and of one with a note one more).
    notes: [Option<&'b CaptureNote>; 3],
    /// The sum of the notes' values ([`CaptureNote::watched`]) when the
    /// round began, or [`NOT_QUIET`]
    /// when the round cannot be quiet (a watched stream was capturing then,
    /// or gpupool cannot see an order's captures): what the reset's one
    /// comparison reads.
    start: Cell<u64>,
    /// The round's capture state beyond `start`; `None` is the state of a
    /// round that began quiet and has not entered graph mode.
    state: Cell<Option<Box<RoundState>>>,
}

/// One reading of a scratchpad's capture notes ([`Watch::read_notes`]).
#[derive(Default)]
struct NotesRead {
    /// The sum of their epochs.
    epochs: u64,
    /// An epoch was odd: a capture was being begun on its stream.
    odd: bool,
    /// A wait that may join a capture was under way on one.
    joining: bool,
}

/// A round's capture state beyond the quiet check.
#[derive(Default)]
pub(super) struct RoundState {
    /// The sum of the notes' values when the round began.
    start_epochs: u64,
    /// A watched stream was capturing when the round began.
    start_captured: bool,
    /// The capture it was in, if the watched streams were in one capture
    /// with an id.
    start_capture: Option<u64>,
    /// A capture was being begun on a watched stream when the round began
    /// (its note odd): a later move of 2 may be the end of that beginning
    /// and the start of another, so it does not tell one capture.
    start_beginning: bool,
    /// While the device kind holds blocks that a graph capture allocated:
    /// the watched epochs when the first was taken, how many blocks the kind
    /// held before it (the blocks after those are the graph's), and the
    /// capture's id; the kind's cursor is paused meanwhile (module
    /// documentation).
    graph: Option<(u64, usize, u64)>,
    /// Bit `i` set: in a round that is not quiet, kind `i` took its first
    /// block of the round once no watched stream was capturing any more and
    /// no note had moved since the round began, so none of its memory of
    /// this round can be a graph's.
    after_capture: u8,
    /// The device blocks of a graph capture that ended during this round
    /// (start, end): slices into them may still exist, and are refused by
    /// the copies ([`Error::GraphMemory`]).
    retired: Vec<(usize, usize)>,
}

/// Never a sum of the notes' values: that would need some 2^32 threads
/// waiting on the scratchpad's streams at once.
const NOT_QUIET: u64 = u64::MAX;

impl<'b> Watch<'b> {
    /// The watch of a scratchpad with these stream orders. Its first round
    /// is begun here as a quiet one; where a watched stream may be capturing
    /// ([`needs_asking_for`](Self::needs_asking_for)), the caller begins it
    /// again by asking ([`Scratchpad::begin_round`]).
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
        // The ones there are first.
        let notes = match (n0, n1, n2) {
            (None, None, n) => [n, None, None],
            (None, Some(n), m) | (Some(n), None, m) => [Some(n), m, None],
            all => [all.0, all.1, all.2],
        };
        Watch {
            notes,
            start: Cell::new(0),
            state: Cell::new(None),
        }
    }

    /// Whether the first round of a scratchpad with these orders must ask
    /// the watched streams: one may be capturing (a note was ever bumped, or
    /// gpupool cannot see an order's captures).
    #[inline(always)]
    pub(super) fn needs_asking_for(
        device: &AccessOrder<'_>,
        config: &ScratchpadConfig<'_>,
    ) -> bool {
        let asks =
            |o: &AccessOrder<'_>| o.captures_unseen() || o.capture_note().is_some_and(|n| n.ever());
        asks(device)
            || config.pinned_release.as_ref().is_some_and(asks)
            || config.managed_release.as_ref().is_some_and(asks)
    }

    /// The sum of the watched notes' values now
    /// ([`CaptureNote::watched`]): what the quiet check compares.
    #[inline(always)]
    pub(super) fn sum(&self) -> u64 {
        // The notes there are come first: a scratchpad without notes (host
        // order, a special stream, `from_raw`) reads one word, one with a
        // note (a lease's order) one more.
        let [Some(first), second, third] = self.notes else {
            return 0;
        };
        let mut sum = first.watched();
        if let Some(second) = second {
            sum = sum.wrapping_add(self.sum_rest(second, third));
        }
        sum
    }

    /// The rest of [`sum`](Self::sum): release orders with notes of their
    /// own.
    #[cold]
    #[inline(never)]
    fn sum_rest(&self, second: &CaptureNote, third: Option<&CaptureNote>) -> u64 {
        second
            .watched()
            .wrapping_add(third.map_or(0, CaptureNote::watched))
    }

    /// The sum of the watched notes' epochs now (not their counts of waits
    /// under way: a move of the sum is a number of bumps); `None` once a
    /// note has saturated (its bumps no longer show: nothing is quiet any
    /// more).
    #[inline]
    fn epochs(&self) -> Option<u64> {
        self.read_notes().map(|r| r.epochs)
    }

    /// [`epochs`](Self::epochs), where no wait that may join a capture is
    /// under way on a watched stream; else `None`. What tells that nothing
    /// joined or began a capture since an earlier reading: a join that the
    /// driver made is noted by then, or its wait still counts.
    #[inline]
    fn settled_epochs(&self) -> Option<u64> {
        self.read_notes().filter(|r| !r.joining).map(|r| r.epochs)
    }

    /// [`epochs`](Self::epochs), and whether a watched note said a capture
    /// was being begun on its stream (its epoch odd) or a wait that may join
    /// one was under way when it was read.
    #[inline]
    fn epochs_and_beginning(&self) -> (Option<u64>, bool) {
        match self.read_notes() {
            Some(r) => (Some(r.epochs), r.odd || r.joining),
            None => (None, true),
        }
    }

    /// One reading of every watched note (`None` if one has saturated).
    #[inline]
    fn read_notes(&self) -> Option<NotesRead> {
        let mut read = NotesRead::default();
        for n in self.notes.into_iter().flatten() {
            let value = n.watched();
            let (joining, epoch) = (value >> 32, value as u32);
            if epoch == CaptureNote::SATURATED {
                return None;
            }
            read.epochs += u64::from(epoch);
            read.odd |= epoch % 2 == 1;
            read.joining |= joining != 0;
        }
        Some(read)
    }

    /// Whether no watched stream can have been in a capture since the round
    /// began: none was capturing then, and no note was bumped since nor a
    /// wait under way on it. The round's start is [`NOT_QUIET`] where a note
    /// was saturated then; one that saturates later has moved. So: one sum
    /// and one comparison (at every reset and drop).
    #[inline(always)]
    pub(super) fn quiet(&self) -> bool {
        self.start.get() == self.sum()
    }

    /// Begins a round of a scratchpad with these stream orders: notes the
    /// epochs, and asks `backend` whether a watched stream is capturing
    /// (only if one may be). A failure to ask counts as
    /// capturing (the round then cannot end quietly).
    pub(super) fn begin_round<B: ScratchBackend>(
        &self,
        backend: &B,
        orders: [AccessOrder<'b>; 3],
    ) -> Result<(), Error<B::Error>> {
        let (epochs, beginning) = self.epochs_and_beginning();
        // A saturated note is as good as a stream gpupool cannot see.
        let unseen = epochs.is_none() || orders.iter().any(AccessOrder::captures_unseen);
        let captured = if epochs == Some(0) && !unseen {
            Ok(Capturing::None)
        } else {
            capturing_now(backend, orders)
        };
        // A failure to ask counts as capturing in captures gpupool cannot
        // tell apart.
        let at_start = captured.as_ref().map_or(Capturing::Several, |c| *c);
        let start_captured = !matches!(at_start, Capturing::None);
        if start_captured || unseen || beginning {
            self.start.set(NOT_QUIET);
            self.state.set(Some(Box::new(RoundState {
                start_epochs: epochs.unwrap_or(u64::MAX),
                start_captured,
                start_capture: match at_start {
                    Capturing::One(_, id) => Some(id),
                    _ => None,
                },
                start_beginning: beginning,
                ..RoundState::default()
            })));
        } else {
            // A quiet round needs no state (and the device kind is in graph
            // mode only in a round that is not).
            self.start.set(epochs.unwrap_or(NOT_QUIET));
            self.state.set(None);
        }
        captured.map(drop)
    }

    /// Runs `f` on the round's capture state (made if there is none).
    fn with_state<R>(&self, f: impl FnOnce(&mut RoundState) -> R) -> R {
        let mut st = self.state.take().unwrap_or_else(|| {
            Box::new(RoundState {
                start_epochs: self.start.get(),
                ..RoundState::default()
            })
        });
        let r = f(&mut st);
        self.state.set(Some(st));
        r
    }

    /// Reads the round's capture state (the default of a quiet round that
    /// began at `start` if there is none).
    fn read<R>(&self, f: impl FnOnce(&RoundState) -> R) -> R {
        match self.state.take() {
            Some(st) => {
                let r = f(&st);
                self.state.set(Some(st));
                r
            }
            None => f(&RoundState {
                start_epochs: self.start.get(),
                ..RoundState::default()
            }),
        }
    }

    /// The device kind's graph mode (see `RoundState::graph`).
    #[inline]
    pub(super) fn graph(&self) -> Option<(u64, usize, u64)> {
        match self.state.take() {
            None => None,
            Some(st) => {
                let g = st.graph;
                self.state.set(Some(st));
                g
            }
        }
    }
}
