//! The process-wide backend and pools of the [`DefaultBackend`] (DALI's
//! `CUDAStreamPool::instance()` and `CUDAEventPool::instance()`).

use std::sync::OnceLock;

use crate::{DefaultBackend, DefaultError, EventPool, StreamPool};

/// The process-wide backend of the selected kind.
///
/// - With `cuda`: a `CudaBackend` (every `CudaBackend` speaks to the same
///   driver; constructing one calls nothing).
/// - With `mock` alone: one simulated machine for the whole process, made on
///   first use, whose work completes as soon as it is queued
///   ([`CompletionPolicy::Immediate`](gpupool_mock::CompletionPolicy::Immediate)):
///   it behaves like an infinitely fast GPU, so code written for a real GPU
///   runs on it unchanged — and, for the same reason, a missing wait is never
///   seen as a hazard there. It has one device, or as many as the environment
///   variable `GPUPOOL_MOCK_DEVICES` says (1 to 64, read once, on first use).
///   With `GPUPOOL_MOCK_CHECK=1` it runs in checking mode instead
///   ([`MockBackend::set_checking`](gpupool_mock::MockBackend::set_checking)):
///   work completes only when the host waits for it, and a hazard (a missing
///   wait, a read-back before the kernel that writes it) panics where it is
///   found, a drop included; `gpupool::backend().set_checking(true)` does the
///   same from code, and `set_checking(false)` puts back completion at once.
///   Any other value of either variable panics on first use, naming it.
///   Tests that complete work by hand, inject faults or check hazards make a
///   machine of their own with `gpupool::mock::MockBackend::new`.
///
/// [`streams()`], [`events()`] and scratchpads made with this backend share it.
///
/// ```
/// let a = gpupool::backend();
/// assert!(std::ptr::eq(a, gpupool::backend()));
/// ```
pub fn backend() -> &'static DefaultBackend {
    static BACKEND: OnceLock<DefaultBackend> = OnceLock::new();
    BACKEND.get_or_init(make_backend)
}

#[cfg(feature = "cuda")]
fn make_backend() -> DefaultBackend {
    gpupool_cuda::CudaBackend::new()
}

#[cfg(all(feature = "mock", not(feature = "cuda")))]
fn make_backend() -> DefaultBackend {
    let devices = match mock_setting("GPUPOOL_MOCK_DEVICES") {
        None => 1,
        Some(v) => match v.trim().parse::<u32>() {
            Ok(n @ 1..=64) => n,
            _ => bad_setting(
                "GPUPOOL_MOCK_DEVICES",
                &v,
                "a number of devices from 1 to 64",
            ),
        },
    };
    let checking = match mock_setting("GPUPOOL_MOCK_CHECK").as_deref().map(str::trim) {
        None | Some("0") | Some("") => false,
        Some("1") => true,
        Some(v) => bad_setting("GPUPOOL_MOCK_CHECK", v, "1 (checking mode) or 0"),
    };
    let machine = gpupool_mock::MockBackend::new(devices);
    if checking {
        machine.set_checking(true);
    } else {
        machine.set_policy(gpupool_mock::CompletionPolicy::Immediate);
    }
    machine
}

/// The value of the environment variable `name`, if it is set (one that is
/// not Unicode is taken as it reads, lossily, and refused by the caller).
#[cfg(all(feature = "mock", not(feature = "cuda")))]
fn mock_setting(name: &str) -> Option<std::string::String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// A configuration of the process-wide mock that means nothing: a panic that
/// names the variable, its value and what it takes, on first use of
/// [`backend()`] (a wrong setting is never taken for the default).
#[cfg(all(feature = "mock", not(feature = "cuda")))]
#[cold]
fn bad_setting(name: &str, value: &str, expected: &str) -> ! {
    panic!("{name}={value:?}: expected {expected}")
}

/// The process-wide stream pool of [`backend()`]: non-blocking streams at the
/// default priority. Created on first use, never dropped (nothing is destroyed
/// while the driver shuts down at exit); [`purge`](StreamPool::purge) gives
/// its streams back earlier. Constructing it calls no backend function.
///
/// ```
/// let lease = gpupool::streams().get(0)?;
/// assert_eq!(lease.device(), gpupool::DeviceId(0));
/// # Ok::<(), gpupool::DefaultError>(())
/// ```
pub fn streams() -> &'static StreamPool<DefaultBackend> {
    pools::streams()
}

/// The process-wide event pool of [`backend()`]: events with timing disabled.
/// Lazy and never dropped, like [`streams()`].
///
/// ```
/// let event = gpupool::events().get(0)?;
/// assert_eq!(event.device(), gpupool::DeviceId(0));
/// # Ok::<(), gpupool::DefaultError>(())
/// ```
pub fn events() -> &'static EventPool<DefaultBackend> {
    pools::events()
}

/// What went wrong out of sight in the process-wide pools and in drops, as
/// [`take_errors`] finds it.
#[derive(Debug)]
#[must_use]
pub struct ErrorsOutOfSight {
    /// The first error [`streams()`] parked (a lease's drop, a failed query
    /// in a scan, a purge's second failure) and nobody took yet; taken now.
    pub streams: Option<DefaultError>,
    /// The same for [`events()`].
    pub events: Option<DefaultError>,
    /// Errors the two pools dropped because one was already parked, since
    /// the previous `take_errors` (or the start of the process).
    pub dropped: usize,
    /// Errors with nobody to report them to ([`lost_errors`](crate::lost_errors):
    /// pools', scratchpads' and leases' drops), since the previous
    /// `take_errors` (or the start of the process).
    pub lost: usize,
}

impl ErrorsOutOfSight {
    /// Whether nothing went wrong out of sight.
    pub fn is_clean(&self) -> bool {
        self.streams.is_none() && self.events.is_none() && self.dropped == 0 && self.lost == 0
    }
}

/// One call that tells whether anything went wrong where no error could be
/// returned: takes the errors the process-wide pools parked, and counts those
/// they dropped and those lost in drops (of any pool or scratchpad) since the
/// previous call, so each checkpoint sees what is new. A runtime calls it at
/// a checkpoint (the end of a request batch, shutdown) and
/// logs or fails on what it finds; a scratchpad's or pool's own errors are
/// best taken where they happen, with its fallible form (`release`, `purge`).
///
/// ```
/// let lease = gpupool::streams().get(0)?;
/// drop(lease); // a return whose query failed would be parked
/// let found = gpupool::take_errors();
/// assert!(found.is_clean(), "{found:?}");
/// # Ok::<(), gpupool::DefaultError>(())
/// ```
pub fn take_errors() -> ErrorsOutOfSight {
    use std::sync::atomic::{AtomicUsize, Ordering};
    /// The totals the previous calls reported up to.
    static DROPPED_SEEN: AtomicUsize = AtomicUsize::new(0);
    static LOST_SEEN: AtomicUsize = AtomicUsize::new(0);
    // The counts only grow; `fetch_max` (Relaxed: counters, no data hangs on
    // them) hands each part of them to one call, also when calls race.
    let since = |seen: &AtomicUsize, total: usize| {
        total.saturating_sub(seen.fetch_max(total, Ordering::Relaxed))
    };
    let (streams, events) = (pools::streams(), pools::events());
    ErrorsOutOfSight {
        streams: streams.take_error(),
        events: events.take_error(),
        dropped: since(
            &DROPPED_SEEN,
            streams.dropped_errors() + events.dropped_errors(),
        ),
        lost: since(&LOST_SEEN, crate::lost_errors()),
    }
}

// With `cuda`, the CUDA backend's own process-wide pools (so code that uses
// `gpupool_cuda` directly shares them).
#[cfg(feature = "cuda")]
use gpupool_cuda as pools;

/// With `mock` alone, pools of [`backend()`] made here on first use.
#[cfg(not(feature = "cuda"))]
mod pools {
    use super::*;

    pub(super) fn streams() -> &'static StreamPool<DefaultBackend> {
        static POOL: OnceLock<StreamPool<DefaultBackend>> = OnceLock::new();
        POOL.get_or_init(|| StreamPool::new(backend().clone()))
    }

    pub(super) fn events() -> &'static EventPool<DefaultBackend> {
        static POOL: OnceLock<EventPool<DefaultBackend>> = OnceLock::new();
        POOL.get_or_init(|| EventPool::new(backend().clone()))
    }
}
