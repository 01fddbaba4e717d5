//! (c) A `cuLaunchHostFunc` waker (the cuda-oxide / vortex design): per
//! future an `Arc`'d state (a done flag and a waker slot); after the work,
//! `cuLaunchHostFunc(stream, on_done, Arc::into_raw(state))`; the driver's
//! callback thread runs `on_done`, which sets the flag and wakes the task.
//!
//! Submission step: the `Arc` and `cuLaunchHostFunc`. Completion machinery:
//! the driver threads that ran a callback (each notes itself on its first
//! callback).

use core::ffi::c_void;
use core::future::Future;
use core::pin::Pin;
use core::sync::atomic::{AtomicBool, Ordering};
use core::task::{Context, Poll};
use std::sync::Arc;

use futures_util::task::AtomicWaker;
use gpupool_cuda::cudarc::driver::sys;

use super::{Design, Lease, Path, Submitted};
use crate::gpu::{check, raw_stream};
use crate::sys_stats::TidSet;

/// The driver threads that ran a callback.
static CALLBACK_THREADS: TidSet = TidSet::new(2);

/// What the callback and the future share.
struct Signal {
    done: AtomicBool,
    waker: AtomicWaker,
}

/// The host function: consumes the reference `submit` gave the driver.
///
/// # Safety
/// `user` is a pointer from `Arc::<Signal>::into_raw`, passed here once.
unsafe extern "C" fn on_done(user: *mut c_void) {
    // SAFETY: the contract: this call owns the reference `submit` leaked.
    let signal = unsafe { Arc::from_raw(user.cast_const().cast::<Signal>()) };
    CALLBACK_THREADS.note();
    signal.done.store(true, Ordering::Release);
    signal.waker.wake();
}

/// Design (c).
pub struct HostFn;

/// Resolves once the callback has run.
pub struct HostFnFut(Arc<Signal>);

impl Future for HostFnFut {
    type Output = Result<Path, String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.0.done.load(Ordering::Acquire) {
            return Poll::Ready(Ok(Path::Direct));
        }
        self.0.waker.register(cx.waker());
        if self.0.done.load(Ordering::Acquire) {
            Poll::Ready(Ok(Path::Direct))
        } else {
            Poll::Pending
        }
    }
}

impl Design for HostFn {
    type Fut = HostFnFut;

    fn name(&self) -> &'static str {
        "c-launch_host_func"
    }

    fn submit(&'static self, lease: Lease) -> Result<Submitted<HostFnFut>, String> {
        let signal = Arc::new(Signal {
            done: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        let user = Arc::into_raw(signal.clone()).cast_mut().cast::<c_void>();
        // SAFETY: the stream is live (the lease borrows it for good);
        // `on_done` takes `user`, a reference leaked for it, exactly once.
        let r = unsafe { sys::cuLaunchHostFunc(raw_stream(lease), Some(on_done), user) };
        if let Err(e) = check("cuLaunchHostFunc", r) {
            // SAFETY: not queued, so the reference is still ours.
            drop(unsafe { Arc::from_raw(user.cast_const().cast::<Signal>()) });
            return Err(e);
        }
        Ok(Submitted::whole(HostFnFut(signal)))
    }

    fn machinery_threads(&self) -> Vec<i32> {
        CALLBACK_THREADS.tids()
    }

    fn machinery_label(&self) -> &'static str {
        "driver threads that ran a callback"
    }
}
