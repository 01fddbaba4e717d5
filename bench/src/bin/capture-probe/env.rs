//! What an operation sees: its streams, pools and capture origin, and what it
//! leaves to drop after the capture (`Env`, `Kept`, `Deferred`).

use std::any::Any;
use std::cell::{Cell, RefCell};

use gpupool_core::{AccessOrder, EventPool, StreamHandle, StreamPool};
use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::{CudaBackend, MemoryStats};

use crate::driver::cu;
use crate::errors::{at, raw, Fail, Res};
use crate::{Lease, BUF_WORDS, D0, GPU};

/// Runs a closure when dropped (raw resources freed after the capture).
pub(crate) struct Deferred(pub(crate) Option<Box<dyn FnOnce()>>);

impl Drop for Deferred {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// The world of one operation.
pub(crate) struct Env<'a> {
    pub(crate) streams: &'static StreamPool<CudaBackend>,
    pub(crate) events: &'static EventPool<CudaBackend>,
    pub(crate) origin_pool: &'static StreamPool<CudaBackend>,
    /// The lease of `origin_raw` (row 2 takes it).
    pub(crate) origin: RefCell<Option<Lease>>,
    /// The stream the operation works on: the capture's origin, or (other
    /// thread) B's own stream, which is not in the capture.
    pub(crate) origin_raw: StreamHandle,
    pub(crate) buf: sys::CUdeviceptr,
    pub(crate) begin_fn: &'a dyn Fn(),
    pub(crate) began: Cell<bool>,
    pub(crate) notes: RefCell<Vec<String>>,
    /// Dropped only after the capture has ended, in this order.
    pub(crate) keep: RefCell<Vec<Box<dyn Any>>>,
    /// Side streams whose status is checked after the capture ended.
    pub(crate) watch: RefCell<Vec<StreamHandle>>,
    /// Memory counters when the operation began (None in a fresh process,
    /// where reading them would initialise the memory state early).
    pub(crate) mem_before: RefCell<Option<MemoryStats>>,
    pub(crate) read_mem: bool,
}

/// A cell's fresh pools, leaked (a stream may still capture when the cell
/// ends): its streams, its events, and the pool the operation's stream is
/// leased from.
pub(crate) struct Pools {
    pub(crate) streams: &'static StreamPool<CudaBackend>,
    pub(crate) events: &'static EventPool<CudaBackend>,
    pub(crate) origin_pool: &'static StreamPool<CudaBackend>,
}

impl Pools {
    pub(crate) fn leaked() -> Pools {
        Pools {
            streams: leak(StreamPool::new(GPU)),
            events: leak(EventPool::new(GPU)),
            origin_pool: leak(StreamPool::new(GPU)),
        }
    }
}

pub(crate) fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// A value whose drop would call the driver: dropped by `drop_now`, or,
/// when the operation returns (or fails) without doing so, kept until the
/// capture has ended.
pub(crate) struct Kept<'e, 'a, T: 'static> {
    pub(crate) env: &'e Env<'a>,
    pub(crate) val: Option<T>,
}

impl<T: 'static> Kept<'_, '_, T> {
    pub(crate) fn drop_now(mut self) {
        drop(self.val.take());
    }
}

impl<T: 'static> std::ops::Deref for Kept<'_, '_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.val.as_ref().expect("taken")
    }
}

impl<T: 'static> std::ops::DerefMut for Kept<'_, '_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.val.as_mut().expect("taken")
    }
}

impl<T: 'static> Drop for Kept<'_, '_, T> {
    fn drop(&mut self) {
        if let Some(v) = self.val.take() {
            self.env.keep(v);
        }
    }
}

impl<'a> Env<'a> {
    /// The world of an operation on `origin` (a lease of `pools.origin_pool`)
    /// whose capture `begin_fn` begins.
    pub(crate) fn new(
        pools: Pools,
        origin: Lease,
        buf: sys::CUdeviceptr,
        begin_fn: &'a dyn Fn(),
        read_mem: bool,
    ) -> Env<'a> {
        Env {
            streams: pools.streams,
            events: pools.events,
            origin_pool: pools.origin_pool,
            origin_raw: origin.handle(),
            origin: RefCell::new(Some(origin)),
            buf,
            begin_fn,
            began: Cell::new(false),
            notes: RefCell::new(Vec::new()),
            keep: RefCell::new(Vec::new()),
            watch: RefCell::new(Vec::new()),
            mem_before: RefCell::new(None),
            read_mem,
        }
    }

    /// Begins the capture (once): from here on the operation is measured.
    pub(crate) fn begin(&self) {
        if !self.began.replace(true) {
            if self.read_mem {
                *self.mem_before.borrow_mut() = GPU.memory_stats(D0).ok();
            }
            (self.begin_fn)();
            // A capture begun through the raw handle: the lease is told
            // (docs/graph-capture.md, rule 3).
            if let Some(lease) = self.origin.borrow().as_ref() {
                lease.note_capture();
            }
        }
    }

    /// The order of `origin_raw`, a stream that captures.
    pub(crate) fn order(&self) -> AccessOrder<'static> {
        // SAFETY: `origin_raw` is a stream of a pool that is leaked for the
        // cell and purged only after everything the operation made (the
        // keep list included) is dropped (`from_raw_capturable` asks for
        // nothing about captures).
        unsafe { AccessOrder::from_raw_capturable(&GPU, self.origin_raw, D0) }
    }

    pub(crate) fn keep<T: 'static>(&self, v: T) {
        self.keep.borrow_mut().push(Box::new(v));
    }

    /// Runs `f` after the capture has ended (a raw resource freed).
    pub(crate) fn defer(&self, f: impl FnOnce() + 'static) {
        self.keep(Deferred(Some(Box::new(f))));
    }

    pub(crate) fn hold<'e, T: 'static>(&'e self, v: T) -> Kept<'e, 'a, T> {
        Kept {
            env: self,
            val: Some(v),
        }
    }

    pub(crate) fn note(&self, s: impl Into<String>) {
        self.notes.borrow_mut().push(s.into());
    }

    /// A little work on `stream`: a memset of the probe's buffer.
    pub(crate) fn work(&self, stream: StreamHandle) -> Res {
        // SAFETY: `buf` holds BUF_WORDS words for the whole run; `stream` is
        // alive (a lease of a leaked pool).
        raw("memset", unsafe {
            sys::cuMemsetD32Async(self.buf, 0, BUF_WORDS, cu(stream))
        })
    }

    /// A memset of `bytes` at `addr` (scratch device memory) on the origin.
    pub(crate) fn work_at(&self, addr: usize, bytes: usize) -> Res {
        // SAFETY: `addr` is `bytes` of scratch device memory allocated in
        // the origin's order and alive until the scratchpad's reset or drop.
        raw("memset scratch", unsafe {
            sys::cuMemsetD8Async(addr as sys::CUdeviceptr, 0, bytes, cu(self.origin_raw))
        })
    }

    /// A lease of a stream of the cell's pool, watched after the capture.
    pub(crate) fn side(&self) -> Result<Kept<'_, 'a, Lease>, Fail> {
        let l = at("get side", self.streams.get(0))?;
        self.watch.borrow_mut().push(l.handle());
        Ok(self.hold(l))
    }

    /// A lease of a stream of the cell's pool, not in any capture.
    pub(crate) fn other(&self) -> Result<Kept<'_, 'a, Lease>, Fail> {
        Ok(self.hold(at("get other", self.streams.get(0))?))
    }

    /// Puts two events in the event pool, so that `wait` finds one.
    pub(crate) fn warm_events(&self) -> Res {
        let a = at("warm events", self.events.get(0))?;
        let b = at("warm events", self.events.get(0))?;
        drop((a, b));
        Ok(())
    }
}
