//! # gpupool-core
//!
//! Lock-free, `no_std` pools of GPU streams and events, handed out as exclusive
//! RAII leases, over a pluggable [`Backend`].
//!
//! Creating a CUDA stream costs 4–6 µs on one thread and over 100 µs per thread
//! when 16 threads do it at once (the driver serialises it); an event costs
//! 0.25–0.6 µs and ~30 µs under the same contention. A runtime that needs a
//! stream or an event per task should lease one from a pool instead:
//!
//! - [`StreamPool`] / [`StreamLease`]: per-device streams; a lease is exclusive,
//!   borrows its pool and returns the stream when dropped. Streams returned with
//!   work pending wait in a busy list until a query finds them finished.
//! - [`EventPool`] / [`EventLease`] / [`SharedEvent`]: per-device events with the
//!   pool's flags (timing disabled by default).
//! - [`AccessOrder`]: the host or a stream; [`AccessOrder::wait`] orders one after
//!   another with a pooled event.
//!
//! Every per-device list is a lock-free stack (Treiber, with crossbeam-epoch
//! reclamation). Pools are lazy: constructing one calls nothing; the first `get`
//! or `put` asks the backend for the device count. Bad input gets a typed
//! [`Error`] and leaves the pool as it was; `Drop` never panics (an error met
//! there is parked and handed out by `take_error`, or, where no owner is left
//! to park it with, counted by [`lost_errors`] and passed to the
//! [`set_lost_error_hook`] hook). The one panic a drop may raise is the
//! mock's checking mode reporting a hazard it found there, which is what that
//! mode is for.
//!
//! ## Features
//! - `std` (default): `get()`/`purge()` pin crossbeam-epoch's thread-local
//!   default collector; without it, register a handle per worker with the pool's
//!   [`collector`](StreamPool::collector) and call the `*_in` forms with its guard.
//!
//! ## Example
//!
//! ```
//! use gpupool_core::{AccessOrder, EventPool, StreamPool};
//! use gpupool_mock::MockBackend;
//!
//! let gpu = MockBackend::new(1);
//! let streams = StreamPool::new(gpu.clone());
//! let events = EventPool::new(gpu.clone());
//!
//! let producer = streams.get(0)?;
//! let consumer = streams.get(0)?;
//! gpu.enqueue_work(producer.handle()).unwrap();
//! // The consumer's later work waits for the producer's work so far.
//! consumer.order().wait(&producer.order(), &events)?;
//! drop((producer, consumer));
//! assert_eq!(streams.live_leases(), 0);
//! # Ok::<(), gpupool_core::Error<gpupool_mock::MockError>>(())
//! ```

#![no_std]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod backend;
mod capture;
#[cfg(feature = "std")]
mod completion;
#[cfg(feature = "std")]
mod completion_engine;
mod epoch;
mod error;
pub mod event_pool;
#[doc(hidden)]
pub mod internals;
mod lost;
mod monotonic;
mod order;
mod owned;
mod pool;
pub mod scratchpad;
mod stack;
mod stats;
pub mod stream_pool;
mod sync;
mod table;
#[cfg(feature = "std")]
mod thread_cache;
/// Without `std` there are no per-thread caches: the same interface, empty.
#[cfg(not(feature = "std"))]
#[path = "thread_cache/absent.rs"]
mod thread_cache;

pub use backend::{
    Backend, BackendId, CaptureBackend, CaptureMode, CaptureStatus, Completion, DeviceId,
    DeviceSelector, EventBackend, EventFlags, EventHandle, MemoryBackend, MemoryKind,
    StreamBackend, StreamHandle, StreamOptions, MAX_DEVICES,
};
#[cfg(feature = "std")]
pub use completion::Completed;
#[cfg(feature = "std")]
pub use completion_engine::DEFAULT_COMPLETION_SPIN;
pub use error::{BackendOp, Error, Rejected};
pub use event_pool::{EventLease, EventPool, OwnedEvent, SharedEvent};
pub use lost::{lost_errors, set_lost_error_hook, LostErrorHook};
pub use monotonic::{Block, DEFAULT_FIRST_BLOCK};
pub use order::AccessOrder;
pub use scratchpad::{
    DeviceSlice, KernelContext, ScratchBackend, ScratchSizes, ScratchStats, Scratchpad,
    ScratchpadConfig,
};
pub use stats::PoolStats;
pub use stream_pool::{OwnedStream, StreamLease, StreamPool, StreamPoolConfig};

/// The epoch crate the pools use, for `no_std` callers that register their own
/// handles ([`StreamPool::with_collector`], the `*_in` calls).
pub use crossbeam_epoch as epoch_crate;

/// The crate whose traits bound what scratch device memory may be written from
/// (`NoUninit`) and read back as (`AnyBitPattern`), re-exported so that a
/// caller can name them, derive them (with bytemuck's `derive` feature in
/// their own dependency) or cast parts to bytes (`cast_slice`).
pub use bytemuck;
