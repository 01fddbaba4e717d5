//! Stress: 8 threads × 100,000 leases on random devices, ending each lease in
//! every way the API allows, with some streams returned while busy. Asserts that
//! no stream or event is ever held by two leases at once, that the live-lease
//! counts return to zero, and that after purge and drop nothing is left alive.

use std::collections::HashSet;
use std::sync::Mutex;

use gpupool_core::{DeviceId, EventPool, StreamPool};
use gpupool_mock::{CompletionPolicy, MockBackend};
use gpupool_tests::Rng;

const THREADS: usize = 8;
const ITERATIONS: usize = if cfg!(miri) { 200 } else { 100_000 };
const DEVICES: u32 = 4;

/// Handles currently leased, sharded to keep the check itself off the hot path.
struct InUse(Vec<Mutex<HashSet<usize>>>);

impl InUse {
    fn new() -> Self {
        InUse((0..64).map(|_| Mutex::new(HashSet::new())).collect())
    }
    fn shard(&self, h: usize) -> &Mutex<HashSet<usize>> {
        &self.0[h % self.0.len()]
    }
    fn claim(&self, h: usize) {
        assert!(
            self.shard(h).lock().unwrap().insert(h),
            "handle {h:#x} leased twice"
        );
    }
    fn free(&self, h: usize) {
        assert!(self.shard(h).lock().unwrap().remove(&h));
    }
}

#[test]
fn eight_threads_never_alias_and_leak_nothing() {
    let gpu = MockBackend::new(DEVICES);
    gpu.set_policy(CompletionPolicy::Manual);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let in_use = InUse::new();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (gpu, streams, events, in_use) = (&gpu, &streams, &events, &in_use);
            scope.spawn(move || {
                let mut rng = Rng::new(t as u64 + 1);
                for i in 0..ITERATIONS {
                    let device = rng.below(DEVICES as u64) as u32;
                    let lease = streams.get(device).unwrap();
                    assert_eq!(lease.device(), DeviceId(device));
                    let s = lease.get();
                    in_use.claim(s.0);
                    let event = events.get(device).unwrap();
                    in_use.claim(event.get().0);
                    // Some leases end with work still pending (busy list).
                    match rng.below(10) {
                        0 => gpu.enqueue_work(s).unwrap(),
                        1 => {
                            gpu.enqueue_work(s).unwrap();
                            gpu.complete_all(s).unwrap();
                        }
                        _ => {}
                    }
                    in_use.free(event.get().0);
                    if rng.below(2) == 0 {
                        drop(event);
                    } else {
                        events.put(event.release(), None).unwrap();
                    }
                    in_use.free(s.0);
                    match rng.below(5) {
                        0 => drop(lease),
                        1 => lease.reset().unwrap(),
                        2 => streams.put(lease.release(), None).unwrap(),
                        3 => streams
                            .put(lease.release(), Some(DeviceId(device)))
                            .unwrap(),
                        _ => {
                            gpu.complete_all(s).unwrap();
                            lease.release().destroy(gpu).unwrap();
                        }
                    }
                    if i % 256 == 0 {
                        gpu.complete_everything();
                    }
                }
            });
        }
    });
    assert_eq!(streams.live_leases(), 0);
    assert_eq!(events.live_leases(), 0);
    assert!(streams.take_error().is_none());
    let stats = streams.total_stats();
    assert_eq!(stats.leases, THREADS * ITERATIONS);
    assert!(stats.reused + stats.busy_hits > 0);
    streams.purge().unwrap();
    events.purge().unwrap();
    drop((streams, events));
    assert_eq!(gpu.live_streams(), 0);
    assert_eq!(gpu.live_events(), 0);
    assert!(gpu.misuses().is_empty(), "{:?}", &gpu.misuses()[..1]);
}
