//! gpupool's acceptance suite: shared helpers for the tests in `tests/`.
