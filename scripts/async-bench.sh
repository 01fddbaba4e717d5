#!/usr/bin/env bash
# Runs the async completion benchmark (bench/src/bin/async-completion.rs) on
# the GPU machine. Builds nothing: the binary is built elsewhere and copied
# into .gpu/ (git-ignored), which travels with the working tree:
#
#   cargo build --release -p gpupool-bench
#   mkdir -p .gpu && cp target/release/async-completion .gpu/
#
# Writes, under $OUT (or ./async-bench-out when OUT is unset):
#   async-completion.txt   the table and the run's description (stdout)
#   async-completion.log   progress, one line per run (stderr)
#   runs.csv               every run of every cell
#   summary.csv            the medians per (design, in flight, threads)
#   system.txt             nvidia-smi, CPU count, the binary's sha256
#
# Usage: scripts/async-bench.sh [--quick] [other options of the binary]
#   --quick   one repetition, short windows (a smoke run, well under a minute)
#   The full run takes about 2 minutes on an H200 and stops repeating cells
#   past --budget-s (200 s).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=.gpu/async-completion
if [[ ! -x $bin ]]; then
  echo "no $bin: build it elsewhere and copy it there (see the top of this script)" >&2
  exit 2
fi
out=${OUT:-./async-bench-out}
mkdir -p "$out"

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  uname -srm
  echo "cpus: $(nproc)"
  sha256sum "$bin" || true
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1 || true
} >"$out/system.txt"

rc=0
OUT="$out" timeout 280 "$bin" --out "$out" "$@" \
  > >(tee "$out/async-completion.txt") \
  2> >(tee "$out/async-completion.log" >&2) || rc=$?
wait
echo "async-completion exited $rc; output in $out" >&2
exit "$rc"
