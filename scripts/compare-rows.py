#!/usr/bin/env python3
"""Compares runs of two builds of the one-thread rows binary
(bench/src/bin/one-thread-rows/, run alternately by
scripts/gpu-before-after.sh).

    scripts/compare-rows.py OLD_DIR... -- NEW_DIR...

Each DIR holds a rows.json. The directories are paired in the order given
(old-1 with new-1, ...: the runs of a pair ran one after the other). For
every row: the median over the old runs and over the new runs (ns), their
quotient, and the median over the pairs of each pair's new/old quotient,
which a drift of the machine's speed between pairs does not move. Above 1
means the new build is slower. Between processes the GPU machine's rows move
up to twofold (2026-12-02): for a few-percent question use
scripts/same-process-rows.sh (both builds in one process) instead.
"""
import json
import statistics
import sys


def main(argv):
    if "--" not in argv:
        sys.exit(__doc__)
    cut = argv.index("--")
    old = [json.load(open(f"{d}/rows.json")) for d in argv[:cut]]
    new = [json.load(open(f"{d}/rows.json")) for d in argv[cut + 1 :]]
    if not old or not new:
        sys.exit(__doc__)
    print("| row | old ns | new ns | new / old | median of pairs' new / old |")
    print("|---|---|---|---|---|")
    for row in old[0]:
        o = statistics.median(r[row] for r in old)
        n = statistics.median(r[row] for r in new)
        pairs = statistics.median(b[row] / a[row] for a, b in zip(old, new))
        print(f"| {row} | {o:.1f} | {n:.1f} | {n / o:.3f} | {pairs:.3f} |")
    print(f"\n(old runs: {len(old)}, new runs: {len(new)}, pairs: {min(len(old), len(new))})")


main(sys.argv[1:])
