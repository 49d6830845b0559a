"""PyTorch's cuDNN SDPA (dense attention) timed like `fvattn bench` times fvattn: CUDA events,
warm-up, median, input sets rotated when they would fit in L2. Called by `fvattn bench`; prints one
JSON object per shape on stdout: {"shape": i, "S": ..., "fwd_ms": ..., "bwd_ms": ..., "backend":
...}, and around each timed loop (forward, then backward) the markers {"timing": "begin"} and
{"timing": "end"}, at which `fvattn bench` starts and stops sampling the SM clock and power.

usage: bench_sdpa.py --shape B,HQ,HKV,S,D,DTYPE,CAUSAL [--shape ...] [--settle SECONDS]
       bench_sdpa.py B H D S [S ...] [--settle SECONDS]     (bf16, H heads for q, k and v, not causal)
DTYPE is bf16 or f16, CAUSAL 0 or 1; HKV < HQ is grouped-query attention (enable_gqa). A shape
cuDNN's SDPA refuses runs on PyTorch's flash backend, and its "backend" says so.
(--settle: the GPU idles that long before each timed loop's warm-up, as `fvattn bench --settle`
lets it before each of its ops.)
"""
import json
import sys
import time

SETTLE_S = 0.0


def median_ms(fn, warmup, iters):
    import torch
    if SETTLE_S > 0:
        torch.cuda.synchronize()
        time.sleep(SETTLE_S)
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    print(json.dumps({"timing": "begin"}), flush=True)
    for i in range(iters):
        starts[i].record()
        fn(warmup + i)
        ends[i].record()
    torch.cuda.synchronize()
    print(json.dumps({"timing": "end"}), flush=True)
    t = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return t[len(t) // 2]


def parse(args):
    """The shapes as (B, HQ, HKV, S, D, dtype, causal) tuples, and the settle time."""
    settle = 0.0
    if "--settle" in args:
        i = args.index("--settle")
        settle = float(args[i + 1])
        del args[i:i + 2]
    shapes = []
    while "--shape" in args:
        i = args.index("--shape")
        b, hq, hkv, s, d, dtype, causal = args[i + 1].split(",")
        if dtype not in ("bf16", "f16"):
            raise SystemExit(f"bench_sdpa.py: dtype {dtype}: bf16 or f16")
        shapes.append((int(b), int(hq), int(hkv), int(s), int(d), dtype, causal == "1"))
        del args[i:i + 2]
    if args:
        B, H, D = (int(x) for x in args[:3])
        shapes += [(B, H, H, int(S), D, "bf16", False) for S in args[3:]]
    return shapes, settle


def main():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    global SETTLE_S
    shapes, SETTLE_S = parse(sys.argv[1:])
    for index, (B, HQ, HKV, S, D, dtype, causal) in enumerate(shapes):
        dt = torch.bfloat16 if dtype == "bf16" else torch.float16
        per_set = 2 * B * S * D * (2 * HQ + 2 * HKV)
        sets = max(1, min(4, -(-100 * 2**20 // per_set)))  # >= 100 MiB touched per rotation

        def tensor(h, grad=True):
            return torch.randn(B, h, S, D, device="cuda", dtype=dt, requires_grad=grad)

        qkv = [(tensor(HQ), tensor(HKV), tensor(HKV)) for _ in range(sets)]
        dos = [tensor(HQ, False) for _ in range(sets)]
        kw = {"is_causal": causal}
        if HKV != HQ:
            kw["enable_gqa"] = True

        def attend(j):
            q, k, v = qkv[j]
            return F.scaled_dot_product_attention(q, k, v, **kw)

        backend = "cudnn"
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                attend(0)
        except RuntimeError:
            backend = "flash"
        be = SDPBackend.CUDNN_ATTENTION if backend == "cudnn" else SDPBackend.FLASH_ATTENTION
        with sdpa_kernel(be):
            def fwd(i):
                with torch.no_grad():
                    attend(i % sets)
            fwd_ms = median_ms(fwd, 3, 20)
            outs = [attend(j) for j in range(sets)]

            def bwd(i):
                j = i % sets
                torch.autograd.grad(outs[j], qkv[j], dos[j], retain_graph=True)
            bwd_ms = median_ms(bwd, 3, 20)
        print(json.dumps({"shape": index, "S": S, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "backend": backend}),
              flush=True)
        del qkv, dos, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
