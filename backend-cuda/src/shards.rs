//! Per-thread shards of a per-device cache, and the registry through which
//! other threads reach them.
//!
//! A cache that every thread of a process visits on each allocation and free
//! is a serial point: its lock and its counters are cache lines that move
//! between cores on every visit. [`Shards`] gives each thread its own part of
//! the cache, a [`Shard`], so the warm path touches only memory its own thread
//! wrote last:
//!
//! - a thread **registers** once per device ([`Shards::register`]) and keeps
//!   the shard in a thread-local table (the callers' `thread_local!`); its
//!   allocations and frees lock only that shard's `Mutex`, which no other
//!   thread takes except to trim, forget a stream or read statistics;
//! - the **registry** (one `Mutex<Vec<_>>` per device) is taken when a thread
//!   registers or exits, and by the calls that must see every shard
//!   ([`Shards::each`]: trim, forget, statistics);
//! - when a thread **exits**, its shard's contents move to the device's
//!   **orphans** ([`Shards::retire`]), with no driver call (the exit may come
//!   during process teardown, and the streams the contents belong to may be
//!   gone); other threads take them from there on their miss path
//!   ([`Shards::orphans`]), and trim and forget reach them through
//!   [`Shards::each`].
//!
//! The shard contents ([`ShardState`]) decide what is kept and how; this
//! module only decides who may touch them, and never loses them: whatever a
//! shard holds is, at every moment, in that shard or in the orphans.
//!
//! ## Lock order
//!
//! registry → shard → orphans. A thread never takes the registry while it
//! holds a shard or the orphans, and takes the orphans inside a shard only in
//! [`retire`](Shards::retire). Owners take their shard alone.
//!
//! The locks come from `crate::sync`, so the loom models (`loom-tests`,
//! models `shards::*`) run this code with loom's.

use core::cell::RefCell;

use crate::sync::{Arc, AtomicBool, Mutex, MutexGuard, Ordering};

/// What a shard holds.
pub trait ShardState: Default + core::fmt::Debug {
    /// What the shards of one device share besides the orphans (a budget,
    /// say), kept in the [`Shards`].
    type Shared: Default + core::fmt::Debug;
    /// Whether it holds nothing (statistics apart).
    fn is_empty(&self) -> bool;
    /// Moves everything of `from` into `self` (the orphans: the thread of
    /// `from` exited), leaving `from` empty.
    fn absorb(&mut self, from: &mut Self, shared: &Self::Shared);
}

/// One thread's part of a cache.
#[derive(Debug, Default)]
pub struct Shard<T> {
    state: Mutex<T>,
}

impl<T> Shard<T> {
    /// Locks the shard's contents. Uncontended unless a trim, a forget or a
    /// statistics read is visiting it.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        // Nothing panics while a shard is locked; a poisoned lock still holds
        // consistent contents.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The shards of one device, and the orphans of the threads that exited.
#[derive(Debug)]
pub struct Shards<T: ShardState> {
    registry: Mutex<Vec<Arc<Shard<T>>>>,
    orphans: Mutex<T>,
    /// Whether `orphans` may hold something: written under its lock, read
    /// without it by the miss path to skip the lock when there is nothing to
    /// adopt.
    has_orphans: AtomicBool,
    shared: T::Shared,
}

impl<T: ShardState> Default for Shards<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: ShardState> Shards<T> {
    /// No shards, no orphans.
    pub fn new() -> Self {
        Shards {
            registry: Mutex::new(Vec::new()),
            orphans: Mutex::new(T::default()),
            has_orphans: AtomicBool::new(false),
            shared: T::Shared::default(),
        }
    }

    /// What the shards share besides the orphans.
    pub fn shared(&self) -> &T::Shared {
        &self.shared
    }

    fn registry(&self) -> MutexGuard<'_, Vec<Arc<Shard<T>>>> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The orphans, locked, whether or not they hold something. Pass the
    /// guard back to [`release_orphans`](Self::release_orphans).
    pub fn lock_orphans(&self) -> MutexGuard<'_, T> {
        self.orphans.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new, empty shard for the calling thread, registered so that
    /// [`each`](Self::each) visits it.
    pub fn register(&self) -> Arc<Shard<T>> {
        let shard = Arc::new(Shard {
            state: Mutex::new(T::default()),
        });
        self.registry().push(Arc::clone(&shard));
        shard
    }

    /// The thread of `shard` is exiting: takes the shard out of the registry
    /// and moves its contents to the orphans. Makes no driver call.
    pub fn retire(&self, shard: &Arc<Shard<T>>) {
        // The registry stays locked until the contents are among the orphans,
        // so an `each` sees them in the shard or in the orphans, never in
        // neither.
        let mut registry = self.registry();
        if let Some(i) = registry.iter().position(|s| Arc::ptr_eq(s, shard)) {
            registry.swap_remove(i);
        }
        let mut state = shard.lock();
        let mut orphans = self.lock_orphans();
        orphans.absorb(&mut state, &self.shared);
        self.publish_orphans(&orphans);
    }

    /// Publishes whether the orphans hold something (under their lock).
    fn publish_orphans(&self, orphans: &T) {
        // Relaxed: a hint of whether to take the lock. A reader that misses a
        // fresh `true` goes to the driver instead of adopting (correct, only
        // less reuse); one that sees a stale `true` finds nothing under the
        // lock. The contents themselves are handed over by the lock.
        self.has_orphans
            .store(!orphans.is_empty(), Ordering::Relaxed);
    }

    /// Whether the orphans may hold something (a hint, read without the
    /// lock: see `publish_orphans`).
    pub fn may_have_orphans(&self) -> bool {
        // Relaxed: see `publish_orphans`.
        self.has_orphans.load(Ordering::Relaxed)
    }

    /// The orphans, locked, if they may hold something; `None` (without
    /// taking the lock) if they hold nothing. Pass the guard back to
    /// [`release_orphans`](Self::release_orphans) after taking from it, so
    /// the hint stays right.
    pub fn orphans(&self) -> Option<MutexGuard<'_, T>> {
        self.may_have_orphans().then(|| self.lock_orphans())
    }

    /// Unlocks the orphans after [`orphans`](Self::orphans) or
    /// [`lock_orphans`](Self::lock_orphans), publishing
    /// whether anything is left.
    pub fn release_orphans(&self, orphans: MutexGuard<'_, T>) {
        self.publish_orphans(&orphans);
    }

    /// Calls `f` on every registered shard and then on the orphans, each
    /// locked in turn (never two at once). Holds the registry meanwhile, so
    /// no thread registers or exits during the visit; keep `f` short (take
    /// what is needed out, and make driver calls after).
    pub fn each(&self, mut f: impl FnMut(&mut T)) {
        let registry = self.registry();
        for shard in registry.iter() {
            f(&mut shard.lock());
        }
        let mut orphans = self.lock_orphans();
        f(&mut orphans);
        self.publish_orphans(&orphans);
    }

    /// How many threads have a shard registered now.
    pub fn threads(&self) -> usize {
        self.registry().len()
    }
}

/// A thread's shards, by index (one index per [`Shards`]: a device, or a
/// device and a memory kind); keep one in a `thread_local!`. Registers the
/// thread with a [`Shards`] on its first use there; when the thread exits,
/// retires every shard it registered ([`Shards::retire`]).
#[derive(Debug)]
pub struct LocalShards<T: ShardState + 'static>(RefCell<Vec<Option<Local<T>>>>);

#[derive(Debug)]
struct Local<T: ShardState + 'static> {
    shards: &'static Shards<T>,
    shard: Arc<Shard<T>>,
}

impl<T: ShardState + 'static> LocalShards<T> {
    /// No shards yet.
    pub const fn new() -> Self {
        LocalShards(RefCell::new(Vec::new()))
    }

    /// Runs `f` on this thread's shard of `shards`, registered now if the
    /// thread has none at `index`. `index` names `shards` alone.
    pub fn with<R>(
        &self,
        index: usize,
        shards: &'static Shards<T>,
        f: impl FnOnce(&mut T) -> R,
    ) -> R {
        // The common case: registered, and no other borrow (`f` never comes
        // back here: it makes no call that could reach this table).
        if let Ok(table) = self.0.try_borrow() {
            if let Some(Some(local)) = table.get(index) {
                return f(&mut local.shard.lock());
            }
        }
        let shard = {
            let mut table = self.0.borrow_mut();
            if table.len() <= index {
                table.resize_with(index + 1, || None);
            }
            let local = table[index].get_or_insert_with(|| Local {
                shards,
                shard: shards.register(),
            });
            Arc::clone(&local.shard)
        };
        let mut state = shard.lock();
        f(&mut state)
    }
}

impl<T: ShardState + 'static> LocalShards<T> {
    /// [`with`](Self::with) on the calling thread's table in `key` (a
    /// `thread_local!` of the caller); `None` while the thread's locals are
    /// being destroyed.
    pub fn with_local<R>(
        key: &'static std::thread::LocalKey<Self>,
        index: usize,
        shards: &'static Shards<T>,
        f: impl FnOnce(&mut T) -> R,
    ) -> Option<R> {
        key.try_with(|local| local.with(index, shards, f)).ok()
    }
}

impl<T: ShardState + 'static> Default for LocalShards<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: ShardState + 'static> Drop for LocalShards<T> {
    fn drop(&mut self) {
        for local in self.0.get_mut().drain(..).flatten() {
            local.shards.retire(&local.shard);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
