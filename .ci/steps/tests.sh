# The README's test command, the measurement crate's own tests, the loom
# models.

tests() {
  section "tests (the README's test command)"
  cargo test
  # The baselines' own tests (the measurement crate is not a default member).
  cargo test -p gpupool-bench --lib

  section "loom models"
  cargo test -p loom-tests
}
