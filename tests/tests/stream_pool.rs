//! StreamPool and StreamLease: DALI's semantics (SPEC.md 1.2) and gpupool's
//! deliberate differences (SPEC.md 0), on the mock machine.

use gpupool_core::{
    AccessOrder, DeviceId, DeviceSelector, OwnedStream, StreamBackend, StreamOptions, StreamPool,
    StreamPoolConfig,
};
use gpupool_mock::CallKind;
use gpupool_tests::mock;

#[test]
fn constructing_a_pool_calls_nothing() {
    let gpu = mock(2);
    let pool = StreamPool::new(gpu.clone());
    assert_eq!(gpu.total_calls(), 0);
    assert_eq!(pool.device_count(), None);
    assert_eq!(pool.stats(DeviceId(0)), None);
    drop(pool);
    assert_eq!(
        gpu.total_calls(),
        0,
        "dropping an unused pool calls nothing"
    );
}

#[test]
fn first_get_counts_devices_once_and_creates_a_stream_on_that_device() {
    let gpu = mock(2);
    let pool = StreamPool::new(gpu.clone());
    let lease = pool.get(1).unwrap();
    assert_eq!(lease.device(), DeviceId(1));
    assert_eq!(gpu.stream_device(lease.get()).unwrap(), DeviceId(1));
    assert_eq!(gpu.calls(CallKind::DeviceCount), 1);
    assert_eq!(gpu.calls(CallKind::CreateStream), 1);
    drop(pool.get(0).unwrap());
    assert_eq!(
        gpu.calls(CallKind::DeviceCount),
        1,
        "the table is built once"
    );
    assert_eq!(pool.device_count(), Some(2));
}

#[test]
fn ready_list_is_lifo_and_reuse_makes_no_backend_call() {
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
    let a = pool.get(0).unwrap();
    let b = pool.get(0).unwrap();
    let (sa, sb) = (a.get(), b.get());
    assert_ne!(sa, sb);
    drop(a);
    drop(b); // returned last: handed out first
    let calls = gpu.total_calls();
    let first = pool.get(0).unwrap();
    let second = pool.get(0).unwrap();
    assert_eq!((first.get(), second.get()), (sb, sa));
    assert_eq!(
        gpu.total_calls(),
        calls,
        "a ready stream is handed out with no call"
    );
    let stats = pool.stats(DeviceId(0)).unwrap();
    assert_eq!((stats.created, stats.reused, stats.live_leases), (2, 2, 2));
}

#[test]
fn return_queries_once_and_sorts_into_ready_or_busy() {
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
    let idle = pool.get(0).unwrap();
    let busy = pool.get(0).unwrap();
    let (si, sb) = (idle.get(), busy.get());
    gpu.enqueue_work(sb).unwrap();
    let q = gpu.calls(CallKind::QueryStream);
    drop(busy);
    drop(idle);
    assert_eq!(gpu.calls(CallKind::QueryStream), q + 2);
    // The ready stream comes out first, without any scan of the busy list.
    let q = gpu.calls(CallKind::QueryStream);
    let l = pool.get(0).unwrap();
    assert_eq!(l.get(), si);
    assert_eq!(
        gpu.calls(CallKind::QueryStream),
        q,
        "busy list scanned although a ready stream existed"
    );
    // Ready list now empty: the scan finds the busy stream still pending and a
    // new stream is created.
    let n = pool.get(0).unwrap();
    assert_ne!(n.get(), sb);
    assert_eq!(pool.stats(DeviceId(0)).unwrap().created, 3);
    assert_eq!(pool.stats(DeviceId(0)).unwrap().busy_hits, 0);
}

#[test]
fn busy_scan_takes_the_oldest_finished_stream_and_promotes_the_next_finished_ones() {
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
    let leases: Vec<_> = (0..4).map(|_| pool.get(0).unwrap()).collect();
    let handles: Vec<_> = leases.iter().map(|l| l.get()).collect();
    for &s in &handles {
        gpu.enqueue_work(s).unwrap();
    }
    drop(leases); // returned in order 0,1,2,3: all to the busy list
    gpu.complete_all(handles[0]).unwrap();
    gpu.complete_all(handles[1]).unwrap();
    gpu.complete_all(handles[2]).unwrap(); // handles[3] stays pending
    let got = pool.get(0).unwrap();
    assert_eq!(
        got.get(),
        handles[0],
        "the oldest finished stream is taken first"
    );
    let stats = pool.stats(DeviceId(0)).unwrap();
    assert_eq!((stats.busy_hits, stats.promoted), (1, 2));
    // The promoted streams come from the ready list with no query.
    let q = gpu.calls(CallKind::QueryStream);
    let p1 = pool.get(0).unwrap();
    let p2 = pool.get(0).unwrap();
    assert_eq!(gpu.calls(CallKind::QueryStream), q);
    let mut promoted = [p1.get(), p2.get()];
    promoted.sort();
    assert_eq!(promoted, [handles[1], handles[2]]);
    // The pending one stays busy until it finishes.
    let fresh = pool.get(0).unwrap();
    assert!(!handles.contains(&fresh.get()));
    gpu.complete_all(handles[3]).unwrap();
    let last = pool.get(0).unwrap();
    assert_eq!(last.get(), handles[3]);
}

#[test]
fn scan_limit_bounds_the_queries_of_one_get() {
    let gpu = mock(1);
    let config = StreamPoolConfig {
        scan_limit: 2,
        ..StreamPoolConfig::default()
    };
    let pool = StreamPool::with_config(gpu.clone(), config);
    let leases: Vec<_> = (0..5).map(|_| pool.get(0).unwrap()).collect();
    let handles: Vec<_> = leases.iter().map(|l| l.get()).collect();
    for l in &leases {
        gpu.enqueue_work(l.get()).unwrap();
    }
    drop(leases);
    let q = gpu.calls(CallKind::QueryStream);
    let l = pool.get(0).unwrap();
    assert_eq!(gpu.calls(CallKind::QueryStream) - q, 2);
    assert_eq!(pool.stats(DeviceId(0)).unwrap().created, 6);
    drop(l);
    // Round robin: the next scan starts with the streams not queried last time.
    gpu.complete_everything();
    let next = pool.get(0).unwrap(); // the idle sixth stream, from the ready list
    let scanned = pool.get(0).unwrap(); // ready list empty: scan
    assert_eq!(scanned.get(), handles[2]);
    assert_eq!(pool.stats(DeviceId(0)).unwrap().busy_hits, 1);
    drop((next, scanned));
}

#[test]
fn purge_destroys_pooled_streams_and_leases_out_come_back_later() {
    let gpu = mock(2);
    let pool = StreamPool::new(gpu.clone());
    let out = pool.get(1).unwrap();
    let kept = out.get();
    let idle = pool.get(0).unwrap();
    let busy = pool.get(0).unwrap();
    gpu.enqueue_work(busy.get()).unwrap();
    drop((idle, busy));
    assert_eq!(gpu.live_streams(), 3);
    assert_eq!(
        pool.purge().unwrap(),
        2,
        "ready and busy streams are destroyed"
    );
    assert_eq!(gpu.live_streams(), 1);
    assert!(gpu.is_live_stream(kept));
    drop(out); // returns normally after the purge
    assert_eq!(pool.get(1).unwrap().get(), kept);
    assert_eq!(pool.live_leases(), 0);
    assert_eq!(pool.device_count(), Some(2), "purge keeps the table");
    drop(pool);
    assert_eq!(
        gpu.live_streams(),
        0,
        "dropping the pool destroys what it holds"
    );
    assert!(gpu.misuses().is_empty());
}

#[test]
fn release_hands_ownership_out_and_put_takes_it_back() {
    let gpu = mock(2);
    let pool = StreamPool::new(gpu.clone());
    let lease = pool.get(1).unwrap();
    let s = lease.get();
    let owned = lease.release();
    assert_eq!((owned.handle(), owned.device()), (s, DeviceId(1)));
    assert_eq!(pool.live_leases(), 0, "a released lease is no longer live");
    assert_ne!(
        pool.get(1).unwrap().get(),
        s,
        "a released stream is not pooled"
    );
    pool.put(owned, None).unwrap(); // its own device
    let again = pool.get(1).unwrap();
    assert_eq!(again.get(), s);
    pool.put(again.release(), Some(DeviceId(1))).unwrap();
    let third = pool.get(1).unwrap();
    assert_eq!(third.get(), s);
    third.release().destroy(&gpu).unwrap();
    assert!(!gpu.is_live_stream(s));
}

#[test]
fn adopting_a_foreign_stream_asks_the_backend_for_its_device() {
    let gpu = mock(2);
    let raw = gpu
        .create_stream(DeviceId(1), StreamOptions::default())
        .unwrap();
    let pool = StreamPool::new(gpu.clone());
    // SAFETY: `raw` was just created and is handed over here.
    let owned = unsafe { OwnedStream::adopt(&gpu, raw) }.unwrap();
    assert_eq!(owned.device(), DeviceId(1));
    pool.put(owned, None).unwrap();
    assert_eq!(pool.get(1).unwrap().get(), raw);
}

#[test]
fn reset_returns_now_and_reports() {
    let gpu = mock(1);
    let pool = StreamPool::new(gpu.clone());
    let lease = pool.get(0).unwrap();
    let s = lease.get();
    lease.reset().unwrap();
    assert_eq!(pool.live_leases(), 0);
    assert_eq!(pool.get(0).unwrap().get(), s);
}

#[test]
fn lease_accessors_and_access_order() {
    let gpu = mock(2);
    let pool = StreamPool::new(gpu.clone());
    let lease = pool.get(1).unwrap();
    assert!(std::ptr::eq(lease.pool(), &pool));
    let order: AccessOrder = (&lease).into();
    assert_eq!(order, AccessOrder::stream(lease.get(), DeviceId(1)));
    assert_eq!(lease.order(), order);
}

#[test]
fn current_device_is_resolved_once_per_call() {
    let gpu = mock(3);
    let pool = StreamPool::new(gpu.clone());
    gpu.set_current_device(DeviceId(2));
    let lease = pool.get(DeviceSelector::Current).unwrap();
    assert_eq!(lease.device(), DeviceId(2));
    assert_eq!(gpu.calls(CallKind::CurrentDevice), 1);
    drop(lease);
    drop(pool.get(DeviceId(2)).unwrap());
    assert_eq!(
        gpu.calls(CallKind::CurrentDevice),
        1,
        "an explicit device needs no lookup"
    );
}

#[test]
fn streams_are_created_with_the_configured_priority() {
    let gpu = mock(1);
    let config = StreamPoolConfig {
        stream: StreamOptions { priority: Some(-2) },
        ..StreamPoolConfig::default()
    };
    let pool = StreamPool::with_config(gpu.clone(), config);
    let lease = pool.get(0).unwrap();
    assert_eq!(gpu.stream_priority(lease.get()), Some(Some(-2)));
}

#[test]
fn leases_for_each_device_hold_streams_of_that_device() {
    let gpu = mock(4);
    let pool = StreamPool::new(gpu.clone());
    let leases: Vec<_> = (0..4u32)
        .flat_map(|d| [pool.get(d).unwrap(), pool.get(d).unwrap()])
        .collect();
    for l in &leases {
        assert_eq!(gpu.stream_device(l.get()).unwrap(), l.device());
    }
    drop(leases);
    for d in 0..4 {
        let l = pool.get(d).unwrap();
        assert_eq!(gpu.stream_device(l.get()).unwrap(), DeviceId(d));
        assert_eq!(gpu.live_streams_on(DeviceId(d)), 2);
    }
}
