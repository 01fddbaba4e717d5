#!/usr/bin/env bash
# Instructions per run of each same-process row, on the CUDA backend, without
# a GPU: the binary of scripts/same-process-rows.sh runs under callgrind
# against scripts/stub-libcuda.c (a driver library that does no GPU work),
# one row at a time, and the row's two closures (the build before and the
# build after) are counted: their inclusive instructions over their calls.
# Deterministic to a few instructions, so a change of 1 % shows; it counts
# the CUDA backend's and the core's own code, not the driver's time, caches
# or code layout (time those on the GPU machine).
#
#   scripts/same-process-rows.sh REV              # then, on its unstripped binary:
#   scripts/callgrind-rows.sh /tmp/gpupool-same-process-rows/target/release/same-process-rows \
#     ["row name" ...]                               # default: every row
#
# BLOCK_MS (default 200): the block the rows are calibrated to under
# callgrind (enough calls that the first, cold ones do not count). Needs
# valgrind and a C compiler.
set -euo pipefail
bin=${1:?usage: scripts/callgrind-rows.sh BIN [ROW ...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -shared -fPIC -o "$work/libcuda.so" "$root/scripts/stub-libcuda.c"
export LD_LIBRARY_PATH=$work${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rows=("$@")
if ((${#rows[@]} == 0)); then
  mapfile -t rows < <(PAIRS=1 BLOCK_MS=1 "$bin" | awk -F' \\| ' '/^\| / && !/^\| row / && !/^\|---/ {sub(/^\| /, "", $1); print $1}')
fi
echo "| row | before: instructions per run | after | after/before |"
echo "|---|---|---|---|"
for row in "${rows[@]}"; do
  ROW=$row PAIRS=1 BLOCK_MS=${BLOCK_MS:-200} valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
    "$bin" > /dev/null 2>&1
  # The calls of the row's closures (from `calibrate` and `time`): inclusive
  # cost and count of each, summed per build.
  { callgrind_annotate --threshold=100 --inclusive=yes --tree=calling "$work/cg.out" 2> /dev/null || true; } |
    { grep -E '^ *[0-9,]+ .*>   .*gpupool_rows_(before|after)::.*with_rows::\{\{closure\}\} \(' || true; } |
    sed -E 's/^ *([0-9,]+) .*gpupool_rows_(before|after)::.*\(([0-9,]+)x\).*/\2 \1 \3/' | tr -d , |
    awk -v row="$row" '{ir[$1] += $2; n[$1] += $3}
      END {
        if (!n["before"] || !n["after"]) { printf "| %s | ? | ? | ? |\n", row; exit }
        b = ir["before"] / n["before"]; a = ir["after"] / n["after"]
        printf "| %s | %.0f | %.0f | %.3f |\n", row, b, a, a / b
      }'
done
