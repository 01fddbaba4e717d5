//! The generic acceptance suite, written against the backend traits only
//! (`gpu()`, `TestGpu`): it runs on the machine of this build, the mock by
//! default and a GPU with `--features cuda` (the only test binary of this crate
//! with tests for the GPU run).

mod bad_input;
mod both;
mod completion;
mod events;
mod order;
mod scratch;
mod streams;
mod stress;
