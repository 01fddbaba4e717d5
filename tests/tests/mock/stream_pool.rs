//! Mock-only: what a stream pool passes to the backend that no backend trait
//! can read back (the stream priority), and same-thread reuse counted in
//! backend calls. Everything else about `StreamPool`
//! is in the generic suite, `suite/streams.rs`, which runs on a GPU too.
#![cfg(not(feature = "cuda"))]

use gpupool_core::{DeviceId, StreamOptions, StreamPool, StreamPoolConfig};
use gpupool_tests::{error_chain, mock, mock_stream_pool};

#[test]
fn streams_are_created_with_the_configured_priority() {
    let gpu = mock(1);
    let config = StreamPoolConfig {
        stream: StreamOptions { priority: Some(-2) },
        ..StreamPoolConfig::default()
    };
    let pool = StreamPool::with_config(gpu.clone(), config);
    let lease = pool.get(0).unwrap();
    assert_eq!(gpu.stream_priority(lease.handle()), Some(Some(-2)));
}

fn same_thread_pool(gpu: &gpupool_mock::MockBackend) -> StreamPool<gpupool_mock::MockBackend> {
    let config = StreamPoolConfig {
        same_thread_reuse: true,
        ..StreamPoolConfig::default()
    };
    StreamPool::with_config(gpu.clone(), config)
}

#[test]
fn same_thread_reuse_hands_a_thread_back_its_own_stream_with_no_driver_call() {
    let gpu = mock(1);
    let pool = same_thread_pool(&gpu);
    let lease = pool.get(0).unwrap();
    let s = lease.handle();
    gpu.enqueue_work(s).unwrap(); // still busy with this thread's own work
    drop(lease);
    let calls = gpu.total_calls();
    let again = pool.get(0).unwrap();
    assert_eq!(
        again.handle(),
        s,
        "the thread's own stream, even though busy"
    );
    drop(again);
    assert_eq!(gpu.total_calls(), calls, "no query on return, none on get");
    let stats = pool.stats(DeviceId(0)).unwrap();
    assert_eq!((stats.leases, stats.reused, stats.live_leases), (2, 1, 0));
}

#[test]
fn same_thread_reuse_never_gives_a_kept_stream_to_another_thread() {
    let gpu = mock(1);
    let pool = same_thread_pool(&gpu);
    let mine = pool.get(0).unwrap().handle(); // kept for this thread
    let theirs = std::thread::scope(|s| s.spawn(|| pool.get(0).unwrap().handle()).join().unwrap());
    assert_ne!(theirs, mine);
    // The other thread has exited: its kept stream goes to the busy list and is
    // handed out only after a query finds it idle.
    gpu.enqueue_work(theirs).unwrap();
    let a = pool.get(0).unwrap(); // this thread's own
    assert_eq!(a.handle(), mine);
    let b = pool.get(0).unwrap(); // the exited thread's is still busy: a new one
    assert!(b.handle() != theirs && b.handle() != mine);
    gpu.complete_all(theirs).unwrap();
    let c = pool.get(0).unwrap();
    assert_eq!(c.handle(), theirs, "found idle by a scan");
    drop((a, b, c));
    assert_eq!(pool.live_leases(), 0);
    assert_eq!(pool.purge().unwrap(), 3, "kept streams are purged too");
    assert_eq!(gpu.live_streams(), 0);
}

#[test]
fn same_thread_reuse_streams_are_destroyed_with_the_pool() {
    let gpu = mock(2);
    let pool = same_thread_pool(&gpu);
    drop(pool.get(0).unwrap());
    drop(pool.get(1).unwrap());
    assert_eq!(gpu.live_streams(), 2);
    drop(pool);
    assert_eq!(gpu.live_streams(), 0);
    assert!(gpu.misuses().is_empty());
}

#[test]
fn a_refused_put_chains_rejected_error_and_backend_error_each_said_once() {
    use gpupool_mock::{CallKind, MockError};
    let (gpu, pool) = mock_stream_pool(1);
    let owned = pool.get(0).unwrap().detach();
    gpu.fail_nth(CallKind::QueryStream, 1);
    let refused = pool.put(owned, None).unwrap_err();
    assert_eq!(
        error_chain(&refused),
        [
            "OwnedStream refused",
            "backend call QueryStream failed",
            &MockError::Injected(CallKind::QueryStream).to_string(),
        ]
    );
    // The stream came back with the error, still the caller's.
    pool.put(refused.value, None).unwrap();
    assert_eq!(pool.stats(DeviceId(0)).unwrap().pooled, 1);
}

#[test]
fn the_error_types_implement_core_error() {
    fn is_error<E: core::error::Error + Send + Sync + 'static>() {}
    is_error::<gpupool_core::Error<gpupool_mock::MockError>>();
    is_error::<gpupool_core::Rejected<gpupool_core::OwnedStream, gpupool_mock::MockError>>();
    is_error::<gpupool_mock::MockError>();
}
