//! The owner's claims of its cell's handles ([`Cell::take`], and
//! [`Cell::lease`] with its [`InPlace`] slot) and the asymmetric barrier that
//! lets the owner claim a handle with a plain store.
//!
//! Only one other kind of thread competes with the owner for a handle in its
//! cell while the owner lives: a drain (purge). So the owner's claim is a
//! plain store over the handle it read (0 for a take, [`LEASED`] for an
//! in-place lease), and a drain pays for both sides: it raises the cell's
//! `DRAINING` bit, then runs the heavy barrier (on Linux `membarrier`, which
//! makes every running thread of the process execute a full barrier), then
//! takes handles. The owner, after its store, runs the light barrier (a
//! compiler fence) and reads the cell's drain word again. It is the
//! store-buffering pattern with a fence on each side: either the drain sees
//! the owner's store (and passes the slot by), or the owner sees the drain
//! (and finds out, below, whether its handle was taken before its store
//! landed).
//!
//! Each take by a drain flips the slot's bit in the drain word. Between the
//! owner's first read of the word and its store, a slot can lose its handle
//! to a drain at most once (after a take the slot is empty, and only the
//! owner, busy claiming, fills empty slots), so a flipped bit says exactly
//! that the handle was taken: the claim is abandoned, and the slot (which the
//! owner's store may have marked leased) is emptied again.
//!
//! A claim is a load and a store, so it is not async-signal-safe: a `get`
//! from a signal handler on the owner's thread, between the two, would be
//! served the same handle (pool methods are not async-signal-safe anyway:
//! the slow paths allocate and lock).
//!
//! Where `membarrier` cannot be had (a kernel without it, a target that is
//! not Linux), the light barrier is a sequentially consistent fence and so is
//! the heavy one; under loom and Miri too, so that the protocol is
//! model-checked as written.

use crate::sync::{AtomicUsize, Ordering};

use super::{Cell, LEASED, SLOTS};

/// The drain word's bit raised while a drain takes handles from the cell;
/// below it, one bit per slot, flipped by each take.
pub(super) const DRAINING: usize = 1 << SLOTS;

/// Chooses the barriers, once, before the first cell exists (a pool's
/// registry calls it when it is made): the light one may be a compiler fence
/// only if the heavy one is `membarrier`.
pub(super) fn choose_barriers() {
    #[cfg(all(target_os = "linux", not(miri), not(loom)))]
    membarrier::register();
}

/// The owner's side of the barrier: orders its store of [`LEASED`] before
/// its read of the drain word, given the drain's [`heavy`] barrier.
#[inline(always)]
fn light() {
    #[cfg(all(target_os = "linux", not(miri), not(loom)))]
    if membarrier::registered() {
        core::sync::atomic::compiler_fence(Ordering::SeqCst);
        return;
    }
    crate::sync::fence(Ordering::SeqCst);
}

/// The drain's side of the barrier: after it, a store an owner made before
/// its [`light`] barrier is visible to this thread, or the owner's read after
/// that barrier sees what this thread stored before this call. False if the
/// barrier could not be made (then no owner may be raced: the caller leaves
/// live owners' cells alone).
pub(super) fn heavy() -> bool {
    #[cfg(all(target_os = "linux", not(miri), not(loom)))]
    if membarrier::registered() {
        return membarrier::private_expedited();
    }
    crate::sync::fence(Ordering::SeqCst);
    true
}

#[cfg(all(target_os = "linux", not(miri), not(loom)))]
mod membarrier {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Once;

    // The commands of `membarrier(2)` (linux/membarrier.h).
    const QUERY: libc::c_int = 0;
    const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    static REGISTER: Once = Once::new();
    /// Whether the process registered for `PRIVATE_EXPEDITED`: written once,
    /// inside `REGISTER`, before any cell exists.
    static REGISTERED: AtomicBool = AtomicBool::new(false);

    fn call(cmd: libc::c_int) -> libc::c_long {
        // SAFETY: `membarrier(cmd, flags = 0, cpu_id = 0)` reads and writes
        // no memory of this process; an unknown command or an old kernel
        // returns -1.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as libc::c_int,
            )
        }
    }

    /// Registers the process for `PRIVATE_EXPEDITED` if the kernel has it.
    pub(super) fn register() {
        REGISTER.call_once(|| {
            let wanted = (PRIVATE_EXPEDITED | REGISTER_PRIVATE_EXPEDITED) as libc::c_long;
            let q = call(QUERY);
            let ok = q >= 0 && q & wanted == wanted && call(REGISTER_PRIVATE_EXPEDITED) == 0;
            // Relaxed: published by `REGISTER` to the thread that made the
            // registry, and from it with the pool to every thread that uses
            // a cell.
            REGISTERED.store(ok, Ordering::Relaxed);
        });
    }

    /// Whether [`register`] succeeded.
    #[inline(always)]
    pub(super) fn registered() -> bool {
        // Relaxed: see `REGISTERED`.
        REGISTERED.load(Ordering::Relaxed)
    }

    /// Runs a full memory barrier on every running thread of the process;
    /// false if the kernel refused.
    pub(super) fn private_expedited() -> bool {
        call(PRIVATE_EXPEDITED) == 0
    }
}

impl Cell {
    /// Takes a handle, if the cell holds one: the most recently kept (`give`
    /// fills from the front, so this is LIFO). Owner only.
    #[inline(always)] // the whole of a memo hit's get: inlined into it
    pub(crate) fn take(&self) -> Option<usize> {
        let (h, _) = self.claim(0)?;
        Self::bump(&self.served);
        Some(h)
    }

    /// Leases the most recently kept handle *in place*: its slot stays
    /// claimed, marked [`LEASED`], so that a drain passes it by, and the lease
    /// ends with one plain store ([`InPlace::unlease`] or [`InPlace::vacate`])
    /// instead of a read-modify-write. Owner only; the returned slot belongs
    /// to the lease (whichever thread holds it) until one of those two calls.
    #[inline(always)] // the whole of a memo hit's get: inlined into it
    pub(crate) fn lease(&self) -> Option<(usize, InPlace<'_>)> {
        let (h, s) = self.claim(LEASED)?;
        // Counted as served by `counts` (one tally, not two).
        Self::bump(&self.in_place);
        Some((h, InPlace(s)))
    }

    /// Claims the newest handle for the owner, leaving `mark` in its slot: 0
    /// (taken out) or [`LEASED`] (leased in place). Owner only.
    #[inline(always)]
    fn claim(&self, mark: usize) -> Option<(usize, &AtomicUsize)> {
        // Acquire: a handle read below is checked against drains that began
        // after this read (see the module documentation).
        let before = self.drain.load(Ordering::Acquire);
        if before & DRAINING != 0 {
            return self.claim_while_draining(mark);
        }
        for (i, s) in self.slots.iter().enumerate().rev() {
            // Acquire: pairs with the Release store that put the handle in
            // (this thread's `keep`, a lease's `unlease` from any thread, or
            // an exited owner's, handed over through the registry).
            let h = s.load(Ordering::Acquire);
            if h == 0 || h == LEASED {
                continue;
            }
            // A plain store: only a drain competes for an unleased handle in
            // a live owner's slot (nobody else writes a slot holding one), and
            // the barrier and the read below settle that race. (Relaxed:
            // nobody takes anything from `mark`.)
            s.store(mark, Ordering::Relaxed);
            light();
            // Acquire: with the drain's Release when it lowers `DRAINING`,
            // the flipped bit of a take is seen.
            let after = self.drain.load(Ordering::Acquire);
            if after != before && self.taken_by_drain(i, before) {
                // The drain took `h` before the store above, which may have
                // marked the empty slot leased: empty again (Release: as
                // `vacate`).
                s.store(0, Ordering::Release);
                continue;
            }
            return Some((h, s));
        }
        None
    }

    /// Whether a drain took the handle of slot `i` since the drain word read
    /// `before` (no drain running then): waits for the drain that may have,
    /// asleep on the lock it holds while it runs.
    #[cold]
    fn taken_by_drain(&self, i: usize, before: usize) -> bool {
        loop {
            // Acquire: pairs with the drain's Release that lowers `DRAINING`
            // after its takes flipped their bits.
            let now = self.drain.load(Ordering::Acquire);
            if now & DRAINING == 0 {
                return (now ^ before) & (1 << i) != 0;
            }
            // The drain took the lock before it raised the bit and releases
            // it after it lowers it.
            let lock = &self.registry.drain_lock;
            drop(lock.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// [`claim`](Self::claim) while a drain runs: the slot claimed with a
    /// compare-and-swap, which a drain's own compare-and-swap excludes.
    #[cold]
    fn claim_while_draining(&self, mark: usize) -> Option<(usize, &AtomicUsize)> {
        for s in self.slots.iter().rev() {
            let h = s.load(Ordering::Relaxed);
            // Acquire on success: as in `claim`.
            if h != 0
                && h != LEASED
                && s.compare_exchange(h, mark, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return Some((h, s));
            }
        }
        None
    }
}

/// The cell slot of an in-place lease ([`Cell::lease`]): marked [`LEASED`]
/// until the lease ends it, on whichever thread holds the lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InPlace<'a>(&'a AtomicUsize);

impl InPlace<'_> {
    /// Ends the lease: `handle` (the leased one) is back in its slot, ready to
    /// be leased again or drained.
    #[inline]
    pub(crate) fn unlease(self, handle: usize) {
        // (No assertion on the slot: this runs in a lease's drop, which never
        // panics; the loom models check where every handle is.)
        // A plain store: while the slot is marked leased nobody else writes
        // it (the owner's `keep` claims only empty slots, `lease` and every
        // taker only unleased ones). Release: publishes the handle, and what
        // the lease holder did with it, to whoever leases or takes it next.
        self.0.store(handle, Ordering::Release);
    }

    /// Ends the lease without returning the handle (released to the caller,
    /// or destroyed): the slot is empty again.
    #[inline]
    pub(crate) fn vacate(self) {
        // A plain store, as in `unlease`. Release: orders the holder's last
        // use of the slot before the owner's next `keep` into it.
        self.0.store(0, Ordering::Release);
    }
}
