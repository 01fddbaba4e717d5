//! The four designs, behind one trait the harness drives.
//!
//! Each request's kernel is already queued on `lease`'s stream when
//! [`Design::submit`] is called; `submit` makes the future that resolves when
//! that kernel has finished, and says what its submission step cost.

use core::future::Future;

use gpupool_core::StreamLease;
use gpupool_cuda::CudaBackend;

pub mod blocking;
pub mod cutile;
pub mod gpupool;
pub mod hostfn;

/// The lease of the stream a request's kernel is queued on: the harness's
/// for the whole run.
pub type Lease = &'static StreamLease<'static, CudaBackend>;

/// How a request's completion was noticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The design's one way.
    Direct,
    /// (d): the bounded `cuStreamQuery` spin in the first poll saw it.
    Spin,
    /// (d): the reactor saw the flag.
    Reactor,
    /// (d): the `cuLaunchHostFunc` fallback (no slot free).
    HostFn,
}

/// What the submission step of one future cost.
#[derive(Clone, Copy, Debug)]
pub enum StepCost {
    /// The whole `submit` call (the harness times it).
    Whole,
    /// Measured inside `submit`, in ns (for (d): the registration alone,
    /// not the spin before it).
    Measured(u64),
    /// No submission step happened (for (d): the spin saw completion).
    Skipped,
}

/// A future of a design, its submission cost, and the time spent spinning
/// on the stream in `submit` (only (d) spins).
pub struct Submitted<F> {
    /// Resolves when the request's kernel has finished.
    pub fut: F,
    /// What the submission step cost.
    pub step: StepCost,
    /// ns spent polling the stream inside `submit`.
    pub spin_ns: u64,
    /// When (host clock) `submit` itself saw the work complete, if it did
    /// (for (d): the spin saw it; cuda-async's first poll returns `Ready`
    /// then, so that is when the future resolves).
    pub ready_ns: Option<u64>,
}

impl<F> Submitted<F> {
    /// A submission that cost the whole `submit` call, without spinning.
    #[inline]
    pub fn whole(fut: F) -> Self {
        Submitted {
            fut,
            step: StepCost::Whole,
            spin_ns: 0,
            ready_ns: None,
        }
    }
}

/// One way of making GPU completion awaitable.
pub trait Design: Send + Sync + 'static {
    /// The future of one request.
    type Fut: Future<Output = Result<Path, String>> + Send + Unpin + 'static;

    /// A short name for the table ("a-gpupool", ...).
    fn name(&self) -> &'static str;

    /// Makes the future of the work queued so far on `lease`'s stream.
    fn submit(&'static self, lease: Lease) -> Result<Submitted<Self::Fut>, String>;

    /// The threads of the design's completion machinery, as of now.
    fn machinery_threads(&self) -> Vec<i32>;

    /// What [`machinery_threads`](Self::machinery_threads) are, for the
    /// report.
    fn machinery_label(&self) -> &'static str;
}
