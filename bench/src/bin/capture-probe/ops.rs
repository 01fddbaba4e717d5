//! The operations (the table's rows), each run while a capture is open.

use std::mem::MaybeUninit;

use gpupool_core::{AccessOrder, EventBackend, MemoryKind, Scratchpad, ScratchpadConfig};
use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::CudaBackend;

use crate::driver::{capture_status, cu, cu_event};
use crate::env::{Env, Kept};
use crate::errors::{at, backend, raw, Fail, Res};
use crate::{Lease, D0, GPU};

/// The scratchpads the rows make (on the origin's order).
type Pad = Scratchpad<'static, CudaBackend>;

pub(crate) struct Row {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) op: Op,
    /// Run in a fresh process (process-wide first use).
    pub(crate) fresh_process: bool,
}

/// A row's operation: a function of its own, or a host-visible scratch row
/// ([`op_host_visible`] with these arguments: the kind, what is in the pool
/// before, whether the round resets).
#[derive(Clone, Copy)]
pub(crate) enum Op {
    Fn(fn(&Env) -> Res),
    HostVisible(MemoryKind, Before, bool),
}

impl Op {
    pub(crate) fn run(self, env: &Env) -> Res {
        match self {
            Op::Fn(op) => op(env),
            Op::HostVisible(kind, before, reset) => op_host_visible(env, kind, before, reset),
        }
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

/// A side stream forked from the origin inside the capture: the side
/// leased (and watched), two events put in the pool, the capture begun, the
/// side made to wait for the origin.
fn forked_side<'e, 'a>(env: &'e Env<'a>) -> Result<Kept<'e, 'a, Lease>, Fail> {
    let side = env.side()?;
    env.warm_events()?;
    env.begin();
    at("fork", side.order().wait(&env.order(), env.events))?;
    Ok(side)
}

/// Notes the capture status of `side` at `when`.
fn note_side(env: &Env, when: &str, side: &Lease) {
    env.note(format!("{when}: side {}", capture_status(side.handle())));
}

pub(crate) fn op_drop_joined_side(env: &Env) -> Res {
    let side = forked_side(env)?;
    note_side(env, "after fork", &side);
    env.work(side.handle())?;
    side.drop_now();
    Ok(())
}

pub(crate) fn op_drop_side_after_join(env: &Env) -> Res {
    let side = forked_side(env)?;
    env.work(side.handle())?;
    at("join", env.order().wait(&side.order(), env.events))?;
    note_side(env, "after join", &side);
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
    let side = forked_side(env)?;
    note_side(env, "after fork", &side);
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

/// A new scratchpad on the origin, kept until the capture has ended unless
/// dropped before.
fn new_scratchpad<'e, 'a>(env: &'e Env<'a>) -> Result<Kept<'e, 'a, Pad>, Fail> {
    Ok(env.hold(at("new", Scratchpad::new(&GPU, env.order()))?))
}

/// `bytes` of scratch device memory (allocation step `what`), written by a
/// memset in the origin's order.
fn device_written(env: &Env, s: &Pad, what: &str, bytes: usize) -> Res {
    let d = at(what, s.device::<u8>(bytes))?;
    env.work_at(d.addr(), d.byte_len())
}

/// Resets the scratchpad, allocates and writes 4 KiB of device memory
/// again, drops the scratchpad.
fn reset_device_again(env: &Env, mut s: Kept<'_, '_, Pad>) -> Res {
    at("reset", s.reset())?;
    device_written(env, &s, "alloc 2", 4096)?;
    s.drop_now();
    Ok(())
}

/// A new scratchpad on the origin: 4 KiB of device memory, written by a
/// memset in the origin's order, then the scratchpad dropped.
pub(crate) fn scratch_device(env: &Env) -> Res {
    let s = new_scratchpad(env)?;
    device_written(env, &s, "alloc", 4096)?;
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
    let s = new_scratchpad(env)?;
    device_written(env, &s, "alloc", 4096)?;
    reset_device_again(env, s)
}

pub(crate) fn op_dev_reset_grown(env: &Env) -> Res {
    env.begin();
    let s = new_scratchpad(env)?;
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
    reset_device_again(env, s)
}

/// A scratchpad on the origin (release order: the origin) with 4 KiB of
/// host-visible `kind` memory written by the host; reset and allocated
/// again when `reset`; dropped.
pub(crate) fn scratch_host_visible(env: &Env, kind: MemoryKind, reset: bool) -> Res {
    let mut s = new_scratchpad(env)?;
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

/// What a host-visible scratch row does before the capture begins.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Before {
    /// Nothing: the pool may be empty.
    Nothing,
    /// A free block of the kind left in the pool.
    FreeBlock,
}

/// The host-visible scratch rows (12 and 13): `before`, then the capture
/// begun and [`scratch_host_visible`].
pub(crate) fn op_host_visible(env: &Env, kind: MemoryKind, before: Before, reset: bool) -> Res {
    if before == Before::FreeBlock {
        warm_host_visible(env, kind)?;
    }
    env.begin();
    scratch_host_visible(env, kind, reset)
}

pub(crate) fn op_to_device(env: &Env) -> Res {
    env.begin();
    let s = new_scratchpad(env)?;
    {
        at("to_device", s.to_device(&[1u32, 2, 3, 4]))?;
    }
    s.drop_now();
    Ok(())
}

pub(crate) fn op_to_host(env: &Env) -> Res {
    let s = new_scratchpad(env)?;
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

/// A raw driver call inside the capture that makes a resource through its
/// out-pointer (`make`); the resource is given to `free` after the capture
/// has ended.
fn op_raw_made<T: 'static>(
    env: &Env,
    make: impl FnOnce(*mut T) -> sys::CUresult,
    free: impl FnOnce(T) -> sys::CUresult + 'static,
) -> Res {
    env.begin();
    let mut v = MaybeUninit::<T>::uninit();
    raw("", make(v.as_mut_ptr()))?;
    // SAFETY: the call succeeded, so it wrote the resource's handle.
    let v = unsafe { v.assume_init() };
    env.defer(move || {
        free(v);
    });
    Ok(())
}

pub(crate) fn op_raw_mem_alloc(env: &Env) -> Res {
    op_raw_made(
        env,
        // SAFETY: an out-pointer; the context is current.
        |p| unsafe { sys::cuMemAlloc_v2(p, 4096) },
        // SAFETY: `p` came from cuMemAlloc and nothing uses it.
        |p| unsafe { sys::cuMemFree_v2(p) },
    )
}

pub(crate) fn op_raw_host_alloc(env: &Env) -> Res {
    op_raw_made(
        env,
        // SAFETY: an out-pointer; the context is current.
        |p| unsafe { sys::cuMemHostAlloc(p, 4096, 0) },
        // SAFETY: `p` came from cuMemHostAlloc and nothing uses it.
        |p| unsafe { sys::cuMemFreeHost(p) },
    )
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
    env.defer(move || {
        let s = addr as sys::CUstream;
        // SAFETY: `p` came from cuMemAllocAsync on `s`, which is alive
        // (its lease is dropped after this).
        unsafe {
            sys::cuMemFreeAsync(p, s);
            sys::cuStreamSynchronize(s);
        }
    });
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
    op_raw_made(
        env,
        // SAFETY: an out-pointer; the context is current.
        |e| unsafe { sys::cuEventCreate(e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
        // SAFETY: our event, unused.
        |e| unsafe { sys::cuEventDestroy_v2(e) },
    )
}

pub(crate) fn op_raw_stream_create(env: &Env) -> Res {
    op_raw_made(
        env,
        // SAFETY: an out-pointer; the context is current.
        |s| unsafe { sys::cuStreamCreate(s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
        // SAFETY: our stream, with no work.
        |s| unsafe { sys::cuStreamDestroy_v2(s) },
    )
}

/// A row of its own operation: id, name, operation.
type Plain = (&'static str, &'static str, fn(&Env) -> Res);

/// The rows of their own operations, in order; the host-visible ones (12
/// and 13) go between the first [`BEFORE_HOST_VISIBLE`] and the rest.
#[rustfmt::skip] // a table: one row a line
const PLAIN: [Plain; 26] = [
    ("1a", "stream get (empty pool: creates)", op_get_empty),
    ("1b", "stream get (ready stream: pops)", op_get_ready),
    ("2", "drop origin lease", op_drop_origin),
    ("3", "drop joined side (not joined back)", op_drop_joined_side),
    ("4", "drop side after join", op_drop_side_after_join),
    ("5", "drop lease not in capture", op_drop_other),
    ("6", "event get (empty: creates) + drop", op_events),
    ("7", "fork + join (order.wait)", op_fork_join),
    ("8", "host.wait(origin)", op_host_wait),
    ("9", "host wait_event (rec. on origin)", op_host_wait_event),
    ("10a", "scratch device 4K + drop", op_dev_cold),
    ("10b", "scratch device 4K + drop (cached block)", op_dev_cached),
    ("10c", "scratch device 4K + drop (first in process)", op_dev_cold),
    ("11a", "scratch device alloc, reset, alloc", op_dev_reset),
    ("11b", "scratch device reset (2 blocks)", op_dev_reset_grown),
    // 12a-13c: HOST_VISIBLE_KINDS and HOST_VISIBLE_ROUNDS.
    ("14a", "scratch to_device + drop", op_to_device),
    ("14b", "scratch to_host", op_to_host),
    ("15a", "raw cuStreamQuery (other stream)", op_raw_stream_query),
    ("15b", "raw cuEventQuery (other stream's)", op_raw_event_query),
    ("15c", "raw cuStreamSynchronize (other)", op_raw_stream_sync),
    ("15d", "raw cuMemAlloc_v2", op_raw_mem_alloc),
    ("15e", "raw cuMemHostAlloc", op_raw_host_alloc),
    ("15f", "raw cuMemAllocAsync (other stream)", op_raw_mem_alloc_async),
    ("15g", "raw cuEventRecord (other stream)", op_raw_event_record),
    ("15h", "raw cuEventCreate", op_raw_event_create),
    ("15i", "raw cuStreamCreate", op_raw_stream_create),
];

/// How many rows of [`PLAIN`] come before the host-visible ones.
const BEFORE_HOST_VISIBLE: usize = 15;

/// The row run in a fresh process (the process's first device scratch).
const FRESH: &str = "10c";

/// The host-visible rows, 12 (pinned) and 13 (managed): each kind's id and
/// name.
const HOST_VISIBLE_KINDS: [(&str, MemoryKind, &str); 2] = [
    ("12", MemoryKind::Pinned, "pinned"),
    ("13", MemoryKind::Managed, "managed"),
];

/// The three host-visible rows of each kind: the id's letter, the name's
/// end, what is in the pool before, whether the round resets.
const HOST_VISIBLE_ROUNDS: [(&str, &str, Before, bool); 3] = [
    ("a", "+ drop (empty pool)", Before::Nothing, false),
    ("b", "+ drop (free block)", Before::FreeBlock, false),
    ("c", "alloc, reset, alloc", Before::Nothing, true),
];

/// Every row, in the table's order.
pub(crate) fn rows() -> Vec<Row> {
    let row = |id: String, name: String, op| Row {
        fresh_process: id == FRESH,
        id,
        name,
        op,
    };
    let plain = |&(id, name, op): &Plain| row(id.into(), name.into(), Op::Fn(op));
    let host_visible = HOST_VISIBLE_KINDS.iter().flat_map(|&(n, kind, kind_name)| {
        HOST_VISIBLE_ROUNDS.map(|(letter, what, before, reset)| {
            let op = Op::HostVisible(kind, before, reset);
            row(
                format!("{n}{letter}"),
                format!("scratch {kind_name} {what}"),
                op,
            )
        })
    });
    let (first, last) = PLAIN.split_at(BEFORE_HOST_VISIBLE);
    first
        .iter()
        .map(plain)
        .chain(host_visible)
        .chain(last.iter().map(plain))
        .collect()
}
