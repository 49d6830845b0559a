"""The whole VSA layer, forward + backward, three ways in one run on one GPU: fvattn
(`fvattn.torch.video_sparse_attn`), FastVideo's own `video_sparse_attn` on its Triton path, and
PyTorch's cuDNN SDPA (dense, the same B, H, S, D) beside them. Timed as `fvattn bench` times: CUDA
events, warm-up calls, the median of the timed calls, input sets rotated so that one rotation touches
at least 100 MiB (no call finds its inputs in the L2 from the call before).

usage: bench_fastvideo_layer.py --fastvideo DIR [--grid T,H,W] [--heads H] [--topk K] [--gate 0|1]
                                [--warmup N] [--iters N] [--json FILE]

DIR is FastVideo's `fastvideo-kernel/python` folder from a checkout the caller supplies; it is run, not
part of fvattn. Its package `__init__` (which imports optional extras) is bypassed: only its `ops`
module and what that imports are loaded, and FASTVIDEO_VSA_TRITON=1 pins its Triton path.
fvattn is loaded as its bindings load it (FVATTN_LIBRARY, PYTHONPATH=bindings/python).

Before timing, both layers run once on the same inputs and the script prints how far apart their
outputs and gradients are (a sanity check, not a test: the tests compare against golden/ and the CPU
backend). Rows: one per implementation, forward ms, forward + backward ms, and fvattn's speed-up.
"""
import argparse
import json
import os
import sys
import types


def load_fastvideo(path):
    os.environ["FASTVIDEO_VSA_TRITON"] = "1"
    pkg_dir = os.path.join(os.path.abspath(path), "fastvideo_kernel")
    if not os.path.isdir(pkg_dir):
        sys.exit(f"bench_fastvideo_layer.py: {pkg_dir} is not a folder (pass fastvideo-kernel/python)")
    pkg = types.ModuleType("fastvideo_kernel")
    pkg.__path__ = [pkg_dir]
    sys.modules["fastvideo_kernel"] = pkg
    from fastvideo_kernel.ops import video_sparse_attn  # noqa: E402
    return video_sparse_attn


def median_ms(fn, warmup, iters):
    import torch
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(warmup + i)
        ends[i].record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return t[len(t) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fastvideo", required=True, help="FastVideo's fastvideo-kernel/python folder")
    ap.add_argument("--grid", default="21,30,52", help="latent T,H,W (default Wan2.1 81 frames 480p)")
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--topk", type=int, default=78)
    ap.add_argument("--gate", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import fvattn.torch as fvt

    fv_layer = load_fastvideo(a.fastvideo)
    grid = tuple(int(x) for x in a.grid.split(","))
    dev = torch.device("cuda")
    sizes = fvt.tile_block_sizes(grid, device=dev)
    nblocks = sizes.numel()
    B, H, D, S = 1, a.heads, a.dim, 64 * nblocks
    # Padding slots are zero, as FastVideo's tiling leaves them.
    slot_real = (torch.arange(64, device=dev)[None, :] < sizes[:, None]).reshape(S)

    def tensor(grad):
        x = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) * slot_real[:, None]
        return x.requires_grad_(grad)

    per_set = 5 * B * H * S * D * 2
    sets = max(1, min(4, -(-100 * 2**20 // per_set)))
    inputs = [dict(q=tensor(True), k=tensor(True), v=tensor(True),
                   gate=tensor(True) if a.gate else None, dout=tensor(False)) for _ in range(sets)]

    def call(impl, x):
        fn = fvt.video_sparse_attn if impl == "fvattn" else fv_layer
        # block_size (4, 4, 4): FastVideo reads an int n as an n x n x n tile.
        return fn(x["q"], x["k"], x["v"], sizes, sizes, a.topk, (4, 4, 4), x["gate"])

    def grads_of(x):
        return [t for t in (x["q"], x["k"], x["v"], x["gate"]) if t is not None]

    # Sanity: both on set 0.
    got = {}
    for impl in ("fvattn", "fastvideo"):
        out = call(impl, inputs[0])
        g = torch.autograd.grad(out, grads_of(inputs[0]), inputs[0]["dout"])
        got[impl] = [out] + list(g)
    names = ["out", "dq", "dk", "dv", "dgate"]
    for n, x, y in zip(names, got["fvattn"], got["fastvideo"]):
        diff = (x.float() - y.float()).abs().max().item()
        nan = bool(torch.isnan(x).any().item())
        print(f"agreement {n:<5}: max |fvattn - fastvideo| = {diff:.3e}, fvattn NaN: {nan}")
    del got, out, g
    torch.cuda.empty_cache()

    rows = {}
    for impl in ("fvattn", "fastvideo"):
        def fwd(i, impl=impl):
            with torch.no_grad():
                call(impl, inputs[i % sets])

        def fwd_bwd(i, impl=impl):
            x = inputs[i % sets]
            out = call(impl, x)
            torch.autograd.grad(out, grads_of(x), x["dout"])
        rows[impl] = (median_ms(fwd, a.warmup, a.iters), median_ms(fwd_bwd, a.warmup, a.iters))
    q, k, v = (inputs[0][n] for n in ("q", "k", "v"))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        def sdpa_fwd(i):
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v)

        def sdpa_fwd_bwd(i):
            out = F.scaled_dot_product_attention(q, k, v)
            torch.autograd.grad(out, (q, k, v), inputs[0]["dout"])
        rows["sdpa_cudnn_dense"] = (median_ms(sdpa_fwd, a.warmup, a.iters),
                                    median_ms(sdpa_fwd_bwd, a.warmup, a.iters))

    name = torch.cuda.get_device_name()
    print(f"{name}: grid {grid}, {nblocks} blocks (S={S}), B={B} H={H} D={D}, topk {a.topk}, "
          f"gate {bool(a.gate)}, bf16; median of {a.iters} after {a.warmup} warm-up, {sets} input set(s)")
    print(f"{'implementation':<20} {'fwd ms':>9} {'fwd+bwd ms':>11} {'fvattn speed-up (fwd+bwd)':>26}")
    for impl, (f, fb) in rows.items():
        print(f"{impl:<20} {f:>9.3f} {fb:>11.3f} {fb / rows['fvattn'][1]:>25.2f}x")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": name, "grid": grid, "blocks": nblocks, "B": B, "H": H, "D": D,
                       "topk": a.topk, "gate": bool(a.gate), "iters": a.iters, "warmup": a.warmup,
                       "rows": {k: {"fwd_ms": f, "fwd_bwd_ms": fb} for k, (f, fb) in rows.items()}},
                      fh, indent=1)


if __name__ == "__main__":
    main()
