//! Mock-only (hazard detection): stream order under a lagging GPU: 10,000
//! randomised rounds of allocate → simulated kernel use on the stream (and
//! host writes to host-visible memory) → drop or reset → allocate again,
//! during which the mock reports no hazard, and after which nothing is left
//! allocated; and the same on eight threads at once, each on its own stream,
//! with resets that ask the stream and with resets that give host-visible
//! blocks back in stream order (`MemoryBackend::batches_host_reuse`, as over
//! the CUDA backend).
use gpupool_core::{MemoryKind, Scratchpad};
use gpupool_mock::MockBackend;
use gpupool_tests::{mock, Rng};

/// Streams straight from the mock (see `MockStream`).
use gpupool_tests::MockStream as Stream;

const ROUNDS: usize = if cfg!(miri) { 20 } else { 10_000 };

fn round(
    gpu: &MockBackend,
    scratch: &Scratchpad<'_, MockBackend>,
    stream: gpupool_core::StreamHandle,
    rng: &mut Rng,
) {
    for _ in 0..rng.below(6) + 1 {
        let kind = MemoryKind::ALL[rng.below(4) as usize];
        let bytes = (rng.below(40_000) + 1) as usize;
        let align = 1usize << rng.below(9);
        let p = scratch.alloc(kind, bytes, align).unwrap().unwrap();
        if kind.is_host_accessible() {
            gpu.host_access(p.as_ptr(), bytes).unwrap(); // the host fills it
        }
        if kind != MemoryKind::Host {
            gpu.use_memory(stream, p.as_ptr(), bytes).unwrap(); // a kernel or copy reads it
        }
    }
}

#[test]
fn ten_thousand_rounds_with_a_lagging_gpu_report_no_hazard() {
    let gpu = mock(1);
    lagging_rounds(&gpu, 42, ROUNDS);
    gpu.complete_everything();
    for kind in MemoryKind::ALL {
        assert_eq!(gpu.live_bytes(kind), 0, "{kind:?} leaked");
    }
}

/// Threads at once, each on its own stream.
const THREADS: usize = 8;

fn rounds_on_threads(batched: bool) {
    let gpu = mock(1);
    gpu.set_batches_host_reuse(batched);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let gpu = &gpu;
            scope.spawn(move || lagging_rounds(gpu, 7 + t as u64, ROUNDS / 4));
        }
    });
    gpu.complete_everything();
    for kind in MemoryKind::ALL {
        assert_eq!(gpu.live_bytes(kind), 0, "{kind:?} leaked");
    }
}

#[test]
fn eight_threads_on_their_own_streams_report_no_hazard() {
    rounds_on_threads(false);
}

#[test]
fn eight_threads_giving_host_visible_blocks_back_at_each_reset_report_no_hazard() {
    rounds_on_threads(true);
}

/// `rounds` randomised rounds (seeded with `seed`) on a new stream of
/// `gpu`, the GPU lagging behind; asserts after each that the mock saw no
/// hazard. Leaves the stream's work unfinished.
fn lagging_rounds(gpu: &MockBackend, seed: u64, rounds: usize) {
    let lease = Stream::new(gpu);
    let s = lease.get();
    let mut rng = Rng::new(seed);
    let mut scratch = Scratchpad::new(gpu, lease.order()).unwrap();
    for i in 0..rounds {
        round(gpu, &scratch, s, &mut rng);
        // The GPU lags: it finishes one kernel, all of them, or nothing.
        match rng.below(3) {
            0 => {}
            1 => {
                gpu.complete_one(s).unwrap();
            }
            _ => gpu.complete_all(s).unwrap(),
        }
        if rng.below(10) == 0 {
            // End this scratchpad for good, start a new one.
            scratch = Scratchpad::new(gpu, lease.order()).unwrap();
        } else {
            scratch.reset().unwrap();
        }
        assert!(gpu.hazards().is_empty(), "round {i}: {:?}", gpu.hazards());
    }
}
