//! Compile-fail tests (`ui/*.rs`): scratch memory cannot outlive its
//! scratchpad, and a scratchpad cannot be reset while a slice of it is alive;
//! with the soundness cases beside them, a scratchpad cannot outlive the lease
//! whose order it uses, an order cannot outlive its lease or owned stream, and
//! safe code can neither forge a handle nor call a backend method that takes
//! one.
//!
//! Machine-independent, and not part of the GPU run: trybuild runs the
//! compiler, which the GPU machine does not have, so the file is compiled out
//! under `--features cuda`.
#![cfg(not(feature = "cuda"))]

#[test]
#[cfg_attr(miri, ignore = "trybuild runs the compiler")]
fn scratch_memory_cannot_outlive_its_scratchpad() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
}
