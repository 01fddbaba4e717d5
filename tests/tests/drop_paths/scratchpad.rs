//! Mock-only (fault injection): every path of `Scratchpad`'s drop, with
//! failures injected into the frees (and event destroys) the drop makes
//! (issue 6, item 5: a drop never loses an error silently).
//!
//! The paths: each memory kind (host, pinned, device, managed), released
//! synchronously (host order) or in stream order, with one block or several,
//! in four states:
//!
//! | state | what the drop finds |
//! |---|---|
//! | `Fresh` | the blocks of one round |
//! | `ResetThenDrop` | after a reset: one kept block (fenced by an armed event for pinned and managed memory released in stream order), or nothing if the round took several blocks (the reset released them) |
//! | `ResetThenReuse` | a second round after a reset, the stream lagging: the kept block was handed out again (host order, device memory) or released in stream order for a fresh one (pinned, managed: the fence had not completed), or one block of the first round's total size |
//! | `StagingPending` | the round's blocks plus a device block of `to_contiguous_device`, whose pinned staging block is still free-pending on the stream (the copy has not run) |
//!
//! For each path the drop runs once with no fault, once with each of its frees
//! failing alone (every position, per free kind: `Deallocate`,
//! `DeallocateAsync`), once with all of them failing, and, where the
//! scratchpad holds an event, with its destroy failing (alone and with every
//! free). Each time: the drop does not panic; [`lost_errors`] grows by exactly
//! the number of failures; the hook sees each error's text; every other block
//! is still released (after the stream drains, the mock's live bytes per kind
//! are exactly the failed blocks'); every event whose destroy did not fail is
//! destroyed; the mock reports no hazard and no misuse.
//!
//! Beyond the drop: [`Scratchpad::release`], [`Scratchpad::reset`] and
//! [`Scratchpad::to_contiguous_device`] return the first of several failures
//! and report the others as lost; a scratchpad that never allocated makes no
//! call; a panicking hook does not escape the drop.
//!
//! `lost_errors` and the hook are process-wide, so everything here runs in one
//! `#[test]`, holding the binary's [`SERIAL`] lock, and compares deltas.
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};

use gpupool_core::{
    lost_errors, set_lost_error_hook, AccessOrder, BackendOp, DeviceId, Error, MemoryKind,
    Scratchpad, StreamBackend, StreamHandle, StreamOptions,
};
use gpupool_mock::{CallKind, MockBackend, MockError};

use crate::{lock, record, SEEN, SERIAL};

const D0: DeviceId = DeviceId(0);

fn injected_text(op: BackendOp) -> String {
    Error::Backend {
        op,
        source: MockError::Injected(op),
    }
    .to_string()
}

/// How the drop frees the blocks of the kinds that are not host memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Release {
    /// Host order (the device order is the host): `Deallocate`.
    Sync,
    /// The device order is a stream: `DeallocateAsync` on it.
    Stream,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum State {
    Fresh,
    ResetThenDrop,
    ResetThenReuse,
    StagingPending,
}

#[derive(Copy, Clone, Debug)]
struct Case {
    kind: MemoryKind,
    release: Release,
    /// One block (one small allocation) or three (64, 128 and 256 KiB).
    several: bool,
    state: State,
}

/// Which failures to inject into the drop.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Faults {
    None,
    /// The `n`-th call of this free kind the drop makes fails.
    Nth(CallKind, u64),
    /// Every free fails.
    AllFrees,
    /// The destroy of the (one) event fails.
    DestroyEvent,
    /// The event's destroy and every free fail.
    DestroyEventAndAllFrees,
}

/// A block the drop frees: its kind, size and the call that frees it.
#[derive(Copy, Clone, Debug)]
struct Free {
    kind: MemoryKind,
    size: usize,
    op: CallKind,
}

fn free_op(kind: MemoryKind, release: Release) -> CallKind {
    if kind == MemoryKind::Host || release == Release::Sync {
        CallKind::Deallocate
    } else {
        CallKind::DeallocateAsync
    }
}

/// One round of `case.kind`: its allocations, each used by a kernel on the
/// stream when that memory is released in stream order (so a free that does
/// not wait for it would be a hazard).
fn round(gpu: &MockBackend, scratch: &Scratchpad<'_, MockBackend>, s: StreamHandle, case: &Case) {
    let sizes: &[usize] = if case.several {
        &[40_000, 70_000, 200_000]
    } else {
        &[1000]
    };
    for &bytes in sizes {
        let p = scratch.alloc(case.kind, bytes, 64).unwrap().unwrap();
        if case.kind.is_host_accessible() {
            gpu.host_access(p.as_ptr(), bytes).unwrap();
        }
        if free_op(case.kind, case.release) == CallKind::DeallocateAsync {
            gpu.use_memory(s, p.as_ptr(), bytes).unwrap();
        }
    }
}

/// The order of `s`, a stream of `gpu`'s device 0 made by the test.
fn on_stream<'g>(gpu: &'g MockBackend, s: StreamHandle) -> AccessOrder<'g> {
    // SAFETY: every test here creates `s` on device 0 of `gpu` and destroys it
    // (if at all) only after the scratchpads that use its order are gone; the
    // mock's trait methods are sound for any handle besides.
    unsafe { AccessOrder::from_raw(gpu, s, D0) }
}

/// Builds the scratchpad of `case` in its state.
fn setup<'g>(gpu: &'g MockBackend, s: StreamHandle, case: &Case) -> Scratchpad<'g, MockBackend> {
    let order = match case.release {
        Release::Sync => AccessOrder::host(),
        Release::Stream => on_stream(gpu, s),
    };
    let mut scratch = Scratchpad::new(gpu, order).unwrap();
    round(gpu, &scratch, s, case);
    match case.state {
        State::Fresh => {}
        State::ResetThenDrop => scratch.reset().unwrap(),
        State::ResetThenReuse => {
            scratch.reset().unwrap();
            round(gpu, &scratch, s, case);
        }
        State::StagingPending => {
            let parts: [&[u32]; 2] = [&[1, 2, 3], &[4, 5]];
            scratch.to_contiguous_device(&parts).unwrap();
            assert!(
                gpu.pending_free_bytes(MemoryKind::Pinned) > 0,
                "{case:?}: the staging block is not pending"
            );
        }
    }
    scratch
}

/// The frees the drop makes, in its order: kind by kind, newest block first.
fn drop_frees(scratch: &Scratchpad<'_, MockBackend>, release: Release) -> Vec<Free> {
    let mut frees = Vec::new();
    for kind in MemoryKind::ALL {
        for &(_, size) in scratch.blocks(kind).iter().rev() {
            frees.push(Free {
                kind,
                size,
                op: free_op(kind, release),
            });
        }
    }
    frees
}

fn live_bytes_total(gpu: &MockBackend) -> usize {
    MemoryKind::ALL.iter().map(|&k| gpu.live_bytes(k)).sum()
}

/// What one drop found: its frees, whether it held an event, and how many
/// failures were injected.
struct Ran {
    frees: Vec<Free>,
    had_event: bool,
    failures: usize,
}

/// Runs one drop of `case` with `faults` and checks it.
fn run(case: &Case, faults: Faults) -> Ran {
    let what = format!("{case:?} with {faults:?}");
    let gpu = MockBackend::new(1);
    let s = gpu.create_stream(D0, StreamOptions::default()).unwrap();
    let scratch = setup(&gpu, s, case);
    let frees = drop_frees(&scratch, case.release);
    let events = gpu.live_events();
    assert!(events <= 1, "{what}: {events} events");

    // Which frees fail (by their position among the drop's calls of their
    // kind), and the errors that must be lost.
    let mut count = [0u64; 2];
    let failing: Vec<bool> = frees
        .iter()
        .map(|f| {
            let i = usize::from(f.op == CallKind::DeallocateAsync);
            count[i] += 1;
            let n = count[i];
            match faults {
                Faults::Nth(op, at) => f.op == op && n == at,
                Faults::AllFrees | Faults::DestroyEventAndAllFrees => true,
                Faults::None | Faults::DestroyEvent => false,
            }
        })
        .collect();
    let event_fails = matches!(
        faults,
        Faults::DestroyEvent | Faults::DestroyEventAndAllFrees
    );
    let mut expected_texts: Vec<String> = frees
        .iter()
        .zip(&failing)
        .filter(|(_, &fails)| fails)
        .map(|(f, _)| injected_text(f.op))
        .collect();
    if event_fails {
        expected_texts.push(injected_text(CallKind::DestroyEvent));
    }

    // Arm them: the n-th call of each kind counted from now.
    for op in [CallKind::Deallocate, CallKind::DeallocateAsync] {
        let mut n = 0;
        for (f, &fails) in frees.iter().zip(&failing) {
            if f.op == op {
                n += 1;
                if fails {
                    gpu.fail_nth(op, n);
                }
            }
        }
    }
    if event_fails {
        gpu.fail_nth(CallKind::DestroyEvent, 1);
    }
    let calls =
        |g: &MockBackend| g.calls(CallKind::Deallocate) + g.calls(CallKind::DeallocateAsync);
    let frees_before = calls(&gpu);

    lock(&SEEN).clear();
    let lost_before = lost_errors();
    let outcome = catch_unwind(AssertUnwindSafe(move || drop(scratch)));
    let lost = lost_errors() - lost_before;
    let mut texts = std::mem::take(&mut *lock(&SEEN));

    assert!(outcome.is_ok(), "{what}: the drop panicked");
    assert_eq!(gpu.armed_faults(), 0, "{what}: a fault did not fire");
    assert_eq!(
        lost,
        expected_texts.len(),
        "{what}: lost_errors grew by {lost}"
    );
    texts.sort();
    expected_texts.sort();
    assert_eq!(texts, expected_texts, "{what}: what the hook saw");
    assert_eq!(
        (calls(&gpu) - frees_before) as usize,
        frees.len(),
        "{what}: not every block was released"
    );

    // Only the failed blocks (and a failed event) are left once the stream
    // has run everything.
    gpu.complete_everything();
    for kind in MemoryKind::ALL {
        let failed: usize = frees
            .iter()
            .zip(&failing)
            .filter(|(f, &fails)| fails && f.kind == kind)
            .map(|(f, _)| f.size)
            .sum();
        assert_eq!(gpu.live_bytes(kind), failed, "{what}: {kind:?} live bytes");
    }
    assert_eq!(
        gpu.live_blocks(),
        failing.iter().filter(|&&f| f).count(),
        "{what}: live blocks"
    );
    let failed_events = usize::from(event_fails);
    assert_eq!(gpu.live_events(), failed_events, "{what}: live events");
    assert!(gpu.hazards().is_empty(), "{what}: {:?}", gpu.hazards());
    assert!(gpu.misuses().is_empty(), "{what}: {:?}", gpu.misuses());
    // SAFETY: `s` is the live stream of device 0 `run` created; the
    // scratchpad that used it is gone.
    unsafe { gpu.destroy_stream(s, D0) }.unwrap();
    Ran {
        failures: expected_texts.len(),
        frees,
        had_event: events == 1,
    }
}

/// Every fault set worth trying after a fault-free drop that found `frees`
/// (and an event or not): each free alone, all of them, and the event's
/// destroy alone and with every free. Under Miri: the first free of each call
/// kind alone, and all of them.
fn fault_sets(frees: &[Free], had_event: bool) -> Vec<Faults> {
    let mut sets = Vec::new();
    for op in [CallKind::Deallocate, CallKind::DeallocateAsync] {
        let count = frees.iter().filter(|f| f.op == op).count() as u64;
        let last = if cfg!(miri) { count.min(1) } else { count };
        sets.extend((1..=last).map(|n| Faults::Nth(op, n)));
    }
    if frees.len() > 1 {
        sets.push(Faults::AllFrees);
    }
    if had_event {
        sets.push(Faults::DestroyEvent);
        sets.push(Faults::DestroyEventAndAllFrees);
    }
    sets
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for kind in MemoryKind::ALL {
        for release in [Release::Sync, Release::Stream] {
            for several in [false, true] {
                for state in [
                    State::Fresh,
                    State::ResetThenDrop,
                    State::ResetThenReuse,
                    State::StagingPending,
                ] {
                    if state == State::StagingPending && release == Release::Sync {
                        // The copy on the stream still writes the device
                        // block that a host-order drop would free at once: a
                        // caller's mistake (it must synchronize first), and
                        // then no staging block is pending any more.
                        continue;
                    }
                    cases.push(Case {
                        kind,
                        release,
                        several,
                        state,
                    });
                }
            }
        }
    }
    cases
}

/// A scratchpad of all four kinds, several blocks each, in stream order.
fn all_kinds<'g>(gpu: &'g MockBackend, s: StreamHandle) -> Scratchpad<'g, MockBackend> {
    let scratch = Scratchpad::new(gpu, on_stream(gpu, s)).unwrap();
    for kind in MemoryKind::ALL {
        for bytes in [40_000, 70_000] {
            scratch.alloc(kind, bytes, 64).unwrap();
        }
    }
    scratch
}

#[test]
fn every_scratchpad_drop_path_reports_each_failed_free_and_releases_the_rest() {
    let _serial = lock(&SERIAL);
    let previous = set_lost_error_hook(Some(record));

    // 1. Each kind, release order, block count and state, each fault set.
    let (mut runs, mut failures, mut with_event) = (0, 0, 0);
    for case in cases() {
        let clean = run(&case, Faults::None);
        runs += 1;
        for faults in fault_sets(&clean.frees, clean.had_event) {
            with_event += usize::from(faults == Faults::DestroyEvent);
            failures += run(&case, faults).failures;
            runs += 1;
        }
    }
    // The fenced paths were reached: pinned and managed memory released in
    // stream order, one block, after a reset (dropped, or reused).
    assert_eq!(with_event, 4, "paths with an event");
    println!("{runs} drops, {failures} injected failures, all reported");

    // 2. All four kinds at once, every free failing: each one is reported,
    // not just the first.
    {
        let gpu = MockBackend::new(1);
        let s = gpu.create_stream(D0, StreamOptions::default()).unwrap();
        let scratch = all_kinds(&gpu, s);
        let reserved: usize = scratch.stats().reserved.iter().sum();
        let blocks: usize = scratch.stats().blocks.iter().sum();
        assert_eq!(blocks, 8);
        for n in 1..=2 {
            gpu.fail_nth(CallKind::Deallocate, n);
        }
        for n in 1..=6 {
            gpu.fail_nth(CallKind::DeallocateAsync, n);
        }
        lock(&SEEN).clear();
        let before = lost_errors();
        let outcome = catch_unwind(AssertUnwindSafe(move || drop(scratch)));
        assert!(outcome.is_ok(), "the drop panicked");
        assert_eq!(lost_errors() - before, 8);
        let seen = std::mem::take(&mut *lock(&SEEN));
        assert_eq!(
            seen.iter()
                .filter(|t| **t == injected_text(CallKind::Deallocate))
                .count(),
            2
        );
        assert_eq!(
            seen.iter()
                .filter(|t| **t == injected_text(CallKind::DeallocateAsync))
                .count(),
            6
        );
        gpu.complete_everything();
        assert_eq!(live_bytes_total(&gpu), reserved);
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
    }

    // 3. `release` returns the first failure and reports the others.
    {
        let gpu = MockBackend::new(1);
        let s = gpu.create_stream(D0, StreamOptions::default()).unwrap();
        let scratch = all_kinds(&gpu, s);
        // Drop order: host (2 blocks, synchronous), then pinned, device and
        // managed (2 each, stream-ordered), newest block first.
        gpu.fail_nth(CallKind::Deallocate, 1); // host's newer block: the first free
        gpu.fail_nth(CallKind::DeallocateAsync, 3); // device's newer block
        gpu.fail_nth(CallKind::DeallocateAsync, 6); // managed's older block
        lock(&SEEN).clear();
        let before = lost_errors();
        let e = scratch.release().unwrap_err();
        assert_eq!(e.backend_op(), Some(BackendOp::Deallocate));
        assert_eq!(lost_errors() - before, 2, "the other two are reported");
        assert_eq!(
            *lock(&SEEN),
            vec![injected_text(CallKind::DeallocateAsync); 2]
        );
        gpu.complete_everything();
        assert_eq!(gpu.live_blocks(), 3, "only the failed blocks are left");
    }

    // 4. A scratchpad with nothing allocated, or only zero-size requests,
    // makes no call and loses nothing.
    {
        let gpu = MockBackend::new(1);
        let before = (lost_errors(), gpu.total_calls());
        let scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
        assert_eq!(scratch.alloc(MemoryKind::Host, 0, 8).unwrap(), None);
        drop(scratch);
        assert_eq!((lost_errors(), gpu.total_calls()), before);
    }

    // 5. A hook that panics does not escape the drop; the error still counts.
    {
        fn panicking(_: &dyn Display) {
            panic!("a hook that panics");
        }
        set_lost_error_hook(Some(panicking));
        let gpu = MockBackend::new(1);
        let scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
        scratch.alloc(MemoryKind::Host, 100, 8).unwrap();
        gpu.fail_nth(CallKind::Deallocate, 1);
        let before = lost_errors();
        let outcome = catch_unwind(AssertUnwindSafe(move || drop(scratch)));
        assert!(outcome.is_ok(), "the hook's panic escaped the drop");
        assert_eq!(lost_errors() - before, 1);
        set_lost_error_hook(Some(record));
    }

    // 6. Not drops, but calls that meet two failures: each returns the first
    // and reports the other. `reset` releasing several blocks:
    {
        let gpu = MockBackend::new(1);
        let s = gpu.create_stream(D0, StreamOptions::default()).unwrap();
        let mut scratch = Scratchpad::new(&gpu, on_stream(&gpu, s)).unwrap();
        for bytes in [40_000, 70_000, 200_000] {
            scratch.alloc(MemoryKind::Device, bytes, 64).unwrap();
        }
        gpu.fail_nth(CallKind::DeallocateAsync, 1);
        gpu.fail_nth(CallKind::DeallocateAsync, 2);
        lock(&SEEN).clear();
        let before = lost_errors();
        let e = scratch.reset().unwrap_err();
        assert_eq!(e.backend_op(), Some(BackendOp::DeallocateAsync));
        assert_eq!(lost_errors() - before, 1);
        assert_eq!(*lock(&SEEN), vec![injected_text(CallKind::DeallocateAsync)]);
        // Still usable: the next round takes a fresh block.
        scratch.alloc(MemoryKind::Device, 1000, 64).unwrap();
        assert_eq!(scratch.stats().blocks[MemoryKind::Device.index()], 1);
        drop(scratch);
        gpu.complete_everything();
        assert_eq!(gpu.live_blocks(), 2, "the two failed blocks");
        assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
    }
    // ... and `to_contiguous_device` whose copy fails and whose staging free
    // fails too.
    {
        let gpu = MockBackend::new(1);
        let s = gpu.create_stream(D0, StreamOptions::default()).unwrap();
        let scratch = Scratchpad::new(&gpu, on_stream(&gpu, s)).unwrap();
        gpu.fail_nth(CallKind::CopyAsync, 1);
        gpu.fail_nth(CallKind::Deallocate, 1);
        lock(&SEEN).clear();
        let before = lost_errors();
        let parts: [&[u32]; 2] = [&[1, 2, 3], &[4, 5]];
        let e = scratch.to_contiguous_device(&parts).unwrap_err();
        assert_eq!(e.backend_op(), Some(BackendOp::CopyAsync));
        assert_eq!(lost_errors() - before, 1);
        assert_eq!(*lock(&SEEN), vec![injected_text(CallKind::Deallocate)]);
        assert_eq!(gpu.live_bytes(MemoryKind::Pinned), 20, "the staging block");
        drop(scratch);
        gpu.complete_everything();
        assert_eq!(gpu.live_bytes(MemoryKind::Device), 0);
    }

    set_lost_error_hook(previous);
}
