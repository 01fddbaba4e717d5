//! Safe wrappers around the crate's private lock-free stacks, for the loom
//! models and stress tests in other crates of this workspace (the pools, and
//! their per-thread caches, are modelled through their public API). Not part of the
//! public API: names and shapes may change at any time.

use alloc::vec::Vec;

use crate::stack::{Bag, Stack};
use crate::sync::epoch::Collector;

/// A Treiber stack together with the collector its pops pin, so that every pop is
/// protected by the right collector.
pub struct GuardedStack<T> {
    stack: Stack<T>,
    collector: Collector,
}

impl<T> GuardedStack<T> {
    /// An empty stack with its own collector.
    pub fn new() -> Self {
        GuardedStack {
            stack: Stack::new(),
            collector: Collector::new(),
        }
    }

    /// Pushes an item.
    pub fn push(&self, value: T) {
        self.stack.push(value)
    }

    /// Pops the top item, pinning the stack's own collector.
    pub fn pop(&self) -> Option<T> {
        let handle = self.collector.register();
        let guard = handle.pin();
        self.stack.pop(&guard)
    }

    /// Takes every item, top first.
    pub fn drain(&self) -> Vec<T> {
        let handle = self.collector.register();
        let guard = handle.pin();
        self.stack.drain(&guard)
    }

    /// Moves every item of `bag` onto this stack, reusing the bag's nodes.
    pub fn take_from(&self, bag: &PushOnlyBag<T>) -> usize {
        let mut chain = bag.bag.take_all();
        let mut n = 0;
        while self.stack.push_from(&mut chain) {
            n += 1;
        }
        n
    }
}

impl<T> Default for GuardedStack<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A push-and-take-all bag: push, and take everything at once.
pub struct PushOnlyBag<T> {
    bag: Bag<T>,
}

impl<T> PushOnlyBag<T> {
    /// An empty bag.
    pub fn new() -> Self {
        PushOnlyBag { bag: Bag::new() }
    }

    /// Pushes an item.
    pub fn push(&self, value: T) {
        self.bag.push(value)
    }

    /// Takes every item, top first.
    pub fn take_all(&self) -> Vec<T> {
        let mut chain = self.bag.take_all();
        let mut out = Vec::new();
        while let Some(v) = chain.pop_first() {
            out.push(v);
        }
        out
    }
}

impl<T> Default for PushOnlyBag<T> {
    fn default() -> Self {
        Self::new()
    }
}
