//! Driving futures by hand in a test: a waker that counts its wakes, one
//! poll, a minimal executor, and waits bounded by [`LONG`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

/// How long a wait may take before a test calls it lost (Miri runs the
/// completion engine's thread hundreds of times slower). Only a lost wake-up
/// or work that never runs takes this long.
pub const LONG: Duration = Duration::from_secs(if cfg!(miri) { 600 } else { 10 });

/// A waker's target: counts its wakes and unparks the thread that made it.
#[derive(Debug)]
pub struct WakeCounter {
    wakes: AtomicUsize,
    thread: thread::Thread,
}

impl WakeCounter {
    /// Wakes so far.
    pub fn wakes(&self) -> usize {
        // SeqCst: a test reads it after the wake it waits for; the strongest
        // order keeps the argument trivial (not a hot path).
        self.wakes.load(Ordering::SeqCst)
    }
}

impl Wake for WakeCounter {
    fn wake(self: Arc<Self>) {
        // SeqCst: see `wakes`.
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// A [`WakeCounter`] of the calling thread and its waker.
pub fn counting_waker() -> (Arc<WakeCounter>, Waker) {
    let c = Arc::new(WakeCounter {
        wakes: AtomicUsize::new(0),
        thread: thread::current(),
    });
    (Arc::clone(&c), Waker::from(c))
}

/// One poll of `f` with `waker`.
pub fn poll<F: Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(waker))
}

/// Polls `f` until it is ready, or `None` once `limit` has passed.
pub fn wait_for<F: Future + Unpin>(f: &mut F, limit: Duration) -> Option<F::Output> {
    poll_every(f, limit, Duration::from_millis(2))
}

/// Polls `f` until it is ready or `limit` has passed, parking up to `pause`
/// between polls (a wake ends the pause).
fn poll_every<F: Future + Unpin>(f: &mut F, limit: Duration, pause: Duration) -> Option<F::Output> {
    let (_, waker) = counting_waker();
    let start = Instant::now();
    loop {
        if let Poll::Ready(v) = poll(f, &waker) {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        thread::park_timeout(pause);
    }
}

/// Polls `f` until it is ready, parking in between (a minimal executor).
///
/// # Panics
/// After [`LONG`].
#[track_caller]
pub fn block_on<F: Future + Unpin>(mut f: F) -> F::Output {
    poll_every(&mut f, LONG, Duration::from_millis(50)).expect("never resolved")
}

/// Waits until `c` was woken at least once.
///
/// # Panics
/// After [`LONG`].
#[track_caller]
pub fn wait_for_wake(c: &WakeCounter) {
    let start = Instant::now();
    while c.wakes() == 0 {
        assert!(start.elapsed() < LONG, "never woken");
        thread::park_timeout(Duration::from_millis(10));
    }
}

/// Waits until `cond` holds.
///
/// # Panics
/// After [`LONG`], naming `what`.
#[track_caller]
pub fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < LONG, "never: {what}");
        thread::sleep(Duration::from_millis(1));
    }
}
