//! A cell whose operation runs on another thread than the capture's, a cell on
//! threads of its own with a time limit, and a cell in a fresh process (`--cell
//! ID COL`).

use std::cell::RefCell;
use std::panic::catch_unwind;
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

use gpupool_core::StreamPool;

use crate::cells::{begin_capture, clean_up, finish_capture, run_op, same_thread_cell, CellOut};
use crate::driver::bind_context;
use crate::env::{leak, Env, Pools};
use crate::errors::panic_text;
use crate::ops::rows;
use crate::{Col, CELL_TIMEOUT, GPU, STEP_TIMEOUT};

pub(crate) enum Msg {
    Ready,
    Begun(Result<(), String>),
    Done,
    Ended,
}

/// Thread A: begins a GLOBAL capture when B is ready, ends it when B is done.
pub(crate) fn capture_thread(
    buf: u64,
    launch: usize,
    rx: Receiver<Msg>,
    to_b: Sender<Msg>,
) -> CellOut {
    let mut out = CellOut::default();
    if let Err(e) = bind_context() {
        let _ = to_b.send(Msg::Begun(Err(e.clone())));
        return CellOut::failed(e);
    }
    let origin_pool = leak(StreamPool::new(GPU));
    let origin = match origin_pool.get(0) {
        Ok(l) => l,
        Err(e) => {
            let _ = to_b.send(Msg::Begun(Err(format!("{e:#}"))));
            return CellOut::failed(format!("origin: {e:#}"));
        }
    };
    let origin_raw = origin.handle();
    if !matches!(rx.recv_timeout(STEP_TIMEOUT), Ok(Msg::Ready)) {
        out.details.push("!! A: B never got ready".into());
    }
    let begun = begin_capture(origin_raw, Col::OtherThread.mode(), buf);
    if let Err(e) = &begun {
        out.details.push(format!("!! begin failed: {e}"));
    }
    let _ = to_b.send(Msg::Begun(begun));
    if !matches!(rx.recv_timeout(STEP_TIMEOUT), Ok(Msg::Done)) {
        out.details
            .push("!! A: B's operation did not finish in time".into());
    }
    finish_capture(origin_raw, launch, &mut out);
    let _ = to_b.send(Msg::Ended);
    drop(origin);
    if let Some(e) = origin_pool.take_error() {
        out.details.push(format!("A: origin return: {e:#}"));
    }
    if let Err(e) = origin_pool.purge() {
        out.details.push(format!("A: purge: {e:#}"));
    }
    out
}

/// Thread B: runs the operation on its own streams while A captures.
pub(crate) fn operation_thread(
    row_index: usize,
    buf: u64,
    rx: Receiver<Msg>,
    to_a: Sender<Msg>,
) -> CellOut {
    let row = &rows()[row_index];
    if let Err(e) = bind_context() {
        let _ = to_a.send(Msg::Ready);
        let _ = to_a.send(Msg::Done);
        return CellOut::failed(e);
    }
    let pools = Pools::leaked();
    let origin = match pools.origin_pool.get(0) {
        Ok(l) => l,
        Err(e) => {
            let _ = to_a.send(Msg::Ready);
            let _ = to_a.send(Msg::Done);
            return CellOut::failed(format!("B's stream: {e:#}"));
        }
    };
    let notes = RefCell::new(Vec::new());
    let begin_fn = || {
        let _ = to_a.send(Msg::Ready);
        match rx.recv_timeout(STEP_TIMEOUT) {
            Ok(Msg::Begun(Ok(()))) => {}
            Ok(Msg::Begun(Err(e))) => notes.borrow_mut().push(format!("!! A's begin failed: {e}")),
            _ => notes.borrow_mut().push("!! B: A never began".to_string()),
        }
    };
    let env = Env::new(pools, origin, buf, &begin_fn, true);
    let mut out = run_op(row, &env);
    let _ = to_a.send(Msg::Done);
    if !matches!(rx.recv_timeout(STEP_TIMEOUT), Ok(Msg::Ended)) {
        out.details.push("!! B: A never ended the capture".into());
    }
    clean_up(env, &mut out);
    out.details.extend(notes.into_inner());
    out
}

pub(crate) fn other_thread_cell(row_index: usize, buf: u64, launch: usize) -> CellOut {
    let (to_a, a_rx) = channel();
    let (to_b, b_rx) = channel();
    let a = std::thread::spawn(move || capture_thread(buf, launch, a_rx, to_b));
    let b = std::thread::spawn(move || operation_thread(row_index, buf, b_rx, to_a));
    let a = a.join();
    let b = b.join();
    let mut out = match b {
        Ok(b) => b,
        Err(p) => CellOut::failed(format!("thread B panicked: {}", panic_text(&*p))),
    };
    match a {
        Ok(a) => {
            out.status = a.status;
            out.end = a.end;
            out.launch = a.launch;
            out.graph = a.graph;
            out.details.extend(a.details);
        }
        Err(p) => out
            .details
            .push(format!("thread A panicked: {}", panic_text(&*p))),
    }
    out
}

/// Runs one cell on threads of its own and waits for it (at most
/// CELL_TIMEOUT: a cell that hangs is reported and left behind).
pub(crate) fn run_cell(
    row_index: usize,
    col: Col,
    buf: u64,
    launch: usize,
    read_mem: bool,
) -> CellOut {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let out = catch_unwind(|| match col {
            Col::OtherThread => other_thread_cell(row_index, buf, launch),
            _ => same_thread_cell(&rows()[row_index], col, buf, launch, read_mem),
        })
        .unwrap_or_else(|p| CellOut::failed(format!("harness panicked: {}", panic_text(&*p))));
        let _ = tx.send(out);
    });
    match rx.recv_timeout(CELL_TIMEOUT) {
        Ok(out) => out,
        Err(_) => CellOut {
            op: "TIMEOUT".into(),
            status: "?".into(),
            end: "?".into(),
            details: vec![format!(
                "!! cell did not finish in {CELL_TIMEOUT:?}; later cells may be affected"
            )],
            ..CellOut::default()
        },
    }
}

/// Runs one cell in a fresh process (`--cell ID COL`).
pub(crate) fn run_cell_in_child(id: &str, col: Col) -> CellOut {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return CellOut::failed(format!("current_exe: {e}")),
    };
    let mut child = match Command::new(exe)
        .args(["--cell", id, col.arg()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return CellOut::failed(format!("spawn: {e}")),
    };
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < CELL_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return CellOut::failed("child process timed out".into());
            }
        }
    }
    let mut text = String::new();
    if let Some(mut so) = child.stdout.take() {
        use std::io::Read;
        let _ = so.read_to_string(&mut text);
    }
    let mut out = CellOut::failed(format!("no CELL line from the child; its stdout: {text}"));
    let mut details = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split('\t').collect();
        match parts.as_slice() {
            ["CELL", op, status, end, launch, graph] => {
                out.op = op.to_string();
                out.status = status.to_string();
                out.end = end.to_string();
                out.launch = launch.to_string();
                out.graph = graph.to_string();
            }
            ["DETAIL", d] => details.push(d.to_string()),
            _ => {}
        }
    }
    out.details = details;
    out
}

pub(crate) fn clean_field(s: &str) -> String {
    s.replace(['\t', '\n'], " ")
}

/// The child's side of `run_cell_in_child`.
pub(crate) fn child_main(id: &str, col: &str, buf: u64, launch: usize) {
    let rows = rows();
    let (Some(index), Some(col)) = (rows.iter().position(|r| r.id == id), Col::from_arg(col))
    else {
        println!("DETAIL\tbad --cell arguments {id} {col}");
        return;
    };
    let out = run_cell(index, col, buf, launch, true);
    println!(
        "CELL\t{}\t{}\t{}\t{}\t{}",
        clean_field(&out.op),
        clean_field(&out.status),
        clean_field(&out.end),
        clean_field(&out.launch),
        clean_field(&out.graph)
    );
    for d in &out.details {
        println!("DETAIL\t{}", clean_field(d));
    }
}
