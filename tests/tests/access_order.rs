//! AccessOrder and `wait` (SPEC.md 3), on the mock machine.

use gpupool_core::{
    AccessOrder, BackendOp, DeviceId, EventPool, StreamBackend, StreamHandle, StreamPool,
};
use gpupool_mock::CallKind;
use gpupool_tests::mock;

#[test]
fn waiting_on_itself_or_on_the_host_does_nothing() {
    let gpu = mock(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let s = streams.get(0).unwrap();
    let calls = gpu.total_calls();
    s.order().wait(&s.order(), &events).unwrap();
    s.order().wait(&AccessOrder::host(), &events).unwrap();
    AccessOrder::host()
        .wait(&AccessOrder::host(), &events)
        .unwrap();
    assert_eq!(gpu.total_calls(), calls);
}

#[test]
fn the_host_waiting_on_a_stream_synchronizes_it() {
    let gpu = mock(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let s = streams.get(0).unwrap();
    gpu.enqueue_work(s.get()).unwrap();
    AccessOrder::host().wait(&s.order(), &events).unwrap();
    assert_eq!(gpu.calls(CallKind::SynchronizeStream), 1);
    assert_eq!(gpu.pending_work(s.get()).unwrap(), 0);
}

#[test]
fn a_stream_waiting_on_another_is_ordered_after_it_through_a_pooled_event() {
    let gpu = mock(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let producer = streams.get(0).unwrap();
    let consumer = streams.get(0).unwrap();
    gpu.enqueue_work(producer.get()).unwrap();
    consumer.order().wait(&producer.order(), &events).unwrap();
    gpu.enqueue_work(consumer.get()).unwrap();
    assert_eq!(gpu.calls(CallKind::RecordEvent), 1);
    assert_eq!(gpu.calls(CallKind::StreamWaitEvent), 1);
    // The consumer cannot run before the producer has finished.
    assert!(!gpu.complete_one(consumer.get()).unwrap());
    gpu.complete_all(producer.get()).unwrap();
    assert!(gpu.complete_one(consumer.get()).unwrap());
    // The event went back to its pool.
    assert_eq!(events.live_leases(), 0);
    assert_eq!(events.total_stats().created, 1);
    consumer.order().wait(&producer.order(), &events).unwrap();
    assert_eq!(events.total_stats().reused, 1);
}

#[test]
fn wait_is_transitive() {
    let gpu = mock(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let [a, b, c] = [(); 3].map(|_| streams.get(0).unwrap());
    gpu.enqueue_work(a.get()).unwrap();
    b.order().wait(&a.order(), &events).unwrap();
    c.order().wait(&b.order(), &events).unwrap();
    gpu.enqueue_work(c.get()).unwrap();
    assert!(
        !gpu.complete_one(c.get()).unwrap(),
        "c ran before a finished"
    );
    gpu.complete_all(a.get()).unwrap();
    assert!(gpu.complete_one(c.get()).unwrap());
}

#[test]
fn waits_across_devices_record_on_the_other_devices_event() {
    let gpu = mock(2);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let on0 = streams.get(0).unwrap();
    let on1 = streams.get(1).unwrap();
    gpu.enqueue_work(on1.get()).unwrap();
    on0.order().wait(&on1.order(), &events).unwrap();
    assert_eq!(events.stats(DeviceId(1)).unwrap().created, 1);
    assert_eq!(events.stats(DeviceId(0)).unwrap().created, 0);
    gpu.enqueue_work(on0.get()).unwrap();
    assert!(!gpu.complete_one(on0.get()).unwrap());
    gpu.complete_all(on1.get()).unwrap();
    assert!(gpu.complete_one(on0.get()).unwrap());
    assert!(gpu.misuses().is_empty());
}

#[test]
fn special_stream_handles_are_valid_orders() {
    let gpu = mock(2);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let s = streams.get(1).unwrap();
    let legacy_on_1 = AccessOrder::stream(StreamHandle::NULL, DeviceId(1));
    s.order().wait(&legacy_on_1, &events).unwrap();
    legacy_on_1.wait(&s.order(), &events).unwrap();
    AccessOrder::host().wait(&legacy_on_1, &events).unwrap();
    assert!(gpu.misuses().is_empty());
}

#[test]
fn a_failed_record_destroys_the_event_and_reports() {
    let gpu = mock(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let a = streams.get(0).unwrap();
    let b = streams.get(0).unwrap();
    gpu.fail_nth(CallKind::RecordEvent, 1);
    let err = a.order().wait(&b.order(), &events).unwrap_err();
    assert_eq!(err.backend_op(), Some(BackendOp::RecordEvent));
    assert_eq!(
        gpu.live_events(),
        0,
        "the event was destroyed, not returned"
    );
    assert_eq!(events.live_leases(), 0);
    a.order().wait(&b.order(), &events).unwrap();
}

#[test]
fn wait_event_from_host_and_stream() {
    let gpu = mock(1);
    let streams = StreamPool::new(gpu.clone());
    let events = EventPool::new(gpu.clone());
    let s = streams.get(0).unwrap();
    let t = streams.get(0).unwrap();
    let e = events.get(0).unwrap();
    gpu.enqueue_work(s.get()).unwrap();
    use gpupool_core::EventBackend;
    gpu.record_event(e.get(), s.get(), DeviceId(0)).unwrap();
    t.order().wait_event(e.get(), DeviceId(0), &gpu).unwrap();
    gpu.enqueue_work(t.get()).unwrap();
    assert!(!gpu.complete_one(t.get()).unwrap());
    AccessOrder::host()
        .wait_event(e.get(), DeviceId(0), &gpu)
        .unwrap();
    assert_eq!(
        gpu.query_stream(s.get(), DeviceId(0)).unwrap(),
        gpupool_core::Completion::Complete
    );
    assert!(gpu.complete_one(t.get()).unwrap());
}
