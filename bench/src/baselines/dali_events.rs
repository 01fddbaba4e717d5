//! DALI's `CUDAEventPool`: a list per device under one spinlock, no lease,
//! no query.

use gpupool_core::{DeviceId, EventBackend, EventFlags, EventHandle};

use super::list::{take_node, List};
use super::lock_yielding;

/// The event pool's lists: one per device, and the recycled nodes.
#[derive(Default)]
struct EventLists {
    events: Vec<List>,
    unused: List,
}

/// DALI's `CUDAEventPool` over any [`EventBackend`]: eager,
/// no lease, no query.
pub struct DaliEventPool<B: EventBackend> {
    backend: B,
    flags: EventFlags,
    lists: spin::Mutex<EventLists>,
}

impl<B: EventBackend> DaliEventPool<B> {
    /// A pool of events with `flags`; counts the devices now, as DALI's
    /// constructor does.
    pub fn new(backend: B, flags: EventFlags) -> Result<Self, B::Error> {
        let n = backend.device_count()? as usize;
        Ok(DaliEventPool {
            backend,
            flags,
            lists: spin::Mutex::new(EventLists {
                events: (0..n).map(|_| List::default()).collect(),
                unused: List::default(),
            }),
        })
    }

    /// Pops the head of `device`'s list, else creates an event outside the
    /// lock. A pooled event may still be pending.
    pub fn get(&self, device: DeviceId) -> Result<EventHandle, B::Error> {
        {
            let mut guard = lock_yielding(&self.lists);
            let lists = &mut *guard;
            if let Some(mut node) = lists.events[device.index()].pop() {
                let handle = std::mem::take(&mut node.handle);
                lists.unused.push(node);
                // SAFETY: the pool owned this event (a live event of `device`
                // made by this backend, `put`'s contract); the caller takes it
                // over.
                return Ok(unsafe { EventHandle::from_raw(handle) });
            }
        }
        self.backend.create_event(device, self.flags)
    }

    /// Pushes `event` onto the head of `device`'s list.
    ///
    /// # Safety
    /// `event` is a live event of `device`, created by this pool's backend (or
    /// one with its [`id`](gpupool_core::Backend::id)), and the caller hands it
    /// over: nothing else owns or uses it from now on.
    pub unsafe fn put(&self, event: EventHandle, device: DeviceId) {
        let guard = lock_yielding(&self.lists);
        let (mut guard, mut node) = take_node(&self.lists, guard, |l| &mut l.unused);
        node.handle = event.as_raw();
        guard.events[device.index()].push(node);
    }

    /// Destroys every pooled event and frees every node; stops at the first
    /// failed destroy.
    pub fn purge(&self) -> Result<usize, B::Error> {
        let mut guard = lock_yielding(&self.lists);
        let lists = &mut *guard;
        lists.unused = List::default();
        let mut destroyed = 0;
        for (d, list) in lists.events.iter_mut().enumerate() {
            while let Some(node) = list.pop() {
                // SAFETY: the pool owns every event in its lists, a live event
                // of the list's device created by this backend; the node is
                // dropped, so nothing uses it after this.
                unsafe {
                    self.backend
                        .destroy_event(EventHandle::from_raw(node.handle), DeviceId(d as u32))?;
                }
                destroyed += 1;
            }
        }
        Ok(destroyed)
    }
}

impl<B: EventBackend> Drop for DaliEventPool<B> {
    /// Purges; an error is dropped.
    fn drop(&mut self) {
        let _ = self.purge();
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use gpupool_mock::MockBackend;

    #[test]
    fn dali_event_pool_is_lifo_and_recycles_nodes() {
        let gpu = MockBackend::new(2);
        let pool = DaliEventPool::new(gpu.clone(), EventFlags::DISABLE_TIMING).unwrap();
        let e1 = pool.get(DeviceId(1)).unwrap();
        let e2 = pool.get(DeviceId(1)).unwrap();
        // SAFETY: (each put) events this pool gave out on device 1, handed
        // back once and not used again.
        unsafe {
            pool.put(e1, DeviceId(1));
            pool.put(e2, DeviceId(1));
        }
        assert_eq!(pool.get(DeviceId(1)).unwrap(), e2);
        // SAFETY: as above.
        unsafe { pool.put(e2, DeviceId(1)) };
        assert_eq!(gpu.live_events(), 2);
        drop(pool);
        assert_eq!(gpu.live_events(), 0);
    }
}
