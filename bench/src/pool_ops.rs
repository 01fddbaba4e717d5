//! The pool operations the benchmarks time, each one get and its return on
//! device 0: gpupool's event and stream pools and the baselines' (DALI-style,
//! `Mutex<Vec>`, no pool), as the criterion bench `pools` and the
//! side-by-side benchmark both measure them.

use std::hint::black_box;

use gpupool_core::{
    DeviceId, EventBackend, EventFlags, EventPool, StreamBackend, StreamPool, StreamPoolConfig,
};

use crate::baselines::{
    event_create_destroy, stream_create_destroy, DaliEventPool, DaliStreamPool, MutexVecEventPool,
    MutexVecStreamPool,
};

/// The device every operation uses.
const D: DeviceId = DeviceId(0);
/// The events' flags, in every pool and without one.
const FLAGS: EventFlags = EventFlags::DISABLE_TIMING;

/// One operation, run once per call; the threads of a run share it.
pub type Op<'a> = Box<dyn Fn() + Sync + 'a>;

/// Every pool the operations use, on one backend.
pub struct Pools<B: StreamBackend + EventBackend> {
    backend: B,
    events: EventPool<B>,
    dali_events: DaliEventPool<B>,
    mv_events: MutexVecEventPool<B>,
    streams: StreamPool<B>,
    /// gpupool's stream pool with same-thread reuse.
    sticky: StreamPool<B>,
    dali_streams: DaliStreamPool<B>,
    mv_streams: MutexVecStreamPool<B>,
}

impl<B: StreamBackend + EventBackend + Clone + Send + Sync> Pools<B> {
    /// The pools, empty, on `backend`; the `Mutex<Vec>` pools hold lists for
    /// `devices` devices.
    pub fn new(backend: &B, devices: u32) -> Self {
        Pools {
            backend: backend.clone(),
            events: EventPool::new(backend.clone()),
            dali_events: DaliEventPool::new(backend.clone(), FLAGS)
                .expect("a DALI-style event pool"),
            mv_events: MutexVecEventPool::new(backend.clone(), FLAGS, devices),
            streams: StreamPool::new(backend.clone()),
            sticky: StreamPool::with_config(
                backend.clone(),
                StreamPoolConfig {
                    same_thread_reuse: true,
                    ..StreamPoolConfig::default()
                },
            ),
            dali_streams: DaliStreamPool::new(backend.clone()),
            mv_streams: MutexVecStreamPool::new(backend.clone(), devices),
        }
    }

    /// Event get+put: gpupool, DALI-style, `Mutex<Vec>`, and no pool (create
    /// and destroy).
    pub fn event_ops(&self) -> [Op<'_>; 4] {
        [
            Box::new(|| {
                black_box(self.events.get(D).expect("gpupool event get").handle());
            }),
            Box::new(|| {
                let e = self.dali_events.get(D).expect("DALI-style event get");
                // SAFETY: an event this pool just gave out on `D`, handed back.
                unsafe { self.dali_events.put(black_box(e), D) };
            }),
            Box::new(|| {
                let e = self.mv_events.get(D).expect("Mutex<Vec> event get");
                // SAFETY: an event this pool just gave out on `D`, handed back.
                unsafe { self.mv_events.put(black_box(e), D) };
            }),
            Box::new(|| {
                event_create_destroy(&self.backend, D, FLAGS).expect("event create+destroy")
            }),
        ]
    }

    /// Stream lease+return: gpupool, gpupool with same-thread reuse,
    /// DALI-style, `Mutex<Vec>`, and no pool (create and destroy).
    pub fn stream_ops(&self) -> [Op<'_>; 5] {
        [
            Box::new(|| {
                black_box(self.streams.get(D).expect("gpupool stream get").handle());
            }),
            Box::new(|| {
                black_box(self.sticky.get(D).expect("gpupool stream get").handle());
            }),
            Box::new(|| {
                black_box(
                    self.dali_streams
                        .get(D)
                        .expect("DALI-style stream get")
                        .handle(),
                );
            }),
            Box::new(|| {
                let st = self.mv_streams.get(D).expect("Mutex<Vec> stream get");
                // SAFETY: a stream this pool just gave out on `D`, handed back.
                unsafe { self.mv_streams.put(black_box(st), D) };
            }),
            Box::new(|| stream_create_destroy(&self.backend, D).expect("stream create+destroy")),
        ]
    }

    /// Checks that no lease is left out, then empties every pool (what they
    /// hold goes back to the backend).
    pub fn purge(&self) {
        let gpupool_leases = [
            (self.streams.live_leases(), "gpupool stream"),
            (self.sticky.live_leases(), "gpupool stream"),
            (self.events.live_leases(), "gpupool event"),
        ];
        for (leases, pool) in gpupool_leases {
            assert_eq!(leases, 0, "{pool} leases left out");
        }
        let dali_leases = self.dali_streams.live_leases();
        assert_eq!(dali_leases, 0, "DALI-style leases left out");
        self.streams.purge().expect("purge the stream pool");
        self.sticky
            .purge()
            .expect("purge the same-thread stream pool");
        self.events.purge().expect("purge the event pool");
        self.dali_streams
            .purge()
            .expect("purge the DALI-style stream pool");
        self.dali_events
            .purge()
            .expect("purge the DALI-style event pool");
        self.mv_streams
            .purge()
            .expect("purge the Mutex<Vec> stream pool");
        self.mv_events
            .purge()
            .expect("purge the Mutex<Vec> event pool");
    }
}
