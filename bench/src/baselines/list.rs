//! The intrusive singly linked lists of boxed nodes DALI's pools keep, and
//! DALI's way of taking a node for a `Put`.

use super::lock_yielding;

/// A list node: a raw handle (0 when the node is unused) and the next node.
pub(super) struct Node {
    pub(super) handle: usize,
    next: Option<Box<Node>>,
}

/// An intrusive singly linked LIFO list of boxed nodes, as DALI's pools keep.
#[derive(Default)]
pub(super) struct List {
    head: Option<Box<Node>>,
}

impl List {
    pub(super) fn push(&mut self, mut node: Box<Node>) {
        node.next = self.head.take();
        self.head = Some(node);
    }

    pub(super) fn pop(&mut self) -> Option<Box<Node>> {
        let mut node = self.head.take()?;
        self.head = node.next.take();
        Some(node)
    }

    /// Walks from the head and unlinks the first node whose handle `pred`
    /// accepts; an error from `pred` stops the walk with the list unchanged.
    pub(super) fn unlink_first<E>(
        &mut self,
        mut pred: impl FnMut(usize) -> Result<bool, E>,
    ) -> Result<Option<Box<Node>>, E> {
        let mut cur = &mut self.head;
        loop {
            let hit = match cur.as_deref() {
                None => return Ok(None),
                Some(node) => pred(node.handle)?,
            };
            if hit {
                break;
            }
            cur = &mut cur.as_mut().expect("a node was just seen here").next;
        }
        let mut node = cur.take().expect("a node was just seen here");
        *cur = node.next.take();
        Ok(Some(node))
    }
}

impl Drop for List {
    /// Iteratively, so that a long list cannot overflow the stack.
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

/// Takes a node from `unused` under the lock; when there is none, lets the
/// lock go, allocates one and takes the lock again (DALI's `Put`).
pub(super) fn take_node<'a, L>(
    lock: &'a spin::Mutex<L>,
    mut guard: spin::MutexGuard<'a, L>,
    unused: impl Fn(&mut L) -> &mut List,
) -> (spin::MutexGuard<'a, L>, Box<Node>) {
    if let Some(node) = unused(&mut guard).pop() {
        return (guard, node);
    }
    drop(guard);
    let node = Box::new(Node {
        handle: 0,
        next: None,
    });
    (lock_yielding(lock), node)
}
