//! loom models of gpupool's lock-free paths.
//!
//! The models live in `tests/models.rs` and compile only with `--cfg loom`
//! (which also switches gpupool-core and gpupool-mock to loom's primitives) and
//! `--cfg crossbeam_loom` (which makes crossbeam-epoch model its collector).
//! `cargo test -p loom-tests` needs neither flag: its plain test
//! (`tests/run_models.rs`) rebuilds this crate with both, in
//! `target/loom`, runs the models in release mode and checks that each one ran
//! and passed.

/// The models `tests/models.rs` defines; the runner checks each one passed.
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
];

/// Preemption bound for the models (loom explores every interleaving with at
/// most this many preemptions per thread).
pub const MAX_PREEMPTIONS: &str = "2";
