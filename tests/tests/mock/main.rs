//! Mock-only tests of the pools: what only the mock can present or count
//! (machines without devices, foreign machines, flags and priorities as the
//! backend received them, injected backend failures), the soundness findings,
//! the compile-fail cases (trybuild) and the soak (ignored by default).
//!
//! Every module but `soundness` is compiled out under `--features cuda`;
//! `soundness` needs only the mock and runs in every build.

mod attacks;
mod attacks2;
mod attacks3;
mod attacks4;
mod attacks5;
mod attacks6;
mod attacks7;
mod bad_input;
mod capture;
mod capture_rounds;
mod common;
mod compile_fail;
mod completion;
mod event_pool;
mod faults;
mod future_kit;
mod soak;
mod soundness;
mod stream_pool;
