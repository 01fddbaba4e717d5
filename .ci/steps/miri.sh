# Miri over the core, the mock and the acceptance suite on the mock: one
# build, then a queue of jobs that two workers take in turn, in the
# background, while the other steps run (Miri interprets on one core; the
# queue keeps both busy to the end, and the other steps fill their gaps).
#
# Strict (-Zmiri-strict-provenance, leaks checked, isolation on, Miri's
# default aliasing model, Stacked Borrows): everything that never pins
# crossbeam-epoch: the whole mock crate (lib, tests, doctests) the core's
# unit tests but the Treiber stack's three that pin, the scratch tests of the
# acceptance suite (they take streams from the mock, not a pool) and the
# baselines of the measurement crate.
#
# Permissive (the old flags): everything that pins crossbeam-epoch, i.e. any
# pool `get`/`purge`/drop: the rest of the core's tests, its doctests and the
# acceptance suite. crossbeam-epoch 0.9.21, its latest release, keeps pointers
# in `AtomicUsize` and casts them back, so under strict provenance a thread's
# first pin fails at crossbeam-epoch-0.9.21/src/atomic.rs:204
# (`&*(ptr as *const T)`, `<Local as Pointable>::deref` <- `Shared::deref` <-
# `List<Local>::insert` (sync/list.rs:176) <- `Local::register` <-
# `Collector::register` <- `default::HANDLE` <- `epoch::pin`), and a pool's
# drop at atomic.rs:212 (`<Node as Pointable>::drop` <- `Owned::drop` <-
# `Guard::defer_destroy` on the unprotected guard <- `Stack::drain`). No
# finding is in gpupool's code. crossbeam's master no longer casts (#796, not
# released): crossbeam-rs/crossbeam#1181, #957. Leaks are ignored for the
# same reason: the global collector's queue sentinel (atomic.rs:200 <-
# `Queue::new` <- `Global::new` <- `default_collector`), the bags exiting
# threads seal (`Local::finalize`) and the `Local`s of exited threads are
# held only as integers, or never freed, and Miri reports them as leaked.
# Tree Borrows for the permissive jobs: crossbeam's intrusive list trips
# Stacked Borrows (crossbeam-rs/crossbeam#545). The strict jobs never reach it
# and keep Stacked Borrows, which rejects more aliasing patterns than Tree
# Borrows and, here, interprets a quarter to a third faster (2-core machine,
# 2026-12-04: the scratch binary 219 -> 152 s of CPU, the mock crate 136 -> 90).
# No isolation: proptest reads the working directory (failure persistence).
# The suite's own leak checks are the mock's live-handle and live-byte
# counters.
#
# MIRIFLAGS do not change what is built (they reach the interpreter), so every
# job shares one target directory; cargo holds its lock only while it builds,
# so two jobs run at once.

MIRI_STRICT="-Zmiri-strict-provenance"
MIRI_PERMISSIVE="-Zmiri-tree-borrows -Zmiri-permissive-provenance -Zmiri-ignore-leaks -Zmiri-disable-isolation"
MIRI_TARGET=target/miri
MIRI_QUEUE=$MIRI_TARGET/queue
# How many stripes the largest test binaries are cut into (each stripe a job).
MIRI_STRIPES=8

# The core's unit tests that pin crossbeam-epoch.
STACK_PINNING=(--skip stack::tests::stack_is_lifo_and_drains_top_first
  --skip stack::tests::chain_node_moves_into_stack_without_loss
  --skip stack::tests::concurrent_push_pop_loses_and_duplicates_nothing)
# The stress test, by far the slowest test under Miri, is a job of its own.
# By exact name (module path in the `suite` binary): if it is renamed it runs
# twice, never not at all.
STRESS=stress::many_threads_never_alias_and_leak_nothing
# The fault sweep, the slowest test of the mock's, likewise (queued first, so
# that it does not start late and leave one worker running alone at the end).
FAULT_SWEEP=faults::each_call_failing_once_gives_an_error_and_leaks_nothing

# `cargo miri test` with flags $1 and the arguments after it.
miri_test() {
  local flags=$1
  shift
  MIRIFLAGS="$flags" cargo +nightly miri test --target-dir "$MIRI_TARGET" "$@"
}

# Adds a job: its flags, then `cargo miri test`'s arguments (`--` and the
# test filters included), one per line in a file of its own.
miri_job() {
  local n
  n=$(find "$MIRI_QUEUE" -name 'job-[0-9][0-9][0-9]*' | wc -l)
  printf '%s\n' "$@" >"$(printf '%s/job-%03d' "$MIRI_QUEUE" "$n")"
}

# The tests of test binary $2 of gpupool-tests (flags $1), as Miri lists them.
miri_list() {
  miri_test "$1" -p gpupool-tests --test "$2" -- --list --format terse 2>/dev/null |
    sed -n 's/: test$//p'
}

# Jobs for test binary $2 (flags $1) but the tests named after it: every
# listed test in one of $MIRI_STRIPES stripes, by turns, each run by exact
# name, so a stripe never misses a test and two never share one.
miri_striped() {
  local flags=$1 binary=$2
  shift 2
  local tests=() stripe i
  mapfile -t tests < <(miri_list "$flags" "$binary" | grep -vxF -f <(printf '%s\n' "$@" ''))
  [[ ${#tests[@]} -gt 0 ]] || {
    echo "Miri: no test listed in $binary"
    return 1
  }
  for ((stripe = 0; stripe < MIRI_STRIPES; stripe++)); do
    local names=()
    for ((i = stripe; i < ${#tests[@]}; i += MIRI_STRIPES)); do names+=("${tests[i]}"); done
    [[ ${#names[@]} -eq 0 ]] || miri_job "$flags" -p gpupool-tests --test "$binary" -- --exact "${names[@]}"
  done
}

# Builds everything the jobs run (both cores), then queues the jobs, the
# longest first (wall time beside the other steps on the 2-core development
# machine, 2026-12-04: the scratch binary ~4.5 min, the stress test ~2, each
# stripe of the mock's tests 1-2 but the one that held the fault sweep, ~6;
# the rest under 2.5 each).
miri_build() {
  section "Miri: build, and the queue of jobs"
  rm -rf "$MIRI_QUEUE"
  mkdir -p "$MIRI_QUEUE"
  miri_test "$MIRI_PERMISSIVE" --no-run -p gpupool-core -p gpupool-mock -p gpupool-tests --lib --tests

  # The acceptance suite's test binaries (tests/tests/<name>/main.rs), found
  # by glob so that a new one is never left out. `scratch` runs strict; in
  # `drop_paths` the module `scratchpad` runs strict and the rest permissive;
  # `mock` (the largest) and `suite` are cut into stripes.
  local binaries=() f name
  for f in tests/tests/*.rs tests/tests/*/main.rs; do
    [[ -e $f ]] || continue
    name=${f#tests/tests/}
    name=${name%/main.rs}
    binaries+=("${name%.rs}")
  done
  # The scratch tests take their streams straight from the mock (no pool, no
  # epoch). proptest in `scratchpad_props` reads the working directory:
  # isolation off there.
  miri_job "$MIRI_PERMISSIVE" -p gpupool-tests --test mock -- --exact "$FAULT_SWEEP"
  miri_job "$MIRI_STRICT" -p gpupool-tests --test scratch -- --skip scratchpad_props::
  miri_job "$MIRI_PERMISSIVE" -p gpupool-tests --test suite -- --exact "$STRESS"
  miri_striped "$MIRI_PERMISSIVE" mock "$FAULT_SWEEP"
  miri_job "$MIRI_STRICT -Zmiri-disable-isolation" -p gpupool-tests --test scratch -- scratchpad_props::
  miri_job "$MIRI_PERMISSIVE" -p gpupool-tests --doc
  miri_job "$MIRI_STRICT" -p gpupool-mock
  miri_job "$MIRI_PERMISSIVE" -p gpupool-tests --test drop_paths -- --skip scratchpad::
  miri_job "$MIRI_STRICT" -p gpupool-tests --test drop_paths -- scratchpad::
  miri_job "$MIRI_PERMISSIVE" -p gpupool-tests --test suite -- --skip "$STRESS"
  miri_job "$MIRI_PERMISSIVE" -p gpupool-core
  miri_job "$MIRI_STRICT" -p gpupool-core --lib -- --exact "${STACK_PINNING[@]}"
  miri_job "$MIRI_STRICT" -p gpupool-bench --lib -- baselines::
  miri_job "$MIRI_PERMISSIVE" -p gpupool-tests --lib
  for name in "${binaries[@]}"; do
    case $name in
      suite | mock | scratch | drop_paths) ;;
      *) miri_job "$MIRI_PERMISSIVE" -p gpupool-tests --test "$name" ;;
    esac
  done
}

# Takes the next job of the queue (its file's path), or fails if none is
# left. A rename is atomic: two workers never take one job.
miri_take() {
  local job
  for job in "$MIRI_QUEUE"/job-[0-9][0-9][0-9]; do
    [[ -e $job ]] || return 1
    mv "$job" "$job.taken-$1" 2>/dev/null && {
      echo "$job.taken-$1"
      return 0
    }
  done
  return 1
}

# Worker $1: runs jobs until the queue is empty or one fails.
miri_worker() {
  local job args
  while job=$(miri_take "$1"); do
    mapfile -t args <"$job"
    echo "-- Miri worker $1 [$((SECONDS / 60))m$((SECONDS % 60))s]: ${args[*]:1}"
    miri_test "${args[@]}" || {
      echo "Miri job failed: ${args[*]}"
      return 1
    }
  done
}

MIRI_WORKERS=()
# Starts two workers in the background, each with its own log.
miri_start() {
  local w
  for w in 1 2; do
    miri_worker "$w" >"$MIRI_TARGET/worker-$w.log" 2>&1 &
    MIRI_WORKERS+=($!)
  done
}

# Waits for the workers, prints their logs, and fails if a job failed or a
# job was left in the queue.
miri_wait() {
  section "Miri: the workers' logs"
  local status=0 pid w
  for pid in "${MIRI_WORKERS[@]}"; do wait "$pid" || status=1; done
  for w in 1 2; do
    echo "-- Miri worker $w"
    cat "$MIRI_TARGET/worker-$w.log"
  done
  if compgen -G "$MIRI_QUEUE/job-[0-9][0-9][0-9]" >/dev/null; then
    echo "Miri: jobs left in the queue:" "$MIRI_QUEUE"/job-[0-9][0-9][0-9]
    status=1
  fi
  if [[ $status -ne 0 ]]; then
    echo "Miri failed"
    return 1
  fi
}
