//! (a) gpupool's own futures: `AccessOrder::completed(&events)` records a
//! pooled event after the work queued so far on the lease's stream and
//! returns a `Completed` future, resolved by the event pool's completion
//! engine (one thread, "gpupool-completion", that queries the pending events
//! and wakes their wakers).
//!
//! The first poll asks about the event itself for up to the pool's
//! completion spin (the run's `--spin-budget-us` for (a), zero for (a0)),
//! then hands it to the engine.
//!
//! Submission step: the `completed()` call. Completion machinery: the
//! threads named "gpupool-completion" (`comm` keeps 15 bytes:
//! "gpupool-complet").

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use gpupool_core::{Completed, EventPool};
use gpupool_cuda::CudaBackend;

use super::{Design, Lease, Path, Submitted};
use crate::sys_stats::threads_named;

/// Design (a).
pub struct GpupoolFutures {
    events: &'static EventPool<CudaBackend>,
    name: &'static str,
}

impl GpupoolFutures {
    /// Records events of `events` (its engine serves the futures; its
    /// completion spin is the first poll's budget), named `name` in the
    /// report.
    pub fn new(events: &'static EventPool<CudaBackend>, name: &'static str) -> GpupoolFutures {
        GpupoolFutures { events, name }
    }
}

/// gpupool's future, its error as text.
pub struct GpupoolFut(Completed<'static, CudaBackend>);

impl Future for GpupoolFut {
    type Output = Result<Path, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.0).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => Poll::Ready(r.map(|()| Path::Direct).map_err(|e| e.to_string())),
        }
    }
}

impl Design for GpupoolFutures {
    type Fut = GpupoolFut;

    fn name(&self) -> &'static str {
        self.name
    }

    fn submit(&'static self, lease: Lease) -> Result<Submitted<GpupoolFut>, String> {
        let fut = lease
            .order()
            .completed(self.events)
            .map_err(|e| format!("completed(): {e}"))?;
        Ok(Submitted::whole(GpupoolFut(fut)))
    }

    fn machinery_threads(&self) -> Vec<i32> {
        threads_named("gpupool-complet")
    }

    fn machinery_label(&self) -> &'static str {
        "threads named gpupool-completion"
    }
}
