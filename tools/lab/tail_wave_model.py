#!/usr/bin/env python3
"""The last wave of a grid of equal blocks, and what sharing it among tail workers buys.

A model, no GPU: `slots` resident blocks (528: the H200's 132 SMs x 4 VSA forward blocks) take the
grid's blocks in index order as they free up (the hardware's block scheduler). Each block takes 1
(its mean time) times 1 + N(0, sigma).

Calibration: on the H200 a grid of 2112 q blocks (S = 16896, four full waves) runs the VSA forward
2.3% faster per FLOP than 2048 (S = 16384, 3.88 waves). The model gives +1.7% at sigma 0.03, +0.8%
at 0.05 and nothing at 0.07: the blocks' times in one slot vary by about 3%. (The spread across SMs
that tools/lab/vsa_fwd_timeline.cu shows, about +-9% between p10 and p90, includes what is the same
for every block of an SM.)

Three grids for `blocks` q blocks (2048 at S = 16384, 4096 at 32768, B = 1, H = 8):
  none   the blocks as they are;
  last   the last partial wave's `tail` blocks shared among `slots` workers of tail / slots of a
         block each plus an overhead c (a second segment's start, the pieces' stores and merge),
         placed after the whole blocks (a stream-K style tail);
  first  the same workers placed before the whole blocks (all of them start at once).
Prints the calibration, then the mean makespan of each grid over `reps` draws and the split's gain
against none. At sigma 0.03 the split gains about 1% with an overhead of 0.03 of a block (2 of its
64 tiles) and nothing at 0.08, in either order: less than a tail worker's merge costs, which is why
the VSA forward keeps the hardware's scheduling of its last wave.
"""
import heapq
import random
import statistics
import sys


def makespan(jobs, slots):
    free = [(0.0, i) for i in range(slots)]
    heapq.heapify(free)
    end = 0.0
    for d in jobs:
        t, i = heapq.heappop(free)
        t += d
        end = max(end, t)
        heapq.heappush(free, (t, i))
    return end


def simulate(blocks, sigma, overhead, order, slots=528, reps=200, seed=1):
    rng = random.Random(seed)
    tail = blocks % slots
    spans = []
    for _ in range(reps):
        noisy = lambda x: x * (1.0 + rng.gauss(0.0, sigma))
        if order == "none" or tail == 0:
            spans.append(makespan([noisy(1.0) for _ in range(blocks)], slots))
            continue
        whole = [noisy(1.0) for _ in range(blocks - tail)]
        workers = [noisy(tail / slots) + overhead for _ in range(slots)]
        spans.append(makespan(whole + workers if order == "last" else workers + whole, slots))
    return statistics.mean(spans)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    for sigma in (0.03, 0.05, 0.07):
        a, b = simulate(2048, sigma, 0.0, "none", reps=reps), simulate(2112, sigma, 0.0, "none", reps=reps)
        print(f"calibration, sigma {sigma:.2f}: 2112 blocks against 2048, per block "
              f"{((2112 / b) / (2048 / a) - 1) * 100:+.1f}% (measured: +2.3%)")
    for sigma in (0.03, 0.07, 0.10):
        for blocks, label in ((2048, "S=16384"), (4096, "S=32768")):
            base = simulate(blocks, sigma, 0.0, "none", reps=reps)
            row = [f"sigma {sigma:.2f} {label}: none {base:.3f}"]
            for c in (0.03, 0.08):
                for order in ("last", "first"):
                    v = simulate(blocks, sigma, c, order, reps=reps)
                    row.append(f"{order} c={c}: {v:.3f} ({(base / v - 1) * 100:+.1f}%)")
            print(" | ".join(row))


if __name__ == "__main__":
    main()
