//! Unit tests of the shard registry: who holds a shard's contents when
//! (its shard, or the orphans), what [`Shards::each`] visits, the orphans'
//! hint, and [`LocalShards`] in real threads.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Barrier;

use super::*;

/// A shard's contents for the tests: numbers. The shared part counts the
/// absorbs, so a test sees that `retire` passes it.
#[derive(Debug, Default, PartialEq)]
struct Items(Vec<u32>);

impl ShardState for Items {
    type Shared = AtomicUsize;

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn absorb(&mut self, from: &mut Self, absorbs: &AtomicUsize) {
        self.0.append(&mut from.0);
        absorbs.fetch_add(1, Relaxed);
    }
}

/// `shard` holding `items` (appended).
fn fill(shard: &Shard<Items>, items: &[u32]) {
    shard.lock().0.extend_from_slice(items);
}

/// What [`Shards::each`] visits, in its order (the orphans last).
fn visit(shards: &Shards<Items>) -> Vec<Vec<u32>> {
    let mut seen = Vec::new();
    shards.each(|t| seen.push(t.0.clone()));
    seen
}

/// The orphans' numbers, sorted.
fn orphans_of(shards: &Shards<Items>) -> Vec<u32> {
    let mut all = shards.lock_orphans().0.clone();
    all.sort_unstable();
    all
}

/// Shards that live as long as the process, as [`LocalShards`] needs (the
/// tests leak them).
fn leaked() -> &'static Shards<Items> {
    Box::leak(Box::new(Shards::new()))
}

thread_local! {
    /// The test threads' shards, as the crate's callers keep them.
    static LOCAL: LocalShards<Items> = const { LocalShards::new() };
}

#[test]
fn each_visits_every_shard_and_then_the_orphans() {
    let shards = Shards::<Items>::new();
    assert_eq!(visit(&shards), [vec![]], "no shard: the orphans alone");
    let (a, b, c) = (shards.register(), shards.register(), shards.register());
    assert_eq!(shards.threads(), 3);
    fill(&a, &[1]);
    fill(&b, &[2]);
    fill(&c, &[3]);
    shards.retire(&b);
    let seen = visit(&shards);
    assert_eq!(seen.len(), 3, "two shards, then the orphans");
    assert_eq!(seen[2], [2], "the orphans come last");
    let mut live: Vec<_> = seen[..2].iter().flatten().copied().collect();
    live.sort_unstable();
    assert_eq!(live, [1, 3]);
    // `f` works on the contents themselves, the orphans' included.
    shards.each(|t| t.0.push(9));
    assert_eq!((&a.lock().0, &c.lock().0), (&vec![1, 9], &vec![3, 9]));
    assert_eq!(orphans_of(&shards), [2, 9]);
    assert!(b.lock().0.is_empty(), "a retired shard is not visited");
}

#[test]
fn retire_takes_the_shard_out_and_moves_its_contents_to_the_orphans() {
    let shards = Shards::<Items>::new();
    let (a, b) = (shards.register(), shards.register());
    fill(&a, &[1, 2]);
    fill(&b, &[3]);
    shards.retire(&a);
    assert_eq!(shards.threads(), 1);
    assert!(a.lock().0.is_empty(), "nothing stays in the retired shard");
    assert_eq!(orphans_of(&shards), [1, 2]);
    assert_eq!(
        shards.shared().load(Relaxed),
        1,
        "absorbed with the shared part"
    );
    assert_eq!(b.lock().0, [3], "the other shard is untouched");
    shards.retire(&b);
    assert_eq!(shards.threads(), 0);
    assert_eq!(orphans_of(&shards), [1, 2, 3], "added to what was there");
    assert_eq!(visit(&shards), [vec![1, 2, 3]]);
    // A second retire of the same shard finds it gone from the registry and
    // moves only what it holds now.
    fill(&a, &[4]);
    shards.retire(&a);
    assert_eq!(
        (shards.threads(), orphans_of(&shards)),
        (0, vec![1, 2, 3, 4])
    );
}

#[test]
fn the_orphans_hint_follows_their_contents() {
    let shards = Shards::<Items>::new();
    assert!(!shards.may_have_orphans());
    assert!(shards.orphans().is_none());
    shards.retire(&shards.register());
    assert!(
        !shards.may_have_orphans(),
        "an empty shard leaves no orphans"
    );
    let a = shards.register();
    fill(&a, &[7, 8]);
    shards.retire(&a);
    assert!(shards.may_have_orphans());
    // Taking part leaves the hint on; taking the rest turns it off.
    let mut orphans = shards.orphans().expect("the hint is on");
    assert_eq!(orphans.0.pop(), Some(8));
    shards.release_orphans(orphans);
    assert!(shards.may_have_orphans());
    let mut orphans = shards.orphans().expect("one is left");
    orphans.0.clear();
    shards.release_orphans(orphans);
    assert!(!shards.may_have_orphans());
    assert!(shards.orphans().is_none());
    // Put back through `lock_orphans`: on again; emptied by a visit: off.
    let mut orphans = shards.lock_orphans();
    orphans.0.push(5);
    shards.release_orphans(orphans);
    assert!(shards.may_have_orphans());
    shards.each(|t| t.0.clear());
    assert!(!shards.may_have_orphans());
    // Filled by a visit: on.
    shards.each(|t| t.0.push(6));
    assert!(shards.may_have_orphans());
}

#[test]
fn a_thread_registers_on_first_use_and_retires_when_it_exits() {
    let (first, second) = (leaked(), leaked());
    let barrier = Arc::new(Barrier::new(2));
    let thread = std::thread::spawn({
        let barrier = Arc::clone(&barrier);
        // Nothing here asserts: a panic before the barrier would leave the
        // test waiting.
        move || {
            let again = LOCAL.with(|l| {
                l.with(0, first, |t| t.0.push(1));
                let again = l.with(0, first, |t| {
                    let seen = t.0.clone();
                    t.0.push(2);
                    seen
                });
                // Another index: a shard of the other `Shards`.
                l.with(1, second, |t| t.0.push(3));
                again
            });
            barrier.wait();
            barrier.wait();
            again
        }
    });
    barrier.wait();
    assert_eq!((first.threads(), second.threads()), (1, 1));
    assert_eq!(
        visit(first),
        [vec![1, 2], vec![]],
        "the thread's shard, live"
    );
    assert_eq!(visit(second), [vec![3], vec![]]);
    barrier.wait();
    // `join` returns once the thread has ended, its locals destroyed.
    assert_eq!(
        thread.join().unwrap(),
        [1],
        "the same shard the second time"
    );
    assert_eq!((first.threads(), second.threads()), (0, 0));
    assert_eq!(orphans_of(first), [1, 2]);
    assert_eq!(orphans_of(second), [3]);
    assert!(first.may_have_orphans() && second.may_have_orphans());
}

#[test]
fn each_thread_has_its_own_shard() {
    let shards = leaked();
    let barrier = Arc::new(Barrier::new(3));
    let threads: Vec<_> = [10, 20]
        .into_iter()
        .map(|n| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                LOCAL.with(|l| l.with(0, shards, |t| t.0.push(n)));
                barrier.wait();
                barrier.wait();
                LOCAL.with(|l| l.with(0, shards, |t| t.0.clone()))
            })
        })
        .collect();
    barrier.wait();
    assert_eq!(shards.threads(), 2);
    let mut seen = visit(shards);
    assert_eq!(seen.pop(), Some(vec![]), "no orphans while both live");
    seen.sort_unstable();
    assert_eq!(seen, [vec![10], vec![20]]);
    barrier.wait();
    let mine: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(mine, [vec![10], vec![20]], "neither saw the other's");
    assert_eq!(shards.threads(), 0);
    assert_eq!(orphans_of(shards), [10, 20]);
    assert_eq!(shards.shared().load(Relaxed), 2);
}

/// A visit during a thread's exit sees the exiting shard's contents in the
/// shard or in the orphans, never in neither: `retire` keeps the registry
/// locked until they are among the orphans. The exiting thread is held inside
/// `retire` (this thread holds its shard) while another thread visits.
#[test]
fn a_visit_during_an_exit_sees_the_exiting_shards_contents() {
    let shards = Shards::<Items>::new();
    let a = shards.register();
    fill(&a, &[5]);
    std::thread::scope(|s| {
        let held = a.lock();
        let exiting = s.spawn(|| shards.retire(&a));
        // Let the exit reach the shard's lock (without this pause the visit
        // may simply come first, which proves nothing but still passes).
        std::thread::sleep(std::time::Duration::from_millis(50));
        let visiting = s.spawn(|| visit(&shards).into_iter().flatten().collect::<Vec<u32>>());
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(held);
        exiting.join().unwrap();
        let seen = visiting.join().unwrap();
        assert_eq!(seen, [5], "the visit missed the exiting shard's contents");
        assert_eq!(orphans_of(&shards), [5]);
    });
}
