//! The operations (the table's rows), each run while a capture is open.

use std::ffi::c_void;

use gpupool_core::{AccessOrder, EventBackend, MemoryKind, Scratchpad, ScratchpadConfig};
use gpupool_cuda::cudarc::driver::sys;

use crate::driver::{capture_status, cu, cu_event};
use crate::env::{Deferred, Env};
use crate::errors::{at, backend, raw, Res};
use crate::{D0, GPU};

pub(crate) struct Row {
    pub(crate) id: &'static str,
    pub(crate) name: &'static str,
    pub(crate) op: fn(&Env) -> Res,
    /// Run in a fresh process (process-wide first use).
    pub(crate) fresh_process: bool,
}

pub(crate) fn row(id: &'static str, name: &'static str, op: fn(&Env) -> Res) -> Row {
    Row {
        id,
        name,
        op,
        fresh_process: false,
    }
}

pub(crate) fn op_get_empty(env: &Env) -> Res {
    env.begin();
    let l = at("", env.streams.get(0))?;
    env.keep(l);
    Ok(())
}

pub(crate) fn op_get_ready(env: &Env) -> Res {
    drop(at("warm", env.streams.get(0))?);
    env.begin();
    let l = at("", env.streams.get(0))?;
    env.keep(l);
    Ok(())
}

pub(crate) fn op_drop_origin(env: &Env) -> Res {
    env.begin();
    let lease = env.origin.borrow_mut().take();
    drop(lease);
    Ok(())
}

pub(crate) fn op_drop_joined_side(env: &Env) -> Res {
    let side = env.side()?;
    env.warm_events()?;
    env.begin();
    at("fork", side.order().wait(&env.order(), env.events))?;
    env.note(format!(
        "after fork: side {}",
        capture_status(side.handle())
    ));
    env.work(side.handle())?;
    side.drop_now();
    Ok(())
}

pub(crate) fn op_drop_side_after_join(env: &Env) -> Res {
    let side = env.side()?;
    env.warm_events()?;
    env.begin();
    at("fork", side.order().wait(&env.order(), env.events))?;
    env.work(side.handle())?;
    at("join", env.order().wait(&side.order(), env.events))?;
    env.note(format!(
        "after join: side {}",
        capture_status(side.handle())
    ));
    side.drop_now();
    Ok(())
}

pub(crate) fn op_drop_other(env: &Env) -> Res {
    let l = env.other()?;
    env.begin();
    l.drop_now();
    Ok(())
}

pub(crate) fn op_events(env: &Env) -> Res {
    env.begin();
    let e = at("get", env.events.get(0))?;
    drop(e); // no driver call
    Ok(())
}

pub(crate) fn op_fork_join(env: &Env) -> Res {
    let side = env.side()?;
    env.warm_events()?;
    env.begin();
    at("fork", side.order().wait(&env.order(), env.events))?;
    env.note(format!(
        "after fork: side {}",
        capture_status(side.handle())
    ));
    env.work(side.handle())?;
    at("join", env.order().wait(&side.order(), env.events))?;
    env.work(env.origin_raw)?;
    env.note(format!(
        "after join: origin {}, side {}",
        capture_status(env.origin_raw),
        capture_status(side.handle())
    ));
    Ok(())
}

pub(crate) fn op_host_wait(env: &Env) -> Res {
    env.begin();
    at("", AccessOrder::host().wait(&env.order(), env.events))
}

pub(crate) fn op_host_wait_event(env: &Env) -> Res {
    let e = env.hold(at("get event", env.events.get(0))?);
    env.begin();
    // SAFETY: a leased event of device 0 and the origin (alive, see `order`).
    backend("record", unsafe {
        GPU.record_event(e.handle(), env.origin_raw, D0)
    })?;
    at("wait_event", AccessOrder::host().wait_event(&*e))
}

/// A new scratchpad on the origin: 4 KiB of device memory, written by a
/// memset in the origin's order, then the scratchpad dropped.
pub(crate) fn scratch_device(env: &Env) -> Res {
    let s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    let d = at("alloc", s.device::<u8>(4096))?;
    env.work_at(d.addr(), d.byte_len())?;
    s.drop_now();
    Ok(())
}

pub(crate) fn op_dev_cold(env: &Env) -> Res {
    env.begin();
    scratch_device(env)
}

pub(crate) fn op_dev_cached(env: &Env) -> Res {
    {
        let s = at("warm new", Scratchpad::new(&GPU, env.order()))?;
        at("warm alloc", s.device::<u8>(4096))?;
    }
    if let Ok(m) = GPU.memory_stats(D0) {
        env.note(format!(
            "before capture: device cache holds {} block(s)",
            m.cached_blocks[MemoryKind::Device.index()]
        ));
    }
    env.begin();
    scratch_device(env)
}

pub(crate) fn op_dev_reset(env: &Env) -> Res {
    env.begin();
    let mut s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    {
        let d = at("alloc", s.device::<u8>(4096))?;
        env.work_at(d.addr(), d.byte_len())?;
    }
    at("reset", s.reset())?;
    {
        let d = at("alloc 2", s.device::<u8>(4096))?;
        env.work_at(d.addr(), d.byte_len())?;
    }
    s.drop_now();
    Ok(())
}

pub(crate) fn op_dev_reset_grown(env: &Env) -> Res {
    env.begin();
    let mut s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    {
        let a = at("alloc", s.device::<u8>(4096))?;
        let b = at("alloc big", s.device::<u8>(128 * 1024))?;
        env.work_at(a.addr(), a.byte_len())?;
        env.work_at(b.addr(), b.byte_len())?;
    }
    env.note(format!(
        "blocks before reset: {}",
        s.stats().blocks[MemoryKind::Device.index()]
    ));
    at("reset", s.reset())?;
    {
        let d = at("alloc 2", s.device::<u8>(4096))?;
        env.work_at(d.addr(), d.byte_len())?;
    }
    s.drop_now();
    Ok(())
}

/// A scratchpad on the origin (release order: the origin) with 4 KiB of
/// host-visible `kind` memory written by the host; reset and allocated
/// again when `reset`; dropped.
pub(crate) fn scratch_host_visible(env: &Env, kind: MemoryKind, reset: bool) -> Res {
    let mut s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    {
        let p = at("alloc", s.uninit::<u32>(kind, 1024))?;
        p.iter_mut().for_each(|x| {
            x.write(7);
        });
    }
    if reset {
        at("reset", s.reset())?;
        let p = at("alloc 2", s.uninit::<u32>(kind, 1024))?;
        p.iter_mut().for_each(|x| {
            x.write(8);
        });
    }
    s.drop_now();
    Ok(())
}

/// Leaves a free block of `kind` in the pool (a host-order release).
pub(crate) fn warm_host_visible(env: &Env, kind: MemoryKind) -> Res {
    let config = ScratchpadConfig {
        pinned_release: Some(AccessOrder::host()),
        managed_release: Some(AccessOrder::host()),
        ..ScratchpadConfig::default()
    };
    let s = at(
        "warm new",
        Scratchpad::with_config(&GPU, env.order(), config),
    )?;
    at("warm alloc", s.uninit::<u32>(kind, 1024))?;
    drop(s);
    Ok(())
}

pub(crate) fn op_pinned_cold(env: &Env) -> Res {
    env.begin();
    scratch_host_visible(env, MemoryKind::Pinned, false)
}

pub(crate) fn op_pinned_warm(env: &Env) -> Res {
    warm_host_visible(env, MemoryKind::Pinned)?;
    env.begin();
    scratch_host_visible(env, MemoryKind::Pinned, false)
}

pub(crate) fn op_pinned_reset(env: &Env) -> Res {
    env.begin();
    scratch_host_visible(env, MemoryKind::Pinned, true)
}

pub(crate) fn op_managed_cold(env: &Env) -> Res {
    env.begin();
    scratch_host_visible(env, MemoryKind::Managed, false)
}

pub(crate) fn op_managed_warm(env: &Env) -> Res {
    warm_host_visible(env, MemoryKind::Managed)?;
    env.begin();
    scratch_host_visible(env, MemoryKind::Managed, false)
}

pub(crate) fn op_managed_reset(env: &Env) -> Res {
    env.begin();
    scratch_host_visible(env, MemoryKind::Managed, true)
}

pub(crate) fn op_to_device(env: &Env) -> Res {
    env.begin();
    let s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    {
        at("to_device", s.to_device(&[1u32, 2, 3, 4]))?;
    }
    s.drop_now();
    Ok(())
}

pub(crate) fn op_to_host(env: &Env) -> Res {
    let s = env.hold(at("new", Scratchpad::new(&GPU, env.order()))?);
    let d = at("to_device (before)", s.to_device(&[1u32, 2, 3, 4]))?;
    env.begin();
    let v = at("to_host", s.to_host(&d))?;
    env.note(format!("to_host gave {v:?}"));
    Ok(()) // the scratchpad is dropped after the capture
}

pub(crate) fn op_raw_stream_query(env: &Env) -> Res {
    let l = env.other()?;
    env.begin();
    // SAFETY: a live leased stream.
    raw("", unsafe { sys::cuStreamQuery(cu(l.handle())) })
}

pub(crate) fn op_raw_event_query(env: &Env) -> Res {
    let l = env.other()?;
    let e = env.hold(at("get event", env.events.get(0))?);
    // SAFETY: a leased event of device 0 and a leased stream of device 0.
    backend("record (before)", unsafe {
        GPU.record_event(e.handle(), l.handle(), D0)
    })?;
    env.begin();
    // SAFETY: a leased event.
    raw("", unsafe { sys::cuEventQuery(cu_event(e.handle())) })
}

pub(crate) fn op_raw_stream_sync(env: &Env) -> Res {
    let l = env.other()?;
    env.begin();
    // SAFETY: a live leased stream with no work.
    raw("", unsafe { sys::cuStreamSynchronize(cu(l.handle())) })
}

pub(crate) fn op_raw_mem_alloc(env: &Env) -> Res {
    env.begin();
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: an out-pointer; the context is current.
    raw("", unsafe { sys::cuMemAlloc_v2(&mut p, 4096) })?;
    env.keep(Deferred(Some(Box::new(move || {
        // SAFETY: `p` came from cuMemAlloc and nothing uses it.
        unsafe { sys::cuMemFree_v2(p) };
    }))));
    Ok(())
}

pub(crate) fn op_raw_host_alloc(env: &Env) -> Res {
    env.begin();
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: an out-pointer; the context is current.
    raw("", unsafe { sys::cuMemHostAlloc(&mut p, 4096, 0) })?;
    let addr = p as usize;
    env.keep(Deferred(Some(Box::new(move || {
        // SAFETY: `addr` came from cuMemHostAlloc and nothing uses it.
        unsafe { sys::cuMemFreeHost(addr as *mut c_void) };
    }))));
    Ok(())
}

pub(crate) fn op_raw_mem_alloc_async(env: &Env) -> Res {
    let l = env.other()?;
    env.begin();
    let mut p: sys::CUdeviceptr = 0;
    let s = cu(l.handle());
    // SAFETY: an out-pointer and a live leased stream.
    raw("", unsafe { sys::cuMemAllocAsync(&mut p, 4096, s) })?;
    let addr = s as usize;
    // Pushed before the lease's `Kept` goes to the keep list: freed while
    // the stream is still leased.
    env.keep(Deferred(Some(Box::new(move || {
        let s = addr as sys::CUstream;
        // SAFETY: `p` came from cuMemAllocAsync on `s`, which is alive
        // (its lease is dropped after this).
        unsafe {
            sys::cuMemFreeAsync(p, s);
            sys::cuStreamSynchronize(s);
        }
    }))));
    Ok(())
}

pub(crate) fn op_raw_event_record(env: &Env) -> Res {
    let l = env.other()?;
    let e = env.hold(at("get event", env.events.get(0))?);
    env.begin();
    // SAFETY: a leased event and a leased stream, both of device 0.
    raw("", unsafe {
        sys::cuEventRecord(cu_event(e.handle()), cu(l.handle()))
    })
}

pub(crate) fn op_raw_event_create(env: &Env) -> Res {
    env.begin();
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: an out-pointer; the context is current.
    raw("", unsafe {
        sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    })?;
    let addr = e as usize;
    env.keep(Deferred(Some(Box::new(move || {
        // SAFETY: our event, unused.
        unsafe { sys::cuEventDestroy_v2(addr as sys::CUevent) };
    }))));
    Ok(())
}

pub(crate) fn op_raw_stream_create(env: &Env) -> Res {
    env.begin();
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: an out-pointer; the context is current.
    raw("", unsafe {
        sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
    })?;
    let addr = s as usize;
    env.keep(Deferred(Some(Box::new(move || {
        // SAFETY: our stream, with no work.
        unsafe { sys::cuStreamDestroy_v2(addr as sys::CUstream) };
    }))));
    Ok(())
}

pub(crate) fn rows() -> Vec<Row> {
    vec![
        row("1a", "stream get (empty pool: creates)", op_get_empty),
        row("1b", "stream get (ready stream: pops)", op_get_ready),
        row("2", "drop origin lease", op_drop_origin),
        row(
            "3",
            "drop joined side (not joined back)",
            op_drop_joined_side,
        ),
        row("4", "drop side after join", op_drop_side_after_join),
        row("5", "drop lease not in capture", op_drop_other),
        row("6", "event get (empty: creates) + drop", op_events),
        row("7", "fork + join (order.wait)", op_fork_join),
        row("8", "host.wait(origin)", op_host_wait),
        row("9", "host wait_event (rec. on origin)", op_host_wait_event),
        row("10a", "scratch device 4K + drop", op_dev_cold),
        row(
            "10b",
            "scratch device 4K + drop (cached block)",
            op_dev_cached,
        ),
        Row {
            fresh_process: true,
            ..row(
                "10c",
                "scratch device 4K + drop (first in process)",
                op_dev_cold,
            )
        },
        row("11a", "scratch device alloc, reset, alloc", op_dev_reset),
        row("11b", "scratch device reset (2 blocks)", op_dev_reset_grown),
        row("12a", "scratch pinned + drop (empty pool)", op_pinned_cold),
        row("12b", "scratch pinned + drop (free block)", op_pinned_warm),
        row("12c", "scratch pinned alloc, reset, alloc", op_pinned_reset),
        row(
            "13a",
            "scratch managed + drop (empty pool)",
            op_managed_cold,
        ),
        row(
            "13b",
            "scratch managed + drop (free block)",
            op_managed_warm,
        ),
        row(
            "13c",
            "scratch managed alloc, reset, alloc",
            op_managed_reset,
        ),
        row("14a", "scratch to_device + drop", op_to_device),
        row("14b", "scratch to_host", op_to_host),
        row(
            "15a",
            "raw cuStreamQuery (other stream)",
            op_raw_stream_query,
        ),
        row(
            "15b",
            "raw cuEventQuery (other stream's)",
            op_raw_event_query,
        ),
        row("15c", "raw cuStreamSynchronize (other)", op_raw_stream_sync),
        row("15d", "raw cuMemAlloc_v2", op_raw_mem_alloc),
        row("15e", "raw cuMemHostAlloc", op_raw_host_alloc),
        row(
            "15f",
            "raw cuMemAllocAsync (other stream)",
            op_raw_mem_alloc_async,
        ),
        row(
            "15g",
            "raw cuEventRecord (other stream)",
            op_raw_event_record,
        ),
        row("15h", "raw cuEventCreate", op_raw_event_create),
        row("15i", "raw cuStreamCreate", op_raw_stream_create),
    ]
}
