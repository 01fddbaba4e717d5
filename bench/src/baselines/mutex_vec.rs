//! The pools anyone would write first (a `std::sync::Mutex<Vec<_>>` per
//! device), and no pool at all (create and destroy each time).

use std::sync::{Mutex, MutexGuard};

use gpupool_core::{
    DeviceId, EventBackend, EventFlags, EventHandle, StreamBackend, StreamHandle, StreamOptions,
};

fn lock_vec<T>(m: &Mutex<Vec<T>>) -> MutexGuard<'_, Vec<T>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes every handle out of the per-device `lists` and gives it to
/// `destroy` with its device; stops at the first failure. Returns how many
/// were destroyed.
fn purge_lists<H, E>(
    lists: &[Mutex<Vec<H>>],
    mut destroy: impl FnMut(H, DeviceId) -> Result<(), E>,
) -> Result<usize, E> {
    let mut destroyed = 0;
    for (d, list) in lists.iter().enumerate() {
        for h in std::mem::take(&mut *lock_vec(list)) {
            destroy(h, DeviceId(d as u32))?;
            destroyed += 1;
        }
    }
    Ok(destroyed)
}

/// A `std::sync::Mutex<Vec<_>>` of streams per device: pop or create, push
/// back. No query on return, so a stream returned with work still queued is
/// handed out again as it is.
pub struct MutexVecStreamPool<B: StreamBackend> {
    backend: B,
    lists: Vec<Mutex<Vec<StreamHandle>>>,
}

impl<B: StreamBackend> MutexVecStreamPool<B> {
    /// A pool for `devices` devices.
    pub fn new(backend: B, devices: u32) -> Self {
        MutexVecStreamPool {
            backend,
            lists: (0..devices).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// The last stream returned on `device`, else a new one.
    pub fn get(&self, device: DeviceId) -> Result<StreamHandle, B::Error> {
        if let Some(s) = lock_vec(&self.lists[device.index()]).pop() {
            return Ok(s);
        }
        self.backend.create_stream(device, StreamOptions::default())
    }

    /// Returns `stream` to `device`'s list.
    ///
    /// # Safety
    /// `stream` is a live, non-special stream of `device`, created by this
    /// pool's backend (or one with its [`id`](gpupool_core::Backend::id)), and
    /// the caller hands it over: nothing else owns or uses it from now on.
    pub unsafe fn put(&self, stream: StreamHandle, device: DeviceId) {
        lock_vec(&self.lists[device.index()]).push(stream);
    }

    /// Destroys every pooled stream; stops at the first failure.
    pub fn purge(&self) -> Result<usize, B::Error> {
        purge_lists(&self.lists, |s, d| {
            // SAFETY: the pool owns every stream in its lists, a live stream
            // of the list's device created by this backend; it was taken out
            // of the list, so nothing uses it after this.
            unsafe { self.backend.destroy_stream(s, d) }
        })
    }
}

/// A `std::sync::Mutex<Vec<_>>` of events per device: pop or create, push back.
pub struct MutexVecEventPool<B: EventBackend> {
    backend: B,
    flags: EventFlags,
    lists: Vec<Mutex<Vec<EventHandle>>>,
}

impl<B: EventBackend> MutexVecEventPool<B> {
    /// A pool of events with `flags` for `devices` devices.
    pub fn new(backend: B, flags: EventFlags, devices: u32) -> Self {
        MutexVecEventPool {
            backend,
            flags,
            lists: (0..devices).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// The last event returned on `device`, else a new one.
    pub fn get(&self, device: DeviceId) -> Result<EventHandle, B::Error> {
        if let Some(e) = lock_vec(&self.lists[device.index()]).pop() {
            return Ok(e);
        }
        self.backend.create_event(device, self.flags)
    }

    /// Returns `event` to `device`'s list.
    ///
    /// # Safety
    /// `event` is a live event of `device`, created by this pool's backend (or
    /// one with its [`id`](gpupool_core::Backend::id)), and the caller hands it
    /// over: nothing else owns or uses it from now on.
    pub unsafe fn put(&self, event: EventHandle, device: DeviceId) {
        lock_vec(&self.lists[device.index()]).push(event);
    }

    /// Destroys every pooled event; stops at the first failure.
    pub fn purge(&self) -> Result<usize, B::Error> {
        purge_lists(&self.lists, |e, d| {
            // SAFETY: the pool owns every event in its lists, a live event of
            // the list's device created by this backend; it was taken out of
            // the list, so nothing uses it after this.
            unsafe { self.backend.destroy_event(e, d) }
        })
    }
}

/// No pool: creates a non-blocking stream on `device` and destroys it.
pub fn stream_create_destroy<B: StreamBackend>(
    backend: &B,
    device: DeviceId,
) -> Result<(), B::Error> {
    let s = backend.create_stream(device, StreamOptions::default())?;
    // SAFETY: created just above on `device` by this backend, used by nothing
    // else.
    unsafe { backend.destroy_stream(s, device) }
}

/// No pool: creates an event with `flags` on `device` and destroys it.
pub fn event_create_destroy<B: EventBackend>(
    backend: &B,
    device: DeviceId,
    flags: EventFlags,
) -> Result<(), B::Error> {
    let e = backend.create_event(device, flags)?;
    // SAFETY: created just above on `device` by this backend, used by nothing
    // else.
    unsafe { backend.destroy_event(e, device) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::tests::D;
    use gpupool_mock::MockBackend;

    #[test]
    fn mutex_vec_pools_and_create_destroy_leave_nothing_behind() {
        let gpu = MockBackend::new(1);
        let streams = MutexVecStreamPool::new(gpu.clone(), 1);
        let events = MutexVecEventPool::new(gpu.clone(), EventFlags::DISABLE_TIMING, 1);
        let s = streams.get(D).unwrap();
        // SAFETY: (each put) a stream or event its pool gave out on `D`,
        // handed back once before it is taken again.
        unsafe { streams.put(s, D) };
        assert_eq!(streams.get(D).unwrap(), s);
        // SAFETY: as above.
        unsafe { streams.put(s, D) };
        let e = events.get(D).unwrap();
        // SAFETY: as above.
        unsafe { events.put(e, D) };
        assert_eq!(events.get(D).unwrap(), e);
        // SAFETY: as above.
        unsafe { events.put(e, D) };
        stream_create_destroy(&gpu, D).unwrap();
        event_create_destroy(&gpu, D, EventFlags::DISABLE_TIMING).unwrap();
        assert_eq!(streams.purge().unwrap(), 1);
        assert_eq!(events.purge().unwrap(), 1);
        assert_eq!(gpu.live_streams(), 0);
        assert_eq!(gpu.live_events(), 0);
    }
}
