//! Lock-free stacks: [`Stack`], a Treiber stack with single-item pop protected by
//! crossbeam-epoch, and [`Bag`], a push-and-take-all stack that needs no epoch.
//!
//! Both link the same heap [`Node`]s, so a node can move from a [`Bag`] into a
//! [`Stack`] without reallocating.
//!
//! # The ABA argument
//!
//! A Treiber pop reads `head`, reads `head.next`, then swings `head` from the
//! node to `next` with a CAS. The CAS is wrong if, between the read of `next`
//! and the CAS, the node was popped, something else changed, and the same node
//! came back to the top (A-B-A): the CAS then installs a stale `next`.
//!
//! | popper P                        | others                                   |
//! |---------------------------------|------------------------------------------|
//! | reads head = A, next = B        |                                          |
//! |                                 | pop A; pop B (B leased out); push A      |
//! | CAS(head: A -> B) succeeds      |                                          |
//! | B is in the stack *and* leased  |                                          |
//!
//! `Stack` rules this out with two facts that hold together:
//! 1. A node enters a `Stack` at most once in its life: [`Stack::pop`] and
//!    [`Stack::drain`] hand the node to [`Guard::defer_destroy`] and never
//!    re-link it, and nodes pushed into a `Stack` are either new or come from a
//!    [`Bag`], whose nodes no `Stack` popper can reference.
//! 2. A node's memory is freed only after every thread that was pinned when it
//!    left the stack has unpinned (crossbeam-epoch), so P's pointer A cannot be
//!    recycled into a new node either.
//!
//! So once A leaves the stack, `head` never holds A again while P is pinned, and
//! P's CAS fails.
//!
//! `Bag` has no single-item pop: it is only ever pushed to (a CAS that reads no
//! other node) and emptied whole (one `swap`). Nobody dereferences a node that
//! is in a `Bag` except through an emptied chain it owns exclusively, so there is
//! no stale reader and no ABA, and its nodes may be re-linked at once.

use alloc::boxed::Box;
use core::mem::ManuallyDrop;
use core::ptr;

use crate::sync::epoch::{Guard, Shared};
use crate::sync::{AtomicPtr, Ordering, UnsafeCell};

/// One stack entry. Allocated with `Box`, so that
/// [`Guard::defer_destroy`] (which frees through `Owned`, a `Box`) can free it.
pub(crate) struct Node<T> {
    /// The item. Written when the node is made, read out exactly once by
    /// whoever unlinks the node; the node's drop never drops it. A loom cell, so
    /// the models check that every read happens after the write.
    value: UnsafeCell<ManuallyDrop<T>>,
    /// The node below this one. Written only while the node is private (before
    /// a push publishes it, or while it sits in a chain taken from a `Bag`); read
    /// by `Stack` poppers, which is why it is atomic.
    next: AtomicPtr<Node<T>>,
}

impl<T> Node<T> {
    fn alloc(value: T) -> *mut Node<T> {
        Box::into_raw(Box::new(Node {
            value: UnsafeCell::new(ManuallyDrop::new(value)),
            next: AtomicPtr::new(ptr::null_mut()),
        }))
    }
}

/// The top of a stack of [`Node`]s, shared by [`Stack`] and [`Bag`]: null,
/// or the first node of a chain the stack owns. Every write to it is a
/// read-modify-write (CAS or swap), so each push's `Release` heads a release
/// sequence that every later `Acquire` load of it synchronises with.
struct Head<T>(AtomicPtr<Node<T>>);

// SAFETY: the stack owns the `T`s it holds and hands each out to exactly one
// thread (the one whose CAS or swap unlinked it), so it is `Send`/`Sync` when `T`
// can be sent between threads. `&Head` only moves `T`s in and out, it never
// shares a `&T`.
unsafe impl<T: Send> Send for Head<T> {}
// SAFETY: see above.
unsafe impl<T: Send> Sync for Head<T> {}

impl<T> Head<T> {
    fn new() -> Self {
        Head(AtomicPtr::new(ptr::null_mut()))
    }

    /// Links the chain `first..=last` on top.
    ///
    /// # Safety
    /// `first..=last` is a chain of live `Box`-allocated nodes (linked by
    /// `next`) that no other thread can reach; a `Stack`'s caller also keeps
    /// fact 1 of the module's ABA argument.
    #[inline]
    unsafe fn link(&self, first: *mut Node<T>, last: *mut Node<T>) {
        // Relaxed: the value we read is only stored into `last.next`; no node is
        // dereferenced on its strength.
        let mut head = self.0.load(Ordering::Relaxed);
        loop {
            // SAFETY: the chain is private until the CAS below publishes it.
            // Relaxed: published by the CAS's Release.
            unsafe { (*last).next.store(head, Ordering::Relaxed) };
            // Release on success: publishes the chain's values and links to the
            // thread whose Acquire load (a popper) or swap (a taker) sees
            // `first`. A push reads no other node, so it has no ABA hazard: if
            // `head` is `head` again, `last.next` is right whatever happened in
            // between. Relaxed on failure: we only retry with the new head.
            match self
                .0
                .compare_exchange_weak(head, first, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    /// Takes the whole chain at once.
    fn take(&self) -> Chain<T> {
        // Acquire: synchronises with every push's Release (all writes are RMWs),
        // so the chain's values and links are visible. One swap: no other thread
        // can take any node of this chain.
        Chain {
            first: self.0.swap(ptr::null_mut(), Ordering::Acquire),
        }
    }
}

impl<T> Drop for Head<T> {
    fn drop(&mut self) {
        // `&mut self`: no other thread can be inside a method, so the nodes can be
        // freed at once, with their items (nodes a `Stack` retired earlier are
        // the epoch's; these never were).
        drop(self.take());
    }
}

/// A Treiber stack: push, pop, drain; LIFO.
pub(crate) struct Stack<T> {
    head: Head<T>,
}

impl<T> Stack<T> {
    /// An empty stack.
    pub(crate) fn new() -> Self {
        Stack { head: Head::new() }
    }

    /// Pushes `value` in a new node.
    pub(crate) fn push(&self, value: T) {
        let node = Node::alloc(value);
        // SAFETY: `node` was just allocated and is private to this call.
        unsafe { self.push_node(node) };
    }

    /// Links a private node on top.
    ///
    /// # Safety
    /// `node` is a live `Box`-allocated node that no other thread can reach, and
    /// it has never been linked into any `Stack` (fact 1 of the module's ABA
    /// argument): it is new, or it comes from a [`Chain`].
    unsafe fn push_node(&self, node: *mut Node<T>) {
        // SAFETY: the caller's guarantees; a one-node chain.
        unsafe { self.head.link(node, node) };
    }

    /// Pops the top item, if any.
    ///
    /// `guard` must be pinned in the collector every other user of this stack
    /// pins (the pools check this); it keeps the node we read alive until we are
    /// done with it.
    pub(crate) fn pop(&self, guard: &Guard) -> Option<T> {
        // Acquire: synchronises with the Release of the push that published the
        // node (through the release sequence: every later write is an RMW), so
        // its `value` and `next` are visible.
        let mut head = self.head.0.load(Ordering::Acquire);
        loop {
            if head.is_null() {
                return None;
            }
            // SAFETY: `head` was read from the stack while `guard` is pinned; a
            // node is freed only through `defer_destroy`, after every guard pinned
            // before its removal is gone, so it is still allocated.
            // Relaxed: `next` was published with the node, which the Acquire
            // load of `head` synchronised with.
            let next = unsafe { (*head).next.load(Ordering::Relaxed) };
            // The CAS succeeds only if `head` is still the top. By the module's
            // ABA argument the top cannot have left and come back while we are
            // pinned, so `next` is still its successor. Acquire on both outcomes:
            // on failure we dereference the new head in the next round.
            match self.head.0.compare_exchange_weak(
                head,
                next,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    // SAFETY: the successful CAS unlinked `head`, so this thread is
                    // the only one that reads its value (stale poppers only read
                    // `next`, and their CAS will fail). The node is then retired
                    // through the epoch: stale poppers may still read its `next`.
                    unsafe {
                        let value = (*head).value.with(|v| ptr::read(&**v));
                        guard.defer_destroy(Shared::from(head as *const Node<T>));
                        return Some(value);
                    }
                }
                Err(actual) => head = actual,
            }
        }
    }

    /// Takes every item at once, top first, retiring the nodes through `guard`.
    pub(crate) fn drain(&self, guard: &Guard) -> alloc::vec::Vec<T> {
        // Acquire: as in `pop`, to see the values of every node we took. The swap
        // is one atomic step, so no other thread can take any of these items.
        let mut node = self.head.0.swap(ptr::null_mut(), Ordering::Acquire);
        let mut out = alloc::vec::Vec::new();
        while !node.is_null() {
            // SAFETY: the swap made this chain ours; nodes are alive (retired only
            // below, through the epoch) and their values are read once, here.
            // Stale poppers may still read `next`, so the nodes are retired
            // through `defer_destroy`, never freed or re-linked directly.
            unsafe {
                // Relaxed: the Acquire swap synchronised with every push.
                let next = (*node).next.load(Ordering::Relaxed);
                out.push((*node).value.with(|v| ptr::read(&**v)));
                guard.defer_destroy(Shared::from(node as *const Node<T>));
                node = next;
            }
        }
        out
    }

    /// Moves the first node of `chain` on top of this stack, without reallocating.
    pub(crate) fn push_from(&self, chain: &mut Chain<T>) -> bool {
        match chain.unlink_first() {
            Some(node) => {
                // SAFETY: `node` came from a `Bag` chain, so no `Stack` popper can
                // hold a reference to it, and the chain gave up ownership of it.
                unsafe { self.push_node(node) };
                true
            }
            None => false,
        }
    }
}

/// A push-and-take-all stack. Its nodes are never reachable by a `Stack` popper,
/// so they need no epoch protection.
pub(crate) struct Bag<T> {
    head: Head<T>,
}

impl<T> Bag<T> {
    /// An empty bag.
    pub(crate) fn new() -> Self {
        Bag { head: Head::new() }
    }

    /// Whether the bag looked empty at the moment of the load.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        // Relaxed: a hint only.
        self.head.0.load(Ordering::Relaxed).is_null()
    }

    /// Pushes `value` in a new node.
    pub(crate) fn push(&self, value: T) {
        let node = Node::alloc(value);
        // SAFETY: `node` was just allocated and is private to this call.
        unsafe { self.head.link(node, node) };
    }

    /// Takes every item at once, as a chain in top-first order. No other
    /// thread reads the chain's nodes.
    pub(crate) fn take_all(&self) -> Chain<T> {
        self.head.take()
    }

    /// Puts every node of `chain` back on top, in the chain's order.
    pub(crate) fn put_back(&self, chain: Chain<T>) {
        let first = chain.first;
        core::mem::forget(chain);
        if first.is_null() {
            return;
        }
        let mut last = first;
        // SAFETY: the chain is ours until the link publishes it.
        unsafe {
            loop {
                // Relaxed: a private chain; no other thread touches it.
                let next = (*last).next.load(Ordering::Relaxed);
                if next.is_null() {
                    break;
                }
                last = next;
            }
        }
        // SAFETY: `first..=last` is the whole chain, which was ours alone
        // (invariant of `Chain`) and which `forget` gave up.
        unsafe { self.head.link(first, last) };
    }
}

/// A chain of nodes taken from a [`Bag`], owned by one thread.
pub(crate) struct Chain<T> {
    /// The first node, or null. Invariant: every node reachable from `first` is
    /// owned by this chain alone.
    first: *mut Node<T>,
}

// SAFETY: the chain owns its nodes exclusively; sending it sends the `T`s.
unsafe impl<T: Send> Send for Chain<T> {}

impl<T> Chain<T> {
    /// An empty chain.
    pub(crate) fn empty() -> Self {
        Chain {
            first: ptr::null_mut(),
        }
    }

    /// Reverses the chain in place (top-first becomes oldest-first).
    pub(crate) fn reverse(&mut self) {
        let mut prev: *mut Node<T> = ptr::null_mut();
        let mut node = self.first;
        while !node.is_null() {
            // SAFETY: nodes of the chain are ours (invariant on `first`).
            // Relaxed: a private chain; no other thread touches it.
            unsafe {
                let next = (*node).next.load(Ordering::Relaxed);
                (*node).next.store(prev, Ordering::Relaxed);
                prev = node;
                node = next;
            }
        }
        self.first = prev;
    }

    /// A reference to the first item.
    pub(crate) fn first(&self) -> Option<&T> {
        // SAFETY: the node is ours and alive while `self` is borrowed.
        unsafe { self.first.as_ref().map(|n| n.value.with(|v| &**v)) }
    }

    /// Removes the first node and returns its item.
    pub(crate) fn pop_first(&mut self) -> Option<T> {
        self.unlink_first().map(|node| {
            // SAFETY: the node is ours alone (never published since `take_all`);
            // its value is read once and the box freed once.
            let boxed = unsafe { Box::from_raw(node) };
            // SAFETY: the value is read once, from the node we own.
            boxed.value.with(|v| unsafe { ptr::read(&**v) })
        })
    }

    /// Detaches the first node, keeping it allocated, and hands it over.
    fn unlink_first(&mut self) -> Option<*mut Node<T>> {
        let node = self.first;
        if node.is_null() {
            return None;
        }
        // SAFETY: the node is ours (invariant on `first`).
        // Relaxed: a private chain; no other thread touches it.
        self.first = unsafe { (*node).next.load(Ordering::Relaxed) };
        Some(node)
    }

    /// Moves the first node of `self` to the front of `other`.
    pub(crate) fn move_first_to(&mut self, other: &mut Chain<T>) -> bool {
        match self.unlink_first() {
            Some(node) => {
                // SAFETY: the node is ours; it becomes `other`'s first node.
                // Relaxed: both chains are private to this thread.
                unsafe { (*node).next.store(other.first, Ordering::Relaxed) };
                other.first = node;
                true
            }
            None => false,
        }
    }
}

impl<T> Drop for Chain<T> {
    fn drop(&mut self) {
        // Frees the nodes and drops the items still in them.
        while self.pop_first().is_some() {}
    }
}

#[cfg(all(test, feature = "std", not(loom)))]
mod tests {
    use super::*;
    use crossbeam_epoch as epoch;
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::vec::Vec;

    #[test]
    fn stack_is_lifo_and_drains_top_first() {
        let s = Stack::new();
        let g = epoch::pin();
        assert_eq!(s.pop(&g), None);
        for i in 0..5 {
            s.push(i);
        }
        assert_eq!(s.pop(&g), Some(4));
        assert_eq!(s.drain(&g), [3, 2, 1, 0]);
        assert_eq!(s.pop(&g), None);
    }

    #[test]
    fn bag_takes_all_and_puts_back_in_order() {
        let b = Bag::new();
        for i in 0..4 {
            b.push(i);
        }
        let mut c = b.take_all();
        assert_eq!(c.first(), Some(&3));
        c.reverse();
        assert_eq!(c.pop_first(), Some(0));
        let mut other = Chain::empty();
        assert!(c.move_first_to(&mut other));
        assert_eq!(other.first(), Some(&1));
        b.put_back(c); // 2, 3
        b.push(9);
        let mut all = b.take_all();
        let mut seen = Vec::new();
        while let Some(v) = all.pop_first() {
            seen.push(v);
        }
        assert_eq!(seen, [9, 2, 3]);
        drop(other); // frees its node and item
    }

    #[test]
    fn chain_node_moves_into_stack_without_loss() {
        let b = Bag::new();
        b.push(7);
        b.push(8);
        let s = Stack::new();
        let mut c = b.take_all();
        assert!(s.push_from(&mut c));
        assert!(s.push_from(&mut c));
        assert!(!s.push_from(&mut c));
        let g = epoch::pin();
        assert_eq!(s.drain(&g), [7, 8]);
    }

    #[test]
    fn drop_frees_items_left_inside() {
        let item = Arc::new(());
        {
            let s = Stack::new();
            let b = Bag::new();
            s.push(item.clone());
            b.push(item.clone());
            assert_eq!(Arc::strong_count(&item), 3);
        }
        assert_eq!(Arc::strong_count(&item), 1);
    }

    #[test]
    fn concurrent_push_pop_loses_and_duplicates_nothing() {
        const THREADS: usize = 4;
        const PER: usize = if cfg!(miri) { 50 } else { 5_000 };
        let s = Arc::new(Stack::new());
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    for i in 0..PER {
                        s.push(t * PER + i);
                        if i % 2 == 0 {
                            if let Some(v) = s.pop(&epoch::pin()) {
                                got.push(v);
                            }
                        }
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<usize> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.extend(s.drain(&epoch::pin()));
        let set: HashSet<_> = all.iter().copied().collect();
        assert_eq!(all.len(), THREADS * PER, "an item was lost or duplicated");
        assert_eq!(set.len(), THREADS * PER);
    }
}
