//! Generic suite: `StreamPool` and `StreamLease` (DALI's `CUDAStreamPool`
//! and where gpupool differs) on the machine of this build — the mock by
//! default, a GPU with `--features cuda`. Counts of backend calls and live
//! streams are checked where the machine can count them. What both pools do
//! alike is in `both.rs`.

use gpupool_core::{
    AccessOrder, DeviceId, DeviceSelector, OwnedStream, StreamBackend, StreamHandle, StreamOptions,
    StreamPool, StreamPoolConfig,
};
use gpupool_tests::any_pool::assert_drop_destroys_the_rest;
use gpupool_tests::{
    assert_calls, assert_count, gpu, machine, with_stream_pool, Gpu, GpuBackend, TestGpu,
};

const D0: DeviceId = DeviceId(0);

/// Runs `test` on the machine of this build ([`machine`]: `mock_devices` on
/// the mock) with its last device current and a stream pool over it, made
/// after; gives it that device.
fn with_the_last_device_current(
    mock_devices: u32,
    test: impl FnOnce(Gpu, DeviceId, StreamPool<GpuBackend>),
) {
    let Some(gpu) = machine(1, mock_devices) else {
        return;
    };
    let last = DeviceId(gpu.device_count() - 1);
    gpu.set_current_device(last);
    let pool = StreamPool::new(gpu.backend());
    test(gpu, last, pool);
}

/// Lets `s`, a busy stream in `pool`'s busy list, finish, and checks that
/// the next lease finds it there: the pool's first busy hit.
///
/// # Safety
/// `pool` holds `s`, a live stream of device 0, in its busy list, and
/// nothing purges it before the call returns.
#[track_caller]
unsafe fn finish_and_find_in_the_busy_list(
    gpu: &Gpu,
    pool: &StreamPool<GpuBackend>,
    s: StreamHandle,
) {
    // SAFETY: the caller's contract: `s` is a live stream of device 0.
    unsafe { gpu.finish(s, D0) };
    let found = pool.get(0).unwrap();
    assert_eq!(found.handle(), s);
    assert_eq!(pool.stats(D0).unwrap().busy_hits, 1);
}

#[test]
fn the_device_table_is_built_once_and_leases_hold_streams_of_their_device() {
    let Some(gpu) = machine(1, 4) else { return };
    let devices = gpu.device_count().min(4);
    let pool = StreamPool::new(gpu.backend());
    let calls = gpu.backend_calls();
    let leases: Vec<_> = (0..devices)
        .flat_map(|d| [pool.get(d).unwrap(), pool.get(d).unwrap()])
        .collect();
    let created = 2 * u64::from(devices);
    assert_calls(&gpu, calls, 1 + created, "the device count is asked once");
    for l in &leases {
        // SAFETY: the lease holds this live stream of the backend.
        let device = unsafe { gpu.backend().stream_device(l.handle()) }.unwrap();
        assert_eq!(device, l.device());
    }
    drop(leases);
    let calls = gpu.backend_calls();
    let again: Vec<_> = (0..devices).map(|d| pool.get(d).unwrap()).collect();
    assert_calls(&gpu, calls, 0, "reuse on every device");
    for (d, l) in (0..devices).zip(&again) {
        assert_eq!(l.device(), DeviceId(d));
        // SAFETY: the lease holds this live stream of the backend.
        let device = unsafe { gpu.backend().stream_device(l.handle()) }.unwrap();
        assert_eq!(device, DeviceId(d));
    }
    assert_eq!(pool.total_stats().created, 2 * devices as usize);
}

#[test]
fn a_busy_stream_is_not_reused_until_it_has_finished() {
    with_stream_pool(1, |gpu, pool| {
        let idle = pool.get(0).unwrap();
        let busy = pool.get(0).unwrap();
        let (si, sb) = (idle.handle(), busy.handle());
        // SAFETY: the lease `busy` holds this live stream of device 0.
        unsafe { gpu.make_busy(sb, D0) };
        let calls = gpu.backend_calls();
        drop(busy); // pending: the busy list
        drop(idle); // idle: the ready list
        assert_calls(&gpu, calls, 2, "each return queries its stream once");
        // The ready stream comes out first, without any scan of the busy list.
        let calls = gpu.backend_calls();
        let l = pool.get(0).unwrap();
        assert_eq!(l.handle(), si);
        assert_calls(
            &gpu,
            calls,
            0,
            "busy list scanned though a stream was ready",
        );
        // Nothing ready, and the busy stream still pending: a new stream.
        let n = pool.get(0).unwrap();
        assert_ne!(n.handle(), sb);
        let stats = pool.stats(D0).unwrap();
        assert_eq!((stats.created, stats.busy_hits), (3, 0));
        // Once it has finished, the scan finds it.
        // SAFETY: the pool holds this live stream of device 0 in its busy list
        // (handed out to no one, as checked above) and nothing purges it during
        // the test.
        unsafe { finish_and_find_in_the_busy_list(&gpu, &pool, sb) };
    });
}

#[test]
fn the_busy_scan_takes_the_oldest_finished_stream_and_promotes_the_next_finished_ones() {
    with_stream_pool(1, |gpu, pool| {
        let leases: Vec<_> = (0..4).map(|_| pool.get(0).unwrap()).collect();
        let handles: Vec<_> = leases.iter().map(|l| l.handle()).collect();
        for &s in &handles {
            // SAFETY: the leases in `leases` hold these live streams of device 0.
            unsafe { gpu.make_busy(s, D0) };
        }
        drop(leases); // returned in order 0,1,2,3: all to the busy list
        for &s in &handles[..3] {
            // SAFETY: the pool holds these live streams of device 0 in its busy
            // list and nothing purges it during the test.
            unsafe { gpu.finish(s, D0) }; // handles[3] stays pending
        }
        let got = pool.get(0).unwrap();
        assert_eq!(got.handle(), handles[0], "the oldest finished stream first");
        let stats = pool.stats(D0).unwrap();
        assert_eq!((stats.busy_hits, stats.promoted), (1, 2));
        // The promoted streams come from the ready list with no query.
        let calls = gpu.backend_calls();
        let p1 = pool.get(0).unwrap();
        let p2 = pool.get(0).unwrap();
        assert_calls(&gpu, calls, 0, "promoted streams are handed out");
        let mut promoted = [p1.handle(), p2.handle()];
        promoted.sort();
        let mut expected = [handles[1], handles[2]];
        expected.sort();
        assert_eq!(promoted, expected);
        // The pending one stays busy until it finishes.
        let fresh = pool.get(0).unwrap();
        assert!(!handles.contains(&fresh.handle()));
        // SAFETY: the pool still holds this live stream of device 0 in its busy
        // list and nothing purges it during the test.
        unsafe { gpu.finish(handles[3], D0) };
        let last = pool.get(0).unwrap();
        assert_eq!(last.handle(), handles[3]);
    });
}

#[test]
fn the_scan_limit_bounds_one_get_and_the_next_scan_starts_where_it_stopped() {
    let Some(gpu) = gpu(1) else { return };
    let config = StreamPoolConfig {
        scan_limit: 2,
        ..StreamPoolConfig::default()
    };
    let pool = StreamPool::with_config(gpu.backend(), config);
    let leases: Vec<_> = (0..5).map(|_| pool.get(0).unwrap()).collect();
    let handles: Vec<_> = leases.iter().map(|l| l.handle()).collect();
    for &s in &handles {
        // SAFETY: the leases in `leases` hold these live streams of device 0.
        unsafe { gpu.make_busy(s, D0) };
    }
    drop(leases);
    let calls = gpu.backend_calls();
    let l = pool.get(0).unwrap();
    assert_calls(&gpu, calls, 3, "two queries, then a create");
    assert_eq!(pool.stats(D0).unwrap().created, 6);
    drop(l);
    for &s in &handles {
        // SAFETY: the pool holds these five live streams of device 0 in its
        // busy list (the one get above created a sixth instead) and nothing
        // purges it during the test.
        unsafe { gpu.finish(s, D0) };
    }
    let next = pool.get(0).unwrap(); // the idle sixth stream, from the ready list
    let scanned = pool.get(0).unwrap(); // ready list empty: scan
    assert_eq!(
        scanned.handle(),
        handles[2],
        "the streams not queried last time"
    );
    assert_eq!(pool.stats(D0).unwrap().busy_hits, 1);
    drop((next, scanned));
}

#[test]
fn purge_destroys_pooled_streams_while_leases_out_come_back_later() {
    with_stream_pool(1, |gpu, pool| {
        let out = pool.get(0).unwrap();
        let kept = out.handle();
        let idle = pool.get(0).unwrap();
        let busy = pool.get(0).unwrap();
        // SAFETY: the lease `busy` holds this live stream of device 0.
        unsafe { gpu.make_busy(busy.handle(), D0) }; // destroyed with its work pending
        drop((idle, busy));
        assert_count(gpu.live_streams(), 3, "live streams before the purge");
        assert_eq!(pool.purge().unwrap(), 2, "ready and busy streams");
        assert_count(gpu.live_streams(), 1, "only the leased stream is left");
        assert_eq!(pool.stats(D0).unwrap().destroyed, 2);
        drop(out); // returns normally after the purge
        assert_eq!(pool.get(0).unwrap().handle(), kept);
        assert_eq!(pool.live_leases(), 0);
        assert_eq!(pool.device_count(), Some(gpu.device_count() as usize));
        assert!(pool.take_error().is_none());
        assert_drop_destroys_the_rest(&gpu, pool);
    });
}

#[test]
fn release_hands_ownership_out_and_put_takes_it_back_with_or_without_a_device() {
    with_stream_pool(1, |gpu, pool| {
        let lease = pool.get(0).unwrap();
        let s = lease.handle();
        let owned = lease.detach();
        assert_eq!((owned.handle(), owned.device()), (s, D0));
        assert_eq!(pool.live_leases(), 0, "a detached lease is no longer live");
        let other = pool.get(0).unwrap();
        assert_ne!(other.handle(), s, "a detached stream is not pooled");
        drop(other);
        pool.put(owned, None).unwrap(); // its own device
        let again = pool.get(0).unwrap();
        assert_eq!(again.handle(), s);
        pool.put(again.detach(), Some(D0)).unwrap();
        let third = pool.get(0).unwrap();
        assert_eq!(third.handle(), s);
        assert_count(gpu.live_streams(), 2, "s and the other stream");
        third.detach().destroy(&gpu.backend()).unwrap();
        assert_count(gpu.live_streams(), 1, "s was destroyed");
        assert_eq!(pool.live_leases(), 0);
    });
}

#[test]
fn put_queries_once_and_a_stream_put_busy_waits_in_the_busy_list() {
    with_stream_pool(1, |gpu, pool| {
        let owned = pool.get(0).unwrap().detach();
        let s = owned.handle();
        // SAFETY: `owned` holds this live stream of device 0.
        unsafe { gpu.make_busy(s, D0) };
        let calls = gpu.backend_calls();
        pool.put(owned, None).unwrap();
        assert_calls(
            &gpu,
            calls,
            2,
            "put asks whether the stream is capturing, then queries once",
        );
        let fresh = pool.get(0).unwrap();
        assert_ne!(fresh.handle(), s, "a pending stream is not handed out");
        // SAFETY: the pool holds this live stream of device 0 in its busy list
        // (put above) and nothing purges it during the test.
        unsafe { finish_and_find_in_the_busy_list(&gpu, &pool, s) };
    });
}

#[test]
fn adopting_a_foreign_stream_asks_the_backend_for_its_device() {
    let Some(gpu) = machine(1, 3) else { return };
    let backend = gpu.backend();
    let last = DeviceId(gpu.device_count() - 1);
    let raw = backend
        .create_stream(last, StreamOptions::default())
        .unwrap();
    let pool = StreamPool::new(gpu.backend());
    // SAFETY: `raw` was just created and is handed over here.
    let owned = unsafe { OwnedStream::adopt(&backend, raw) }.unwrap();
    assert_eq!(owned.device(), last);
    pool.put(owned, None).unwrap();
    assert_eq!(pool.get(last).unwrap().handle(), raw);
}

#[test]
fn reset_returns_the_stream_now_to_the_ready_or_the_busy_list() {
    with_stream_pool(1, |gpu, pool| {
        let lease = pool.get(0).unwrap();
        let s = lease.handle();
        lease.return_to_pool().unwrap();
        assert_eq!(pool.live_leases(), 0);
        let lease = pool.get(0).unwrap();
        assert_eq!(lease.handle(), s);
        // SAFETY: the lease holds this live stream of device 0.
        unsafe { gpu.make_busy(s, D0) };
        lease.return_to_pool().unwrap();
        let fresh = pool.get(0).unwrap();
        assert_ne!(fresh.handle(), s, "pending at return: the busy list");
        // SAFETY: the pool holds this live stream of device 0 in its busy list
        // and nothing purges it during the test.
        unsafe { gpu.finish(s, D0) };
        assert_eq!(pool.get(0).unwrap().handle(), s);
    });
}

#[test]
fn lease_accessors_and_its_access_order() {
    let Some(gpu) = machine(1, 3) else { return };
    let last = DeviceId(gpu.device_count() - 1);
    let pool = StreamPool::new(gpu.backend());
    let lease = pool.get(last).unwrap();
    assert!(std::ptr::eq(lease.pool(), &pool));
    assert_eq!(lease.device(), last);
    let order: AccessOrder = (&lease).into();
    assert!(order.is_device() && !order.is_host());
    assert_eq!(order.stream_handle(), Some(lease.handle()));
    assert_eq!(order.device(), Some(last));
    // SAFETY: the lease holds this live stream of `last`, made by this
    // backend, for as long as the order is used.
    let raw = unsafe { AccessOrder::from_raw(&gpu.backend(), lease.handle(), last) };
    assert_eq!(order, raw);
    assert_eq!(lease.order(), order);
}

#[test]
fn the_current_device_is_resolved_once_per_call() {
    with_the_last_device_current(3, |gpu, last, pool| {
        let calls = gpu.backend_calls();
        let lease = pool.get(DeviceSelector::Current).unwrap();
        assert_eq!(lease.device(), last);
        assert_calls(&gpu, calls, 3, "count devices, current device, create");
        drop(lease);
        let calls = gpu.backend_calls();
        drop(pool.get(last).unwrap());
        assert_calls(
            &gpu,
            calls,
            1,
            "an explicit device: reuse, then the return's query",
        );
    });
}

// ---- `pooled`, device selectors, `get_in` and the thread's cell ----------

#[test]
fn pooled_counts_the_streams_the_pool_holds_and_has_not_leased() {
    with_stream_pool(1, |gpu, pool| {
        let pooled = |pool: &StreamPool<_>| pool.stats(D0).unwrap().pooled;
        let leases: Vec<_> = (0..6).map(|_| pool.get(0).unwrap()).collect();
        assert_eq!(pooled(&pool), 0, "every stream is out");
        // SAFETY: the lease holds this live stream of device 0.
        unsafe { gpu.make_busy(leases[5].handle(), D0) };
        let mut leases = leases.into_iter();
        let detached = leases.next().unwrap().detach();
        drop(leases); // four idle (cell, then ready list) and one busy
        assert_eq!(pooled(&pool), 5, "idle, kept in the cell and busy alike");
        assert_eq!(pool.live_leases(), 0);
        pool.put(detached, None).unwrap();
        assert_eq!(pooled(&pool), 6, "put in");
        let again = pool.get(0).unwrap();
        assert_eq!(pooled(&pool), 5, "one out again");
        assert_eq!(pool.total_stats().pooled, 5);
        let gone = again.detach(); // leaves the pool
        assert_eq!(pooled(&pool), 5);
        gone.destroy(&gpu.backend()).unwrap();
        assert_eq!(pool.purge().unwrap(), 5);
        assert_eq!(pooled(&pool), 0, "purged");
        gpu.quiesce();
    });
}

#[test]
fn a_device_is_named_by_an_integer_literal_an_option_or_a_checked_index() {
    with_the_last_device_current(2, |gpu, last, pool| {
        assert_eq!(pool.get(0).unwrap().device(), D0, "a literal is a u32");
        assert_eq!(
            pool.get(None).unwrap().device(),
            last,
            "None: the current device"
        );
        assert_eq!(pool.get(Some(D0)).unwrap().device(), D0);
        let index: usize = last.index();
        let selector = DeviceSelector::try_from(index).unwrap();
        assert_eq!(pool.get(selector).unwrap().device(), last);
        assert_eq!(DeviceId::try_from(index), Ok(last));
        if usize::BITS > 32 {
            assert!(
                DeviceSelector::try_from(u32::MAX as usize + 1).is_err(),
                "not truncated"
            );
        }
        gpu.set_current_device(D0);
    });
}

#[test]
fn get_in_cycles_reuse_the_threads_kept_stream() {
    with_stream_pool(1, |gpu, pool| {
        let handle = pool.collector().register();
        let guard = handle.pin();
        let first = pool.get_in(0, &guard).unwrap().handle();
        for _ in 0..10 {
            // Each return goes to this thread's cell; each get_in takes it back.
            assert_eq!(pool.get_in(0, &guard).unwrap().handle(), first);
        }
        let stats = pool.stats(D0).unwrap();
        assert_eq!((stats.created, stats.live_leases, stats.pooled), (1, 0, 1));
        // `get` and `get_in` share the cell.
        assert_eq!(pool.get(0).unwrap().handle(), first);
        assert_count(gpu.live_streams(), 1, "one stream for every cycle");
    });
}
