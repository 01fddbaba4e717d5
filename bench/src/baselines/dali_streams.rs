//! DALI's `CUDAStreamPool`: a ready and a busy list per device under one
//! spinlock, and its leases.

use std::sync::atomic::{AtomicIsize, Ordering};

use gpupool_core::{Completion, DeviceId, StreamBackend, StreamHandle, StreamOptions};

use super::list::{take_node, List};
use super::lock_yielding;

/// The stream pool's lists: per device a ready and a busy list, and the
/// recycled nodes.
#[derive(Default)]
struct StreamLists {
    ready: Vec<List>,
    busy: Vec<List>,
    unused: List,
}

/// DALI's `CUDAStreamPool` over any [`StreamBackend`].
///
/// Lazy like DALI's: the first `get` or `put` counts the devices under the
/// lock (the per-device vectors are reserved for 128 devices up front, so that
/// count allocates nothing while the lock is held).
pub struct DaliStreamPool<B: StreamBackend> {
    backend: B,
    options: StreamOptions,
    lists: spin::Mutex<StreamLists>,
    lease_count: AtomicIsize,
}

impl<B: StreamBackend> DaliStreamPool<B> {
    /// An empty pool creating non-blocking streams with default options. Calls
    /// nothing.
    pub fn new(backend: B) -> Self {
        DaliStreamPool {
            backend,
            options: StreamOptions::default(),
            lists: spin::Mutex::new(StreamLists {
                ready: Vec::with_capacity(128),
                busy: Vec::new(),
                unused: List::default(),
            }),
            lease_count: AtomicIsize::new(0),
        }
    }

    /// DALI's `Init`: sizes the per-device lists on first use.
    fn init(&self, lists: &mut StreamLists) -> Result<(), B::Error> {
        if lists.ready.is_empty() {
            let n = self.backend.device_count()? as usize;
            lists.ready.resize_with(n, List::default);
            lists.busy.resize_with(n, List::default);
        }
        Ok(())
    }

    /// Leases a stream on `device`: the ready list's head; else the first
    /// finished stream of the busy list, newest first, queried under the lock;
    /// else a new stream, created outside the lock.
    pub fn get(&self, device: DeviceId) -> Result<DaliStreamLease<'_, B>, B::Error> {
        let found = {
            let mut guard = lock_yielding(&self.lists);
            self.init(&mut guard)?;
            let lists = &mut *guard;
            let d = device.index();
            let node = match lists.ready[d].pop() {
                Some(node) => Some(node),
                None => lists.busy[d].unlink_first(|h| {
                    // SAFETY: the pool owns every stream in its lists: each is a
                    // live stream of the list's device (`device`), created by
                    // this backend (`put`'s contract, or `create_stream` here).
                    let state = unsafe {
                        self.backend
                            .query_stream(StreamHandle::from_raw(h), device)?
                    };
                    Ok(state == Completion::Complete)
                })?,
            };
            node.map(|mut node| {
                let handle = std::mem::take(&mut node.handle);
                lists.unused.push(node);
                // SAFETY: a stream the pool owned (see above); the lease takes
                // it over.
                unsafe { StreamHandle::from_raw(handle) }
            })
        };
        let stream = match found {
            Some(s) => s,
            None => self.backend.create_stream(device, self.options)?,
        };
        self.lease_count.fetch_add(1, Ordering::SeqCst);
        Ok(DaliStreamLease {
            pool: self,
            stream,
            device,
        })
    }

    /// Takes a stream into the pool: queried before the lock, then pushed onto
    /// the head of the device's ready list (finished) or busy list (pending).
    /// On a failed query the stream stays the caller's.
    ///
    /// # Panics
    /// On a null stream (DALI throws `std::invalid_argument`).
    ///
    /// # Safety
    /// `stream` is a live, non-special stream of `device`, created by this
    /// pool's backend (or one with its [`id`](gpupool_core::Backend::id)), and
    /// the caller hands it over: nothing else owns or uses it from now on
    /// (unless the query fails, when it stays the caller's).
    pub unsafe fn put(&self, stream: StreamHandle, device: DeviceId) -> Result<(), B::Error> {
        assert!(!stream.is_null(), "Cannot put a null stream in the pool.");
        // SAFETY: the caller's contract: a live stream of `device` of this
        // backend.
        let state = unsafe { self.backend.query_stream(stream, device)? };
        let mut guard = lock_yielding(&self.lists);
        self.init(&mut guard)?;
        let (mut guard, mut node) = take_node(&self.lists, guard, |l| &mut l.unused);
        node.handle = stream.as_raw();
        let lists = &mut *guard;
        match state {
            Completion::Complete => lists.ready[device.index()].push(node),
            Completion::Pending => lists.busy[device.index()].push(node),
        }
        Ok(())
    }

    /// Leases that are out now.
    pub fn live_leases(&self) -> isize {
        self.lease_count.load(Ordering::SeqCst)
    }

    /// Destroys every pooled stream, ready or busy, under the lock, and frees
    /// every node. Returns how many streams were destroyed; stops at the first
    /// failed destroy (that stream is then lost, as in DALI).
    pub fn purge(&self) -> Result<usize, B::Error> {
        let mut guard = lock_yielding(&self.lists);
        let lists = &mut *guard;
        lists.unused = List::default();
        let mut destroyed = 0;
        for (d, (ready, busy)) in lists.ready.iter_mut().zip(&mut lists.busy).enumerate() {
            for list in [ready, busy] {
                while let Some(node) = list.pop() {
                    let device = DeviceId(d as u32);
                    // SAFETY: the pool owns every stream in its lists, a live
                    // stream of the list's device created by this backend;
                    // the node is dropped, so nothing uses it after this.
                    unsafe {
                        self.backend
                            .destroy_stream(StreamHandle::from_raw(node.handle), device)?;
                    }
                    destroyed += 1;
                }
            }
        }
        Ok(destroyed)
    }
}

impl<B: StreamBackend> Drop for DaliStreamPool<B> {
    /// Purges; an error is dropped (DALI would terminate).
    fn drop(&mut self) {
        let _ = self.purge();
    }
}

/// A stream leased from a [`DaliStreamPool`]; returned to it on drop.
pub struct DaliStreamLease<'p, B: StreamBackend> {
    pool: &'p DaliStreamPool<B>,
    stream: StreamHandle,
    device: DeviceId,
}

impl<B: StreamBackend> DaliStreamLease<'_, B> {
    /// The leased stream.
    pub fn handle(&self) -> StreamHandle {
        self.stream
    }

    /// Its device.
    pub fn device(&self) -> DeviceId {
        self.device
    }
}

impl<B: StreamBackend> Drop for DaliStreamLease<'_, B> {
    /// `Put`s the stream back with the lease's device, then counts the lease
    /// out.
    ///
    /// # Panics
    /// When the put fails (DALI's lease destructor calls `std::terminate`).
    fn drop(&mut self) {
        // SAFETY: the lease holds the stream its pool gave out (from its lists
        // or created by its backend on `device`) and hands it back here; the
        // lease ends with this drop.
        if let Err(e) = unsafe { self.pool.put(self.stream, self.device) } {
            panic!("returning a stream to the DALI-style pool failed: {e}");
        }
        self.pool.lease_count.fetch_sub(1, Ordering::SeqCst);
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::tests::D;
    use gpupool_mock::MockBackend;

    #[test]
    fn dali_stream_pool_reuses_ready_then_finished_busy_then_creates() {
        let gpu = MockBackend::new(1);
        let pool = DaliStreamPool::new(gpu.clone());
        let a = pool.get(D).unwrap();
        let b = pool.get(D).unwrap();
        let (sa, sb) = (a.handle(), b.handle());
        assert_eq!(pool.live_leases(), 2);
        gpu.enqueue_work(sa).unwrap();
        gpu.enqueue_work(sb).unwrap();
        drop(a); // busy
        drop(b); // busy, newer
        assert_eq!(gpu.live_streams(), 2);
        gpu.complete_all(sa).unwrap();
        // Ready list empty: the busy scan finds `sa` (`sb` is still pending).
        let c = pool.get(D).unwrap();
        assert_eq!(c.handle(), sa);
        // Nothing ready, `sb` pending: a new stream.
        let e = pool.get(D).unwrap();
        assert_ne!(e.handle(), sb);
        assert_eq!(gpu.live_streams(), 3);
        drop(c); // idle: ready
        let f = pool.get(D).unwrap();
        assert_eq!(f.handle(), sa);
        drop((e, f));
        assert_eq!(pool.live_leases(), 0);
        gpu.complete_all(sb).unwrap();
        assert_eq!(pool.purge().unwrap(), 3);
        assert_eq!(gpu.live_streams(), 0);
    }
}
