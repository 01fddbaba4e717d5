# Formatting, the module graph, clippy in every configuration that compiles
# different code, and the docs with warnings denied.

lint() {
  section "fmt"
  cargo fmt --all --check

  section "module graph (no import circle in any crate: scripts/module-graph.py)"
  python3 scripts/module-graph.py core/src backend-mock/src backend-cuda/src src tests/src \
    bench/src bench/rows/src

  section "clippy"
  cargo clippy --workspace --all-targets -- -D warnings
  # The suite on the CUDA machine, the facade with the CUDA backend (the
  # generic runtime's CUDA kernels) and the measurement crate's CUDA probes:
  # one build, the features of all three.
  cargo clippy -p gpupool-tests -p gpupool -p gpupool-bench --all-targets \
    --features gpupool-tests/cuda,gpupool/cuda,gpupool/nvrtc,gpupool-bench/cuda -- -D warnings
  RUSTFLAGS="--cfg loom --cfg crossbeam_loom" \
    cargo clippy -p loom-tests -p gpupool-core -p gpupool-mock -p gpupool-cuda --all-targets \
    --target-dir target/loom-check -- -D warnings

  section "docs"
  RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
  RUSTDOCFLAGS="-D warnings" cargo doc -p gpupool --features cuda,nvrtc --no-deps --target-dir target/doc-cuda
}
