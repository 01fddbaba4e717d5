#!/usr/bin/env bash
# Builds, on a machine without a GPU, everything scripts/gpu-check.sh runs on
# the GPU machine (which has no Rust toolchain), and copies it into .gpu/
# (git-ignored) under stable names:
#
#   .gpu/test-gpupool-cuda-<target>   each test executable of gpupool-cuda
#                                     (`lib` is the unit tests), release build;
#                                     one that holds no test with these
#                                     features is left out (it says so)
#   .gpu/example-<name>               each example of gpupool-cuda, and the
#                                     probes and the side-by-side benchmark
#                                     of gpupool-bench (its `cuda` feature)
#   .gpu/MANIFEST                     commit, toolchain, date, sizes, sha256
#
# cudarc loads libcuda at run time, so nothing here needs CUDA installed.
# Binaries are stripped (the release profile has no debug info anyway) to keep
# .gpu/ small: it travels to the GPU machine with the working tree.
#
# Usage: scripts/build-gpu-binaries.sh [--with-suite]
#   --with-suite  also build the acceptance suite (`-p gpupool-tests
#                 --features cuda`) as .gpu/test-gpupool-tests-<target>
#                 (the generic suite, `suite`, and the mock-only soundness
#                 tests in `mock`; the other binaries hold no test there)
set -euo pipefail
cd "$(dirname "$0")/.."

with_suite=0
for arg in "$@"; do
  case "$arg" in
    --with-suite) with_suite=1 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

dest=.gpu
rm -rf "$dest"
mkdir -p "$dest"

# Prints "kind<TAB>name<TAB>executable" for every executable cargo reports.
executables() {
  if command -v jq >/dev/null; then
    jq -r 'select(.reason == "compiler-artifact" and .executable != null)
           | [(.target.kind | join(",")), .target.name, .executable] | @tsv'
  else
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(",".join(m["target"]["kind"]), m["target"]["name"], m["executable"], sep="\t")'
  fi
}

# How many tests a test executable holds (its `--list`, ignored tests
# included; listing runs none), or nothing if it cannot be listed here.
tests_held() {
  local listing
  listing=$("$1" --list --format terse 2>/dev/null) || return 0
  printf '%s\n' "$listing" | grep -c ': test$' || true
}

# Copies the test and example executables of one cargo invocation.
# $1: the package name used in the copies' names; the rest: cargo arguments.
collect() {
  local package=$1
  shift
  local json
  json=$(cargo "$@" --message-format=json)
  while IFS=$'\t' read -r kind name exe; do
    local out
    case "$kind" in
      lib) out="test-$package-lib" ;;
      test) out="test-$package-$name" ;;
      example | bin) out="example-$name" ;;
      *) continue ;;
    esac
    if [[ $out == test-* && $(tests_held "$exe") == 0 ]]; then
      echo "  (no tests with these features: $out left out)"
      continue
    fi
    cp "$exe" "$dest/$out"
    strip "$dest/$out" 2>/dev/null || true
    echo "  $dest/$out"
  done < <(printf '%s\n' "$json" | executables)
}

echo "== gpupool-cuda: test executables and examples (release)"
# CUDA 12.8 bindings (what runs on the H200's driver), named: without a
# version the bindings would follow this machine's toolkit, or cudarc's newest.
collect gpupool-cuda test --release --no-run -p gpupool-cuda --features cuda-12080
collect gpupool-cuda build --release -p gpupool-cuda --features cuda-12080 --examples
if [[ $with_suite == 1 ]]; then
  echo "== gpupool-tests --features cuda: test executables (release)"
  collect gpupool-tests test --release --no-run -p gpupool-tests --features cuda --tests
fi
echo "== gpupool --features cuda,nvrtc,cuda-12080: the generic runtime, record-once and async service examples (release)"
collect gpupool build --release -p gpupool --features cuda,nvrtc,cuda-12080 --example 03-generic-runtime \
  --example 04-record-once --example 05-async-service
echo "== .ci/downstream --features cuda: an application on CUDA 13.0 bindings (release)"
collect gpupool-downstream build --release --manifest-path .ci/downstream/Cargo.toml \
  --target-dir target/downstream --features cuda
echo "== gpupool-bench --features cuda: the probes and the side-by-side benchmark (release)"
collect gpupool-bench build --release -p gpupool-bench --features cuda --bin soak --bin driver-scaling \
  --bin capture-probe --bin scratch-thread-profile --bin one-thread-rows --bin side-by-side

{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "rustc: $(rustc --version)"
  echo "files:"
  (cd "$dest" && for f in test-* example-*; do
    [[ -e $f ]] || continue
    printf '  %-48s %10s bytes  sha256 %s\n' "$f" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)"
  done)
} > "$dest/MANIFEST"

echo "== $dest/MANIFEST"
cat "$dest/MANIFEST"
echo "== total: $(du -sh "$dest" | cut -f1) (the run tool carries at most 64 MiB)"
