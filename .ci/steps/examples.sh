# The programs a user runs first, and the measurement tools' smoke runs.

examples() {
  section "demo (the README's first command)"
  cargo run --release --example 01-runtime

  section "the generic runtime on the mock; its CUDA build (run on a GPU by scripts/gpu-check.sh)"
  cargo run --release --example 03-generic-runtime
  # The same on the process-wide mock in checking mode (work completes only when
  # the host waits; a hazard panics): removing either of its waits fails here.
  GPUPOOL_MOCK_CHECK=1 cargo run --release --example 03-generic-runtime
  # One pooled event recorded once and waited on by three streams, no `unsafe`.
  GPUPOOL_MOCK_CHECK=1 cargo run --release --example 04-record-once

  section "the async service on the mock (4,096 tokio tasks awaiting the GPU)"
  cargo run --release --example 05-async-service

  section "the examples' CUDA builds"
  cargo build --release --example 03-generic-runtime --example 05-async-service --features cuda,nvrtc

  section "side-by-side benchmark, smoke run (the mock; a few seconds)"
  GPUPOOL_BENCH_QUICK=1 OUT=target/side-by-side-smoke cargo run --release -p gpupool-bench --bin side-by-side

  section "two builds in one process (scripts/same-process-rows.sh): built against this commit, run on the mock"
  SAME_PROCESS_ROWS_DIR=$(mktemp -d) scripts/same-process-rows.sh HEAD target/same-process-rows-ci
  PAIRS=3 BLOCK_MS=1 target/same-process-rows-ci --mock
}
