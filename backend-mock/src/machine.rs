//! [`MockBackend`]: the handle to a simulated machine, the lock around its
//! state, and the machine-wide settings (current device, completion policy,
//! checking mode).

use core::fmt;

use gpupool_core::{BackendId, DeviceId};
#[cfg(doc)]
use {
    crate::Misuse,
    gpupool_core::{EventHandle, StreamHandle},
};

use crate::queue::CompletionPolicy;
use crate::state::State;
use crate::sync::{write, Arc, RwLock, RwLockWriteGuard};

/// A simulated machine with a fixed number of devices. See the
/// [crate documentation](crate) for the model.
///
/// Clones share one machine, so a test can keep a clone while a pool owns
/// another. All state sits behind one reader-writer lock, held only for the
/// length of a call (see [Locking](crate#locking)).
///
/// Each machine made by [`new`](Self::new) has its own
/// [`BackendId`] ([`id`](gpupool_core::Backend::id));
/// its clones share it, being the same simulated device. Two machines have
/// different ids, so a stream or event of one put into a pool of another (or
/// an order of one given to a scratchpad of another) is refused with
/// [`Error::ForeignHandle`](gpupool_core::Error::ForeignHandle), as handles of
/// two real drivers would be.
///
/// ```
/// use gpupool_core::{Backend, DeviceId, Error, OwnedStream, StreamBackend};
/// use gpupool_mock::MockBackend;
///
/// let (one, two) = (MockBackend::new(1), MockBackend::new(1));
/// assert_ne!(one.id(), two.id());
/// assert_eq!(one.clone().id(), one.id());
///
/// // A stream of `one` is refused by `two` (as it would be by a pool of `two`)...
/// let h = one.create_stream(DeviceId(0), Default::default()).unwrap();
/// // SAFETY: a live stream `one` just made on device 0, handed over.
/// let stream = unsafe { OwnedStream::from_raw_parts(&one, h, DeviceId(0)) }.unwrap();
/// let refused = stream.destroy(&two).unwrap_err();
/// assert!(matches!(refused.error, Error::ForeignHandle));
/// // ...and comes back, still the caller's, for its own machine.
/// refused.value.destroy(&one).unwrap();
/// assert!(one.misuses().is_empty() && two.misuses().is_empty());
/// assert_eq!(one.live_streams(), 0);
/// ```
///
/// # Safety of the trait methods
///
/// Every trait method of the mock is sound for any argument, but for the two
/// memory obligations below: it validates handles and addresses and reports a
/// misuse or returns an error; the `unsafe` is the trait's, for real drivers.
/// A stream or event this machine never made, a destroyed one, a device out
/// of range or a handle of another device is an error and a [`Misuse`], with
/// no effect; so is an address where no live block of this machine starts, or
/// a layout other than the block's. (Every machine counts its handles from the
/// same start, so a handle of another machine names this machine's handle of
/// that number, if there is one: still sound, but not caught here; the pools
/// catch it by [`id`](gpupool_core::Backend::id).) Tests may hand the mock bad
/// handles on purpose, made with [`StreamHandle::from_raw`] or
/// [`EventHandle::from_raw`], to check that a caller's misuse is caught.
///
/// What the mock cannot check is memory it does not own, so two obligations
/// of [`MemoryBackend`](gpupool_core::MemoryBackend) stay with the caller:
/// - a successful `deallocate` or `deallocate_async` reclaims the block (at
///   once, or when the stream passes the free): nothing may use it
///   afterwards, as on a GPU (a call of the mock that names it is refused
///   while the mock remembers it, see [Refusals](crate#refusals), but a host
///   read through a pointer is the caller's: of the quarantined memory, and
///   of freed memory once the mock has forgotten the block);
/// - `copy_async` copies the bytes during the call: `dst` is checked to lie
///   inside a live block of this mock, but a `src` outside every block (live
///   or remembered) is foreign host memory and is read as it is, so it must be valid for
///   `size` bytes; the source's bytes are initialised (as the trait asks:
///   device memory is read back as any bit pattern); and neither range may
///   be accessed by another thread meanwhile.
#[derive(Clone)]
pub struct MockBackend {
    pub(crate) inner: Arc<Machine>,
}

/// What the clones of one [`MockBackend`] share: the machine's id and its
/// state.
pub(crate) struct Machine {
    /// Made once by [`MockBackend::new`]; never changes.
    pub(crate) id: BackendId,
    pub(crate) state: RwLock<State>,
}

/// The machine's state, locked for writing. When the lock is released, a
/// machine that fails on hazards ([`MockBackend::set_fail_on_hazard`])
/// panics for the hazards found meanwhile (not while the thread is already
/// panicking): after the lock is released, so the machine stays usable.
pub(crate) struct StateGuard<'a>(Option<RwLockWriteGuard<'a, State>>);

impl core::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        // Some until dropped.
        self.0.as_ref().expect("state guard in use")
    }
}

impl core::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("state guard in use")
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let Some(mut state) = self.0.take() else {
            return;
        };
        let report = state.unreported_hazards();
        drop(state);
        if let Some(message) = report {
            if !std::thread::panicking() {
                panic!("{message}");
            }
        }
    }
}

impl MockBackend {
    /// The machine's state, locked for writing (see [`StateGuard`]).
    pub(crate) fn state(&self) -> StateGuard<'_> {
        StateGuard(Some(write(&self.inner.state)))
    }
}

impl fmt::Debug for MockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("MockBackend")
            .field("id", &self.inner.id)
            .field("devices", &state.devices)
            .field("current", &state.current)
            .field("policy", &state.policy)
            .field("live_streams", &state.streams.created().count())
            .field("live_events", &state.events.len())
            .field("live_blocks", &state.memory.live_blocks())
            .field("quarantined_blocks", &state.memory.quarantine.len())
            .field("hazards", &state.memory.hazards.len())
            .field("open_captures", &state.captures.open_count())
            .field("misuses", &state.misuses.len())
            .finish_non_exhaustive()
    }
}

impl MockBackend {
    /// A machine with `devices` devices (zero is allowed: no GPU), policy
    /// [`CompletionPolicy::Manual`], current device 0.
    pub fn new(devices: u32) -> Self {
        MockBackend {
            inner: Arc::new(Machine {
                id: BackendId::unique(),
                state: RwLock::new(State::new(devices)),
            }),
        }
    }

    /// Sets the device [`current_device`](gpupool_core::Backend::current_device) reports.
    ///
    /// It is **mock-wide**, not per thread as in CUDA: every thread and clone
    /// sees the change. An out-of-range device is accepted, so tests can check
    /// how callers handle one.
    pub fn set_current_device(&self, device: DeviceId) {
        self.state().current = device;
    }

    /// Sets what [`batches_host_reuse`](gpupool_core::MemoryBackend::batches_host_reuse)
    /// answers (`false` by default): `true` makes a scratchpad reset give its
    /// host-visible blocks back in stream order instead of asking the stream,
    /// as it does over the CUDA backend, so the hazard detector checks that
    /// path too. The mock's memory itself behaves the same either way.
    pub fn set_batches_host_reuse(&self, on: bool) {
        self.state().batches_host_reuse = on;
    }

    /// Makes each hazard ([`hazards`](Self::hazards)) panic, with what was
    /// found, at the end of the call that found it (`false` by default: a
    /// hazard is only recorded). A test or a program run to check its
    /// ordering then fails at the first missing wait instead of reading
    /// [`hazards`](Self::hazards) itself. (A call made while the thread is
    /// already panicking records the hazard without a second panic.)
    pub fn set_fail_on_hazard(&self, on: bool) {
        let mut state = self.state();
        state.fail_on_hazard = on;
        let found = state.memory.hazards.len();
        state.hazards_reported = found;
    }

    /// Checking mode on or off: on, work completes only when the host waits
    /// for it ([`CompletionPolicy::Manual`]) and every hazard panics
    /// ([`set_fail_on_hazard`](Self::set_fail_on_hazard)), so a missing wait
    /// between two streams, or a read-back before the kernel that writes it,
    /// fails loudly where it happens, also inside a drop (a scratchpad's
    /// or a lease's: that is where a missing wait shows); off again, hazards
    /// are only recorded and work completes as it did before checking mode
    /// was turned on. The process-wide machine of the `gpupool` crate turns
    /// it on when the environment variable `GPUPOOL_MOCK_CHECK` is `1`.
    ///
    /// Work completes only when the host waits for it: pinned and managed
    /// scratch blocks released in stream order come back once the host
    /// waits, so a loop that never waits holds more memory each round than
    /// on a GPU (or without checking mode).
    pub fn set_checking(&self, on: bool) {
        let restore = {
            let mut state = self.state();
            if on {
                let policy = state.policy;
                state.policy_before_checking.get_or_insert(policy);
                Some(CompletionPolicy::Manual)
            } else {
                state.policy_before_checking.take()
            }
        };
        if let Some(policy) = restore {
            self.set_policy(policy);
        }
        self.set_fail_on_hazard(on);
    }

    /// Sets when simulated work completes.
    pub fn set_policy(&self, policy: CompletionPolicy) {
        let mut state = self.state();
        state.policy = policy;
        if policy == CompletionPolicy::Immediate {
            state.streams.settle_all(policy);
            state.reclaim();
        }
    }
}
