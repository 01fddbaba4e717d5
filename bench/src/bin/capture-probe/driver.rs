//! Raw driver calls: the capture status, the current context, a graph's
//! summary, launching it.

use std::panic::catch_unwind;

use gpupool_core::StreamHandle;
use gpupool_cuda::cudarc::driver::sys;

use crate::errors::panic_text;
use crate::{D0, GPU, SUCCESS};

pub(crate) fn cu(s: StreamHandle) -> sys::CUstream {
    s.as_raw() as sys::CUstream
}

pub(crate) fn cu_event(e: gpupool_core::EventHandle) -> sys::CUevent {
    e.as_raw() as sys::CUevent
}

/// The capture status of `s` as a word (or the error of the query).
pub(crate) fn capture_status(s: StreamHandle) -> String {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: every stream passed here is alive: owned by a pool that is
    // purged only after the last status read of the cell.
    let r = unsafe { sys::cuStreamIsCapturing(cu(s), &mut st) };
    if r != SUCCESS {
        return format!("{r:?}");
    }
    match st {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => "NONE",
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => "ACTIVE",
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => "INVALIDATED",
    }
    .to_string()
}

/// Makes device 0's primary context current on the calling thread.
pub(crate) fn bind_context() -> Result<(), String> {
    let ctx = GPU.context(D0).map_err(|e| format!("{e}"))?;
    ctx.bind_to_thread().map_err(|e| format!("{e:?}"))
}

pub(crate) fn node_type_name(t: u32) -> String {
    match t {
        0 => "kernel",
        1 => "memcpy",
        2 => "memset",
        3 => "host",
        4 => "child_graph",
        5 => "empty",
        6 => "wait_event",
        7 => "event_record",
        8 => "sem_signal",
        9 => "sem_wait",
        10 => "mem_alloc",
        11 => "mem_free",
        12 => "batch_mem_op",
        13 => "conditional",
        _ => return format!("type{t}"),
    }
    .to_string()
}

/// The graph's nodes by type and its edge count.
pub(crate) fn graph_summary(g: sys::CUgraph) -> String {
    let r = catch_unwind(|| {
        let mut n = 0usize;
        // SAFETY: `g` is a graph just returned by cuStreamEndCapture, not
        // destroyed yet; a null node array asks for the count.
        let r = unsafe { sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n) };
        if r != SUCCESS {
            return format!("cuGraphGetNodes {r:?}");
        }
        let mut nodes = vec![std::ptr::null_mut(); n];
        // SAFETY: as above; `nodes` holds `n` entries.
        let r = unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n) };
        if r != SUCCESS {
            return format!("cuGraphGetNodes {r:?}");
        }
        let mut counts: Vec<(String, usize)> = Vec::new();
        for &node in &nodes[..n] {
            let mut t: u32 = u32::MAX;
            // SAFETY: a node of `g`; the type is read as a plain u32 (the
            // driver may know types the bindings' enum does not).
            let r = unsafe {
                sys::cuGraphNodeGetType(node, (&mut t as *mut u32).cast::<sys::CUgraphNodeType>())
            };
            let name = if r == SUCCESS {
                node_type_name(t)
            } else {
                format!("{r:?}")
            };
            match counts.iter_mut().find(|(k, _)| *k == name) {
                Some((_, c)) => *c += 1,
                None => counts.push((name, 1)),
            }
        }
        let mut edges = 0usize;
        // SAFETY: `g` as above; null arrays ask for the count.
        let r = unsafe {
            sys::cuGraphGetEdges_v2(
                g,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut edges,
            )
        };
        let edges = if r == SUCCESS {
            format!("{edges} edges")
        } else {
            format!("edges {r:?}")
        };
        let nodes: Vec<String> = counts
            .into_iter()
            .map(|(k, c)| if c == 1 { k } else { format!("{k}×{c}") })
            .collect();
        format!("{} nodes ({}); {edges}", n, nodes.join(" "))
    });
    r.unwrap_or_else(|p| format!("panic: {}", panic_text(&*p)))
}

/// Instantiates `g`, launches it once on `stream` and synchronizes.
pub(crate) fn launch_graph(g: sys::CUgraph, stream: sys::CUstream) -> String {
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: `g` is a live graph; `exec` receives the executable graph.
    let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, g, 0) };
    if r != SUCCESS {
        return format!("launch: instantiate {r:?}");
    }
    // SAFETY: `exec` was just instantiated; `stream` is the probe's launch
    // stream (created by main, never captured, never destroyed).
    let launched = unsafe { sys::cuGraphLaunch(exec, stream) };
    // SAFETY: as above.
    let synced = unsafe { sys::cuStreamSynchronize(stream) };
    // SAFETY: `exec` is ours and no launch of it is pending (synchronized).
    unsafe { sys::cuGraphExecDestroy(exec) };
    match (launched, synced) {
        (SUCCESS, SUCCESS) => "launch ok".into(),
        (SUCCESS, s) => format!("launch ok, sync {s:?}"),
        (l, _) => format!("launch {l:?}"),
    }
}
