//! A graph capture meets another thread's `get` (issue 14): the stream pool
//! holds a stream returned while it was capturing (a side stream that joined
//! the capture with `AccessOrder::wait`), unqueried and unleased, until its
//! capture has ended; the hold (the returning thread's `give_back` pushing
//! it on the held list) races another thread's `get`, whose slow path takes
//! the held list apart to ask each stream whether its capture has ended.
//!
//! The capture is thread-local to the main thread: the other thread's lease
//! returns with a query, which a `Global` capture would refuse to every
//! thread (a finding of the mock acceptance tests,
//! `tests/tests/mock/capture.rs`), and the model is about the hold, not that.

use gpupool_core::StreamPoolConfig;
use gpupool_mock::{CaptureMode, MockBackend};

use super::{event_pool, model_deep, spawn_scoped, stream_pool};

/// The main thread forks a side lease off a capture's origin, joins it back
/// and returns it inside the capture, while another thread leases and
/// returns a stream: that thread is never given the side stream. Once the
/// capture has ended, the side stream is found again by a `get`; nothing is
/// a misuse, every stream is destroyed once.
#[test]
fn side_stream_return_races_a_get_during_a_capture() {
    model_deep(|| {
        let mock = MockBackend::new(1);
        let streams = stream_pool(&mock, StreamPoolConfig::default());
        let events = event_pool(&mock);
        let origin = streams.get(0).unwrap();
        origin.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let side = streams.get(0).unwrap();
        let side_stream = side.handle();
        side.order().wait(&origin.order(), &events).unwrap(); // fork
        mock.enqueue_work(side_stream).unwrap(); // captured
        origin.order().wait(&side.order(), &events).unwrap(); // join

        let other = spawn_scoped(|| {
            let lease = streams.get(0).unwrap();
            lease.handle()
        });
        drop(side); // held for the capture, racing the other thread's get
        let theirs = other.join();
        assert_ne!(theirs, side_stream, "a stream in a capture was leased");
        assert!(mock.misuses().is_empty(), "{:?}", mock.misuses());

        let graph = origin.end_capture().unwrap();
        assert_eq!(graph.node_count(), 1);
        // Found again: at most the other thread's stream (if it went to the
        // shared ready list) comes first.
        let first = streams.get(0).unwrap();
        let second = streams.get(0).unwrap();
        assert!(
            first.handle() == side_stream || second.handle() == side_stream,
            "the side stream was not found after the capture ended"
        );
        drop((first, second, origin, graph));
        streams.purge().unwrap();
        events.purge().unwrap();
        assert_eq!(mock.live_streams(), 0);
        assert_eq!(mock.live_events(), 0);
        assert!(mock.misuses().is_empty(), "{:?}", mock.misuses());
    });
}
