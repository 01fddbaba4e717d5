//! The lazy per-device table that both pools keep: one slot per device, built on
//! the first call that needs it, never before (so constructing a pool makes no
//! backend call).
//!
//! Publication is one CAS of a pointer, not a lock: two threads that race to
//! build the table both ask the backend for the device count and build a table;
//! the first CAS wins and the loser frees its own, still empty, copy. No thread
//! ever waits for another. A failed or zero device count publishes nothing, so
//! the next call asks again (DALI's stream pool does the same).

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::ptr;

use crate::backend::{Backend, DeviceId, DeviceSelector, MAX_DEVICES};
use crate::error::{BackendOp, Error};
use crate::stats::{Counters, PoolStats};
use crate::sync::{AtomicPtr, Ordering};

/// A table of `S`, one per device, built once.
pub(crate) struct DeviceTable<S> {
    /// Null until published; then a `Box<[S]>` (boxed again to get a thin
    /// pointer) that lives until the table is dropped. Written once, by a CAS.
    table: AtomicPtr<Box<[S]>>,
}

// SAFETY: the table owns its slots; sharing it shares `&S` across threads.
unsafe impl<S: Send + Sync> Sync for DeviceTable<S> {}
// SAFETY: sending the table sends the slots.
unsafe impl<S: Send> Send for DeviceTable<S> {}

impl<S> DeviceTable<S> {
    /// An unpublished table.
    pub(crate) fn new() -> Self {
        DeviceTable {
            table: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The slots, if the table has been published.
    #[inline]
    pub(crate) fn get(&self) -> Option<&[S]> {
        // Acquire: synchronises with the publishing CAS, so the slots' initial
        // state is visible.
        let p = self.table.load(Ordering::Acquire);
        // SAFETY: a non-null pointer was published by `get_or_try_init` from a
        // live `Box` and is freed only by `Drop`, which needs `&mut self`.
        unsafe { p.as_ref().map(|b| &**b) }
    }

    /// The slots, building them first if needed. `count` is asked for the number
    /// of devices and may fail; `Ok(0)` publishes nothing and yields `Ok(None)`.
    pub(crate) fn get_or_try_init<E>(
        &self,
        count: impl FnOnce() -> Result<u32, E>,
        make: impl Fn() -> S,
    ) -> Result<Option<&[S]>, E> {
        if let Some(t) = self.get() {
            return Ok(Some(t));
        }
        let n = count()?;
        if n == 0 {
            return Ok(None);
        }
        let slots: Vec<S> = (0..n).map(|_| make()).collect();
        let mine = Box::into_raw(Box::new(slots.into_boxed_slice()));
        // AcqRel on success: Release publishes our slots; Acquire on failure
        // synchronises with the winner's publication, whose slots we then use.
        match self.table.compare_exchange(
            ptr::null_mut(),
            mine,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: we just published `mine`; see `get` for its lifetime.
            Ok(_) => Ok(Some(unsafe { &**mine })),
            Err(winner) => {
                // SAFETY: `mine` lost the race and was never shared: free it.
                // Its slots are fresh and empty, so nothing they would hold is lost.
                drop(unsafe { Box::from_raw(mine) });
                // SAFETY: `winner` is the published table (non-null: the CAS
                // failed because the pointer was no longer null).
                Ok(Some(unsafe { &**winner }))
            }
        }
    }

    /// Takes the slots out, leaving the table unpublished. Needs `&mut self`.
    pub(crate) fn take(&mut self) -> Option<Box<[S]>> {
        // Acquire: as in `get`, to own the published slots.
        let p = self.table.swap(ptr::null_mut(), Ordering::Acquire);
        if p.is_null() {
            None
        } else {
            // SAFETY: published from a live `Box`, taken out once (we hold `&mut`).
            Some(*unsafe { Box::from_raw(p) })
        }
    }
}

impl<S> Drop for DeviceTable<S> {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// Asks `backend` for its device count, refusing counts above
/// [`MAX_DEVICES`].
pub(crate) fn checked_device_count<B: Backend>(backend: &B) -> Result<u32, Error<B::Error>> {
    let count = backend
        .device_count()
        .map_err(Error::backend(BackendOp::DeviceCount))?;
    if count > MAX_DEVICES {
        return Err(Error::TooManyDevices { count });
    }
    Ok(count)
}

/// What a pool keeps per device: made empty, with its tallies.
pub(crate) trait DeviceSlot {
    /// An empty slot.
    fn new() -> Self;
    /// The slot's tallies.
    fn counters(&self) -> &Counters;
}

impl<S: DeviceSlot> DeviceTable<S> {
    /// The device a pool call is about, and its slot: resolves "current" once,
    /// builds the table on first use, checks the range.
    pub(crate) fn resolve<B: Backend>(
        &self,
        backend: &B,
        device: DeviceSelector,
    ) -> Result<(DeviceId, &S), Error<B::Error>> {
        let table = self
            .get_or_try_init(|| checked_device_count(backend), S::new)?
            .ok_or(Error::NoDevice)?;
        let device = match device {
            DeviceSelector::Id(d) => d,
            DeviceSelector::Current => backend
                .current_device()
                .map_err(Error::backend(BackendOp::CurrentDevice))?,
        };
        match table.get(device.index()) {
            Some(slot) => Ok((device, slot)),
            None => Err(Error::DeviceOutOfRange {
                device,
                count: table.len() as u32,
            }),
        }
    }

    /// The slot of `device`, if the table is built and the device in range.
    #[inline]
    pub(crate) fn slot_of(&self, device: DeviceId) -> Option<&S> {
        self.get().and_then(|t| t.get(device.index()))
    }

    /// One device's tallies, with `cached` = (leases served from, leases
    /// returned into) per-thread caches added.
    pub(crate) fn stats(
        &self,
        device: DeviceId,
        cached: impl FnOnce() -> (usize, usize),
    ) -> Option<PoolStats> {
        let slot = self.slot_of(device)?;
        Some(slot.counters().snapshot_with(cached()))
    }

    /// `stats` summed over all devices.
    pub(crate) fn total_of(&self, stats: impl Fn(DeviceId) -> Option<PoolStats>) -> PoolStats {
        (0..self.len().unwrap_or(0))
            .filter_map(|d| stats(DeviceId(d as u32)))
            .fold(PoolStats::default(), |acc, s| acc + s)
    }

    /// The number of devices, once the table is built.
    pub(crate) fn len(&self) -> Option<usize> {
        self.get().map(|t| t.len())
    }
}
