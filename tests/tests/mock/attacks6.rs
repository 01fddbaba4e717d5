//! Mock-only: a sixth adversarial review, of the `Completed` futures' first
//! poll (its own event queries for up to `EventPool::completion_spin`), of
//! futures dropped before their first poll (handed to the engine), and of the
//! engine's per-(stream, recording thread) order by record sequence.
//! Each test asserts what *should* happen. Findings, fixed: the first poll's
//! own queries ran on the polling thread with its capture interaction mode
//! as it was, so a capture another library had open (thread-local on the
//! polling thread, or global on any thread) refused them, failing the future
//! and invalidating the capture
//! (`a_foreign_thread_local_capture_on_the_polling_thread_spin_on`,
//! `a_foreign_global_capture_on_another_thread_spin_on`; the spin now runs
//! inside `EventBackend::relaxed_queries`); and the mock refused the engine
//! thread's queries under a foreign global capture, though the CUDA engine's
//! thread is relaxed for good
//! (`a_foreign_global_capture_on_another_thread_spin_off`: the mock now
//! models a thread's interaction mode).
//!
//! Safe code only, but for one helper (`raw_begin_capture`): the mock's
//! harness `begin_capture` on a stream that the test made straight from the
//! mock and no gpupool pool or lease ever holds (the call's contract only
//! concerns streams gpupool holds; the mock is sound for any argument). It
//! stands for a capture some other library begins with the raw driver call.
#![cfg(not(feature = "cuda"))]
#![deny(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

use super::common::{busy_lease, leases};
use super::future_kit::*;
use gpupool_core::{
    BackendOp, CaptureMode, Completed, DeviceId, Error, EventPool, StreamBackend, StreamHandle,
    StreamPool, DEFAULT_COMPLETION_SPIN,
};
use gpupool_mock::{CallKind, MockBackend, MockError};

const ROUNDS: usize = if cfg!(miri) { 2 } else { 50 };
/// The clamp `set_completion_spin` documents: `u32::MAX` ns.
const CLAMPED: Duration = Duration::from_nanos(u32::MAX as u64);

type Fut<'p> = Completed<'p, MockBackend>;

/// A small deterministic shuffle (xorshift).
fn shuffle<T>(v: &mut [T], seed: &mut u64) {
    for i in (1..v.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        v.swap(i, (*seed % (i as u64 + 1)) as usize);
    }
}

/// A capture begun with the raw (harness) call on a stream no gpupool pool
/// holds: what another library's `cuStreamBeginCapture` looks like.
#[allow(unsafe_code)]
fn raw_begin_capture(gpu: &MockBackend, stream: StreamHandle, mode: CaptureMode) {
    // SAFETY: `stream` was made by `gpu.create_stream` in the test and is
    // never handed to a gpupool pool, lease or order, so there is nothing to
    // `note_capture`; the mock checks everything else.
    unsafe { gpu.begin_capture(stream, mode) }.unwrap();
}

// ---- 1. The spin budget ----

#[test]
fn spin_budgets_clamp_and_a_huge_one_ends_when_the_work_does() {
    let (gpu, streams, events) = machine(1);
    assert_eq!(events.completion_spin(), DEFAULT_COMPLETION_SPIN);
    for (set, got) in [
        (Duration::MAX, CLAMPED),
        (Duration::from_secs(5), CLAMPED),
        (CLAMPED + Duration::from_nanos(1), CLAMPED),
        (Duration::from_nanos(1), Duration::from_nanos(1)),
        (Duration::ZERO, Duration::ZERO),
    ] {
        events.set_completion_spin(set);
        assert_eq!(events.completion_spin(), got, "set {set:?}");
    }
    // Duration::MAX: the first poll spins (up to ~4.3 s) until another
    // thread runs the work, then resolves in that poll, after the work.
    events.set_completion_spin(Duration::MAX);
    let lease = busy_lease(&gpu, &streams);
    gpu.enqueue_work(lease.handle()).unwrap();
    let mut f = lease.order().completed(&events).unwrap();
    let (_, w) = flag();
    let first = thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(1));
            assert!(gpu.complete_one(lease.handle()).unwrap());
            thread::sleep(Duration::from_millis(1));
            gpu.complete_all(lease.handle()).unwrap();
        });
        let first = poll(&mut f, &w);
        // Resolved only once both items ran.
        if first.is_ready() {
            assert_eq!(gpu.pending_work(lease.handle()).unwrap(), 0);
        }
        first
    });
    // Under Miri the other thread may be slower than the budget: the engine
    // then finishes it. Either way it resolves, Ok.
    let r = match first {
        Poll::Ready(r) => r,
        Poll::Pending => wait_for(&mut f, LONG).expect("resolves once the work ran"),
    };
    assert_eq!(r, Ok(()));
    drop(f);
    drop_then_all_back(lease, events, &gpu);
}

#[test]
fn the_first_poll_never_resolves_before_the_work_ran() {
    let (gpu, streams, events) = machine(1);
    let lease = streams.get(0).unwrap();
    let (_, w) = flag();
    for spin in [
        DEFAULT_COMPLETION_SPIN,
        Duration::from_millis(2),
        Duration::ZERO,
    ] {
        events.set_completion_spin(spin);
        for _ in 0..3 {
            gpu.enqueue_work(lease.handle()).unwrap();
        }
        let mut f = lease.order().completed(&events).unwrap();
        // An event lease recorded after the same work, completed separately.
        let e = events.get(0).unwrap();
        e.record(&lease.order()).unwrap();
        let mut g = e.completed().unwrap();
        assert!(poll(&mut f, &w).is_pending(), "spin {spin:?}");
        assert!(poll(&mut g, &w).is_pending(), "spin {spin:?}");
        assert!(gpu.complete_one(lease.handle()).unwrap());
        assert!(gpu.complete_one(lease.handle()).unwrap());
        thread::sleep(Duration::from_millis(2));
        assert!(poll(&mut f, &w).is_pending(), "resolved with work left");
        assert!(poll(&mut g, &w).is_pending(), "resolved with work left");
        gpu.complete_all(lease.handle()).unwrap();
        assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
        assert_eq!(wait_for(&mut g, LONG), Some(Ok(())));
    }
    drop(lease);
    assert_eq!(events.live_leases(), 0);
    drop_pool_then_all_back(events, &gpu);
}

// ---- 2. Record order against poll order, threads, streams ----

/// One recorded future: its stream, and how many items of that stream must
/// have run before it may resolve `Ok`.
struct Rec<'p> {
    stream: usize,
    needed: u64,
    fut: Option<Fut<'p>>,
}

#[test]
fn futures_recorded_by_several_threads_polled_out_of_order_elsewhere() {
    let (gpu, streams, events) = machine(1);
    let (n_streams, n_threads, per) = if cfg!(miri) { (2, 2, 2) } else { (3, 3, 6) };
    let leases: Vec<_> = (0..n_streams).map(|_| streams.get(0).unwrap()).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..ROUNDS / 10 + 2 {
        events.set_completion_spin(if round % 2 == 0 {
            Duration::ZERO
        } else {
            DEFAULT_COMPLETION_SPIN
        });
        // Items enqueued per stream so far; each record is made under its
        // stream's lock, right after one more item.
        let enq: Vec<Mutex<u64>> = leases
            .iter()
            .map(|l| Mutex::new(gpu.pending_work(l.handle()).unwrap() as u64))
            .collect();
        let recs: Vec<Rec<'_>> = thread::scope(|s| {
            let hs: Vec<_> = (0..n_threads)
                .map(|t| {
                    let (gpu, leases, enq, events) = (&gpu, &leases, &enq, &events);
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        for k in 0..per {
                            let s = (t + k) % leases.len();
                            let mut n = enq[s].lock().unwrap();
                            gpu.enqueue_work(leases[s].handle()).unwrap();
                            *n += 1;
                            let fut = leases[s].order().completed(events).unwrap();
                            mine.push(Rec {
                                stream: s,
                                needed: *n,
                                fut: Some(fut),
                            });
                        }
                        mine
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let mut recs = recs;
        shuffle(&mut recs, &mut seed);
        // Some never polled: dropped (handed to the engine) at once.
        for (i, r) in recs.iter_mut().enumerate() {
            if i % 5 == 4 {
                r.fut = None;
            }
        }
        // Items run per stream: what was there before the round (all of
        // which the test counts as not run) plus what it completed.
        let mut ran = vec![0u64; n_streams];
        let mut step = 0usize;
        loop {
            // Poll every live future on worker threads, each step handing
            // the futures to other threads (first polls happen at many
            // steps: a later record often reaches the engine first).
            let mut live: Vec<&mut Rec<'_>> = recs.iter_mut().filter(|r| r.fut.is_some()).collect();
            if live.is_empty() {
                break;
            }
            shuffle(&mut live, &mut seed);
            let take = (step + 1) * 3; // only the first `take` are polled this step
            let early: Vec<String> = thread::scope(|s| {
                let n = live.len().min(take);
                let chunks: Vec<_> = live[..n].chunks_mut(n.div_ceil(3).max(1)).collect();
                let hs: Vec<_> = chunks
                    .into_iter()
                    .map(|chunk| {
                        let ran = &ran;
                        s.spawn(move || {
                            let (_, w) = flag();
                            let mut bad = Vec::new();
                            for r in chunk.iter_mut() {
                                let f = r.fut.as_mut().unwrap();
                                match poll(f, &w) {
                                    Poll::Pending => {}
                                    Poll::Ready(Ok(())) => {
                                        if ran[r.stream] < r.needed {
                                            bad.push(format!(
                                                "stream {}: resolved after {} of {} items",
                                                r.stream, ran[r.stream], r.needed
                                            ));
                                        }
                                        r.fut = None;
                                    }
                                    Poll::Ready(Err(e)) => bad.push(format!("failed: {e:?}")),
                                }
                            }
                            bad
                        })
                    })
                    .collect();
                hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
            });
            assert!(early.is_empty(), "round {round} step {step}: {early:?}");
            // The GPU runs one more item of some stream with work left;
            // once none is left, the engine gets time to catch up.
            let with_work: Vec<usize> = (0..n_streams)
                .filter(|&s| gpu.pending_work(leases[s].handle()).unwrap() > 0)
                .collect();
            if let Some(&s) = with_work.get(step % with_work.len().max(1)) {
                assert!(gpu.complete_one(leases[s].handle()).unwrap());
                ran[s] += 1;
            } else {
                thread::sleep(Duration::from_millis(1));
            }
            step += 1;
            assert!(step < 100_000, "futures never resolved");
        }
    }
    drop(leases);
    gpu.complete_everything();
    assert_eq!(events.live_leases(), 0);
    drop_pool_then_all_back(events, &gpu);
}

#[test]
fn one_thread_records_on_one_stream_into_two_pools_interleaved() {
    // Sequence numbers are per thread, engines per pool: the records of one
    // pool's group have gaps; the binary search must still resolve only
    // what ran.
    let gpu = MockBackend::new(1);
    let streams = StreamPool::new(gpu.clone());
    let (a, b) = (EventPool::new(gpu.clone()), EventPool::new(gpu.clone()));
    a.set_completion_spin(Duration::ZERO);
    let lease = streams.get(0).unwrap();
    let mut futs: Vec<(u64, Fut<'_>)> = Vec::new();
    for i in 0..8u64 {
        gpu.enqueue_work(lease.handle()).unwrap();
        let pool = if i % 3 == 1 { &b } else { &a };
        futs.push((i + 1, lease.order().completed(pool).unwrap()));
    }
    let (_, w) = flag();
    // First polls in reverse record order.
    for (_, f) in futs.iter_mut().rev() {
        assert!(poll(f, &w).is_pending());
    }
    for ran in 1..=8u64 {
        assert!(gpu.complete_one(lease.handle()).unwrap());
        thread::sleep(Duration::from_millis(1));
        for (needed, f) in futs.iter_mut() {
            if let Poll::Ready(r) = poll(f, &w) {
                assert!(*needed <= ran, "resolved after {ran} of {needed} items");
                assert_eq!(r, Ok(()));
                *needed = 0; // polled again below: Ok(()) (taken)
            }
        }
    }
    for (_, f) in futs.iter_mut() {
        assert_eq!(wait_for(f, LONG), Some(Ok(())));
    }
    drop(futs);
    drop(lease);
    drop((a, b));
    all_back(&gpu);
}

#[test]
fn a_future_moved_between_threads_then_polled_by_each_keeps_the_latest_waker() {
    let (gpu, streams, events) = machine(1);
    let (lease, mut f) = busy_lease_and_future(&gpu, &streams, &events);
    // First polled on another thread, then on a third, with their wakers.
    let mut counters = Vec::new();
    for _ in 0..3 {
        let (fut, c) = thread::scope(|s| {
            s.spawn(move || {
                let (c, _w) = pending_with_flag(&mut f);
                (f, c)
            })
            .join()
            .unwrap()
        });
        f = fut;
        counters.push(c);
    }
    gpu.complete_all(lease.handle()).unwrap();
    until("the latest waker is woken", || counters[2].wakes() > 0);
    assert_eq!(counters[0].wakes(), 0, "a stale waker woken");
    assert_eq!(counters[1].wakes(), 0, "a stale waker woken");
    assert_eq!(poll(&mut f, &flag().1), Poll::Ready(Ok(())));
    drop(f);
    drop_then_all_back(lease, events, &gpu);
}

// ---- 3. Dropping before the first poll, forgetting, the pool's drop ----

#[test]
fn unpolled_futures_dropped_on_many_threads_racing_completion() {
    let (gpu, streams, events) = machine(1);
    let leases: Vec<_> = (0..3).map(|_| streams.get(0).unwrap()).collect();
    let per = if cfg!(miri) { 3 } else { 40 };
    for round in 0..ROUNDS / 10 + 2 {
        let futs: Vec<Fut<'_>> = (0..per)
            .map(|i| {
                let l = &leases[i % leases.len()];
                if i % 2 == 0 {
                    gpu.enqueue_work(l.handle()).unwrap();
                }
                l.order().completed(&events).unwrap()
            })
            .collect();
        let stop = AtomicBool::new(false);
        thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(SeqCst) {
                    for l in &leases {
                        let _ = gpu.complete_one(l.handle());
                    }
                    thread::yield_now();
                }
            });
            let mut futs = futs;
            let mut parts = Vec::new();
            while !futs.is_empty() {
                let k = futs.len().min(per / 3 + 1);
                parts.push(futs.drain(..k).collect::<Vec<_>>());
            }
            let hs: Vec<_> = parts
                .into_iter()
                .enumerate()
                .map(|(t, mut part)| {
                    s.spawn(move || {
                        // Some polled once first (watched), the rest never.
                        let (_, w) = flag();
                        for (i, f) in part.iter_mut().enumerate() {
                            if (i + t + round) % 3 == 0 {
                                let _ = poll(f, &w);
                            }
                        }
                        drop(part);
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            stop.store(true, SeqCst);
        });
        // The engine hands the abandoned events back; the next
        // completed() takes them in.
        until_every_event_pooled(&gpu, &leases[0], &events);
    }
    assert_clean(&gpu);
    drop_then_all_back(leases, events, &gpu);
}

#[test]
fn a_forgotten_unpolled_future_then_the_pool_drops() {
    let (gpu, streams, events) = machine(1);
    let lease = busy_lease(&gpu, &streams);
    // The engine exists (an earlier future), and one is abandoned pending.
    drop(lease.order().completed(&events).unwrap());
    std::mem::forget(lease.order().completed(&events).unwrap());
    gpu.enqueue_work(lease.handle()).unwrap();
    let mut watched = lease.order().completed(&events).unwrap();
    assert!(poll(&mut watched, &flag().1).is_pending());
    std::mem::forget(watched);
    drop(lease.order().completed(&events).unwrap());
    // The pool drops with all of them pending: no hang, no panic.
    drop(events);
    gpu.complete_everything();
    // The two forgotten futures' events stay leaked; nothing else.
    assert_eq!(gpu.live_events(), 2, "live events");
    assert_clean(&gpu);
    // A forgotten future of a pool whose engine never started.
    let (gpu, streams, events) = machine(1);
    let lease = busy_lease(&gpu, &streams);
    std::mem::forget(lease.order().completed(&events).unwrap());
    drop(events);
    assert_eq!(gpu.live_events(), 1);
    assert_clean(&gpu);
}

#[test]
fn each_event_is_returned_exactly_once_across_spin_engine_and_drops() {
    let (gpu, streams, events) = machine(1);
    let lease = streams.get(0).unwrap();
    let (_, w) = flag();
    let mut seed = 7u64;
    for round in 0..ROUNDS {
        events.set_completion_spin(if round % 3 == 0 {
            Duration::ZERO
        } else {
            DEFAULT_COMPLETION_SPIN
        });
        let mut futs: Vec<Fut<'_>> = (0..6)
            .map(|i| {
                if i % 2 == 0 {
                    gpu.enqueue_work(lease.handle()).unwrap();
                }
                lease.order().completed(&events).unwrap()
            })
            .collect();
        shuffle(&mut futs, &mut seed);
        // Half polled (to the engine, or resolved in the spin), half not.
        for f in futs.iter_mut().step_by(2) {
            let _ = poll(f, &w);
        }
        match round % 3 {
            0 => gpu.complete_all(lease.handle()).unwrap(),
            1 => {
                let _ = gpu.complete_one(lease.handle()).unwrap();
            }
            _ => {}
        }
        // Drop in a shuffled order, some resolved first.
        for (i, mut f) in futs.into_iter().enumerate() {
            if i % 3 == 0 && round % 3 == 0 {
                assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
            }
        }
        // Nothing leased is leased twice: two leases at once never share
        // an event.
        let a = events.get(0).unwrap();
        let b = events.get(0).unwrap();
        assert_ne!(a.handle(), b.handle());
    }
    abandoned_events_back(&gpu, lease, events);
}

// ---- 4. The spin setting changed while futures poll ----

#[test]
fn the_spin_changed_concurrently_with_first_polls() {
    let (gpu, streams, events) = machine(1);
    let stop = AtomicBool::new(false);
    let workers = if cfg!(miri) { 2 } else { 3 };
    let per = if cfg!(miri) { 3 } else { 60 };
    thread::scope(|s| {
        s.spawn(|| {
            let budgets = [
                Duration::ZERO,
                Duration::from_nanos(1),
                DEFAULT_COMPLETION_SPIN,
                Duration::from_micros(300),
                Duration::MAX,
            ];
            let mut i = 0;
            while !stop.load(SeqCst) {
                events.set_completion_spin(budgets[i % budgets.len()]);
                let got = events.completion_spin();
                assert!(got <= CLAMPED, "{got:?}");
                i += 1;
                thread::yield_now();
            }
        });
        // The GPU: runs whatever is queued, all the time (so no spin lasts).
        s.spawn(|| {
            while !stop.load(SeqCst) {
                gpu.complete_everything();
                thread::yield_now();
            }
        });
        let hs: Vec<_> = (0..workers)
            .map(|_| {
                let (gpu, streams, events) = (&gpu, &streams, &events);
                s.spawn(move || {
                    let lease = streams.get(0).unwrap();
                    let mut enq = gpu.pending_work(lease.handle()).unwrap() as u64;
                    for _ in 0..per {
                        gpu.enqueue_work(lease.handle()).unwrap();
                        enq += 1;
                        let needed = enq;
                        let mut f = lease.order().completed(events).unwrap();
                        let r = wait_for(&mut f, LONG).expect("resolves");
                        assert_eq!(r, Ok(()));
                        // Completions only grow: the work ran by now.
                        let pending = gpu.pending_work(lease.handle()).unwrap() as u64;
                        assert!(enq - pending >= needed, "resolved before its work ran");
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        stop.store(true, SeqCst);
    });
    assert_eq!(events.live_leases(), 0);
    drop_then_all_back(streams, events, &gpu);
}

// ---- 5. Failed queries during the first poll's spin ----

#[test]
fn a_query_that_fails_during_the_first_poll_spin() {
    let (gpu, streams, events) = machine(1);
    // The first query of the spin fails.
    let (lease, mut f) = busy_lease_and_future(&gpu, &streams, &events);
    let (_, w) = flag();
    gpu.fail_nth(CallKind::QueryEvent, 1);
    match poll(&mut f, &w) {
        Poll::Ready(Err(Error::Backend { op, source: error })) => {
            assert_eq!(op, BackendOp::QueryEvent);
            assert_eq!(error, MockError::Injected(CallKind::QueryEvent));
        }
        other => panic!("{other:?}"),
    }
    drop(f);
    // A later query of a long spin fails (the work never runs meanwhile).
    events.set_completion_spin(Duration::from_secs(2));
    let mut g = lease.order().completed(&events).unwrap();
    gpu.fail_nth(CallKind::QueryEvent, 3);
    assert!(matches!(
        poll(&mut g, &w),
        Poll::Ready(Err(Error::Backend {
            op: BackendOp::QueryEvent,
            ..
        }))
    ));
    assert_eq!(gpu.armed_faults(), 0);
    drop(g);
    // The failed futures' events went back to the pool with their work
    // pending; a future made with one of them now must not resolve early.
    events.set_completion_spin(DEFAULT_COMPLETION_SPIN);
    let mut h = lease.order().completed(&events).unwrap();
    assert!(poll(&mut h, &w).is_pending());
    assert_eq!(events.live_leases(), 1);
    gpu.complete_all(lease.handle()).unwrap();
    assert_eq!(wait_for(&mut h, LONG), Some(Ok(())));
    drop(h);
    drop(lease);
    drop(events);
    // The injected failures are the mock's, not misuses by gpupool.
    let misuses: Vec<_> = gpu
        .misuses()
        .into_iter()
        .filter(|m| !format!("{m:?}").contains("Injected"))
        .collect();
    assert!(misuses.is_empty(), "{misuses:?}");
    assert_eq!(gpu.live_events(), 0);
}

// ---- 6. Wakers ----

/// A waker whose wake panics.
struct Panicky(AtomicUsize);

impl Wake for Panicky {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
        panic!("a waker that panics");
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
        panic!("a waker that panics (by ref)");
    }
}

#[test]
fn panicking_wakers_at_the_first_registration_and_at_later_submissions() {
    let (gpu, streams, events) = machine(1);
    let lease = streams.get(0).unwrap();
    let p = Arc::new(Panicky(AtomicUsize::new(0)));
    let pw = Waker::from(Arc::clone(&p));
    for round in 0..ROUNDS / 5 + 2 {
        events.set_completion_spin(if round % 2 == 0 {
            Duration::ZERO
        } else {
            DEFAULT_COMPLETION_SPIN
        });
        gpu.enqueue_work(lease.handle()).unwrap();
        let mut f = lease.order().completed(&events).unwrap();
        let first = catch_unwind(AssertUnwindSafe(|| poll(&mut f, &pw)));
        assert!(matches!(first, Ok(Poll::Pending)), "the first registration");
        // Counted before the work completes: from then on the engine may
        // run the waker on its own thread at any moment.
        let woken = p.0.load(SeqCst);
        gpu.complete_all(lease.handle()).unwrap();
        // Other futures submitted from this thread meanwhile: the engine may
        // have left the panicking waker to this thread's next submission.
        until("the panicking waker ran", || {
            gpu.enqueue_work(lease.handle()).unwrap();
            let mut g = lease.order().completed(&events).unwrap();
            let r = catch_unwind(AssertUnwindSafe(|| poll(&mut g, &flag().1)));
            assert!(r.is_ok(), "a later first poll panicked");
            gpu.complete_all(lease.handle()).unwrap();
            drop(g);
            p.0.load(SeqCst) > woken
        });
        assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
    }
    abandoned_events_back(&gpu, lease, events);
}

/// A waker that, on the engine's thread, makes a new future and polls it
/// for the first time there (an executor that polls inside `wake`).
struct InlinePoll {
    pools: Arc<(MockBackend, StreamPool<MockBackend>, EventPool<MockBackend>)>,
    results: Mutex<Vec<Poll<Result<(), String>>>>,
}

impl Wake for InlinePoll {
    fn wake(self: Arc<Self>) {
        let (gpu, streams, events) = &*self.pools;
        let lease = busy_lease(gpu, streams);
        let mut f = lease.order().completed(events).unwrap();
        let r = poll(&mut f, &flag().1).map(|r| r.map_err(|e| format!("{e:?}")));
        self.results.lock().unwrap().push(r);
        drop(f);
        gpu.complete_all(lease.handle()).unwrap();
    }
}

#[test]
fn a_first_poll_on_the_engine_thread_inside_a_wake() {
    let pools = Arc::new(machine(1));
    let inline = Arc::new(InlinePoll {
        pools: Arc::clone(&pools),
        results: Mutex::new(Vec::new()),
    });
    let w = Waker::from(Arc::clone(&inline));
    {
        let (gpu, streams, events) = &*pools;
        let lease = busy_lease(gpu, streams);
        let mut f = lease.order().completed(events).unwrap();
        assert!(poll(&mut f, &w).is_pending());
        gpu.complete_all(lease.handle()).unwrap();
        until("the wake ran", || {
            !inline.results.lock().unwrap().is_empty()
        });
        // Made after work not run yet: never Ok at once.
        let r = inline.results.lock().unwrap()[0].clone();
        assert!(r.is_pending(), "{r:?}");
        assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
        drop(f);
        until_every_event_pooled(gpu, &lease, events);
    }
    drop((w, inline));
    let Ok((gpu, _, _)) = Arc::try_unwrap(pools) else {
        panic!("a waker left")
    };
    all_back(&gpu);
}

// ---- 7. Captures between completed() and the first poll ----

#[test]
fn a_gpupool_capture_begun_between_completed_and_the_first_poll() {
    let (gpu, streams, events) = machine(1);
    let [lease, other] = leases(&streams);
    use CaptureMode::{Global, Relaxed, ThreadLocal};
    for mode in [Global, ThreadLocal, Relaxed] {
        for spin in [DEFAULT_COMPLETION_SPIN, Duration::ZERO] {
            events.set_completion_spin(spin);
            gpu.enqueue_work(lease.handle()).unwrap();
            let mut f = lease.order().completed(&events).unwrap();
            gpu.enqueue_work(other.handle()).unwrap();
            let mut g = other.order().completed(&events).unwrap();
            // A capture on the recorded stream, on this thread; the first
            // polls (its own stream's future and another's) inside it.
            lease.begin_capture(mode).unwrap();
            let (_, w) = flag();
            assert!(poll(&mut f, &w).is_pending(), "{mode:?}");
            assert!(poll(&mut g, &w).is_pending(), "{mode:?}");
            gpu.enqueue_work(lease.handle()).unwrap(); // captured
            let graph = lease.end_capture().expect("the capture was not broken");
            assert_eq!(graph.node_count(), 1);
            drop(graph);
            gpu.complete_all(lease.handle()).unwrap();
            gpu.complete_all(other.handle()).unwrap();
            assert_eq!(wait_for(&mut f, LONG), Some(Ok(())));
            assert_eq!(wait_for(&mut g, LONG), Some(Ok(())));
        }
    }
    drop_then_all_back((lease, other), events, &gpu);
}

/// After a first poll that left the future pending: waits until the engine
/// has asked about it (while the foreign capture is still open).
fn engine_asked_once<T>(gpu: &MockBackend, first: &Poll<T>) {
    if first.is_pending() {
        let after = gpu.calls(CallKind::QueryEvent);
        until("the engine asks", || {
            gpu.calls(CallKind::QueryEvent) > after
        });
    }
}

/// A future of a pooled stream, made (and its work queued) before the
/// caller opens a foreign capture.
fn raw_capture_case(spin: Duration, mode: CaptureMode, on_other_thread: bool) -> String {
    let (gpu, streams, events) = machine(1);
    events.set_completion_spin(spin);
    let lease = streams.get(0).unwrap();
    let raw = gpu.create_stream(DeviceId(0), Default::default()).unwrap();
    gpu.enqueue_work(lease.handle()).unwrap();
    let mut f = lease.order().completed(&events).unwrap();
    let (_, w) = flag();
    let first = if on_other_thread {
        // Another library captures on its own thread, in `mode`; this thread
        // (an async runtime's worker) polls the future meanwhile.
        let (begun_tx, begun_rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let gpu2 = gpu.clone();
        let capturer = thread::spawn(move || {
            raw_begin_capture(&gpu2, raw, mode);
            begun_tx.send(()).unwrap();
            end_rx.recv().unwrap();
            gpu2.enqueue_work(raw).unwrap();
            gpu2.end_capture(raw).map(|g| g.node_count())
        });
        begun_rx.recv().unwrap();
        let first = poll(&mut f, &w);
        engine_asked_once(&gpu, &first);
        end_tx.send(()).unwrap();
        let ended = capturer.join().unwrap();
        (first, ended)
    } else {
        // This thread captures (another library's code running on it) and
        // polls the future before it ends the capture.
        raw_begin_capture(&gpu, raw, mode);
        let first = poll(&mut f, &w);
        engine_asked_once(&gpu, &first);
        gpu.enqueue_work(raw).unwrap();
        (first, gpu.end_capture(raw).map(|g| g.node_count()))
    };
    gpu.complete_all(lease.handle()).unwrap();
    let later = match first.0 {
        Poll::Ready(ref r) => Some(r.clone()),
        Poll::Pending => wait_for(&mut f, LONG),
    };
    format!(
        "first poll: {:?}; result: {:?}; the foreign capture ended: {:?}",
        first.0.map(|r| r.is_ok()),
        later,
        first.1
    )
}

const UNHARMED: &str =
    "first poll: Pending; result: Some(Ok(())); the foreign capture ended: Ok(1)";

// Control: with the spin off only the engine's thread asks, and a
// thread-local capture on the polling thread does not concern it.
#[test]
fn a_foreign_thread_local_capture_on_the_polling_thread_spin_off() {
    let got = raw_capture_case(Duration::ZERO, CaptureMode::ThreadLocal, false);
    assert_eq!(got, UNHARMED);
}

// Should: the first poll's own query must not fail the future nor break a
// capture that another library has open on the polling thread (docs/async.md:
// "its queries never break a capture begun elsewhere"; the CUDA backend's
// `unrestricted` relaxes only for captures gpupool began, and
// `prepare_query_thread` relaxes only the engine's thread).
#[test]
fn a_foreign_thread_local_capture_on_the_polling_thread_spin_on() {
    let got = raw_capture_case(DEFAULT_COMPLETION_SPIN, CaptureMode::ThreadLocal, false);
    assert_eq!(got, UNHARMED);
}

// Should: likewise for a global-mode capture another library has open on
// another thread (CUDA refuses a global-mode `cuEventQuery` from any thread
// whose mode is not relaxed, and invalidates that capture).
#[test]
fn a_foreign_global_capture_on_another_thread_spin_on() {
    let got = raw_capture_case(DEFAULT_COMPLETION_SPIN, CaptureMode::Global, true);
    assert_eq!(got, UNHARMED);
}

// Should: with the spin off, only the engine's thread asks; on CUDA that
// thread is relaxed for good (`prepare_query_thread`), so a global capture
// elsewhere neither refuses nor is broken by its queries. (Fails on the mock,
// before this change too: its `prepare_query_thread` marks the thread for
// checking mode only, and `Captures::prohibiting` refuses every thread.)
#[test]
fn a_foreign_global_capture_on_another_thread_spin_off() {
    let got = raw_capture_case(Duration::ZERO, CaptureMode::Global, true);
    assert_eq!(got, UNHARMED);
}
