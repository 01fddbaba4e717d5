//! Mock-only tests of the scratchpad: hazards, upstream call kinds and live
//! bytes as the mock sees them, learned sizes, randomised rounds under a
//! lagging GPU and property tests. No pool: the streams come straight from the
//! mock, so under Miri these run with strict provenance (`.ci/run`).
#![cfg(not(feature = "cuda"))]

mod scratch_sizes;
mod scratchpad;
mod scratchpad_props;
mod scratchpad_rounds;
