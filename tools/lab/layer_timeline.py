#!/usr/bin/env python3
"""When each kernel of one VSA layer call starts and ends on the GPU, and so which kernels overlap
(the launch chain's programmatic launches, kernels beside kernels), ON THE GPU MACHINE from the
repository root after a build (tools/gpu-check's, or tools/device/ab_check.sh's).

torch.profiler (CUPTI's concurrent-kernel records, which see the library's driver-API launches as
well as torch's) records a few forward + backward calls of fvattn.torch.video_sparse_attn with a
gate; the last call's kernels (its forward and its backward, the last two groups of kernels between
gaps) are printed in start order, each with its start and end relative to the first kernel of its
group and its duration, in microseconds. ncu times kernels one at a
time and cannot show this.

    python3 tools/lab/layer_timeline.py [--lib build-gpu/src/libfvattn.so.1] [--grid 8,30,52]
        [--heads 12] [--topk 26] [--calls 5] [--groups 2] [--json out.json]
"""
import argparse
import json
import os
import sys
import tempfile

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--lib", default="build-gpu/src/libfvattn.so.1")
parser.add_argument("--grid", default="8,30,52", help="T,H,W of the token grid")
parser.add_argument("--heads", type=int, default=12)
parser.add_argument("--topk", type=int, default=26)
parser.add_argument("--calls", type=int, default=5, help="forward + backward calls; the last is shown")
parser.add_argument("--groups", type=int, default=2,
                    help="groups of kernels (split at gaps of 50 us) to print, the last ones")
parser.add_argument("--json", help="also write the printed groups' kernels here")
args = parser.parse_args()

os.environ["FVATTN_LIBRARY"] = os.path.abspath(args.lib)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import fvattn.torch as ft  # noqa: E402

grid = tuple(int(x) for x in args.grid.split(","))
sizes = ft.tile_block_sizes(grid, device="cuda")
S = sizes.numel() * 64
torch.manual_seed(0)
shape = (1, args.heads, S, 128)
q, k, v, gate = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(4))
dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)


def call():
    for x in (q, k, v, gate):
        x.grad = None  # no accumulation kernels after the backward
    out = ft.video_sparse_attn(q, k, v, sizes, sizes, args.topk, 64, gate)
    out.backward(dout)


for _ in range(2):  # warm-up: modules loaded, workspaces allocated
    call()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(args.calls):
        torch.cuda.synchronize()
        call()
        torch.cuda.synchronize()
trace = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(trace)
events = json.load(open(trace))["traceEvents"]
kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
# The calls are separated by synchronizations: split at gaps of more than 50 us between kernels.
calls, current, last_end = [], [], None
for e in kernels:
    if last_end is not None and e["ts"] - last_end > 50 and current:
        calls.append(current)
        current = []
    current.append(e)
    last_end = max(last_end or 0, e["ts"] + e["dur"])
if current:
    calls.append(current)
# The last groups: the last call's backward, and before it its forward (the autograd's host work
# between them usually leaves a gap, so the forward is a group of its own).
print(f"VSA layer {args.grid}, H = {args.heads}, S = {S}, topk {args.topk}: the last {args.groups} of "
      f"{len(calls)} groups of kernels ({torch.cuda.get_device_name()}), microseconds from each "
      f"group's first kernel")
rows = []
for index, group in enumerate(calls[-args.groups:]):
    t0 = group[0]["ts"]
    print(f"group {index - min(args.groups, len(calls))}\n{'start':>9} {'end':>9} {'dur':>8}  kernel")
    for e in group:
        start, dur = e["ts"] - t0, e["dur"]
        name = e["name"].split("(")[0]
        rows.append({"group": index, "name": name, "start_us": start, "dur_us": dur})
        print(f"{start:9.1f} {start + dur:9.1f} {dur:8.1f}  {name}")
    span = max(r["start_us"] + r["dur_us"] for r in rows if r["group"] == index)
    print(f"span {span:.1f} us")
if args.json:
    json.dump(rows, open(args.json, "w"), indent=1)
