//! (b) A blocking wait moved to tokio's blocking pool: a pooled event is
//! recorded after the work, and `cuEventSynchronize` on it runs inside
//! `spawn_blocking` (tokio's default blocking pool, up to 512 threads).
//!
//! Submission step: leasing the event, recording it and `spawn_blocking`.
//! Completion machinery: the blocking-pool threads that ran a wait (each
//! notes itself on its first wait).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use gpupool_core::EventPool;
use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::CudaBackend;
use tokio::task::JoinHandle;

use super::{Design, Lease, Path, Submitted};
use crate::gpu::check;
use crate::sys_stats::TidSet;

/// The blocking-pool threads that ran a wait.
static WAITERS: TidSet = TidSet::new(1);

/// Design (b).
pub struct Blocking {
    events: &'static EventPool<CudaBackend>,
}

impl Blocking {
    /// Records events of `events`.
    pub fn new(events: &'static EventPool<CudaBackend>) -> Blocking {
        Blocking { events }
    }
}

/// The wait's join handle.
pub struct BlockingFut(JoinHandle<Result<(), String>>);

impl Future for BlockingFut {
    type Output = Result<Path, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.0).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(r)) => Poll::Ready(r.map(|()| Path::Direct)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(format!("the blocking task: {e}"))),
        }
    }
}

impl Design for Blocking {
    type Fut = BlockingFut;

    fn name(&self) -> &'static str {
        "b-spawn_blocking"
    }

    fn submit(&'static self, lease: Lease) -> Result<Submitted<BlockingFut>, String> {
        let event = self
            .events
            .get(lease.device())
            .map_err(|e| format!("leasing an event: {e}"))?;
        event
            .record(&lease.order())
            .map_err(|e| format!("recording an event: {e}"))?;
        let wait = tokio::task::spawn_blocking(move || {
            WAITERS.note();
            let raw = event.handle().as_raw() as sys::CUevent;
            // SAFETY: the event is leased (alive, of device 0) until `event`
            // drops below, after the call; the thread has device 0's primary
            // context current (the runtime's thread-start hook).
            let r = unsafe { sys::cuEventSynchronize(raw) };
            drop(event);
            check("cuEventSynchronize", r)
        });
        Ok(Submitted::whole(BlockingFut(wait)))
    }

    fn machinery_threads(&self) -> Vec<i32> {
        WAITERS.tids()
    }

    fn machinery_label(&self) -> &'static str {
        "blocking-pool threads that waited"
    }
}
