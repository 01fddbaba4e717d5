//! Unit tests of the device cache: the [`Shelf`] bookkeeping, and the
//! special streams refused before any driver call.

use super::*;

/// A shelf with these bounds, holding `blocks` (stream, size, block), put in
/// this order and none refused.
fn shelf(max_blocks: usize, max_bytes: usize, blocks: &[(u64, usize, u32)]) -> Shelf<u32> {
    let mut s = Shelf::new(max_blocks, max_bytes);
    for &(stream, size, block) in blocks {
        kept(s.put(stream, size, block));
    }
    s
}

fn kept(p: Put<u32>) -> Vec<u32> {
    assert_eq!(p.refused, None);
    p.evicted
}

/// The special streams: the driver's current context's default streams.
const SPECIAL: [StreamHandle; 3] = [
    StreamHandle::NULL,
    StreamHandle::LEGACY,
    StreamHandle::PER_THREAD,
];

#[test]
fn hits_only_on_the_same_stream_and_size() {
    let mut s = shelf(8, 1 << 20, &[]);
    assert!(kept(s.put(1, 4096, 10)).is_empty());
    assert_eq!(s.take(2, 4096), None, "another stream");
    assert_eq!(s.take(1, 4097), None, "another size");
    assert_eq!(s.take(1, 2048), None, "a smaller size");
    assert_eq!(s.take(1, 4096), Some(10));
    assert_eq!(s.take(1, 4096), None, "taken once");
    assert_eq!((s.len(), s.bytes()), (0, 0));
}

#[test]
fn most_recently_freed_first() {
    let mut s = shelf(
        8,
        1 << 20,
        &[(7, 256, 1), (7, 256, 2), (7, 256, 3), (8, 256, 4)],
    );
    assert_eq!(s.take(7, 256), Some(3));
    assert_eq!(s.take(7, 256), Some(2));
    assert_eq!(s.take(7, 256), Some(1));
    assert_eq!(s.take(7, 256), None);
    assert_eq!(s.take(8, 256), Some(4));
}

#[test]
fn the_block_bound_evicts_the_oldest_of_the_same_stream() {
    let mut s = shelf(3, 1 << 20, &[(1, 100, 10), (2, 100, 20), (1, 200, 11)]);
    // Full: stream 1's oldest goes.
    assert_eq!(kept(s.put(1, 300, 12)), vec![10]);
    assert_eq!((s.len(), s.bytes()), (3, 600));
    // Stream 3 has nothing to evict: refused, nothing else touched.
    let p = s.put(3, 100, 30);
    assert_eq!(p.refused, Some(30));
    assert!(p.evicted.is_empty());
    assert_eq!(s.len(), 3);
    assert_eq!(s.take(2, 100), Some(20));
    assert_eq!(s.take(1, 200), Some(11));
    assert_eq!(s.take(1, 300), Some(12));
    assert_eq!((s.len(), s.bytes()), (0, 0));
}

#[test]
fn the_byte_bound_is_respected() {
    let mut s = shelf(100, 1000, &[]);
    assert_eq!(s.put(1, 1001, 1).refused, Some(1), "larger than the bound");
    kept(s.put(1, 400, 2));
    kept(s.put(2, 400, 3));
    // 800 + 300 > 1000: stream 1's 400 goes.
    assert_eq!(kept(s.put(1, 300, 4)), vec![2]);
    assert_eq!(s.bytes(), 700);
    // 700 + 400 > 1000, and stream 1 holds only 300: refused, nothing
    // evicted.
    let p = s.put(1, 700, 5);
    assert_eq!(p.refused, Some(5));
    assert!(p.evicted.is_empty());
    assert_eq!(s.bytes(), 700);
    // 800 + 700 > 1000: both of stream 2's blocks must go, oldest
    // first; exactly at the bound is within it.
    kept(s.put(2, 100, 6));
    assert_eq!(s.bytes(), 800);
    assert_eq!(kept(s.put(2, 700, 7)), vec![3, 6]);
    assert_eq!((s.len(), s.bytes()), (2, 1000));
    // Only as many as needed: 1000 - 700 + 600 fits after one.
    assert_eq!(kept(s.put(2, 600, 8)), vec![7]);
    assert_eq!((s.len(), s.bytes()), (2, 900));
}

#[test]
fn a_zero_bound_caches_nothing() {
    let mut s = shelf(0, 1 << 20, &[]);
    assert_eq!(s.put(1, 1, 1).refused, Some(1));
    assert_eq!(s.len(), 0);
}

#[test]
fn draining_a_stream_leaves_the_others() {
    let mut s = shelf(8, 1 << 20, &[(1, 100, 10), (2, 200, 20), (1, 300, 11)]);
    assert_eq!(s.drain_stream(1), vec![(100, 10), (300, 11)]);
    assert_eq!((s.len(), s.bytes()), (1, 200));
    assert_eq!(s.drain_stream(1), Vec::<(usize, u32)>::new());
    assert_eq!(s.take(2, 200), Some(20));
}

#[test]
fn draining_returns_everything() {
    let mut s = shelf(8, 1 << 20, &[(1, 100, 10), (2, 200, 20), (1, 100, 11)]);
    assert_eq!(s.drain(), vec![(1, 100, 10), (2, 200, 20), (1, 100, 11)]);
    assert_eq!((s.len(), s.bytes()), (0, 0));
    assert_eq!(s.take(1, 100), None);
}

#[test]
fn special_streams_are_never_cached() {
    for s in SPECIAL {
        assert!(!cacheable(s));
    }
    // SAFETY: only looked at, never passed to a backend or the driver.
    assert!(cacheable(unsafe {
        StreamHandle::from_raw(0x7f00_1234_5000)
    }));
    // And the driver-side entry points refuse them before any driver
    // call (none is loaded here).
    let cache: &'static DeviceCache = Box::leak(Box::new(DeviceCache::new(0)));
    let frees = AtomicU64::new(0);
    for s in SPECIAL {
        // SAFETY: a special stream is usable on every device, and refused
        // before any driver call.
        assert_eq!(unsafe { cache.take(s, 256) }, None);
        // SAFETY: a special stream is refused before the block is looked
        // at; nothing is freed.
        assert!(!unsafe { cache.put(s, 0x1000, 256, &frees) });
        // SAFETY: as for `take`.
        assert_eq!(unsafe { cache.forget(s, &frees) }, Ok(0));
    }
    let c = cache.counts();
    assert_eq!((c.blocks, c.tallies), (0, CacheTallies::default()));
}
