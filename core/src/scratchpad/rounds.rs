//! The end of a scratchpad's rounds: [`Scratchpad::reset`] (the next round
//! reuses the blocks), [`Scratchpad::release`] and the drop (the blocks go
//! back upstream), with every failure kept or reported.

use alloc::vec::Vec;
use core::fmt;

use super::capture::RoundEnd;
use super::{ScratchBackend, Scratchpad};
use crate::backend::{DeviceId, MemoryKind};
use crate::error::{BackendOp, Error};
use crate::monotonic::Upstream;

impl<B: ScratchBackend> Scratchpad<'_, B> {
    /// Ends the round: every allocation is over (the `&mut` proves no slice is
    /// left), and the memory is reused in stream order (module documentation).
    /// Visits only the kinds that hold blocks.
    ///
    /// On error the kind concerned releases what it can (a block whose release
    /// fails is forgotten: the error says it is still allocated); the
    /// scratchpad stays usable. The first error is returned, any further one
    /// reported through [`lost_errors`](crate::lost_errors).
    ///
    /// ```
    /// use gpupool_core::{AccessOrder, Scratchpad};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let mut scratch = Scratchpad::new(&gpu, AccessOrder::host())?;
    /// let mut after_first = None;
    /// for round in 0..3u32 {
    ///     let x = scratch.to_device(&[round; 64])?; // this round's memory
    ///     assert_eq!(scratch.to_host(&x)?[0], round);
    ///     scratch.reset()?; // `x` is gone (the borrow ends); its block is reused
    ///     after_first.get_or_insert(scratch.stats().upstream_allocations);
    /// }
    /// // The later rounds took nothing new from the backend.
    /// assert_eq!(Some(scratch.stats().upstream_allocations), after_first);
    /// # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
    /// ```
    #[inline]
    pub fn reset(&mut self) -> Result<(), Error<B::Error>> {
        // A round that a graph capture may have overlapped gives its memory
        // away instead (`capture.rs`): one comparison, while no watched
        // stream was ever in a capture.
        if !self.watch.quiet() {
            return self.reset_after_capture();
        }
        // Fast path, inline: a kind that holds one block, not waiting on a
        // fence, and needs no fence (host memory, device memory, or a release
        // in host order) is rewound, and that is all.
        let held = self.held.get();
        let mut slow = held & self.fenced;
        let quick = held & !self.fenced;
        for i in 0..4 {
            if quick & (1 << i) != 0 {
                // No fence: nothing can be waiting on one.
                let res = &mut self.kinds[i].res;
                if res.block_count_mut() == 1 {
                    res.rewind();
                } else {
                    slow |= 1 << i;
                }
            }
        }
        if slow == 0 {
            return Ok(());
        }
        self.reset_slow(slow)
    }

    /// The kinds of `reset` (a bit each) that the fast path left.
    #[inline(never)]
    fn reset_slow(&mut self, kinds: u8) -> Result<(), Error<B::Error>> {
        let Some(device) = self.device.get() else {
            return Ok(()); // nothing was ever allocated (a kind holds blocks only once it is known)
        };
        let mut errors = FirstError::new();
        for kind in MemoryKind::ALL {
            if kinds & (1 << kind.index()) != 0 {
                self.reset_kind(kind, device, &mut errors);
            }
        }
        errors.result()
    }

    /// `reset` of a round that was not quiet: a graph may use its memory.
    #[inline(never)]
    fn reset_after_capture(&mut self) -> Result<(), Error<B::Error>> {
        let mut errors = FirstError::new();
        let end = self.round_end(&mut errors);
        match (end, self.device.get()) {
            (RoundEnd::Clean, _) | (_, None) => {
                // `reset_slow` visits every kind that holds blocks.
                if let Err(e) = self.reset_slow(self.held.get()) {
                    errors.push(e);
                }
            }
            (end, Some(device)) => {
                for kind in MemoryKind::ALL {
                    if self.held.get() & (1 << kind.index()) == 0 {
                        continue;
                    }
                    match self.kind_round_end(kind, end) {
                        RoundEnd::Clean => self.reset_kind(kind, device, &mut errors),
                        end => self.retire_kind(kind, device, end, &mut errors),
                    }
                }
            }
        }
        if let Err(e) = self.begin_round() {
            errors.push(e);
        }
        errors.result()
    }

    /// Releases everything now (every block, every event), carrying on past
    /// failures, and returns the first; any further one is reported through
    /// [`lost_errors`](crate::lost_errors). Dropping does the same and reports
    /// every failure that way.
    pub fn release(mut self) -> Result<(), Error<B::Error>> {
        let mut errors = FirstError::new();
        self.release_all(&mut |e| errors.push(e));
        // The drop that follows finds nothing left to release.
        errors.result()
    }

    /// Releases every block and destroys every event, handing each failure to
    /// `sink` and carrying on. A block whose release fails is forgotten.
    fn release_all(&mut self, sink: &mut dyn FnMut(Error<B::Error>)) {
        let device = self.device.get();
        if let (false, Some(device)) = (self.watch.quiet(), device) {
            self.retire_last_round(device, sink);
        }
        // Only the kinds that ever held a block (a scratchpad made and
        // dropped unused visits none).
        let mut visit = self.touched.get();
        while visit != 0 {
            let kind = MemoryKind::ALL[visit.trailing_zeros() as usize];
            visit &= visit - 1;
            let st = &self.kinds[kind.index()];
            if let Some(sizes) = self.sizes {
                // A kind never used learns 0, which `learn` ignores.
                sizes.learn(kind, st.note_round());
            }
            // A kind holds blocks only once the device is resolved; one that
            // holds none has nothing to release (and its upstream is not
            // worth building: a drop visits all four kinds, most rounds use
            // one).
            if let Some(device) = device.filter(|_| st.res.block_count() > 0) {
                let up = self.counting(kind, device);
                for block in st.res.take_blocks(0) {
                    // SAFETY: each block came from this upstream and is released
                    // once, newest first, in the kind's release order.
                    if let Err(e) = unsafe { up.release(block) } {
                        sink(e);
                    }
                }
            }
            if let Some(f) = st.fence.take() {
                // SAFETY: the fence's event is the scratchpad's own, taken out
                // of its cell here and never used again.
                if let Err(source) = unsafe { self.backend.destroy_event(f.event, f.device) } {
                    sink(Error::Backend {
                        op: BackendOp::DestroyEvent,
                        source,
                    });
                }
            }
        }
        self.held.set(0);
        self.touched.set(0);
    }

    /// The part of `release_all` for a last round that may have been in a
    /// graph capture: its memory goes to the graph, or is kept
    /// (`capture.rs`).
    #[cold]
    #[inline(never)]
    fn retire_last_round(&mut self, device: DeviceId, sink: &mut dyn FnMut(Error<B::Error>)) {
        let mut errors = FirstError::new();
        let end = self.round_end(&mut errors);
        for kind in MemoryKind::ALL {
            let end = self.kind_round_end(kind, end);
            if !matches!(end, RoundEnd::Clean) && self.kinds[kind.index()].res.block_count() > 0 {
                self.retire_kind(kind, device, end, &mut errors);
            }
        }
        if let Some(e) = errors.first.take() {
            sink(e);
        }
    }
}

impl<B: ScratchBackend> Drop for Scratchpad<'_, B> {
    fn drop(&mut self) {
        // Never panics, and releases everything it can. There is no owner left
        // to return a failure to: each one is counted by `lost_errors` and
        // handed to the hook.
        self.release_all(&mut |e| crate::lost::report(&e));
    }
}

/// The errors of a call that may meet several: the first is returned, each
/// later one is reported as lost (the caller sees only one).
pub(super) struct FirstError<E: fmt::Display> {
    first: Option<Error<E>>,
    /// The later errors, reported through [`lost_errors`](crate::lost_errors)
    /// when the call is done ([`result`](Self::result), or the drop on an
    /// early exit): a lost-error hook then runs after the scratchpad's own
    /// backend calls, so one that begins or joins a capture cannot do it
    /// between two of them.
    rest: Vec<Error<E>>,
}

impl<E: fmt::Display> FirstError<E> {
    pub(super) const fn new() -> Self {
        FirstError {
            first: None,
            rest: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, e: Error<E>) {
        match self.first {
            None => self.first = Some(e),
            Some(_) => self.rest.push(e),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The first error, if any (the later ones reported as lost). Inline with
    /// a test of `first` alone: a round without errors (every round, nearly)
    /// moves no `Error` value around (the moves of a `None` written a byte
    /// at a time and read back whole cost a reset a quarter of its time).
    #[inline]
    pub(super) fn result(mut self) -> Result<(), Error<E>> {
        if self.first.is_none() {
            // `rest` is empty: `push` fills `first` before `rest`.
            return Ok(());
        }
        self.take_first()
    }

    #[cold]
    #[inline(never)]
    fn take_first(&mut self) -> Result<(), Error<E>> {
        self.report_rest();
        self.first.take().map_or(Ok(()), Err)
    }

    #[cold]
    #[inline(never)]
    fn report_all(&mut self) {
        if let Some(e) = self.first.take() {
            crate::lost::report(&e);
        }
        self.report_rest();
    }

    pub(super) fn report_rest(&mut self) {
        for e in core::mem::take(&mut self.rest) {
            crate::lost::report(&e);
        }
    }
}

impl<E: fmt::Display> Drop for FirstError<E> {
    /// An exit that did not take the errors (a panic unwinding): each one
    /// is reported, none silently dropped.
    #[inline]
    fn drop(&mut self) {
        // `rest` is empty whenever `first` is (see `result`).
        if self.first.is_some() {
            self.report_all();
        }
    }
}
