//! What gpupool knows of a stream's graph captures: [`CaptureNote`], kept
//! by every lease and owned stream, and read by the orders that borrow it.
//!
//! A stream enters a graph capture in one of two ways: a capture is begun on
//! it, or it waits on an event recorded in an open capture (it *joins*). The
//! ways safe code can do either to a stream gpupool holds all go through
//! gpupool, which bumps the stream's note each time:
//! - [`StreamLease::begin_capture`](crate::StreamLease::begin_capture);
//! - [`AccessOrder::wait`](crate::AccessOrder::wait) and
//!   [`wait_event`](crate::AccessOrder::wait_event) on an order whose other
//!   side is capturing (the wait joins the capture);
//! - [`StreamLease::note_capture`](crate::StreamLease::note_capture), which
//!   the caller of the `unsafe` raw calls must make right after beginning or
//!   joining a capture through the raw handle.
//!
//! The end of a capture is not always seen (the origin's owner ends it, and
//! a stream that only joined is not told), so the note does not say whether
//! the stream is capturing *now*: it says whether it may have been in a
//! capture since a given moment. The pools ask the backend
//! ([`capture_status`](crate::StreamBackend::capture_status)) only for a
//! stream whose note was ever bumped; the scratchpad compares the epochs at
//! the start and the end of a round to tell whether any of the round's
//! memory may be used by a graph.

use crate::sync::{AtomicU32, Ordering};

/// A stream's capture epoch: 0 while the stream has never been in a graph
/// capture as far as gpupool can tell; moved by 2 each time it may have
/// joined one, and by 1 just before and 1 just after gpupool begins one on it
/// ([`begin_half`](Self::begin_half)), so an odd epoch says a beginning is
/// under way (not when one ends: a round that a capture overlapped is told
/// by the move during the round, or by a stream capturing when the round
/// began). A move of 2 is one capture begun or joined; a move of 1, the
/// beginning under way at one end of the interval.
///
/// Beside the epoch, the number of waits under way on the stream that may
/// join a capture ([`joining`](Self::joining)): a wait joins in the driver
/// first and moves the epoch after, so a scratchpad on another thread that
/// allocated on the stream right after the join and ends its round before
/// the move sees the wait under way instead ([`watched`](Self::watched)).
#[derive(Debug, Default)]
pub(crate) struct CaptureNote {
    epoch: AtomicU32,
    /// Waits under way that may make the stream join a capture.
    joining: AtomicU32,
}

/// A wait under way that may make a stream join a capture
/// ([`CaptureNote::joining`]): counted from before the wait reaches the
/// driver until after the note moves for the join (or the wait turned out
/// to join nothing), also on an early exit or a panic.
pub(crate) struct Joining<'n> {
    note: &'n CaptureNote,
}

impl Joining<'_> {
    /// The wait joined a capture: the note moves as for [`bump`](CaptureNote::bump),
    /// before the wait stops being counted.
    #[inline]
    pub(crate) fn joined(&self) {
        self.note.bump();
    }
}

impl Drop for Joining<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release, with the Acquire of `watched`: a reader that sees the
        // count back down also sees the move of `joined` made before.
        self.note.joining.fetch_sub(1, Ordering::Release);
    }
}

impl CaptureNote {
    /// The epoch a note stops at: its bumps no longer show, so whoever reads
    /// it takes the stream for one that may always be capturing.
    pub(crate) const SATURATED: u32 = u32::MAX;

    /// A note of a stream that has not been in a capture.
    pub(crate) fn new() -> Self {
        CaptureNote {
            epoch: AtomicU32::new(0),
            joining: AtomicU32::new(0),
        }
    }

    /// A note that carries `epoch` over (a lease detached into an owned
    /// stream, whose capture state goes with it).
    pub(crate) fn with_epoch(epoch: u32) -> Self {
        CaptureNote {
            epoch: AtomicU32::new(epoch),
            joining: AtomicU32::new(0),
        }
    }

    /// Notes that the stream may have joined a capture (or began one through
    /// the raw handle). Saturates rather than wrapping back to 0, which would
    /// say "never".
    #[inline]
    pub(crate) fn bump(&self) {
        self.add(2);
    }

    /// One half of the note of a capture gpupool begins: called once before
    /// the backend begins it (waits on other threads then ask, see
    /// `AccessOrder::wait`) and once after (a round that began in between
    /// sees the move).
    #[inline]
    pub(crate) fn begin_half(&self) {
        self.add(1);
    }

    fn add(&self, n: u32) {
        // AcqRel, with the Acquire of `epoch`: a thread that sees the new
        // epoch (a scratchpad ending its round on another thread) also sees
        // everything the bumping thread did before (the wait that joined
        // the capture). `fetch_update` fails only on a saturated note,
        // which keeps its epoch.
        let _ = self
            .epoch
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                (e != Self::SATURATED).then(|| e.saturating_add(n))
            });
    }

    /// Whether gpupool is beginning a capture on the stream now (between
    /// the two halves of [`begin_half`](Self::begin_half)).
    #[inline]
    pub(crate) fn beginning(&self) -> bool {
        let e = self.epoch();
        e % 2 == 1 && e != Self::SATURATED
    }

    /// The epoch now.
    #[inline]
    pub(crate) fn epoch(&self) -> u32 {
        // Acquire: see `bump`.
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the stream has ever been in a capture as far as gpupool can
    /// tell, or a wait under way may make it join one: only then can it be
    /// capturing now.
    #[inline]
    pub(crate) fn ever(&self) -> bool {
        // The count first: see `watched`.
        self.joining.load(Ordering::Acquire) != 0 || self.epoch() != 0
    }

    /// Counts a wait that may make the stream join a capture, until the
    /// returned guard is dropped. Called before the wait reaches the driver.
    #[inline]
    pub(crate) fn joining(&self) -> Joining<'_> {
        // AcqRel: the count is up before the wait reaches the driver (which
        // orders the calls made on one stream), so a thread whose call on
        // the stream came after the join reads it (or the move that
        // follows it).
        self.joining.fetch_add(1, Ordering::AcqRel);
        Joining { note: self }
    }

    /// Whether two readings of [`watched`](Self::watched), before and after
    /// a call, say that no capture began on or was joined by the stream in
    /// between (nor could have, unseen).
    #[inline]
    pub(crate) fn unmoved(before: u64, after: u64) -> bool {
        // No wait under way at the start, no move, and no capture being
        // begun (an odd epoch) at either end.
        before == after && before >> 32 == 0 && before % 2 == 0
    }

    /// What a scratchpad compares between the start and the end of a round:
    /// the waits under way (high 32 bits) and the epoch (low 32 bits). The
    /// same value at both ends, with no wait under way at the start, says
    /// that nothing joined or began a capture on the stream in between.
    #[inline]
    pub(crate) fn watched(&self) -> u64 {
        // The count before the epoch (both Acquire, with the Release of a
        // `Joining`'s drop): a count read back at 0 after a wait's join
        // comes with the move that wait made before.
        let joining = self.joining.load(Ordering::Acquire);
        (u64::from(joining) << 32) | u64::from(self.epoch())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::CaptureNote;

    #[test]
    fn a_wait_under_way_shows_until_it_is_over() {
        let note = CaptureNote::new();
        let quiet = note.watched();
        assert!(!note.ever());
        let joining = note.joining();
        // Under way: the value a round would compare has moved, and the
        // stream may be capturing.
        assert_ne!(note.watched(), quiet);
        assert!(note.ever());
        drop(joining);
        // A wait that joined nothing leaves the note as it was.
        assert_eq!(note.watched(), quiet);
        assert!(!note.ever());
    }

    #[test]
    fn a_wait_that_joins_moves_the_epoch_before_it_stops_counting() {
        let note = CaptureNote::new();
        let joining = note.joining();
        joining.joined();
        // The join shows while the wait is still counted...
        assert_eq!(note.watched() as u32, 2);
        assert_eq!(note.watched() >> 32, 1);
        drop(joining);
        // ...and stays once it is not.
        assert_eq!(note.watched(), 2);
        assert!(note.ever());
    }

    #[test]
    fn waits_on_several_threads_count_each() {
        let note = CaptureNote::new();
        let (a, b) = (note.joining(), note.joining());
        assert_eq!(note.watched() >> 32, 2);
        a.joined();
        drop(a);
        assert_eq!(note.watched(), (1 << 32) | 2);
        drop(b);
        assert_eq!(note.watched(), 2);
    }
}
