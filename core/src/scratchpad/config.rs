//! [`ScratchpadConfig`]: how a scratchpad is set up besides its device order.

use crate::backend::DeviceId;
#[cfg(doc)]
use crate::backend::MemoryKind;
use crate::order::AccessOrder;

/// How a [`Scratchpad`](super::Scratchpad) is set up besides its device order. The orders it
/// names borrow their streams for `'s`, like the device order.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct ScratchpadConfig<'s> {
    /// The order pinned blocks are released in; `None`: the device order.
    pub pinned_release: Option<AccessOrder<'s>>,
    /// The order managed blocks are released in; `None`: the device order.
    pub managed_release: Option<AccessOrder<'s>>,
    /// The first block size per kind, indexed by [`MemoryKind::index`]; 0 means
    /// 64 KiB.
    pub initial_sizes: [usize; 4],
    /// The device memory is allocated for; `None`: the device of the first
    /// stream order among the device order and the release orders, or, when
    /// all are host order, the current device (resolved on first use). Every
    /// stream order must be on this device: each block is allocated and freed
    /// under one device.
    pub device: Option<DeviceId>,
}
