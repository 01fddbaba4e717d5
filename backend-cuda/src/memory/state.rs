//! The memory state of each device ([`DeviceMemory`]): gpupool's memory pool
//! and private stream, the counters, the pinned and managed block pools, the
//! device cache and the over-alignment table; and the process-wide table of
//! them, made on the first memory call. The parent module's calls and its
//! other children work on this state.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicUsize;
use std::sync::{Mutex, OnceLock};

use gpupool_core::{DeviceId, MemoryKind, StreamHandle};

use crate::block_pool::{BlockPool, KindCounters, PoolKind, ThreadBlocks};
use crate::device_cache::DeviceCache;
use crate::driver::{driver, Driver};
use crate::error::CudaError;
use crate::shards::Shards;

/// The memory state of one device.
#[derive(Debug)]
pub(super) struct DeviceMemory {
    /// The device's index.
    index: usize,
    /// gpupool's own memory pool on this device (`CUmemoryPool` as an
    /// address), its threshold raised; set once, never destroyed.
    pub(super) mempool: OnceLock<usize>,
    /// The private stream for host-order device memory calls: created by
    /// this backend on the device, never destroyed.
    pub(super) sync_stream: OnceLock<StreamHandle>,
    pub(super) host: KindCounters,
    pub(super) device: KindCounters,
    pub(super) pinned: BlockPool,
    pub(super) managed: BlockPool,
    /// Each thread's pinned blocks, in front of `pinned`.
    pub(super) pinned_threads: Shards<ThreadBlocks>,
    /// Each thread's managed blocks, in front of `managed`.
    pub(super) managed_threads: Shards<ThreadBlocks>,
    /// Device blocks freed in stream order, kept for the same stream.
    pub(super) cache: DeviceCache,
    /// Over-aligned blocks: handed-out address to the address allocated.
    pub(super) overaligned: Mutex<HashMap<usize, usize>>,
    /// `overaligned.len()`, readable without the lock (written under it).
    pub(super) overaligned_len: AtomicUsize,
    /// What graph captures did with this device's memory (`capture.rs`).
    pub(super) graphs: GraphMemory,
}

/// Memory that graph captures own or use, per device: the device blocks
/// allocated on a capturing stream (the graph's allocation nodes, which a
/// free inside a capture must name), and the blocks freed in the order of a
/// capturing stream that a replay of the graph may still use (never handed
/// out again while a graph can use them; see `capture.rs`).
#[derive(Debug, Default)]
pub(super) struct GraphMemory {
    /// Device blocks allocated on a capturing stream and not freed yet:
    /// start address to size and capture.
    pub(super) allocations: Mutex<BTreeMap<usize, GraphAllocation>>,
    /// `allocations.len()`, readable without the lock (written under it).
    pub(super) allocations_len: AtomicUsize,
    /// Blocks kept for graphs.
    pub(super) kept: Mutex<KeptForGraphs>,
}

/// The blocks kept for graphs, per device.
#[derive(Debug, Default)]
pub(super) struct KeptForGraphs {
    /// Blocks and bytes of each kind kept and not given back yet (every
    /// block below, and those the graphs still hold).
    pub(super) blocks: [usize; 4],
    pub(super) bytes: [usize; 4],
    /// Blocks no graph holds a reference for (the capture's graph could not
    /// be told, or the block was freed outside a capture): kept for the life
    /// of the process. (kind, address, bytes).
    pub(super) forever: Vec<(MemoryKind, usize, usize)>,
    /// Blocks whose graphs are gone (every graph and executable graph that
    /// held them destroyed and their launches done): to be given back by
    /// `trim_memory`.
    pub(super) released: Vec<GraphHeld>,
}

/// The memory state of every device, by ordinal; created on the first memory
/// call and never dropped (the driver frees what is left at exit).
static MEMORY: OnceLock<Box<[DeviceMemory]>> = OnceLock::new();

/// The driver, and `device`'s memory state (made now for every device if no
/// memory call has made it yet).
pub(super) fn state(
    device: DeviceId,
) -> Result<(&'static Driver, &'static DeviceMemory), CudaError> {
    let drv = driver()?;
    let table = MEMORY.get_or_init(|| (0..drv.count() as usize).map(DeviceMemory::new).collect());
    let mem = table
        .get(device.index())
        .ok_or(CudaError::DeviceOutOfRange {
            device,
            count: drv.count(),
        })?;
    Ok((drv, mem))
}

/// `device`'s memory state if a memory call has made it; `None` before
/// (and for a device out of range).
pub(super) fn existing(device: DeviceId) -> Option<&'static DeviceMemory> {
    MEMORY.get().and_then(|t| t.get(device.index()))
}

impl DeviceMemory {
    fn new(index: usize) -> Self {
        DeviceMemory {
            index,
            mempool: OnceLock::new(),
            sync_stream: OnceLock::new(),
            host: KindCounters::default(),
            device: KindCounters::default(),
            pinned: BlockPool::new(PoolKind::Pinned),
            managed: BlockPool::new(PoolKind::Managed),
            pinned_threads: Shards::new(),
            managed_threads: Shards::new(),
            cache: DeviceCache::new(index),
            overaligned: Mutex::new(HashMap::new()),
            overaligned_len: AtomicUsize::new(0),
            graphs: GraphMemory::default(),
        }
    }

    /// The pool of a host-visible kind, its threads' blocks, and their index
    /// in a thread's table of them; `None` for host and device memory.
    pub(super) fn host_visible(
        &self,
        kind: MemoryKind,
    ) -> Option<(&BlockPool, &Shards<ThreadBlocks>, usize)> {
        match kind {
            MemoryKind::Pinned => Some((&self.pinned, &self.pinned_threads, 2 * self.index)),
            MemoryKind::Managed => Some((&self.managed, &self.managed_threads, 2 * self.index + 1)),
            MemoryKind::Host | MemoryKind::Device => None,
        }
    }

    /// The counters of `kind`.
    pub(super) fn counters(&self, kind: MemoryKind) -> &KindCounters {
        match kind {
            MemoryKind::Host => &self.host,
            MemoryKind::Pinned => &self.pinned.counters,
            MemoryKind::Device => &self.device,
            MemoryKind::Managed => &self.managed.counters,
        }
    }
}

/// A device block allocated on a capturing stream: an allocation node of
/// the graph being captured.
#[derive(Copy, Clone, Debug)]
pub(super) struct GraphAllocation {
    pub(super) size: usize,
    /// The capture's id (0 where the driver cannot tell).
    pub(super) capture: u64,
}

/// How a block kept for a graph is given back once the graph is gone.
#[derive(Copy, Clone, Debug)]
pub(super) enum GiveBack {
    /// As `MemoryBackend::deallocate` would (the address, size and alignment
    /// the block was handed out with).
    Block { align: usize },
    /// As a device block the driver allocated (the device cache's level).
    DeviceBlock,
}

/// A block a graph holds (through a CUDA user object), to be given back
/// when the graph is gone.
#[derive(Debug)]
pub(super) struct GraphHeld {
    pub(super) mem: &'static DeviceMemory,
    pub(super) device: DeviceId,
    pub(super) kind: MemoryKind,
    pub(super) addr: usize,
    pub(super) size: usize,
    pub(super) how: GiveBack,
}
