//! Models of the mock backend itself (`MockBackend`: one reader-writer lock
//! over the whole simulated machine; the read-only calls count themselves in
//! atomics and answer under the read lock when nothing needs changing), which
//! every other model runs on: two threads make every kind of call at once, or
//! query while a third records and destroys, and the live counts, the call
//! and fault counters, the misuse and hazard logs must come out exact in
//! every interleaving.

use std::ptr::NonNull;

use gpupool_core::{
    Backend, Completion, DeviceId, EventBackend, EventFlags, MemoryBackend, MemoryKind,
    StreamBackend, StreamHandle,
};
use gpupool_mock::{CallKind, HazardKind, MockBackend, MockError};

use super::{model_deep, spawn_scoped};

const D: DeviceId = DeviceId(0);
const SIZE: usize = 256;

/// An address no block of the mock covers (the mock only compares it).
fn foreign(i: usize) -> *const u8 {
    std::ptr::without_provenance(0x100 + 0x10 * i)
}

/// A block that the threads of a model share.
#[derive(Copy, Clone)]
struct Block(NonNull<u8>);

// SAFETY: the models never dereference the pointer: the mock only compares
// its address with its records (and frees the block through them).
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    fn get(self) -> NonNull<u8> {
        self.0
    }
}

/// What one thread did.
struct Done {
    stream: StreamHandle,
    injected: bool,
}

/// One thread's calls: a stream, a device block used by a kernel on it, a
/// deliberate use of memory that is no block (one hazard), then an event
/// recorded after the kernel that a stream shared by both threads waits for,
/// and the block freed in that shared stream's order; or, when its event
/// creation is the one that fails (the fault is armed for the first
/// creation, whichever thread makes it), the block freed in its own stream's
/// order and the stream synchronized. Everything it made is destroyed.
fn one_thread(mock: &MockBackend, shared: StreamHandle, i: usize) -> Done {
    let s = mock.create_stream(D, Default::default()).unwrap();
    let p: NonNull<u8> = mock.allocate(MemoryKind::Device, D, SIZE, SIZE).unwrap();
    mock.use_memory(s, p.as_ptr(), SIZE).unwrap();
    mock.use_memory(s, foreign(i), 8).unwrap(); // a hazard, on purpose
    assert_eq!(mock.query_stream(s, D).unwrap(), Completion::Pending);
    let injected = match mock.create_event(D, EventFlags::DISABLE_TIMING) {
        Ok(e) => {
            mock.record_event(e, s, D).unwrap();
            mock.stream_wait_event(shared, D, e).unwrap();
            // SAFETY: `shared` waits for the event recorded after the only
            // use of `p`; the mock checks exactly that ordering.
            unsafe { mock.deallocate_async(MemoryKind::Device, D, p, SIZE, SIZE, shared) }.unwrap();
            mock.complete_all(s).unwrap();
            assert_eq!(mock.query_event(e, D).unwrap(), Completion::Complete);
            mock.destroy_event(e, D).unwrap();
            false
        }
        Err(e) => {
            assert!(e.is_injected(), "{e}");
            // SAFETY: `p` is used only by work on `s`.
            unsafe { mock.deallocate_async(MemoryKind::Device, D, p, SIZE, SIZE, s) }.unwrap();
            mock.synchronize_stream(s, D).unwrap();
            true
        }
    };
    assert_eq!(mock.query_stream(s, D).unwrap(), Completion::Complete);
    mock.destroy_stream(s, D).unwrap();
    Done {
        stream: s,
        injected,
    }
}

#[test]
fn two_threads_every_call() {
    model_deep(|| {
        let mock = MockBackend::new(1);
        let shared = mock.create_stream(D, Default::default()).unwrap();
        mock.fail_nth(CallKind::CreateEvent, 1);
        let t = spawn_scoped(|| one_thread(&mock, shared, 1));
        let mine = one_thread(&mock, shared, 0);
        let theirs = t.join();

        assert_ne!(mine.stream, theirs.stream, "one handle for two streams");
        assert!(
            mine.injected ^ theirs.injected,
            "the armed fault fired once"
        );
        assert_eq!(mock.armed_faults(), 0);
        assert_eq!(mock.calls(CallKind::CreateStream), 3);
        assert_eq!(mock.calls(CallKind::CreateEvent), 2);
        assert_eq!(mock.calls(CallKind::RecordEvent), 1);
        assert_eq!(mock.calls(CallKind::DeallocateAsync), 2);
        assert_eq!(mock.calls(CallKind::DestroyStream), 2);
        assert!(mock.misuses().is_empty(), "{:?}", mock.misuses());

        let mut hazards = mock.hazards();
        hazards.sort_by_key(|h| h.addr);
        let expected = [(foreign(0), mine.stream), (foreign(1), theirs.stream)];
        assert_eq!(hazards.len(), 2, "{hazards:?}");
        for (h, (addr, s)) in hazards.iter().zip(expected) {
            assert_eq!(h.kind, HazardKind::UsedAfterFree);
            assert_eq!((h.addr, h.len, h.stream), (addr.addr(), 8, Some(s)));
        }

        // Both kernels are done, so the shared stream's waits have resolved
        // and both blocks are back.
        assert_eq!(mock.live_streams(), 1);
        assert_eq!(mock.live_events(), 0);
        assert_eq!(mock.live_blocks(), 0);
        assert_eq!(mock.live_bytes(MemoryKind::Device), 0);
        assert_eq!(mock.pending_free_bytes(MemoryKind::Device), 0);
        let peak = mock.peak_live_bytes(MemoryKind::Device);
        assert!(peak == SIZE || peak == 2 * SIZE, "peak {peak}");
        assert_eq!(mock.query_stream(shared, D).unwrap(), Completion::Complete);
        mock.destroy_stream(shared, D).unwrap();
        assert_eq!(mock.live_streams(), 0);
    });
}

/// A "GPU" thread completes work (one item, then everything) while a user
/// thread runs a kernel on a pinned block, records an event after it, frees
/// the block in the stream's order and waits for the event: whichever thread
/// completes the kernel, the free-pending block goes back exactly once, and
/// the counts end at zero with no hazard.
#[test]
fn completion_races_a_stream_ordered_free() {
    model_deep(|| {
        let mock = MockBackend::new(1);
        let s = mock.create_stream(D, Default::default()).unwrap();
        let e = mock.create_event(D, EventFlags::DISABLE_TIMING).unwrap();
        let p = Block(mock.allocate(MemoryKind::Pinned, D, SIZE, SIZE).unwrap());
        let user = spawn_scoped(|| {
            let p = p.get();
            mock.use_memory(s, p.as_ptr(), SIZE).unwrap();
            mock.record_event(e, s, D).unwrap();
            // SAFETY: only the kernel on `s` uses `p`; the free is after it.
            unsafe { mock.deallocate_async(MemoryKind::Pinned, D, p, SIZE, SIZE, s) }.unwrap();
            mock.synchronize_event(e, D).unwrap();
            assert_eq!(mock.query_event(e, D).unwrap(), Completion::Complete);
        });
        let gpu = spawn_scoped(|| {
            let one = mock.complete_one(s).unwrap();
            mock.complete_everything();
            one
        });
        let pending_then = mock.pending_free_bytes(MemoryKind::Pinned);
        assert!(pending_then == 0 || pending_then == SIZE);
        user.join();
        gpu.join();
        assert_eq!(mock.live_blocks(), 0);
        assert_eq!(mock.live_bytes(MemoryKind::Pinned), 0);
        assert_eq!(mock.pending_free_bytes(MemoryKind::Pinned), 0);
        assert_eq!(mock.pending_work(s).unwrap(), 0);
        assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
        assert!(mock.misuses().is_empty(), "{:?}", mock.misuses());
        mock.destroy_event(e, D).unwrap();
        mock.destroy_stream(s, D).unwrap();
        assert_eq!((mock.live_streams(), mock.live_events()), (0, 0));
    });
}

/// Two threads make the read-only calls (`query_stream` twice each,
/// `query_event`, `stream_device`, `current_device`: the read-locked fast path
/// when nothing is armed or pending) on a stream with queued work while a
/// third records an event on it and destroys it; a per-stream fault armed on
/// `query_stream` sends the first such query (whichever thread makes it)
/// through the write lock. Every call is counted exactly once, the fault fires exactly once,
/// each query sees the stream either live (pending work) or destroyed (an
/// error, logged once as a misuse), never anything between.
#[test]
fn queries_race_destroy_and_record() {
    model_deep(|| {
        let mock = MockBackend::new(1);
        let s = mock.create_stream(D, Default::default()).unwrap();
        let e = mock.create_event(D, EventFlags::DISABLE_TIMING).unwrap();
        mock.enqueue_work(s).unwrap();
        mock.fail_stream(CallKind::QueryStream, s);
        let a = spawn_scoped(|| {
            let stream = [mock.query_stream(s, D), mock.query_stream(s, D)];
            let event = mock.query_event(e, D);
            (stream, event)
        });
        let b = spawn_scoped(|| {
            let stream = [mock.query_stream(s, D), mock.query_stream(s, D)];
            let device = mock.stream_device(s);
            assert_eq!(mock.current_device(), Ok(D));
            (stream, device)
        });
        mock.record_event(e, s, D).unwrap();
        mock.destroy_stream(s, D).unwrap();
        let (queries_a, event) = a.join();
        let (queries_b, device) = b.join();

        let gone = Err(MockError::InvalidStream(s));
        let injected = Err(MockError::Injected(CallKind::QueryStream));
        let queries = [queries_a, queries_b].concat();
        let fired = queries.iter().filter(|&q| *q == injected).count();
        assert_eq!(fired, 1, "the armed fault fired once: {queries:?}");
        let mut expected_misuses = 0;
        for query in queries {
            assert!(
                query == Ok(Completion::Pending) || query == gone || query == injected,
                "{query:?}"
            );
            expected_misuses += usize::from(query == gone);
        }
        assert!(device == Ok(D) || device == Err(MockError::InvalidStream(s)));
        expected_misuses += usize::from(device.is_err());
        // Recorded behind the pending work: pending until the stream is
        // destroyed (its work then counts as finished); never recorded:
        // complete.
        assert!(event.is_ok(), "{event:?}");

        let misuses = mock.misuses();
        assert_eq!(misuses.len(), expected_misuses, "{misuses:?}");
        for m in &misuses {
            assert!(
                matches!(m.call, CallKind::QueryStream | CallKind::StreamDevice),
                "{m:?}"
            );
            assert_eq!(m.error, MockError::InvalidStream(s));
        }
        assert_eq!(mock.armed_faults(), 0);
        assert_eq!(mock.calls(CallKind::QueryStream), 4);
        assert_eq!(mock.calls(CallKind::QueryEvent), 1);
        assert_eq!(mock.calls(CallKind::StreamDevice), 1);
        assert_eq!(mock.calls(CallKind::CurrentDevice), 1);
        assert_eq!(mock.calls(CallKind::RecordEvent), 1);
        assert_eq!(mock.calls(CallKind::DestroyStream), 1);
        assert_eq!(mock.total_calls(), 2 + 9);
        assert_eq!(mock.query_event(e, D), Ok(Completion::Complete));
        mock.destroy_event(e, D).unwrap();
        assert_eq!((mock.live_streams(), mock.live_events()), (0, 0));
        assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    });
}
