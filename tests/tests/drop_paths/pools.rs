//! Mock-only: every `Drop` in gpupool-core that can meet a backend failure,
//! with one failure injected into each path (issue 6, item 5: "drop never
//! panics: errors during drop are parked and reported by the next call or an
//! accessor"). Each test checks that nothing panics, that the error surfaces
//! where it is documented to, that the pool stays usable where it still
//! exists, and that the mock's live streams and events end at exactly the
//! handles whose destroy failed. The scratchpad's drop has its own file
//! (`drop_paths/scratchpad.rs`).
//!
//! Faults are armed on one handle ([`MockBackend::fail_stream`],
//! [`MockBackend::fail_event`]), so a test does not depend on the order in
//! which a drop reaches its lists. "Lost" below means: counted by
//! [`lost_errors`] (process-wide) and handed, as text, to the
//! [`set_lost_error_hook`] hook. The tests of this binary run one at a time
//! ([`watch`], [`SERIAL`]) and compare deltas of that counter.
//!
//! | `Drop` (`core/src`) | path, backend call that fails | test | what surfaces |
//! |---|---|---|---|
//! | `StreamLease` (stream_pool.rs) | return: `query_stream` fails | [`stream_lease_drop_whose_query_fails_parks_the_error_and_quarantines_the_stream`] | `take_error()` = `Backend { QueryStream }`; stream quarantined, never leased again, destroyed by the pool's drop; nothing lost |
//! | `StreamLease` | two returns fail | same | first parked, `dropped_errors() == 1` |
//! | `StreamLease`, `same_thread_reuse` | kept in the thread's cell: no call | [`same_thread_reuse_lease_drop_queries_only_when_the_cell_is_full`] | no backend call |
//! | `StreamLease`, `same_thread_reuse` | cell full: `query_stream` fails | same | parked (`QueryStream`), one per failed query; quarantined |
//! | `EventLease`, `SharedEvent`'s last clone (event_pool.rs) | no backend call (back into the cell slot it was leased in place from, else the returning thread's cell, else the ready list) | [`event_lease_and_shared_event_drops_make_no_backend_call`] | zero calls, even with faults armed on every kind |
//! | `StreamPool` (stream_pool.rs) | `destroy_stream` fails: a stream on the shared ready list | [`stream_pool_drop_reports_a_failed_destroy_of_each_kind_of_pooled_stream`] | lost +1, the hook sees the `DestroyStream` error; only that stream stays live |
//! | `StreamPool` | a busy stream (returned with work pending) | same | same |
//! | `StreamPool` | a quarantined stream | same | same |
//! | `StreamPool` | an idle stream kept in this thread's cell | same | same |
//! | `StreamPool` | an idle stream kept in the cell of an exited thread | same | same |
//! | `StreamPool`, `same_thread_reuse` | an unqueried stream kept in this thread's cell | [`stream_pool_drop_reports_a_failed_destroy_of_a_stream_kept_in_a_thread_cache`] | same |
//! | `StreamPool`, `same_thread_reuse` | an unqueried stream left by an exited thread | same | same |
//! | `EventPool` (event_pool.rs) | `destroy_event` fails: an event on the shared ready list | [`event_pool_drop_reports_a_failed_destroy_of_each_kind_of_pooled_event`] | lost +1, the hook sees the `DestroyEvent` error; only that event stays live |
//! | `EventPool` | a quarantined event (its lease's `destroy` failed) | same | same |
//! | `EventPool` | an event in this thread's cell | same | same |
//! | `EventPool` | an event in the cell of an exited thread | same | same |
//! | (`AccessOrder::wait`, not a drop) | record or wait fails, then the event's destroy fails | [`access_order_wait_parks_the_failed_destroy_and_returns_the_first_error`] | returns `RecordEvent` / `StreamWaitEvent`; `events.take_error()` = `DestroyEvent`; event quarantined |
//! | lost-error hook | the hook itself panics | [`a_panicking_lost_error_hook_does_not_escape_the_drop`] | caught; still counted |
//! | `ParkedError` (stats.rs), dropped with its pool | an error parked and never taken | [`an_error_parked_and_never_taken_is_reported_when_its_pool_drops`] | `lost_errors` +1, the hook sees its text |
//! | `thread_cache::Owned` (thread exit), `ThreadCache` | no backend call; handles stay reachable | the exited-thread cases above | handles destroyed by the pool's drop |
//! | `Stack`, `Bag`, `Chain` (stack.rs), `DeviceTable` (table.rs) | free nodes and tables only; no backend call | every pool-drop test | live counts end exact |
//! | `Scratchpad` (scratchpad.rs) | see `drop_paths/scratchpad.rs` | | |
use std::panic::{catch_unwind, AssertUnwindSafe};

use gpupool_core::{
    epoch_crate, lost_errors, set_lost_error_hook, BackendOp, DeviceId, Error, EventHandle,
    EventPool, StreamHandle, StreamPool, StreamPoolConfig,
};
use gpupool_mock::{CallKind, MockBackend, MockError};

use gpupool_tests::any_pool::AnyPool;

use crate::{lock, record, SEEN, SERIAL};

const D0: DeviceId = DeviceId(0);

/// More leases than a per-thread cell keeps (four handles per device),
/// so that some returns must take the shared path. Fewer under Miri, which is
/// slow.
const OVERFLOW: usize = if cfg!(miri) { 8 } else { 16 };

/// The lost errors a closure caused: how many, and the hook's texts.
#[derive(Debug, PartialEq, Eq)]
struct Lost {
    count: usize,
    texts: Vec<String>,
}

/// Runs `f` alone (no other test of this binary runs meanwhile) with the
/// recording hook installed; asserts that it did not panic; returns what was
/// lost meanwhile.
fn watch(f: impl FnOnce()) -> Lost {
    let _serial = lock(&SERIAL);
    lock(&SEEN).clear();
    let before = lost_errors();
    let previous = set_lost_error_hook(Some(record));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    set_lost_error_hook(previous);
    let count = lost_errors() - before;
    let texts = std::mem::take(&mut *lock(&SEEN));
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    Lost { count, texts }
}

/// Drops `value`, asserting that the drop does not panic.
fn drop_quietly<T>(what: &str, value: T) {
    let outcome = catch_unwind(AssertUnwindSafe(move || drop(value)));
    assert!(outcome.is_ok(), "dropping {what} panicked");
}

fn injected(op: BackendOp) -> Error<MockError> {
    Error::Backend {
        op,
        source: MockError::Injected(op),
    }
}

fn is_injected(e: &Error<MockError>, op: BackendOp) -> bool {
    matches!(e, Error::Backend { op: o, source: MockError::Injected(k) } if *o == op && *k == op)
}

/// What a drop with one failed destroy must have lost: exactly that error.
fn one_lost(op: BackendOp) -> Lost {
    Lost {
        count: 1,
        texts: vec![injected(op).to_string()],
    }
}

fn nothing_lost() -> Lost {
    Lost {
        count: 0,
        texts: vec![],
    }
}

/// What must hold after drops that lose nothing: no error lost, no stream or
/// event left, no misuse.
#[track_caller]
fn assert_nothing_lost_or_left(gpu: &MockBackend, lost: Lost, case: &dyn std::fmt::Debug) {
    assert_eq!(lost, nothing_lost(), "{case:?}");
    assert_eq!((gpu.live_streams(), gpu.live_events()), (0, 0), "{case:?}");
    assert!(gpu.misuses().is_empty(), "{case:?}: {:?}", gpu.misuses());
}

/// Runs `f` on a thread of its own, which then exits; what `f` returned.
fn on_an_exiting_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

/// What must hold after a pool's drop in which only the destroy of one
/// handle failed (`op`): exactly that error lost, every fault fired, that
/// handle alone still live (`live` handles of its kind, `doomed_live` for
/// it), no misuse.
#[track_caller]
fn assert_only_the_doomed_handle_left(
    gpu: &MockBackend,
    lost: Lost,
    op: BackendOp,
    (live, doomed_live): (usize, bool),
    case: &dyn std::fmt::Debug,
) {
    assert_eq!(lost, one_lost(op), "{case:?}");
    assert_eq!(
        gpu.armed_faults(),
        0,
        "{case:?}: the doomed handle was reached"
    );
    assert_eq!(live, 1, "{case:?}: all but the failed one");
    assert!(doomed_live, "{case:?}");
    assert!(gpu.misuses().is_empty(), "{case:?}: {:?}", gpu.misuses());
}

#[test]
fn stream_lease_drop_whose_query_fails_parks_the_error_and_quarantines_the_stream() {
    let gpu = MockBackend::new(1);
    let lost = watch(|| {
        let pool = StreamPool::new(gpu.clone());
        let [a, b, c] = [(); 3].map(|_| pool.get(0).unwrap());
        let (ha, hb, hc) = (a.handle(), b.handle(), c.handle());
        gpu.fail_stream(CallKind::QueryStream, ha);
        drop_quietly("a lease whose query fails", a);

        let e = pool.take_error().expect("the error is parked");
        assert!(is_injected(&e, BackendOp::QueryStream), "{e:?}");
        assert!(pool.take_error().is_none(), "taken once");
        assert_eq!(pool.dropped_errors(), 0);
        let s = pool.stats(D0).unwrap();
        assert_eq!((s.quarantined, s.live_leases), (1, 2));

        // Two more failures: the first is parked, the second only counted.
        gpu.fail_stream(CallKind::QueryStream, hb);
        gpu.fail_stream(CallKind::QueryStream, hc);
        drop_quietly("a second lease whose query fails", b);
        drop_quietly("a third lease whose query fails", c);
        let e = pool.take_error().expect("parked");
        assert!(is_injected(&e, BackendOp::QueryStream), "{e:?}");
        assert_eq!(pool.dropped_errors(), 1);
        assert_eq!(pool.stats(D0).unwrap().quarantined, 3);
        assert_eq!(gpu.armed_faults(), 0);

        // Still usable; a quarantined stream is never leased again.
        let d = pool.get(0).unwrap();
        assert!(![ha, hb, hc].contains(&d.handle()));
        drop(d);
        assert!(pool.take_error().is_none());
        assert_eq!(pool.live_leases(), 0);
        assert_eq!(gpu.live_streams(), 4);

        // The pool's drop destroys the quarantined streams too.
        drop_quietly("the pool", pool);
    });
    assert_nothing_lost_or_left(&gpu, lost, &"a parked error is not also lost");
}

#[test]
fn same_thread_reuse_lease_drop_queries_only_when_the_cell_is_full() {
    // More leases than a cell keeps: some returns must query.
    const N: usize = OVERFLOW;
    let gpu = MockBackend::new(1);
    let lost = watch(|| {
        let config = StreamPoolConfig {
            same_thread_reuse: true,
            ..StreamPoolConfig::default()
        };
        let pool = StreamPool::with_config(gpu.clone(), config);
        let leases: Vec<_> = (0..N).map(|_| pool.get(0).unwrap()).collect();
        let handles: Vec<StreamHandle> = leases.iter().map(|l| l.handle()).collect();
        for &h in &handles {
            gpu.fail_stream(CallKind::QueryStream, h);
        }
        let calls = gpu.total_calls();
        let queries = gpu.calls(CallKind::QueryStream);
        drop_quietly("the leases", leases);

        // Every backend call the drops made is a (failed) query of a stream
        // that did not fit in the cell.
        let queried = (gpu.calls(CallKind::QueryStream) - queries) as usize;
        assert_eq!(gpu.total_calls() - calls, queried as u64);
        assert!(queried >= 1, "a cell keeps fewer than {N} streams");
        assert!(queried < N, "the cell keeps at least one stream, unqueried");
        let e = pool.take_error().expect("parked");
        assert!(is_injected(&e, BackendOp::QueryStream), "{e:?}");
        assert_eq!(pool.dropped_errors(), queried - 1);
        assert_eq!(pool.stats(D0).unwrap().quarantined, queried);
        // The kept streams were never queried: their faults are still armed.
        assert_eq!(gpu.armed_faults(), N - queried);
        gpu.clear_faults();

        // Still usable: the kept streams come back to this thread without a
        // backend call.
        let calls = gpu.total_calls();
        let again: Vec<_> = (0..N - queried).map(|_| pool.get(0).unwrap()).collect();
        assert_eq!(gpu.total_calls(), calls, "served from the cell");
        let s = pool.stats(D0).unwrap();
        assert_eq!((s.live_leases, s.created), (N - queried, N));
        drop(again);
        assert!(pool.take_error().is_none());
        drop_quietly("the pool", pool);
    });
    assert_nothing_lost_or_left(&gpu, lost, &"cell overflow");
}

#[test]
fn event_lease_and_shared_event_drops_make_no_backend_call() {
    // More leases than a cell keeps: some returns go to the shared ready
    // list. Neither path calls the backend.
    let gpu = MockBackend::new(1);
    let lost = watch(|| {
        let pool = EventPool::new(gpu.clone());
        let leases: Vec<_> = (0..OVERFLOW).map(|_| pool.get(0).unwrap()).collect();
        let shared = pool.get_shared(0).unwrap();
        let clones = vec![shared.clone(), shared.clone()];
        for kind in [
            CallKind::DestroyEvent,
            CallKind::QueryEvent,
            CallKind::RecordEvent,
            CallKind::SynchronizeEvent,
            CallKind::CreateEvent,
            CallKind::DeviceCount,
            CallKind::CurrentDevice,
        ] {
            gpu.fail_nth(kind, 1);
        }
        let calls = gpu.total_calls();
        drop_quietly("the event leases", leases);
        drop_quietly("two clones of a shared event", clones);
        assert_eq!(pool.live_leases(), 1, "the last clone still holds it");
        drop_quietly("the last clone of a shared event", shared);
        assert_eq!(gpu.total_calls(), calls, "no backend call");
        assert_eq!(gpu.armed_faults(), 7, "no fault fired");
        assert!(pool.take_error().is_none());
        assert_eq!(pool.live_leases(), 0);
        gpu.clear_faults();
        // Every event is back: OVERFLOW + 1 leases reuse them all.
        let again: Vec<_> = (0..=OVERFLOW).map(|_| pool.get(0).unwrap()).collect();
        assert_eq!(gpu.calls(CallKind::CreateEvent), OVERFLOW as u64 + 1);
        drop(again);
        drop_quietly("the pool", pool);
    });
    assert_nothing_lost_or_left(&gpu, lost, &"event returns");
}

/// Where a stream can sit when its pool drops.
#[derive(Copy, Clone, Debug)]
enum StreamPlace {
    /// The shared ready list.
    Ready,
    Busy,
    Quarantined,
    /// Idle at return, kept in this thread's cell.
    OwnCell,
    /// Idle at return, kept in the cell of a thread that has exited.
    ExitedThreadCell,
}

impl StreamPlace {
    const ALL: [Self; 5] = [
        Self::Ready,
        Self::Busy,
        Self::Quarantined,
        Self::OwnCell,
        Self::ExitedThreadCell,
    ];
}

/// Puts handles of `pool` in three of the places a handle can sit when its
/// pool drops: `c`, returned while this thread's cell is empty, in that
/// cell; one leased and returned by a thread that then exits, in that
/// thread's cell; and, once more returns have filled the cell, one leased
/// from the shared lists only and returned, on the ready list. Their handles,
/// in that order.
fn in_the_cells_and_the_ready_list<P: AnyPool<MockBackend> + Sync>(
    pool: &P,
    c: P::Lease<'_>,
) -> [P::Handle; 3] {
    let fill: Vec<_> = (0..OVERFLOW).map(|_| pool.lease(D0)).collect();
    // A thread returns an idle handle into its cell, and exits.
    let he = on_an_exiting_thread(|| pool.lease_handle(D0));
    // This thread's cell: `c`, returned idle while the cell is empty.
    let hc = P::handle_of(&c);
    drop(c);
    // More idle returns fill the cell, then the ready list; a lease from the
    // shared lists only, returned, goes to the ready list.
    drop(fill);
    let hr = pool.lease_handle_in(D0, &epoch_crate::pin());
    [hc, he, hr]
}

/// For each of `places`, in the order `build` gives their handles: on a
/// fresh mock of `devices` devices, `build` makes a pool with a handle in
/// every place, the destroy of the one in that place fails, and the pool is
/// dropped. Only that error is lost, and only that handle left.
fn each_place_fails_its_destroy<P: AnyPool<MockBackend>, const N: usize>(
    places: [impl std::fmt::Debug; N],
    devices: u32,
    build: fn(&MockBackend) -> (P, [P::Handle; N]),
) {
    for (i, place) in places.iter().enumerate() {
        let gpu = MockBackend::new(devices);
        let mut doomed = None;
        let lost = watch(|| {
            let (pool, handles) = build(&gpu);
            let distinct: std::collections::HashSet<_> = handles.into_iter().collect();
            assert_eq!(distinct.len(), N);
            P::fail_destroy_on_mock(&gpu, handles[i]);
            doomed = Some(handles[i]);
            drop_quietly(&format!("the {} pool", P::WHAT), pool);
        });
        let doomed = doomed.unwrap();
        let left = (P::live_on(&gpu).unwrap(), P::is_live_on_mock(&gpu, doomed));
        assert_only_the_doomed_handle_left(&gpu, lost, P::DESTROY, left, place);
    }
}

/// A stream pool with a stream in each place, in [`StreamPlace::ALL`]'s
/// order.
fn a_stream_in_each_place(gpu: &MockBackend) -> (StreamPool<MockBackend>, [StreamHandle; 5]) {
    let pool = StreamPool::new(gpu.clone());
    // This thread's cell is registered by its first `get`, before the other
    // thread exits (so it never adopts that thread's cell).
    let [b, q, c] = [(); 3].map(|_| pool.get(0).unwrap());
    let on_device_1 = pool.get(1).unwrap();
    let [hc, he, hr] = in_the_cells_and_the_ready_list(&pool, c);
    // Busy: returned with work pending.
    let hb = b.handle();
    gpu.enqueue_work(hb).unwrap();
    drop(b);
    // Quarantined: its query on return fails.
    let hq = q.handle();
    gpu.fail_stream(CallKind::QueryStream, hq);
    drop(q);
    let e = pool.take_error().expect("the quarantine's error");
    assert!(is_injected(&e, BackendOp::QueryStream), "{e:?}");
    drop(on_device_1);
    let s = pool.stats(D0).unwrap();
    assert_eq!((s.quarantined, s.live_leases), (1, 0));
    assert_eq!(gpu.live_streams(), OVERFLOW + 5);
    (pool, [hr, hb, hq, hc, he])
}

#[test]
fn stream_pool_drop_reports_a_failed_destroy_of_each_kind_of_pooled_stream() {
    each_place_fails_its_destroy(StreamPlace::ALL, 2, a_stream_in_each_place);
}

#[test]
fn stream_pool_drop_reports_a_failed_destroy_of_a_stream_kept_in_a_thread_cache() {
    for exited_thread in [false, true] {
        let gpu = MockBackend::new(1);
        let mut doomed = StreamHandle::NULL;
        let lost = watch(|| {
            let config = StreamPoolConfig {
                same_thread_reuse: true,
                ..StreamPoolConfig::default()
            };
            let pool = StreamPool::with_config(gpu.clone(), config);
            let (r, b) = (pool.get(0).unwrap(), pool.get(0).unwrap());
            let b_handle = b.handle();
            // The stream kept in a cell: this thread's, or that of a thread
            // that has exited since. Its return makes no call.
            let lease_and_return = || {
                let l = pool.get(0).unwrap();
                let h = l.handle();
                let calls = gpu.total_calls();
                drop(l);
                assert_eq!(gpu.total_calls(), calls, "kept without a query");
                h
            };
            doomed = if exited_thread {
                on_an_exiting_thread(lease_and_return)
            } else {
                lease_and_return()
            };
            // A ready and a busy stream, put in directly (no cell involved).
            pool.put(r.detach(), None).unwrap();
            gpu.enqueue_work(b_handle).unwrap();
            pool.put(b.detach(), None).unwrap();
            assert_eq!(gpu.calls(CallKind::QueryStream), 2, "only the two puts");
            assert_eq!(gpu.live_streams(), 3);
            gpu.fail_stream(CallKind::DestroyStream, doomed);
            drop_quietly("the stream pool", pool);
        });
        let case = if exited_thread { "exited" } else { "own" };
        let left = (gpu.live_streams(), gpu.is_live_stream(doomed));
        assert_only_the_doomed_handle_left(&gpu, lost, BackendOp::DestroyStream, left, &case);
    }
}

/// Where an event can sit when its pool drops.
#[derive(Copy, Clone, Debug)]
enum EventPlace {
    /// The shared ready list.
    Ready,
    Quarantined,
    OwnCell,
    ExitedThreadCell,
}

impl EventPlace {
    const ALL: [Self; 4] = [
        Self::Ready,
        Self::Quarantined,
        Self::OwnCell,
        Self::ExitedThreadCell,
    ];
}

/// An event pool with an event in each place, in [`EventPlace::ALL`]'s
/// order.
fn an_event_in_each_place(gpu: &MockBackend) -> (EventPool<MockBackend>, [EventHandle; 4]) {
    let pool = EventPool::new(gpu.clone());
    // As for streams: this thread registers first.
    let [q, c] = [(); 2].map(|_| pool.get(0).unwrap());
    let [hc, he, hr] = in_the_cells_and_the_ready_list(&pool, c);
    // Quarantined: a lease's `destroy` that fails.
    let hq = q.handle();
    gpu.fail_event(CallKind::DestroyEvent, hq);
    let e = q.destroy().unwrap_err();
    assert!(is_injected(&e, BackendOp::DestroyEvent), "{e:?}");
    let s = pool.stats(D0).unwrap();
    assert_eq!((s.quarantined, s.live_leases), (1, 0));
    assert_eq!(gpu.live_events(), OVERFLOW + 3);
    assert!(pool.take_error().is_none());
    (pool, [hr, hq, hc, he])
}

#[test]
fn event_pool_drop_reports_a_failed_destroy_of_each_kind_of_pooled_event() {
    each_place_fails_its_destroy(EventPlace::ALL, 1, an_event_in_each_place);
}

#[test]
fn access_order_wait_parks_the_failed_destroy_and_returns_the_first_error() {
    for failing in [CallKind::RecordEvent, CallKind::StreamWaitEvent] {
        let gpu = MockBackend::new(1);
        let lost = watch(|| {
            let streams = StreamPool::new(gpu.clone());
            let events = EventPool::new(gpu.clone());
            let (a, b) = (streams.get(0).unwrap(), streams.get(0).unwrap());
            // Learn which event `wait` leases: the pool's next one.
            let e = events.get(0).unwrap();
            let he = e.handle();
            drop(e);
            gpu.fail_event(failing, he);
            gpu.fail_event(CallKind::DestroyEvent, he);
            let err = a.order().wait(&b.order(), &events).unwrap_err();
            assert!(is_injected(&err, failing), "{failing:?}: {err:?}");
            let parked = events.take_error().expect("the failed destroy's error");
            assert!(is_injected(&parked, BackendOp::DestroyEvent), "{parked:?}");
            assert_eq!(gpu.armed_faults(), 0);
            assert_eq!(events.stats(D0).unwrap().quarantined, 1);
            assert_eq!(events.live_leases(), 0);
            // Still usable, with another event.
            a.order().wait(&b.order(), &events).unwrap();
            assert_eq!(gpu.live_events(), 2);
            drop((a, b));
            drop_quietly("the event pool", events);
            drop_quietly("the stream pool", streams);
        });
        assert_nothing_lost_or_left(&gpu, lost, &failing);
    }
}

#[test]
fn a_panicking_lost_error_hook_does_not_escape_the_drop() {
    fn panics(_: &dyn std::fmt::Display) {
        panic!("a lost-error hook that panics (expected by this test)");
    }
    let gpu = MockBackend::new(1);
    let mut doomed = EventHandle::NULL;
    let lost = watch(|| {
        let pool = EventPool::new(gpu.clone());
        let e = pool.get(0).unwrap();
        doomed = e.handle();
        pool.put(e.detach(), None).unwrap();
        gpu.fail_event(CallKind::DestroyEvent, doomed);
        let recording = set_lost_error_hook(Some(panics));
        drop_quietly("an event pool whose lost-error hook panics", pool);
        set_lost_error_hook(recording);
    });
    assert_eq!(lost.count, 1, "counted although the hook panicked");
    assert!(lost.texts.is_empty());
    assert!(gpu.is_live_event(doomed));
    assert_eq!(gpu.live_events(), 1);
}

/// A lease's error parked in its pool and never taken, when the pool drops:
/// nobody is left to take it, so it is lost (counted, and handed to the hook)
/// like the pool's own destroy errors: the pools' drops hand it to
/// `lost::report` before `ParkedError`'s drop could discard it.
#[test]
fn an_error_parked_and_never_taken_is_reported_when_its_pool_drops() {
    let gpu = MockBackend::new(1);
    let lost = watch(|| {
        let pool = StreamPool::new(gpu.clone());
        let l = pool.get(0).unwrap();
        gpu.fail_stream(CallKind::QueryStream, l.handle());
        drop_quietly("a lease whose query fails", l);
        drop_quietly("the stream pool, its error untaken", pool);
    });
    assert_eq!(lost, one_lost(BackendOp::QueryStream));
}
