//! [`EngineSlot`]: a pool's lazily started completion engine, its stop, and
//! the first poll's spin budget.

use alloc::boxed::Box;
use core::time::Duration;

use super::Engine;
use crate::backend::EventBackend;
use crate::owned::OwnedEvent;
use crate::sync::thread;
use crate::sync::{AtomicPtr, Mutex, Ordering};

/// How long a [`Completed`](crate::Completed) future's first poll asks about its event itself
/// before the completion engine watches it, unless the pool says otherwise
/// ([`EventPool::set_completion_spin`](crate::EventPool::set_completion_spin)): 20 µs, a short kernel's time.
/// Work done by then resolves in that poll, with no thread hand-off (on the
/// H200 a future resolved this way wakes its task a few microseconds after
/// the GPU finished, against tens to hundreds of microseconds through the
/// engine while many threads submit; see `docs/async.md`).
pub const DEFAULT_COMPLETION_SPIN: Duration = Duration::from_micros(20);

/// The pool's lazily started engine.
pub(crate) struct EngineSlot<B: EventBackend> {
    engine: AtomicPtr<Engine<B>>,
    /// Held while an engine is started, so only one is.
    starting: Mutex<()>,
    /// How long a future's first poll asks about its event itself, in ns
    /// (see [`crate::EventPool::set_completion_spin`]). A setting: read and
    /// written Relaxed (a poll that reads a stale one spins as long as the
    /// setting said just before).
    spin_ns: core::sync::atomic::AtomicU32,
}

impl<B: EventBackend> EngineSlot<B> {
    pub(crate) fn new() -> Self {
        EngineSlot {
            engine: AtomicPtr::new(core::ptr::null_mut()),
            starting: Mutex::new(()),
            spin_ns: core::sync::atomic::AtomicU32::new(duration_ns(DEFAULT_COMPLETION_SPIN)),
        }
    }

    /// The first poll's budget for asking about its event itself.
    pub(crate) fn spin(&self) -> Duration {
        Duration::from_nanos(u64::from(
            self.spin_ns.load(core::sync::atomic::Ordering::Relaxed),
        ))
    }

    /// Sets [`spin`](Self::spin) (clamped to `u32::MAX` ns, about 4.3 s).
    pub(crate) fn set_spin(&self, budget: Duration) {
        self.spin_ns
            .store(duration_ns(budget), core::sync::atomic::Ordering::Relaxed);
    }

    /// The engine, started by the first call.
    pub(crate) fn get(&self, backend: &B) -> Result<&Engine<B>, std::io::Error>
    where
        B: Clone + 'static,
    {
        // Acquire: with the Release below, the engine is fully built.
        let p = self.engine.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: published once, below, from a `Box` freed only by
            // `stop` (`&mut self`), so it lives as long as `&self`.
            return Ok(unsafe { &*p });
        }
        self.start(backend)
    }

    #[cold]
    fn start(&self, backend: &B) -> Result<&Engine<B>, std::io::Error>
    where
        B: Clone + 'static,
    {
        let _starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        // Acquire: as in `get`; the lock makes this the only start.
        let p = self.engine.load(Ordering::Acquire);
        if p.is_null() {
            let engine = Box::into_raw(Box::new(Engine::start(backend.clone())?));
            // Release: the engine is built before it is seen.
            self.engine.store(engine, Ordering::Release);
            // SAFETY: just published; freed only by `stop`.
            return Ok(unsafe { &*engine });
        }
        // SAFETY: as in `get`.
        Ok(unsafe { &*p })
    }

    /// Stops the engine, if one started, and hands every event it still
    /// held (futures dropped before their events passed) to `give`, passed
    /// or not. Called from the pool's drop on the engine's own thread (a
    /// waker that owned the pool's last owner), it cannot wait for itself:
    /// it leaves the thread to end on its own, destroying those events.
    pub(crate) fn stop(&mut self, give: impl FnMut(OwnedEvent)) {
        let p = self.engine.swap(core::ptr::null_mut(), Ordering::Acquire);
        if p.is_null() {
            return;
        }
        // SAFETY: published by `start` from `Box::into_raw`, taken out of the
        // slot above, so freed once; `&mut self`: no borrow of it is left.
        let engine = unsafe { Box::from_raw(p) };
        let join = engine.join.lock().unwrap_or_else(|p| p.into_inner()).take();
        {
            let mut gate = engine.shared.gate.lock().unwrap_or_else(|p| p.into_inner());
            gate.stopping = true;
            if thread::current().id() == engine.thread.id() {
                // Dropped by a waker the thread runs: it cannot wait for
                // itself. Read by the thread, after the waker returns, under
                // the gate.
                engine.shared.detached.store(true, Ordering::Relaxed);
            }
        }
        // Release/Acquire: nothing rides on it but the stop itself; the unpark
        // makes a parked thread look again.
        engine.shared.stop.store(true, Ordering::Release);
        engine.thread.unpark();
        if engine.shared.detached.load(Ordering::Relaxed) {
            drop(join); // detached: it ends after the waker returns
            return;
        }
        // `None`: the thread is gone (it cannot panic: wakers are caught);
        // what it held is lost with it, never touched again.
        let left = join.and_then(|j| j.join().ok()).unwrap_or_default();
        engine.shared.held_events(left, give);
    }
}

/// `d` in ns, clamped to `u32::MAX`.
fn duration_ns(d: Duration) -> u32 {
    u32::try_from(d.as_nanos()).unwrap_or(u32::MAX)
}
