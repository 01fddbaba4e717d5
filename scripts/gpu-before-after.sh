#!/usr/bin/env bash
# Runs two builds of the side-by-side benchmark alternately on the GPU machine
# (old, new, new, old, old, new, ...: each build runs first as often as
# second, so a drift within the session favours neither), so a change is
# measured against the code before it on the same machine in the same session. Builds nothing: build each binary on
# a build machine first (`cargo build --release -p gpupool-bench --features cuda
# --bin side-by-side` at each commit) and bring both along.
#
#   OUT=dir scripts/gpu-before-after.sh OLD_BIN NEW_BIN [PAIRS]
#
# Each run writes $OUT/{old,new}-N/side-by-side.json and stdout.txt; compare
# them with scripts/compare-side-by-side.py. The same for two builds of
# gpupool-bench's one-thread-rows binary (gpupool's own one-thread rows,
# ~5 s a run: many more pairs in the same time; rows.json, compared by
# scripts/compare-rows.py); between processes the GPU machine's rows move up
# to twofold, so for a few-percent question prefer scripts/same-process-rows.sh
# (both builds in one process). Pinned to 16 cores where the machine has more
# (as scripts/gpu-check.sh does).
set -uo pipefail
old=$1
new=$2
pairs=${3:-2}
out=${OUT:-$PWD/gpu-out}
pin=()
if command -v taskset >/dev/null && (($(nproc) > 16)); then
  pin=(taskset -c 0-15)
fi
failed=0
for i in $(seq 1 "$pairs"); do
  order=(old new)
  ((i % 2 == 0)) && order=(new old)
  for which in "${order[@]}"; do
    bin=$old
    [[ $which == new ]] && bin=$new
    dir="$out/$which-$i"
    mkdir -p "$dir"
    start=$(date +%s)
    OUT="$dir" "${pin[@]}" "$bin" --cuda >"$dir/stdout.txt" 2>&1
    rc=$?
    echo "$which-$i: exit $rc, $(($(date +%s) - start)) s"
    ((rc == 0)) || failed=1
  done
done
exit "$failed"
