//! The device cache's bookkeeping: blocks by stream id and size, within a
//! bound on their count and bytes. No driver calls.

/// One cached block.
#[derive(Debug)]
struct Entry<B> {
    stream: u64,
    size: usize,
    block: B,
}

/// What [`Shelf::put`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Put<B> {
    /// The block offered, if it was not kept (past the bound): the caller
    /// frees it.
    pub(crate) refused: Option<B>,
    /// Older blocks of the same stream taken out to make room, oldest first:
    /// the caller frees them, in the order of that stream.
    pub(crate) evicted: Vec<B>,
}

/// Blocks by stream id and size, oldest first, within a bound on their count
/// and bytes.
#[derive(Debug)]
pub(crate) struct Shelf<B> {
    entries: Vec<Entry<B>>,
    bytes: usize,
    max_blocks: usize,
    max_bytes: usize,
}

impl<B> Shelf<B> {
    pub(crate) const fn new(max_blocks: usize, max_bytes: usize) -> Self {
        Shelf {
            entries: Vec::new(),
            bytes: 0,
            max_blocks,
            max_bytes,
        }
    }

    /// Changes the byte bound (kept blocks stay, even past it; the next
    /// [`put`](Self::put) makes room).
    pub(crate) fn set_max_bytes(&mut self, max_bytes: usize) {
        self.max_bytes = max_bytes;
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The most recently kept block of `stream` with exactly `size` bytes.
    pub(crate) fn take(&mut self, stream: u64, size: usize) -> Option<B> {
        let i = self
            .entries
            .iter()
            .rposition(|e| e.stream == stream && e.size == size)?;
        // The newest block is the one usually found: popped, nothing moves.
        let e = if i + 1 == self.entries.len() {
            self.entries.pop()?
        } else {
            self.entries.remove(i)
        };
        self.bytes -= e.size;
        Some(e.block)
    }

    /// Keeps `block` (`size` bytes, freed on `stream`), taking out the oldest
    /// blocks of the same stream if that is what it takes to stay within the
    /// bound; refuses it if even that would not do.
    pub(crate) fn put(&mut self, stream: u64, size: usize, block: B) -> Put<B> {
        let refuse = |block| Put {
            refused: Some(block),
            evicted: Vec::new(),
        };
        if self.max_blocks == 0 || size > self.max_bytes {
            return refuse(block);
        }
        // How many of the oldest same-stream blocks must go.
        let mut count = self.entries.len();
        let mut bytes = self.bytes;
        let mut victims = 0;
        let fits =
            |count: usize, bytes: usize| count < self.max_blocks && bytes + size <= self.max_bytes;
        if !fits(count, bytes) {
            for e in self.entries.iter().filter(|e| e.stream == stream) {
                count -= 1;
                bytes -= e.size;
                victims += 1;
                if fits(count, bytes) {
                    break;
                }
            }
            if !fits(count, bytes) {
                return refuse(block);
            }
        }
        let mut evicted = Vec::with_capacity(victims);
        while victims > 0 {
            // The oldest block of `stream`: one exists (counted above).
            let Some(i) = self.entries.iter().position(|e| e.stream == stream) else {
                break;
            };
            let e = self.entries.remove(i);
            self.bytes -= e.size;
            evicted.push(e.block);
            victims -= 1;
        }
        self.entries.push(Entry {
            stream,
            size,
            block,
        });
        self.bytes += size;
        Put {
            refused: None,
            evicted,
        }
    }

    /// Takes out every block of `stream`, oldest first, with its size.
    pub(crate) fn drain_stream(&mut self, stream: u64) -> Vec<(usize, B)> {
        let mut out = Vec::new();
        let mut kept = Vec::with_capacity(self.entries.len());
        for e in self.entries.drain(..) {
            if e.stream == stream {
                self.bytes -= e.size;
                out.push((e.size, e.block));
            } else {
                kept.push(e);
            }
        }
        self.entries = kept;
        out
    }

    /// Takes out every block, oldest first, with its stream id and size.
    pub(crate) fn drain(&mut self) -> Vec<(u64, usize, B)> {
        self.bytes = 0;
        self.entries
            .drain(..)
            .map(|e| (e.stream, e.size, e.block))
            .collect()
    }

    /// Keeps `block` whatever the bound: a block that could not be given
    /// back stays cached (the bound is exceeded until it goes).
    pub(crate) fn force(&mut self, stream: u64, size: usize, block: B) {
        self.entries.push(Entry {
            stream,
            size,
            block,
        });
        self.bytes += size;
    }
}
