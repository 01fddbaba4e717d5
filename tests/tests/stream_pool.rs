//! Mock-only: what a stream pool passes to the backend that no backend trait
//! can read back (the stream priority). Everything else about `StreamPool`
//! is in the generic suite, `suite_streams.rs`, which runs on a GPU too.
#![cfg(not(feature = "cuda"))]

use gpupool_core::{StreamOptions, StreamPool, StreamPoolConfig};
use gpupool_tests::mock;

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
