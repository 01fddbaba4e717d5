//! What the benchmarks measure gpupool against, over the same backend traits:
//!
//! - [`DaliStreamPool`] and [`DaliEventPool`]: DALI's `CUDAStreamPool` and
//!   `CUDAEventPool` as DALI's sources have them: one spinlock
//!   (DALI's `yielding_spinlock<100>`, see [`lock_yielding`]) over per-device
//!   singly linked lists of boxed nodes, emptied nodes recycled through an
//!   `unused` list, a new node allocated outside the lock only when that list
//!   is empty. The stream pool queries a stream on return (before the lock),
//!   sorts it into a ready or a busy list, pops the ready list on `get`, else
//!   scans the busy list newest first under the lock, else creates a stream
//!   outside the lock; its leases count themselves in an atomic, as DALI's do.
//! - [`MutexVecStreamPool`] and [`MutexVecEventPool`]: the pool anyone would
//!   write first, a `std::sync::Mutex<Vec<_>>` per device; no query on return.
//! - [`stream_create_destroy`] and [`event_create_destroy`]: no pool at all.
//! - [`DaliScratchpad`]: DALI's `DynamicScratchpad`: one
//!   monotonic resource per kind, created lazily, 64 KiB first block, the
//!   doubling growth with its 32-byte footer on host-accessible kinds, blocks
//!   freed newest first when it drops (device memory in the device order).
//! - [`raw_round`] and [`bumpalo_round`]: a round of allocations made with the
//!   plain calls (every allocation its own upstream call), and with bumpalo.
//!
//! Device ids are explicit everywhere (the benchmarks pass the lease's own
//! device, as DALI's leases do); an id out of range panics on the index, where
//! DALI has undefined behaviour. Backend errors are returned as DALI throws
//! them; a failure in a lease's drop panics, where DALI calls
//! `std::terminate`.
//!
//! The baselines check nothing a benchmark round would pay for: what DALI
//! leaves to its caller (a handle handed back is one the pool gave out; a
//! scratchpad's order is a stream of its backend and device) is the `# Safety`
//! contract of the `unsafe fn`s here ([`DaliStreamPool::put`],
//! [`DaliEventPool::put`], the `Mutex<Vec>` pools' `put`,
//! [`DaliScratchpad::new`], [`raw_round`]).
//!
//! The files here, by subject: `list.rs` (the linked lists of DALI's pools),
//! `dali_streams.rs` and `dali_events.rs` (DALI's pools), `mutex_vec.rs` (the
//! `Mutex<Vec>` pools and no pool at all), `scratchpad.rs` (DALI's
//! scratchpad) and `upstream.rs` (the plain calls a round without a
//! scratchpad makes, and bumpalo).

mod dali_events;
mod dali_streams;
mod list;
mod mutex_vec;
mod scratchpad;
mod upstream;

pub use dali_events::DaliEventPool;
pub use dali_streams::{DaliStreamLease, DaliStreamPool};
pub use mutex_vec::{
    event_create_destroy, stream_create_destroy, MutexVecEventPool, MutexVecStreamPool,
};
pub use scratchpad::{DaliScratchpad, DALI_FIRST_BLOCK};
pub use upstream::{bumpalo_round, raw_round};

/// Takes `lock` the way DALI's `yielding_spinlock<100>` does: try with a
/// relaxed load and then an acquiring exchange; after 100 failed tries,
/// `sched_yield` and start counting again.
pub fn lock_yielding<T>(lock: &spin::Mutex<T>) -> spin::MutexGuard<'_, T> {
    const MAX_SPIN: u32 = 100;
    let mut spins = 0;
    loop {
        if !lock.is_locked() {
            if let Some(guard) = lock.try_lock() {
                return guard;
            }
        }
        spins += 1;
        if spins >= MAX_SPIN {
            std::thread::yield_now();
            spins = 0;
        } else {
            core::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    /// The device the baselines' tests use.
    pub(super) const D: gpupool_core::DeviceId = gpupool_core::DeviceId(0);
}
