"""PyTorch's cuDNN SDPA (dense bf16) timed like `fvattn bench` times fvattn: CUDA events, warm-up,
median, input sets rotated when they would fit in L2. Called by `fvattn bench`; prints one JSON
object per shape on stdout: {"S": ..., "fwd_ms": ..., "bwd_ms": ..., "backend": ...}, and around
each timed loop (forward, then backward) the markers {"timing": "begin"} and {"timing": "end"}, at
which `fvattn bench` starts and stops sampling the SM clock and power.

usage: bench_sdpa.py B H D S [S ...] [--settle SECONDS]
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


def main():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    global SETTLE_S
    args = sys.argv[1:]
    if "--settle" in args:
        i = args.index("--settle")
        SETTLE_S = float(args[i + 1])
        del args[i:i + 2]
    B, H, D = (int(x) for x in args[:3])
    for S in (int(x) for x in args[3:]):
        per_set = 4 * B * H * S * D * 2
        sets = max(1, min(4, -(-100 * 2**20 // per_set)))  # >= 100 MiB touched per rotation
        qs = [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for _ in range(3 * sets)]
        dos = [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        backend = "cudnn"
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qs[0], qs[1], qs[2])
        except RuntimeError:
            backend = "flash"
        be = SDPBackend.CUDNN_ATTENTION if backend == "cudnn" else SDPBackend.FLASH_ATTENTION
        with sdpa_kernel(be):
            def fwd(i):
                j = i % sets
                with torch.no_grad():
                    F.scaled_dot_product_attention(qs[3 * j], qs[3 * j + 1], qs[3 * j + 2])
            fwd_ms = median_ms(fwd, 3, 20)
            outs = [F.scaled_dot_product_attention(qs[3 * j], qs[3 * j + 1], qs[3 * j + 2])
                    for j in range(sets)]

            def bwd(i):
                j = i % sets
                torch.autograd.grad(outs[j], (qs[3 * j], qs[3 * j + 1], qs[3 * j + 2]), dos[j],
                                    retain_graph=True)
            bwd_ms = median_ms(bwd, 3, 20)
        print(json.dumps({"S": S, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "backend": backend}), flush=True)
        del qs, dos, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
