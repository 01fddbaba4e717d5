# Beside the README's test command (run by .ci/run itself): the measurement
# crate's own tests and the loom models.

tests() {
  section "the measurement crate's tests (not a default member: the baselines)"
  cargo test -p gpupool-bench --lib

  section "loom models"
  cargo test -p loom-tests
}
