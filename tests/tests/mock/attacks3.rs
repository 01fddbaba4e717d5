//! Mock-only: a third adversarial review, of the capture watch's one-sum
//! quiet check and the `joining` count that waits keep on the waiting
//! stream's note. Safe code only; each test asserts what
//! *should* happen (no hazards, no misuses, nothing reused while a graph may
//! use it).
#![cfg(not(feature = "cuda"))]
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

use super::common::mock_rig;
use gpupool_core::{CaptureMode, Scratchpad, ScratchpadConfig};
use gpupool_mock::CallKind;
use gpupool_tests::assert_clean;

/// How many resets the race below may take to begin a round while the other
/// thread's wait is under way.
const TRIES: usize = 2_000_000;

// ===========================================================================
// Finding: the values a round compares are `(joining << 32) | epoch`, summed
// over the notes, and `round_end` subtracts the start's sum from the end's
// and reads a small difference as "this many bumps". A round that began
// while a wait was under way on one note (joining 1: the start is
// NOT_QUIET, but `start_epochs` carries 2^32) and ends after that wait is
// over (joining 0) with the two notes' epochs moved by 2^32 in all reads
// `moved == 0`: "only unseen streams, never capturing" -> RoundEnd::Clean.
// Before the commit the difference was the epochs' alone (2^32, not 0):
// AfterCapture, the round's blocks kept from everybody.
//
// The 2^32 moves need a capture and ~2^31 calls of the safe
// `StreamLease::note_capture` (no note saturates: each stays below 2^32 - 1),
// some seconds in a release build. The round start under a wait is a race,
// observed from the outside: with both notes' epochs 0, a reset makes two
// capture questions (`round_end`'s and `begin_round`'s, the latter only when
// the start's sum was not 0) only when its round start read the count at 1.
// ===========================================================================

/// A scratchpad on lease `a` (device order) with pinned release order `b`.
/// Another thread waits in a loop with `b`'s order (on `c`, joining
/// nothing), so that a reset begins its round with `b`'s joining count at 1.
/// Then, in that round: a device block outside any capture, a capture on
/// `a` whose kernel writes a slice of it, the capture ended, and the notes
/// moved to 2^31 each (`note_capture`). The reset must keep the block from
/// everybody (`kept_for_graphs` > 0); it takes the round for a clean one, the
/// drop frees the block, and a replay of the graph writes freed memory.
#[test]
#[cfg_attr(
    any(miri, debug_assertions),
    ignore = "2^31 note bumps: run in release, `cargo test --release --test mock attacks3`"
)]
fn a_round_begun_under_a_wait_hides_2_pow_32_bumps() {
    mock_rig!(gpu, streams, events; [a, b, c, replay] = leases);
    let config = ScratchpadConfig {
        pinned_release: Some(b.order()),
        ..ScratchpadConfig::default()
    };
    let mut scratch = Scratchpad::with_config(&gpu, a.order(), config).unwrap();
    let stop = AtomicBool::new(false);
    let tries = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                b.order().wait(&c.order(), &events).unwrap();
            }
        });
        let mut found = None;
        for i in 0..TRIES {
            let before = gpu.calls(CallKind::CaptureStatus);
            scratch.reset().unwrap();
            if gpu.calls(CallKind::CaptureStatus) - before == 2 {
                found = Some(i);
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        found
    });
    // The waits are over: no joining count any more. (Where no reset began
    // its round under a wait, as before the commit, which had no count, the
    // round below starts quiet and the test passes.)
    gpu.complete_everything();

    // The round: a device block taken outside any capture...
    let x0 = scratch.device::<u32>(16).unwrap();
    let _ = x0;
    // ...a capture on the device stream whose kernel writes the block...
    a.begin_capture(CaptureMode::Relaxed).unwrap();
    let x = scratch.device::<u32>(16).unwrap();
    gpu.launch_map(&a.order(), &x, &x, |v| v + 1).unwrap();
    let _ = x;
    let graph = a.end_capture().unwrap();
    // ...and the epochs moved by 2^32 in all (2 by the capture), neither
    // note saturated.
    for _ in 0..(1u32 << 30) - 1 {
        a.note_capture();
    }
    for _ in 0..(1u32 << 30) {
        b.note_capture();
    }
    scratch.reset().unwrap();
    let kept = scratch.stats().kept_for_graphs;
    // A clean round's blocks go back upstream at the drop.
    drop(scratch);
    gpu.complete_everything();
    gpu.launch_graph(&graph, replay.handle()).unwrap();
    gpu.complete_everything();
    let hazards = gpu.hazards();
    let misuses = gpu.misuses();
    drop(graph);
    gpu.complete_everything();
    assert!(
        kept > 0,
        "a round a capture overlapped ended clean (start under a wait, found after {tries:?} \
         resets); hazards {hazards:?}, misuses {misuses:?}"
    );
    assert_clean(&gpu);
}
