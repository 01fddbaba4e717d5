//! Generic suite, stress: THREADS threads × ITERATIONS leases on random
//! devices, on the machine of this build (the mock by default, a GPU with
//! `--features cuda`), ending each lease in every way the API allows, with
//! some streams returned while their work is pending and some events recorded
//! before they go back. Asserts that no stream or event is ever held by two
//! leases at once, that the live-lease counts return to zero, and, where the
//! machine can count, that nothing is left alive after purge and drop and
//! that the backend saw no misuse.

use std::collections::HashSet;
use std::sync::Mutex;

use gpupool_core::{DeviceId, EventBackend, EventPool, StreamPool};
use gpupool_tests::{assert_count, assert_no_misuse, machine, Rng, TestGpu};

/// 16 threads on a GPU, as issue 4 asks; 8 on the mock (issue 2).
const THREADS: usize = if cfg!(feature = "cuda") { 16 } else { 8 };

/// Leases per thread. On a GPU each lease makes real driver calls (a query
/// per return, a kernel launch for one lease in ten, a stream creation for
/// each one in five whose stream was destroyed), which the driver serialises
/// across threads at up to ~100 µs each under contention (DESIGN.md): 20,000
/// per thread keeps the run well under a minute even then. Set
/// `GPUPOOL_STRESS_ITERATIONS` to run more.
fn iterations() -> usize {
    // Under Miri, 8 threads of 50 leases each: every path of a lease's life
    // (ready, busy, destroyed, created) dozens of times, in one of Miri's
    // interleavings; still the longest single run of CI's Miri queue (about
    // three minutes; six at 100 leases a thread).
    if cfg!(miri) {
        return 50;
    }
    let default = if cfg!(feature = "cuda") {
        20_000
    } else {
        100_000
    };
    std::env::var("GPUPOOL_STRESS_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Devices the mock has; a GPU machine uses its own (up to 4).
const MOCK_DEVICES: u32 = 4;

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
fn many_threads_never_alias_and_leak_nothing() {
    let Some(gpu) = machine(1, MOCK_DEVICES) else {
        return;
    };
    let devices = gpu.device_count().min(4);
    let iterations = iterations();
    let backend = gpu.backend();
    let streams = StreamPool::new(gpu.backend());
    let events = EventPool::new(gpu.backend());
    let in_use = InUse::new();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (gpu, backend) = (&gpu, &backend);
            let (streams, events, in_use) = (&streams, &events, &in_use);
            scope.spawn(move || {
                let mut rng = Rng::new(t as u64 + 1);
                for i in 0..iterations {
                    let device = rng.below(u64::from(devices)) as u32;
                    let d = DeviceId(device);
                    let lease = streams.get(device).unwrap();
                    assert_eq!(lease.device(), d);
                    let s = lease.handle();
                    in_use.claim(s.as_raw());
                    let event = events.get(device).unwrap();
                    in_use.claim(event.handle().as_raw());
                    // Some leases end with work still pending (busy list).
                    match rng.below(10) {
                        // SAFETY: the lease holds this live stream of device
                        // `d`.
                        0 => unsafe { gpu.submit(s, d) },
                        // SAFETY: as above.
                        1 => unsafe {
                            gpu.submit(s, d);
                            gpu.finish(s, d);
                        },
                        // SAFETY: the leases hold this live event and stream
                        // of the backend, both on device `d`.
                        2 => unsafe { backend.record_event(event.handle(), s, d) }.unwrap(),
                        _ => {}
                    }
                    in_use.free(event.handle().as_raw());
                    if rng.below(2) == 0 {
                        drop(event);
                    } else {
                        events.put(event.detach(), None).unwrap();
                    }
                    in_use.free(s.as_raw());
                    match rng.below(5) {
                        0 => drop(lease),
                        1 => lease.return_to_pool().unwrap(),
                        2 => streams.put(lease.detach(), None).unwrap(),
                        3 => streams.put(lease.detach(), Some(d)).unwrap(),
                        _ => {
                            // SAFETY: the lease still holds this live stream
                            // of device `d` (it is destroyed only below).
                            unsafe { gpu.finish(s, d) };
                            lease.detach().destroy(backend).unwrap();
                        }
                    }
                    if i % 256 == 0 {
                        gpu.quiesce();
                    }
                }
            });
        }
    });
    assert_eq!(streams.live_leases(), 0);
    assert_eq!(events.live_leases(), 0);
    assert!(streams.take_error().is_none());
    assert!(events.take_error().is_none());
    let stats = streams.total_stats();
    assert_eq!(stats.leases, THREADS * iterations);
    assert!(stats.reused + stats.busy_hits > 0);
    purge_drop_and_assert_clean(&gpu, streams, events);
}

/// Purges and drops both pools, then asserts, where the machine can tell,
/// that no stream or event is left alive and that it saw no misuse.
fn purge_drop_and_assert_clean<G: TestGpu>(
    gpu: &G,
    streams: StreamPool<G::Backend>,
    events: EventPool<G::Backend>,
) {
    streams.purge().unwrap();
    events.purge().unwrap();
    drop((streams, events));
    assert_count(gpu.live_streams(), 0, "streams left after purge and drop");
    assert_count(gpu.live_events(), 0, "events left after purge and drop");
    assert_no_misuse(gpu);
}

/// Threads lease events in place from their own cells (leased on one
/// device, recorded, returned), while another thread purges over and over:
/// a purge takes a handle from a live thread's cell only when no lease of
/// it can be out (the lease's claim is a plain store; the purge's barrier
/// settles the race). Asserts that no event is held twice, that no record
/// meets a destroyed event (the record would fail, or the machine count it
/// as a misuse), and that nothing is left alive after purge and drop.
#[test]
fn in_place_leases_race_purges() {
    let Some(gpu) = machine(1, MOCK_DEVICES) else {
        return;
    };
    let (threads, iterations) = if cfg!(miri) {
        (2, 20)
    } else if cfg!(feature = "cuda") {
        (THREADS, 5_000)
    } else {
        (THREADS, 20_000)
    };
    let backend = gpu.backend();
    let streams = StreamPool::new(gpu.backend());
    let events = EventPool::new(gpu.backend());
    let in_use = InUse::new();
    let working = std::sync::atomic::AtomicUsize::new(threads);
    let purges = std::thread::scope(|scope| {
        let purger = scope.spawn(|| {
            let mut purges = 0usize;
            // Relaxed: a stop signal; the scope's join orders the rest.
            while working.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                events.purge().unwrap();
                purges += 1;
            }
            purges
        });
        for _ in 0..threads {
            let (backend, streams, events, in_use, working) =
                (&backend, &streams, &events, &in_use, &working);
            scope.spawn(move || {
                let stream = streams.get(0).unwrap();
                for _ in 0..iterations {
                    let event = events.get(0).unwrap();
                    in_use.claim(event.handle().as_raw());
                    // SAFETY: the leases hold this live event and stream of
                    // the backend, both on device 0.
                    unsafe { backend.record_event(event.handle(), stream.handle(), DeviceId(0)) }
                        .unwrap();
                    in_use.free(event.handle().as_raw());
                    drop(event);
                }
                drop(stream);
                working.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            });
        }
        purger.join().unwrap()
    });
    assert!(purges > 0, "the purges ran");
    assert_eq!(events.live_leases(), 0);
    assert!(events.take_error().is_none());
    assert_eq!(events.total_stats().leases, threads * iterations);
    purge_drop_and_assert_clean(&gpu, streams, events);
}
