#!/usr/bin/env python3
"""Compares side-by-side benchmark runs of two builds (see gpu-before-after.sh).

    scripts/compare-side-by-side.py OLD_DIR... -- NEW_DIR...

Each DIR holds a side-by-side.json. For every gpupool row, prints its ratio to
the DALI-style baseline measured in the same run (time per op or round; p99.9
for the oversubscribed latency rows), the median of those ratios over the old
runs and over the new runs, and new/old: above 1 means the new build lost
ground against the baseline. Beside it, the gpupool row's own time (median
over the runs, ns) in both builds and their quotient: the baselines are the
same code in both builds, so where the ratio moves but gpupool's own time does
not, the baseline's noise moved it.
"""
import json
import statistics
import sys


def rows(path):
    """{row: (gpupool's time in ns, that time ÷ DALI-style's)}"""
    d = json.load(open(f"{path}/side-by-side.json"))
    out = {}
    thr = {(r["operation"], r["variant"], r["threads"]): r["ns_per_op"] for r in d["throughput"]}
    for (op, var, t), ns in thr.items():
        base = thr.get((op.split(",")[0], "DALI-style", t))
        if var == "gpupool" and base:
            out[f"{op}, {t} thr"] = (ns, ns / base)
    lat = {(r["operation"], r["variant"]): r for r in d["latency"]}
    for (op, var), r in lat.items():
        base = lat.get((op.split(",")[0], "DALI-style"))
        if var == "gpupool" and base:
            out[f"{op}, p99.9 at {r['threads']} thr"] = (r["p999_ns"], r["p999_ns"] / base["p999_ns"])
    sc = {(r["kind"], r["variant"]): r["ns_per_round"] for r in d["scratch"]}
    for (kind, var), ns in sc.items():
        base = sc.get((kind, "DALI-style new each round"))
        if var.startswith("gpupool") and base:
            out[f"scratch {kind}: {var}"] = (ns, ns / base)
    return out


def main():
    args = sys.argv[1:]
    cut = args.index("--")
    old = [rows(p) for p in args[:cut]]
    new = [rows(p) for p in args[cut + 1:]]
    print("| row | old ÷ DALI-style | new ÷ DALI-style | new / old | gpupool old ns | new ns | new / old |")
    print("|---|---|---|---|---|---|---|")
    worst = (0.0, "")
    worst_own = (0.0, "")
    for key in old[0]:
        o = statistics.median(r[key][1] for r in old if key in r)
        n = statistics.median(r[key][1] for r in new if key in r)
        o_ns = statistics.median(r[key][0] for r in old if key in r)
        n_ns = statistics.median(r[key][0] for r in new if key in r)
        worst = max(worst, (n / o, key))
        worst_own = max(worst_own, (n_ns / o_ns, key))
        print(f"| {key} | {o:.4g} | {n:.4g} | {n / o:.3f} | {o_ns:.4g} | {n_ns:.4g} | {n_ns / o_ns:.3f} |")
    print(f"\nworst new/old of the ratio: {worst[0]:.3f} ({worst[1]}); of gpupool's own time: "
          f"{worst_own[0]:.3f} ({worst_own[1]}) (old runs: {len(old)}, new runs: {len(new)})")


if __name__ == "__main__":
    main()
