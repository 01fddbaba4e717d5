//! [`Entry`]: what the completion engine and one [`Completed`](crate::Completed)
//! future share about its pending event, and the state machine between them.

use core::task::Waker;

use crate::backend::{DeviceId, EventHandle};
use crate::owned::OwnedEvent;
use crate::sync::{AtomicU32, Mutex, Ordering};

/// What the engine and a future share about one pending event.
pub(crate) struct Entry<E> {
    /// The event the engine asks about, and its device. The future's lease
    /// (or, once the future is dropped, the engine) keeps it alive until the
    /// entry is resolved.
    pub(super) event: EventHandle,
    pub(super) device: DeviceId,
    /// The submitting thread's inbox, whose threads may wake the task.
    pub(super) shard: usize,
    /// Its place among the records of the thread that recorded the event
    /// (orders an ordered key's queue: [`super::StreamKey::of`]).
    pub(super) seq: u64,
    /// [`WATCHED`], [`PASSED`], [`FAILED`] or [`ABANDONED`]; changed only
    /// under `parts`' lock, read without it by the future's fast path.
    state: AtomicU32,
    parts: Mutex<Parts<E>>,
}

/// An entry's fields that change with its state.
struct Parts<E> {
    /// The waker of the future's latest pending poll.
    waker: Option<Waker>,
    /// The backend's error, for [`FAILED`].
    error: Option<E>,
    /// The event of a dropped future, for [`ABANDONED`].
    orphan: Option<OwnedEvent>,
}

/// The engine watches the event for a live future.
const WATCHED: u32 = 0;
/// The event passed.
const PASSED: u32 = 1;
/// Asking about the event failed (`Parts::error`).
const FAILED: u32 = 2;
/// The future was dropped first: the event (`Parts::orphan`) is the engine's.
const ABANDONED: u32 = 3;

impl<E> Entry<E> {
    pub(crate) fn new(event: EventHandle, device: DeviceId, shard: usize, seq: u64) -> Self {
        Entry {
            event,
            device,
            shard,
            seq,
            state: AtomicU32::new(WATCHED),
            parts: Mutex::new(Parts {
                waker: None,
                error: None,
                orphan: None,
            }),
        }
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Parts<E>> {
        // A panic cannot happen under this lock (it only moves values), but
        // a poisoned one is used as it is rather than panic in a drop.
        self.parts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state, in words (for `Debug`).
    pub(crate) fn state_name(&self) -> &'static str {
        match self.state.load(Ordering::Relaxed) {
            WATCHED => "pending",
            FAILED => "failed",
            ABANDONED => "abandoned",
            _ => "passed",
        }
    }

    /// Whether the engine is done with the event (passed or failed).
    pub(crate) fn is_resolved(&self) -> bool {
        // Acquire: with the engine's Release under the lock, its last query
        // of the event happened before; the lease may end.
        matches!(self.state.load(Ordering::Acquire), PASSED | FAILED)
    }

    /// The future's poll: the result once resolved, else `None` with
    /// `waker` kept for the engine.
    pub(crate) fn poll(&self, waker: &Waker) -> Option<Result<(), E>> {
        if self.is_resolved() {
            return Some(self.take_result());
        }
        let mut parts = self.lock();
        // Checked again under the lock the engine resolves under: either it
        // resolved first (seen here), or it takes the waker stored here.
        if self.state.load(Ordering::Acquire) != WATCHED {
            drop(parts);
            return Some(self.take_result());
        }
        let replaced = match &mut parts.waker {
            Some(w) if w.will_wake(waker) => None,
            slot => slot.replace(waker.clone()),
        };
        drop(parts);
        // The caller's code, outside the lock.
        drop(replaced);
        None
    }

    /// The result of a resolved entry.
    fn take_result(&self) -> Result<(), E> {
        match self.lock().error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The future is dropped before the entry resolved: the engine takes
    /// `event` and returns it once it passed. `Some(event)` back if the
    /// entry resolved meanwhile (the event passed: the caller returns it).
    pub(crate) fn abandon(&self, event: OwnedEvent) -> Option<OwnedEvent> {
        let mut parts = self.lock();
        if self.state.load(Ordering::Acquire) != WATCHED {
            return Some(event);
        }
        parts.orphan = Some(event);
        let waker = parts.waker.take();
        // Relaxed: stored and read under the lock (the engine's `resolve`).
        self.state.store(ABANDONED, Ordering::Relaxed);
        drop(parts);
        // The caller's code, after the entry is consistent.
        quietly(|| drop(waker));
        None
    }

    /// The pool's end of an entry the engine stopped with: the event of a
    /// dropped future, if it is one (an entry of a future leaked by
    /// `mem::forget` keeps its event in the leaked lease). Wakes nobody.
    pub(super) fn forsake(&self) -> Option<OwnedEvent> {
        let mut parts = self.lock();
        let orphan = if self.state.load(Ordering::Relaxed) == ABANDONED {
            parts.orphan.take()
        } else {
            None
        };
        let waker = parts.waker.take();
        drop(parts);
        quietly(|| drop(waker));
        orphan
    }

    /// The engine's end of the entry, after its last query of the event:
    /// `Ok` with the waker to wake (the future's, if it was polled), or,
    /// if the future was dropped, `Err` with the event it left, to give
    /// back.
    pub(super) fn resolve(
        &self,
        result: Result<(), E>,
    ) -> Result<Option<Waker>, Option<OwnedEvent>> {
        let mut parts = self.lock();
        // Relaxed: the state changes only under this lock.
        if self.state.load(Ordering::Relaxed) == ABANDONED {
            return Err(parts.orphan.take());
        }
        let state = match result {
            Ok(()) => PASSED,
            Err(e) => {
                parts.error = Some(e);
                FAILED
            }
        };
        // Release: the future's Acquire load sees the query (and the error)
        // before it ends the lease.
        self.state.store(state, Ordering::Release);
        Ok(parts.waker.take())
    }
}

/// Runs the caller's code (a waker's `wake` or drop) on the engine's thread
/// or in a drop, catching a panic, and forgetting its payload (whose own
/// drop may panic).
pub(super) fn quietly(f: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(core::panic::AssertUnwindSafe(f)) {
        core::mem::forget(payload);
    }
}
