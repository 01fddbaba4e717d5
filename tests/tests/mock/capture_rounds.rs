//! Mock-only: scratch memory, streams and events across the boundaries of a
//! graph capture, as a user would write it with safe code alone: a
//! scratchpad made before a capture and used inside it, reset inside it or
//! after it; made inside and used or dropped after; a per-thread-stream
//! scratchpad; a pool dropped while a stream it holds is still capturing; an
//! event recorded in a capture. No memory a graph may use reaches the host or
//! a later round, no graph allocation is used outside its graph, and the mock
//! (hazards, misuses) agrees. Also run under Miri.
#![cfg(not(feature = "cuda"))]
#![forbid(unsafe_code)]

use super::common::{
    assert_scratchpads_refuse, capturing, complete_and_assert_clean, drop_and_assert_all_freed,
    forked, forked_and_joined, join, mock_rig,
};
use gpupool_core::{
    lost_errors, AccessOrder, CaptureMode, CaptureStatus, DeviceId, Error, MemoryKind, Scratchpad,
    StreamLease, StreamPool,
};
use gpupool_mock::{MockBackend, MockGraph};
use gpupool_tests::assert_clean;
use gpupool_tests::mock_pools;

const D0: DeviceId = DeviceId(0);

/// The address range of a scratchpad's device blocks.
fn device_blocks(scratch: &Scratchpad<'_, MockBackend>) -> Vec<(usize, usize)> {
    scratch.blocks(MemoryKind::Device)
}

/// Whether `addr` lies in one of `blocks`.
fn inside(blocks: &[(usize, usize)], addr: usize) -> bool {
    blocks.iter().any(|&(a, n)| a <= addr && addr < a + n)
}

/// The case a user found: a scratchpad on a lease takes its first device
/// block inside a capture (the graph's own allocation); the capture ends
/// and the graph is dropped. Reading a slice handed out during the capture
/// is refused (it was the graph's memory), the next allocation takes a
/// fresh block, and nothing reads freed memory.
#[test]
fn a_graph_allocation_is_never_read_or_handed_out_after_its_capture() {
    let (gpu, streams, _events) = mock_pools(1);
    let origin = streams.get(0).unwrap();
    let mut scratch = Scratchpad::new(&gpu, origin.order()).unwrap();
    origin.begin_capture(CaptureMode::Global).unwrap();
    let x = scratch.device::<u32>(16).unwrap(); // the graph's allocation
    gpu.launch_map(&origin.order(), &x, &x, |v| v + 1).unwrap(); // captured
    let graph_blocks = device_blocks(&scratch);
    assert!(inside(&graph_blocks, x.addr()));
    let graph = origin.end_capture().unwrap();

    assert_eq!(scratch.to_host(&x), Err(Error::GraphMemory));
    // The next allocation is not the graph's block.
    let y = scratch.to_device(&[7u32; 16]).unwrap();
    assert!(!inside(&graph_blocks, y.addr()));
    assert_eq!(scratch.to_host(&y).unwrap(), [7; 16]);
    assert_eq!(scratch.to_host(&x), Err(Error::GraphMemory));
    gpu.launch_graph(&graph, origin.handle()).unwrap();
    scratch.reset().unwrap();
    // And the rounds after.
    for round in 0..3u32 {
        let z = scratch.to_device(&[round; 8]).unwrap();
        assert!(!inside(&graph_blocks, z.addr()));
        assert_eq!(scratch.to_host(&z).unwrap(), [round; 8]);
        scratch.reset().unwrap();
    }
    gpu.complete_everything();
    drop(graph); // frees the graph's memory
                 // A slice of the graph's memory is still refused after the graph is
                 // gone (the memory was freed).
    scratch.device::<u32>(16).unwrap();
    drop(scratch);
    complete_and_assert_clean(&gpu);
    assert_eq!(gpu.live_bytes(MemoryKind::Device), 0);
}

/// A scratchpad on `origin`'s order whose first round used one device block
/// and was reset, with all its work completed; and that block's range.
fn scratchpad_with_a_used_block<'p>(
    gpu: &'p MockBackend,
    origin: &'p StreamLease<'_, MockBackend>,
) -> (Scratchpad<'p, MockBackend>, Vec<(usize, usize)>) {
    let mut scratch = Scratchpad::new(gpu, origin.order()).unwrap();
    scratch.to_device(&[1u32; 64]).unwrap();
    let block = device_blocks(&scratch);
    scratch.reset().unwrap();
    gpu.complete_everything();
    (scratch, block)
}

/// Three rounds on `origin`'s order, each beside a replay of `graph` on
/// `replay`: none gets memory of `graph_block`, and each reads back what it
/// computed.
#[track_caller]
fn replays_beside_later_rounds(
    gpu: &MockBackend,
    scratch: &mut Scratchpad<'_, MockBackend>,
    graph: &MockGraph,
    [origin, replay]: [&StreamLease<'_, MockBackend>; 2],
    graph_block: &[(usize, usize)],
) {
    for round in 0..3u32 {
        gpu.launch_graph(graph, replay.handle()).unwrap();
        let z = scratch.to_device(&[round; 64]).unwrap();
        assert!(
            !inside(graph_block, z.addr()),
            "round {round} got the graph's block"
        );
        gpu.launch_map(&origin.order(), &z, &z, |v| v + 1).unwrap();
        assert_eq!(scratch.to_host(&z).unwrap(), [round + 1; 64]);
        scratch.reset().unwrap();
    }
}

/// Completes and asserts clean, drops `graph_and_scratch` (first to last),
/// then asserts that every device block came back (`what`) and that the
/// mock is still clean.
#[track_caller]
fn drop_and_assert_device_memory_back<T>(gpu: &MockBackend, graph_and_scratch: T, what: &str) {
    complete_and_assert_clean(gpu);
    drop(graph_and_scratch);
    gpu.complete_everything();
    assert_eq!(gpu.live_bytes(MemoryKind::Device), 0, "{what}");
    assert_clean(gpu);
}

/// A scratchpad made before a capture, whose block serves the capture (a
/// bump from the block it already held) and which is reset inside the
/// capture: the block goes to the graph, the later rounds never get it, and
/// it comes back when the graph is gone.
#[test]
fn a_block_used_before_and_inside_a_capture_goes_to_the_graph_at_a_reset_inside() {
    mock_rig!(gpu, streams, _events; [origin, replay] = leases);
    // (The replays run on another stream: the work before the capture
    // that used the block is done by then.)
    let (mut scratch, block) = scratchpad_with_a_used_block(&gpu, &origin);

    origin.begin_capture(CaptureMode::Relaxed).unwrap();
    let used = scratch.device::<u32>(64).unwrap(); // a bump in the old block
    assert!(inside(&block, used.addr()));
    gpu.launch_map(&origin.order(), &used, &used, |v| v * 2)
        .unwrap();
    scratch.reset().unwrap(); // inside: the block is the graph's now
    assert_eq!(scratch.stats().kept_for_graphs, 1);
    let graph = origin.end_capture().unwrap();

    // Replays run while later rounds work on other memory: no hazard.
    replays_beside_later_rounds(&gpu, &mut scratch, &graph, [&origin, &replay], &block);
    // The rounds after the capture (the first began inside it, but took its
    // memory after it ended) kept nothing more.
    assert_eq!(scratch.stats().kept_for_graphs, 1);
    drop_and_assert_device_memory_back(&gpu, (graph, scratch), "the graph's block came back");
}

/// The same, but the round ends after the capture did (the reset comes
/// after `end_capture`): the block cannot be given to the graph any more,
/// so it is kept from everybody; replays and later rounds never share it.
#[test]
fn a_block_used_inside_a_capture_and_reset_after_it_is_never_reused() {
    mock_rig!(gpu, streams, _events; [origin, replay] = leases);
    let (mut scratch, block) = scratchpad_with_a_used_block(&gpu, &origin);

    origin.begin_capture(CaptureMode::Global).unwrap();
    let used = scratch.device::<u32>(64).unwrap();
    gpu.launch_map(&origin.order(), &used, &used, |v| v * 2)
        .unwrap();
    let graph = origin.end_capture().unwrap();
    scratch.reset().unwrap(); // after the capture
    assert_eq!(scratch.stats().kept_for_graphs, 1);

    replays_beside_later_rounds(&gpu, &mut scratch, &graph, [&origin, &replay], &block);
    drop_and_assert_device_memory_back(&gpu, (graph, scratch), "kept until the graph went");
}

/// A scratchpad made inside a capture and dropped after it: its blocks
/// (the graph's allocations, and a pinned block the host wrote for the
/// graph) are kept, never freed under the graph.
#[test]
fn a_scratchpad_made_inside_a_capture_and_dropped_after_it_frees_nothing_under_the_graph() {
    mock_rig!(gpu, streams, _events; [origin, replay] = capturing(CaptureMode::Relaxed));
    let scratch = Scratchpad::new(&gpu, origin.order()).unwrap();
    let x = scratch.to_device(&[3u32; 32]).unwrap();
    let y = scratch.device::<u32>(32).unwrap();
    gpu.launch_map(&origin.order(), &x, &y, |v| v * 3).unwrap();
    let staging = scratch.pinned::<u32>(32).unwrap();
    staging.iter_mut().for_each(|v| {
        v.write(5);
    });
    let graph = origin.end_capture().unwrap();
    assert_eq!(scratch.to_host(&y), Err(Error::GraphMemory));
    drop(scratch);
    for _ in 0..2 {
        gpu.launch_graph(&graph, replay.handle()).unwrap();
    }
    complete_and_assert_clean(&gpu);
    drop(graph);
    gpu.complete_everything();
    assert_eq!(gpu.live_blocks(), 0, "everything came back with the graph");
    assert_clean(&gpu);
}

/// A side lease forks off a capture, its scratchpad made and dropped inside
/// (the rules followed): every block is the graph's own or given to it, no
/// memory is kept for ever, and the graph frees it all.
#[test]
fn a_side_scratchpad_inside_a_fork_gives_the_graph_exactly_its_memory() {
    mock_rig!(gpu, streams, events; [origin] = capturing(CaptureMode::Global));
    {
        let side = forked(&streams, &origin, &events);
        {
            let scratch = Scratchpad::new(&gpu, side.order()).unwrap();
            let x = scratch.device::<u32>(100).unwrap();
            gpu.launch_map(&side.order(), &x, &x, |v| v + 1).unwrap();
        }
        join(&origin, &side, &events);
    }
    let graph = origin.end_capture().unwrap();
    assert_eq!(graph.node_count(), 3); // allocation, kernel, free
    gpu.launch_graph(&graph, origin.handle()).unwrap();
    gpu.complete_everything();
    drop_and_assert_all_freed(&gpu, graph);
}

/// Takes 64 bytes of pinned memory from `scratch`, whose pinned kind must
/// then hold one block: that block's address.
#[track_caller]
fn only_pinned_block_after_64_bytes(scratch: &Scratchpad<'_, MockBackend>) -> usize {
    scratch.pinned::<u8>(64).unwrap();
    let [(block, _)] = scratch.blocks(MemoryKind::Pinned)[..] else {
        panic!("one pinned block")
    };
    block
}

/// Pinned memory written by the host for a capture, in a round that spans
/// the capture's end: kept while the graph lives, never handed to the next
/// rounds.
#[test]
fn a_pinned_block_used_by_a_capture_is_never_handed_out_while_the_graph_lives() {
    let (gpu, streams, _events) = mock_pools(1);
    let origin = streams.get(0).unwrap();
    let mut scratch = Scratchpad::new(&gpu, origin.order()).unwrap();
    let old = only_pinned_block_after_64_bytes(&scratch);
    scratch.reset().unwrap();
    gpu.complete_everything();
    origin.begin_capture(CaptureMode::Relaxed).unwrap();
    scratch.to_device(&[9u8; 64]).unwrap(); // a staged upload in the capture
    let graph = origin.end_capture().unwrap();
    scratch.reset().unwrap();
    for _ in 0..3 {
        let new = only_pinned_block_after_64_bytes(&scratch);
        assert_ne!(new, old);
        gpu.complete_everything();
        scratch.reset().unwrap();
    }
    drop_and_assert_all_freed(&gpu, (graph, scratch));
}

/// The per-thread default stream names another stream on every thread: a
/// scratchpad, which may move between threads, refuses it (as its device
/// order or a release order), and nothing is called.
#[test]
fn a_scratchpad_refuses_the_per_thread_default_stream() {
    let gpu = MockBackend::new(1);
    let per_thread = AccessOrder::per_thread_stream(D0);
    let calls = gpu.total_calls();
    assert_scratchpads_refuse(&gpu, per_thread, AccessOrder::host());
    // Only the device count was asked (the special stream's device).
    assert!(gpu.total_calls() - calls <= 2);
    assert!(gpu.misuses().is_empty());
}

/// A pool dropped while a stream it holds (returned during a capture) is
/// still in that capture: the stream is not destroyed (that would break the
/// capture), the loss is reported, and the capture ends cleanly.
#[test]
fn a_pool_dropped_during_a_capture_leaves_the_captured_stream_alone() {
    let gpu = MockBackend::new(1);
    let events = gpupool_core::EventPool::new(gpu.clone());
    let streams = StreamPool::new(gpu.clone());
    let [origin] = capturing(&streams, CaptureMode::Global);
    let side = forked_and_joined(&streams, &origin, &events);
    let side_stream = side.handle();
    drop(side); // held by the pool: still in the capture
    let origin = origin.detach(); // the capture goes on, outside the pool
    let lost = lost_errors();
    drop(streams);
    assert!(lost_errors() > lost, "the leak is reported");
    assert!(gpu.is_live_stream(side_stream), "not destroyed");
    assert_eq!(
        gpu.capture_status_of(side_stream),
        Ok(CaptureStatus::Active)
    );
    let graph = gpu.end_capture(origin.handle()).unwrap();
    drop(graph);
    assert_clean(&gpu);
    origin.destroy(&gpu).unwrap();
}

/// The events of a fork and a join recorded in a capture do not go back to
/// the pool (another user's wait on one would join the capture); an event
/// leased and recorded on a capturing stream by the user is destroyed when
/// its lease ends, refused by the host's waits and by `put`.
#[test]
fn an_event_recorded_in_a_capture_is_never_handed_out_again() {
    mock_rig!(gpu, streams, events; [origin] = capturing(CaptureMode::Relaxed));
    let side = forked_and_joined(&streams, &origin, &events);
    // Whatever event the pool gives now, an unrelated stream's wait on it
    // does not join the capture.
    let unrelated = streams.get(0).unwrap();
    for _ in 0..4 {
        let e = events.get(0).unwrap();
        unrelated.order().wait_event(&e).unwrap();
    }
    assert_eq!(
        gpu.capture_status_of(unrelated.handle()),
        Ok(CaptureStatus::NotCapturing)
    );

    let mine = events.get(0).unwrap();
    let handle = mine.handle();
    mine.record(&origin.order()).unwrap();
    assert_eq!(
        AccessOrder::host().wait_event(&mine),
        Err(Error::CapturedEvent)
    );
    let rejected = events.put(mine.detach(), None).unwrap_err();
    assert_eq!(rejected.error, Error::CapturedEvent);
    rejected.value.destroy(&gpu).unwrap();
    assert!(!gpu.is_live_event(handle));

    let again = events.get(0).unwrap();
    again.record(&origin.order()).unwrap();
    let handle = again.handle();
    drop(again); // destroyed, not pooled
    assert!(!gpu.is_live_event(handle));
    drop((side, unrelated));
    origin.end_capture().unwrap();
    assert!(events.take_error().is_none());
    assert_clean(&gpu);
}
