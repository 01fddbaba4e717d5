#!/usr/bin/env bash
# Runs every GPU check in one go on the GPU machine, building nothing (that
# machine has no Rust toolchain): the prebuilt binaries come from
# scripts/build-gpu-binaries.sh, run here beforehand, in .gpu/.
#
#   1. the machine: date, host, nvidia-smi, driver and tool versions, and
#      .gpu/MANIFEST (which commit the binaries were built from);
#   2. every test executable .gpu/test-*, with --include-ignored (the GPU tests
#      are #[ignore]d elsewhere) and --test-threads=1, counting the tests each
#      ran (libtest's "test result: ... N passed" line);
#   3. every example .gpu/example-*;
#   4. compute-sanitizer --tool memcheck on the kernel examples (02, 03, 05);
#   5. compute-sanitizer --tool memcheck, racecheck and synccheck on the
#      stream-order proofs of gpu_memory (scratch memory reused while a kernel
#      still reads it shows up there, and as wrong sums in the test itself);
#   6. compute-sanitizer --tool memcheck and racecheck on the graph-capture
#      tests (gpu_capture).
#
# Everything printed also goes to $OUT/gpu-check.log, and one line per step to
# $OUT/gpu-check-summary.txt (OUT defaults to ./gpu-out when unset): PASS or
# FAIL, and for a test executable the number of tests it ran; an executable
# that ran no test is marked NONE ("no tests"), not passed. The summary ends
# with the totals. Exits 0 only if no step failed. Each step is limited to
# $GPU_CHECK_STEP_TIMEOUT seconds (default 300).
#
# Usage: bash scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

bin_dir=${GPU_BIN_DIR:-.gpu}
out_dir=${OUT:-$PWD/gpu-out}
step_timeout=${GPU_CHECK_STEP_TIMEOUT:-300}
mkdir -p "$out_dir"
log="$out_dir/gpu-check.log"
summary="$out_dir/gpu-check-summary.txt"
export RUST_BACKTRACE=1

section() { printf '\n==== %s\n' "$*"; }

# Runs a command with the step time limit.
limited() {
  if command -v timeout >/dev/null; then
    timeout --kill-after=10 "$step_timeout" "$@"
  else
    "$@"
  fi
}

# Runs a command that must succeed *and* print a line "OK" (an example that
# finds no driver or no GPU exits 0 after saying "skipped", which is not a
# pass on the GPU machine).
expect_ok() {
  local out rc
  out=$(mktemp)
  "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if [[ $rc == 0 ]] && ! grep -qx 'OK' "$out"; then
    echo "(exit 0, but no line \"OK\": the check did not run)"
    rc=3
  fi
  rm -f "$out"
  return "$rc"
}

failed=0
steps=0
test_steps=0
no_test_steps=0
tests_passed=0
: > "$summary"

# Sums one field of libtest's result lines ("test result: ok. 12 passed; 0
# failed; ..."; one per test executable) in a step's output.
# $1: the field ("passed" or "failed"); $2: the output file.
tests_counted() {
  awk -v field="$1" '/^test result: / {
      for (i = 1; i < NF; i++) if ($(i + 1) ~ "^" field) n += $i
    } END { print n + 0 }' "$2"
}

# Runs one step, timing it and recording it in the summary.
# Options first: --tests for a test executable (counts its tests; one that ran
# none is NONE, "no tests", rather than a pass), --must-test for one filtered to
# tests that must exist (running none fails the step). Then $1: the step's
# name; the rest: the command.
step() {
  local mode=
  if [[ $1 == --tests || $1 == --must-test ]]; then
    mode=$1
    shift
  fi
  local name=$1
  shift
  section "$name: $*"
  local start end rc out
  out=$(mktemp)
  start=$(date +%s.%N)
  "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  end=$(date +%s.%N)
  local secs passed=0 what=
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  steps=$((steps + 1))
  if [[ -n $mode ]]; then
    passed=$(tests_counted passed "$out")
    what="$passed tests"
    test_steps=$((test_steps + 1))
    tests_passed=$((tests_passed + passed))
    if [[ $rc == 0 && $passed == 0 ]]; then
      if [[ $mode == --must-test ]]; then
        echo "(exit 0, but no test ran)"
        rc=3
      else
        printf 'NONE  %-60s %8ss  no tests\n' "$name" "$secs" | tee -a "$summary"
        no_test_steps=$((no_test_steps + 1))
        rm -f "$out"
        return
      fi
    fi
  fi
  if [[ $rc == 0 ]]; then
    printf 'PASS  %-60s %8ss%s\n' "$name" "$secs" "${what:+  $what}" | tee -a "$summary"
  else
    [[ $rc == 124 || $rc == 137 ]] && echo "(timed out after ${step_timeout}s)"
    [[ -n $mode ]] && what="$passed passed, $(tests_counted failed "$out") failed; "
    printf 'FAIL  %-60s %8ss  %sexit %s\n' "$name" "$secs" "$what" "$rc" | tee -a "$summary"
    failed=$((failed + 1))
  fi
  rm -f "$out"
}

main() {
  section "machine"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "kernel: $(uname -r)"
  # The CPU: whether the cores are hyperthreads matters to every many-thread
  # figure (16 threads on 8 cores with two threads each halve a thread's
  # share of a core).
  if command -v lscpu >/dev/null; then
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|Hypervisor vendor)' || true
  else
    grep -m1 'model name' /proc/cpuinfo || true
    echo "siblings/cores: $(grep -m1 siblings /proc/cpuinfo | cut -d: -f2) /$(grep -m1 'cpu cores' /proc/cpuinfo | cut -d: -f2)"
  fi
  if [[ -r /proc/driver/nvidia/version ]]; then
    cat /proc/driver/nvidia/version
  fi
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap,pci.bus_id --format=csv
    nvidia-smi topo -m 2>/dev/null || true
  else
    echo "nvidia-smi: not found"
  fi
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  if command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --version | head -n 3
  else
    echo "compute-sanitizer: not found (the memcheck steps will fail)"
  fi

  section "binaries ($bin_dir)"
  if [[ ! -d $bin_dir ]]; then
    echo "no $bin_dir: run scripts/build-gpu-binaries.sh on a build machine first, and bring $bin_dir along"
    echo "FAIL  binaries missing" >> "$summary"
    return 1
  fi
  cat "$bin_dir/MANIFEST" 2>/dev/null || echo "(no MANIFEST)"

  shopt -s nullglob
  local tests=("$bin_dir"/test-*) examples=("$bin_dir"/example-*)
  if (( ${#tests[@]} + ${#examples[@]} == 0 )); then
    echo "no test-* or example-* in $bin_dir"
    echo "FAIL  binaries missing" >> "$summary"
    return 1
  fi
  chmod +x "${tests[@]}" "${examples[@]}" 2>/dev/null || true

  for t in "${tests[@]}"; do
    step --tests "$(basename "$t")" limited "$t" --include-ignored --test-threads=1
  done
  for e in "${examples[@]}"; do
    case "$(basename "$e")" in
      example-side-by-side)
        # The CUDA backend, on 16 cores at most (the figures it is compared
        # with were taken on a 16-core host; 4 threads per core makes the
        # oversubscribed run 64 threads there).
        local pin=()
        if command -v taskset >/dev/null && (( $(nproc) > 16 )); then
          pin=(taskset -c 0-15)
        fi
        step "$(basename "$e") --cuda" expect_ok limited "${pin[@]}" "$e" --cuda \
          --svg "$out_dir/side-by-side.svg"
        ;;
      *) step "$(basename "$e")" expect_ok limited "$e" ;;
    esac
  done
  # memcheck on the kernel examples (the benchmark example only times driver
  # calls, which the sanitizer would slow down many times over).
  for e in "$bin_dir"/example-02* "$bin_dir"/example-03* "$bin_dir"/example-05*; do
    step "memcheck $(basename "$e")" expect_ok limited compute-sanitizer --tool memcheck --error-exitcode 1 "$e"
  done
  # The proofs' device checks. API-error reporting is off here: the pools poll
  # cuEventQuery / cuStreamQuery, whose CUDA_ERROR_NOT_READY is the answer
  # they expect, not a failure; every driver call's result is checked by the
  # code and the tests themselves (a failed call fails the test, and so the step).
  local proof="$bin_dir/test-gpupool-cuda-gpu_memory" filter=stream_order_proof
  if [[ -e $proof ]]; then
    for tool in memcheck racecheck synccheck; do
      step --must-test "$tool $(basename "$proof") $filter" limited compute-sanitizer --tool "$tool" \
        --report-api-errors no --error-exitcode 1 \
        "$proof" --include-ignored --test-threads=1 "$filter"
    done
  else
    echo "FAIL  $proof missing (the stream-order proofs)" | tee -a "$summary"
    failed=$((failed + 1))
  fi
  # The graph-capture acceptance (a forked step on scratch memory captured,
  # replayed and checked; blocks kept for graphs given back) under memcheck
  # and racecheck, API errors off for the same reason.
  local capture="$bin_dir/test-gpupool-cuda-gpu_capture"
  if [[ -e $capture ]]; then
    for tool in memcheck racecheck; do
      step --must-test "$tool $(basename "$capture")" limited compute-sanitizer --tool "$tool" \
        --report-api-errors no --error-exitcode 1 \
        "$capture" --include-ignored --test-threads=1
    done
  else
    echo "FAIL  $capture missing (the graph-capture tests)" | tee -a "$summary"
    failed=$((failed + 1))
  fi

  section "summary"
  printf 'total: %s steps; %s tests passed in %s test steps; %s test executable(s) with no tests; %s step(s) failed\n' \
    "$steps" "$tests_passed" "$test_steps" "$no_test_steps" "$failed" | tee -a "$summary" >/dev/null
  cat "$summary"
  if (( failed > 0 )); then
    echo "$failed step(s) FAILED"
    return 1
  fi
  echo "no step failed ($tests_passed tests passed)"
}

main "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "log: $log" >&2
exit "$rc"
