//! The warm-up before the cells, and the cost of the capture queries.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use gpupool_bench::sys_stats::upper_median as median;
use gpupool_core::{AccessOrder, Scratchpad, StreamPool};
use gpupool_cuda::cudarc::driver::sys;

use crate::errors::panic_text;
use crate::{CALLS, D0, GPU, REPEATS, SUCCESS};

/// Makes the first use of every memory kind outside any capture (gpupool's
/// device memory pool, the pinned and managed pools, the staging path),
/// then gives the blocks back, so that the cells see empty pools but
/// initialised state.
pub(crate) fn warm_up() -> Result<(), String> {
    let pool = StreamPool::new(GPU);
    let l = pool.get(0).map_err(|e| format!("{e:#}"))?;
    {
        let s = Scratchpad::new(&GPU, l.order()).map_err(|e| format!("{e:#}"))?;
        s.device::<u8>(4096).map_err(|e| format!("device: {e:#}"))?;
        s.pinned::<u32>(1024)
            .map_err(|e| format!("pinned: {e:#}"))?;
        s.managed::<u32>(1024)
            .map_err(|e| format!("managed: {e:#}"))?;
        let d = s
            .to_device(&[1u32, 2])
            .map_err(|e| format!("to_device: {e:#}"))?;
        s.to_host(&d).map_err(|e| format!("to_host: {e:#}"))?;
    }
    AccessOrder::host()
        .wait(&l.order(), gpupool_cuda::events())
        .map_err(|e| format!("{e:#}"))?;
    drop(l);
    pool.purge().map_err(|e| format!("{e:#}"))?;
    GPU.trim_memory(D0).map_err(|e| format!("trim: {e}"))?;
    Ok(())
}

/// ns per call of `f`, median of REPEATS runs of CALLS calls.
pub(crate) fn time_call(mut f: impl FnMut() -> sys::CUresult) -> Result<f64, String> {
    let r = f();
    if r != SUCCESS {
        return Err(format!("{r:?}"));
    }
    let mut runs = Vec::new();
    for _ in 0..REPEATS {
        let t = Instant::now();
        for _ in 0..CALLS {
            std::hint::black_box(f());
        }
        runs.push(t.elapsed().as_nanos() as f64 / CALLS as f64);
    }
    Ok(median(runs))
}

/// `cuStreamGetCaptureInfo_v3` asking for the status and the id only.
///
/// # Safety
///
/// `s` is a live stream.
#[inline(always)]
unsafe fn capture_info(
    s: sys::CUstream,
    st: &mut sys::CUstreamCaptureStatus,
    id: &mut sys::cuuint64_t,
) -> sys::CUresult {
    // SAFETY: `s` is live (the caller's word), the out-pointers are
    // references, null optional outputs are allowed.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            s,
            st,
            id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

pub(crate) fn timings() -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut s: sys::CUstream = std::ptr::null_mut();
    let mut c: sys::CUstream = std::ptr::null_mut();
    // SAFETY: out-pointers; the context is current on this thread.
    let created = unsafe {
        (
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
            sys::cuStreamCreate(&mut c, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
        )
    };
    if created != (SUCCESS, SUCCESS) {
        rows.push(("streams".into(), format!("{created:?}")));
        return rows;
    }
    let fmt = |r: Result<f64, String>| match r {
        Ok(ns) => format!("{ns:.1}"),
        Err(e) => format!("failed: {e}"),
    };
    let mut one = |name: &str, f: &mut dyn FnMut() -> sys::CUresult| {
        let r = catch_unwind(AssertUnwindSafe(|| time_call(&mut *f)))
            .unwrap_or_else(|p| Err(format!("panic: {}", panic_text(&*p))));
        rows.push((name.to_string(), fmt(r)));
    };
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    // In every closure below: `s` and `c` are live streams created above,
    // the out-pointers are locals, null optional outputs are allowed.
    one("cuStreamIsCapturing (idle stream)", &mut || {
        // SAFETY: see above.
        unsafe { sys::cuStreamIsCapturing(s, &mut st) }
    });
    one("cuStreamGetCaptureInfo_v3 (status + id)", &mut || {
        // SAFETY: see above.
        unsafe { capture_info(s, &mut st, &mut id) }
    });
    one("cuStreamQuery (idle stream)", &mut || {
        // SAFETY: see above.
        unsafe { sys::cuStreamQuery(s) }
    });
    // The same query on a stream that captures (relaxed, so nothing else is
    // affected).
    // SAFETY: `c` is live and not capturing.
    let begun = unsafe {
        sys::cuStreamBeginCapture_v2(c, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
    };
    if begun == SUCCESS {
        one("cuStreamIsCapturing (capturing stream)", &mut || {
            // SAFETY: see above.
            unsafe { sys::cuStreamIsCapturing(c, &mut st) }
        });
        one("cuStreamGetCaptureInfo_v3 (capturing stream)", &mut || {
            // SAFETY: see above.
            unsafe { capture_info(c, &mut st, &mut id) }
        });
        let mut g: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the capture begun above on `c`.
        unsafe {
            sys::cuStreamEndCapture(c, &mut g);
            if !g.is_null() {
                sys::cuGraphDestroy(g);
            }
        }
    } else {
        rows.push((
            "capturing-stream timings".into(),
            format!("begin {begun:?}"),
        ));
    }
    // SAFETY: our streams, idle.
    unsafe {
        sys::cuStreamDestroy_v2(s);
        sys::cuStreamDestroy_v2(c);
    }
    rows
}
