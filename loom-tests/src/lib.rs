//! loom models of every shared (`Sync`) type in gpupool.
//!
//! The models live in `tests/models.rs` (with `tests/models/mock_backend.rs`,
//! `tests/models/block_pool.rs`, `tests/models/shards.rs`, `tests/models/capture.rs`, `tests/models/thread_exit.rs`,
//! `tests/models/in_place.rs` and their ledger, `tests/models/ledger.rs`) and compile only with `--cfg loom` (which also
//! switches gpupool-core, gpupool-mock and the block pools of gpupool-cuda to
//! loom's primitives) and `--cfg crossbeam_loom` (which makes crossbeam-epoch
//! model its collector).
//! `cargo test -p loom-tests` needs neither flag: its plain tests
//! (`tests/run_models.rs`, one per model) rebuild this crate with both once,
//! under the build's target directory, and each runs its model in release mode
//! with `LOOM_MAX_PREEMPTIONS=2` (3 for the models that are cheap enough, see
//! [`DEEP_PREEMPTIONS`]), failing unless that model ran and passed.
//! `docs/verification.md` describes each model and the deliberate breaks it
//! was checked against.
//!
//! Everything a model shares between its threads goes through loom's types
//! (the test's own bookkeeping included): loom prunes interleavings that
//! differ only in the order of accesses it cannot see, so a `std` mutex in a
//! fake would hide the very races the model is for.
//!
//! ## Every `Sync` type and its models
//!
//! | type (crate) | shared state | model(s) |
//! |---|---|---|
//! | `Stack<T>`: Treiber stack (core, private) | head pointer, nodes retired through crossbeam-epoch | `stack_push_pop_is_exact`, `bag_push_races_take_all` (`push_from`); every pool model (ready lists) |
//! | `Bag<T>`: push / take-all (core, private) | head pointer | `bag_push_races_take_all`; `stream_put_to_busy_races_scan` (busy list); `parked_error_two_drops` (quarantine) |
//! | `DeviceTable<S>`: lazy per-device table (core, private) | one pointer published by CAS | `lazy_device_table_two_threads` |
//! | `ParkedError<E>` (core, private) | error slot (CAS / swap), dropped-error tally | `parked_error_two_drops` |
//! | `Counters` (core, private) | relaxed tallies | checked after the joins in `stream_pool_two_threads_one_device`, `event_pool_two_threads_get_put`, `stream_put_to_busy_races_scan`, and exactly (`pooled`, `live_leases`, `leases`) in every thread-cache model |
//! | `ThreadCache` / `Cell`: per-thread cells, the pools' fast path (core, private) | cell slots (the owner's `take`/`give`/`keep` vs drains' CASes; the owner's `lease`, a plain store and a re-read of the cell's drain word, vs a drain's flag, barrier and CASes, with the barriers as the SeqCst fences they stand for; and the one plain store that ends an in-place lease on any thread), the registry `Mutex`, the `owned` flag (thread exit vs adoption), orphan list and flag, owner-only tallies; the thread-local memo and list of cells, and their destructor (a thread's exit) | all through the pools' public API, so the code that ships: `thread_cache_owner_races_a_drain` (stream pool: `put`, `get` from the cell, return into it, racing a purge), `thread_cache_registration_races_a_drain` (stream pool with `same_thread_reuse`: a first `get` registers the thread's cell racing a purge), `thread_exit::adopter_keeps_the_handles_racing_a_drain` (event pool: a thread exits, the next one's registration adopts its cell and events; tallies continued), `thread_exit::one_adopter_per_orphaned_cell` (two registrations after an exit: one adopts the cell, exact tallies), `thread_exit::adopter_is_not_served_the_orphans` (stream pool with `same_thread_reuse`: the exited thread's pending stream never served), `in_place::owner_lease_races_a_drain` (an owner's in-place lease racing a purge on another thread: both the kept event and a new one served), `in_place::lease_ends_on_another_thread_racing_a_drain`, `in_place::vacate_races_give_and_drain`, `in_place::lease_ends_after_its_owner_exits` (the event pool's in-place leases ended by drop or detach on another thread, racing purges, gets and puts, and the owner's exit); each keeps a ledger of where its handles are (`tests/models/ledger.rs`) |
//! | `StreamPool<B>`, `StreamLease` (core) | the above, per device; the list of streams held for a graph capture | `stream_pool_two_threads_one_device`, `stream_get_races_purge`, `stream_put_to_busy_races_scan`, `lazy_device_table_two_threads`, `parked_error_two_drops`, `capture::side_stream_return_races_a_get_during_a_capture` |
//! | `EventPool<B>`, `EventLease` (core) | the above, per device | `event_pool_two_threads_get_put`, `shared_event_last_two_clones` |
//! | `SharedEvent` (core) | `Arc` count of one lease | `shared_event_last_two_clones` |
//! | `Completed` futures, `Entry` and the completion engine (core, `completion`, `completion_engine`) | an entry's state (an atomic changed under its `Mutex`, with the waker, the error and a dropped future's event), the engine's inboxes (one `Mutex` and a `filled` flag each; one under loom), its `sleeping` and `stop` flags (a fenced store-then-load handshake with the submitters), its list of passed events, the lazily started engine (`AtomicPtr` published under a `Mutex`) | `completion::wake_races_the_gpu`, `completion::drop_races_the_gpu`, `completion::ordered_pair_never_resolves_early` |
//! | `Pinning` (core, private) | a crossbeam-epoch `Collector` | every stack and pool model (crossbeam-epoch's own loom mode) |
//! | `MockBackend` (mock) | one `RwLock` over streams, events, waits, memory and its hazard detector, call counters, armed faults, misuse log; the read-only calls' fast path under the read lock, counted in relaxed atomics | `mock_backend::two_threads_every_call`, `mock_backend::completion_races_a_stream_ordered_free`, `mock_backend::queries_race_destroy_and_record` (two threads query, a third records and destroys: fast and write-locked paths, a per-handle fault, misuses); it is the backend of every pool model too |
//! | `Pool<U>` / `BlockPool`: pinned and managed blocks (cuda, `block_pool`) | one `Mutex` over the free lists, parked blocks and idle fences; relaxed tallies | `block_pool::reuse_waits_for_the_fence`, `block_pool::give_after_races_trim`, `block_pool::failed_record_races_take`, `block_pool::idle_return_races_take` (over a fake upstream; the CUDA pools are the same `Pool` over `PoolKind`) |
//! | `Shards<T>` / `Shard<T>`: per-thread shards of a per-device cache, the registry, the orphans of exited threads and their relaxed `has_orphans` hint (cuda, `shards`); `ThreadBlocks`: each thread's free blocks and pending groups by stream of a block pool (cuda, `block_pool::local`) | the registry `Mutex`, one `Mutex` per shard, the orphans' `Mutex` and the hint (a relaxed `AtomicBool` written under it) | `shards::adoption_from_an_exited_thread` (an exited thread's pending group adopted by another thread's settle, whose one query must cover it; its free block, kept with its last stream's group, taken by a miss), `shards::trim_races_an_owner` (the backend's trim: `drain_local`, the context synchronization, `give_all`, `Pool::trim`, racing an owner's takes and frees), `shards::forget_races_an_owner` (`forget_stream_local` racing an owner and the GPU), `shards::retire_races_an_orphans_reader` (`Shards` alone: a retire racing a reader of the hint and a visit, which then keeps an item among the orphans: the visit finds everything put before it, nothing lost or found twice, the hint exact once the threads are done); over the block pool's fake upstream and its oracle, the threads' shards registered and retired by hand as `LocalShards` does |
//!
//! Not modelled, and why:
//!
//! - That a thread's exit is seen by `join`: loom's `join` returns before the
//!   joined thread's thread-locals are dropped (the operating system's
//!   returns after), so no model asserts, after a `join`, that the joined
//!   thread's cells are orphaned; the exits themselves, their destructors
//!   and the adoptions they allow are modelled (rows above).
//! - Pools on crossbeam-epoch's global collector: each model's pools have a
//!   collector of their own (`tests/models.rs`, `stream_pool`): with the
//!   global one every model thread gets crossbeam's thread-local handle,
//!   whose destructor, like the pools' own, makes atomic accesses, and loom
//!   drops a thread's thread-locals in an order that changes between
//!   executions, which it reports as a model that is not deterministic. The
//!   pools' code is the same for either collector but for `Pinning::pin`.
//! - `lost_errors` / `set_lost_error_hook` (core): two process-wide statics,
//!   plain `core` atomics in every build (a relaxed tally and a pointer
//!   published by an `AcqRel` swap / `Acquire` load); loom does not reset
//!   statics between executions. The pool-id counter of the thread cache is
//!   the same kind (a relaxed `fetch_add` handing out unique ids).
//! - `CudaBackend` (cuda): zero-sized; its shared state is the process-wide
//!   driver table and each device's primary context, `OnceLock`s filled by
//!   driver calls (`cuInit`, `cuDevicePrimaryCtxRetain`), which loom cannot
//!   run.
//! - The CUDA memory state per device (cuda, `memory.rs`): `OnceLock`s over
//!   driver calls (gpupool's own memory pool, the private stream; a racing
//!   loser destroys its pool or stream), relaxed tallies, and the over-alignment
//!   table: a `Mutex<HashMap>` with a length read without the lock
//!   (`Acquire`) on every free. The table's code is interleaved with the
//!   driver calls around it, which loom cannot run; separated from them, it
//!   could be modelled like the block pool.
//! - `testing::Gate` (cuda): its other side is a GPU kernel.
//! - Plain data (`Sync` with nothing mutable behind `&self`): handles,
//!   `DeviceId`, `AccessOrder`, `OwnedStream`, `OwnedEvent`, `PoolStats`,
//!   configurations, errors, `Hazard`, `Misuse`. `Scratchpad` (and the
//!   `MonotonicResource`s inside it) is `Send` but not `Sync`.

/// The models `tests/models.rs` defines (as the test harness names them);
/// the runner checks each one passed.
pub const MODELS: &[&str] = &[
    "stack_push_pop_is_exact",
    "bag_push_races_take_all",
    "stream_pool_two_threads_one_device",
    "stream_get_races_purge",
    "stream_put_to_busy_races_scan",
    "lazy_device_table_two_threads",
    "shared_event_last_two_clones",
    "event_pool_two_threads_get_put",
    "parked_error_two_drops",
    "thread_cache_owner_races_a_drain",
    "thread_cache_registration_races_a_drain",
    "thread_exit::adopter_keeps_the_handles_racing_a_drain",
    "thread_exit::one_adopter_per_orphaned_cell",
    "thread_exit::adopter_is_not_served_the_orphans",
    "in_place::owner_lease_races_a_drain",
    "in_place::lease_ends_on_another_thread_racing_a_drain",
    "in_place::vacate_races_give_and_drain",
    "in_place::lease_ends_after_its_owner_exits",
    "mock_backend::two_threads_every_call",
    "mock_backend::completion_races_a_stream_ordered_free",
    "mock_backend::queries_race_destroy_and_record",
    "block_pool::reuse_waits_for_the_fence",
    "block_pool::give_after_races_trim",
    "block_pool::failed_record_races_take",
    "block_pool::idle_return_races_take",
    "shards::adoption_from_an_exited_thread",
    "shards::trim_races_an_owner",
    "shards::forget_races_an_owner",
    "shards::retire_races_an_orphans_reader",
    "capture::side_stream_return_races_a_get_during_a_capture",
    "completion::wake_races_the_gpu",
    "completion::drop_races_the_gpu",
    "completion::ordered_pair_never_resolves_early",
];

/// Preemption bound for the models (loom explores every interleaving with at
/// most this many preemptions per thread).
pub const MAX_PREEMPTIONS: &str = "2";

/// The bound for the models cheap enough to go deeper (those that call
/// `model_deep` in `tests/models.rs` and its modules: the mock backend's, the
/// block pool's, most thread-cache, thread-exit, in-place-lease and shards
/// models): under a minute together.
pub const DEEP_PREEMPTIONS: usize = 3;
