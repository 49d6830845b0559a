#!/usr/bin/env python3
"""The A/B scripts' table (tools/device/ab_builds.sh, env_ab.sh): TFLOPS and the SM clock per op and
length, one column per variant, every round's figure in order.

Usage: ab_table.py OUT ROUNDS VARIANT... (reads OUT/ab-VARIANT-ROUND.json, `fvattn bench --json`).
"""
import json
import os
import sys

out, rounds, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cells = {}
for r in range(1, rounds + 1):
    for v in variants:
        path = os.path.join(out, f"ab-{v}-{r}.json")
        if not os.path.exists(path):
            continue
        for x in json.load(open(path))["results"]:
            cells.setdefault((x["op"], x["S"]), {}).setdefault(v, []).append(
                f"{x['tflops']:.1f}@{x.get('sm_mhz_median', 0)}")
print(f"{'op':22s} {'S':>6s}  " + " ".join(
    f"{(name + ' (TFLOPS@MHz, by round)') if name == variants[0] else name:34s}" for name in variants))
for (op, s), v in cells.items():
    print(f"{op:22s} {s:6d}  " + " ".join(f"{', '.join(v.get(name, [])):34s}" for name in variants))
