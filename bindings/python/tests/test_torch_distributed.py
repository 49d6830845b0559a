"""Sequence parallelism in PyTorch (fvattn.torch.distributed) on CPU tensors over torch.distributed's
gloo backend, 2 and 4 processes: Ulysses around QAT attention (plain and quantized, GQA), VSA from
indices (the lists cut to each rank's heads) and the whole VSA layer with its gate gives the
single-process outputs and gradients bit for bit (on the CPU backend a head's numbers do not depend
on where it runs); ring attention (plain, GQA, causal and not) gives them within SPEC's bound (the
partial outputs are rounded to the dtype before their merge); a head count the group does not divide
and NVFP4-quantized ring attention are refused.

Each world size runs every case in one set of worker processes (spawned once per module, one CPU
backend thread each); the parent computes the single-process results and compares the shards."""
import os
import tempfile
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import fvattn  # noqa: E402
import fvattn.torch as ft  # noqa: E402
from fvattn.torch.distributed import ring_attention, ulysses  # noqa: E402
from conftest import rel_l2  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

WORLDS = (2, 4)
TIMEOUT_S = 240


# ---- the cases: full-size inputs, which of them are sequence-sharded, and the computation ---------
#
# A case is make(n, gen) -> (tensors, seq, grads, call): `tensors` the single-process inputs (by
# name), `seq` the names of those sharded over the sequence (dim 2), `grads` the names whose
# gradients are compared, call(t, group) the outputs (a tuple; the first is differentiated
# through sum(o * w), w a sequence-sharded input) on t: whole with group SINGLE, else the shards
# over `group` (None: the default group).

SINGLE = "single process"


def bf16(gen, *shape):
    return torch.randn(*shape, generator=gen).to(torch.bfloat16)


def qat_case(quantize):
    def make(n, gen):
        B, Hq, Hkv, S, D = 1, 8, 4, 64 * n, 64  # GQA: both head counts split over 2 and 4 ranks
        t = dict(q=bf16(gen, B, Hq, S, D), k=bf16(gen, B, Hkv, S, D), v=bf16(gen, B, Hkv, S, D),
                 w=torch.randn(B, Hq, S, D, generator=gen))
        cfg = fvattn.QatConfig(quantize=quantize)

        def call(t, group):
            f = ft.qat_attention if group is SINGLE else ulysses(ft.qat_attention, group)
            return (f(t["q"], t["k"], t["v"], cfg),)

        return t, ("q", "k", "v", "w"), ("q", "k", "v"), call
    return make


def vsa_indices(n, gen):
    B, H, nq, nkv, k_max, D = 1, 4, 8, 8, 3, 64  # 2 or 4 rows of blocks per rank
    t = dict(q=bf16(gen, B, H, 64 * nq, D), k=bf16(gen, B, H, 64 * nkv, D),
             v=bf16(gen, B, H, 64 * nkv, D), w=torch.randn(B, H, 64 * nq, D, generator=gen))
    perms = torch.stack([torch.randperm(nkv, generator=gen)[:k_max].sort().values
                         for _ in range(B * H * nq)])
    t["q2k_idx"] = perms.reshape(B, H, nq, k_max).to(torch.int32)
    t["q2k_num"] = torch.randint(0, k_max + 1, (B, H, nq), generator=gen, dtype=torch.int32)
    t["sizes"] = torch.tensor([64, 64, 40, 64, 64, 0, 64, 17], dtype=torch.int32)

    def call(t, group):
        f = (ft.block_sparse_attn_from_indices if group is SINGLE
             else ulysses(ft.block_sparse_attn_from_indices, group))
        return f(t["q"], t["k"], t["v"], t["q2k_idx"], t["q2k_num"], t["sizes"])  # (o, lse)

    return t, ("q", "k", "v", "w"), ("q", "k", "v"), call


def vsa_layer(n, gen):
    grid = (4, 8, 8)  # 16 blocks of 64 tokens, some partial: 8 or 4 per rank
    sizes = ft.tile_block_sizes(grid)
    B, H, S, D = 1, 4, 64 * sizes.numel(), 64
    real = (torch.arange(64)[None, :] < sizes[:, None]).reshape(1, 1, S, 1)
    t = {name: bf16(gen, B, H, S, D) * real for name in ("q", "k", "v", "gate")}
    t["w"] = torch.randn(B, H, S, D, generator=gen)
    t["sizes"] = sizes

    def call(t, group):
        f = ft.video_sparse_attn if group is SINGLE else ulysses(ft.video_sparse_attn, group)
        return (f(t["q"], t["k"], t["v"], t["sizes"], t["sizes"], 6, (4, 4, 4),
                  compress_attn_weight=t["gate"]),)

    return t, ("q", "k", "v", "gate", "w"), ("q", "k", "v", "gate"), call


def ring_case(causal):
    def make(n, gen):
        B, Hq, Hkv, S, D = 2, 4, 2, 96 * n, 64  # GQA; 96-token shards: no tile boundary lines up
        t = dict(q=bf16(gen, B, Hq, S, D), k=bf16(gen, B, Hkv, S, D), v=bf16(gen, B, Hkv, S, D),
                 w=torch.randn(B, Hq, S, D, generator=gen))
        cfg = fvattn.QatConfig(quantize=False, causal=causal)

        def call(t, group):
            if group is SINGLE:
                return (ft.qat_attention(t["q"], t["k"], t["v"], cfg),)
            return (ring_attention(t["q"], t["k"], t["v"], cfg, group),)

        return t, ("q", "k", "v", "w"), ("q", "k", "v"), call
    return make


def ring_default(n, gen):
    t = {name: bf16(gen, 1, 2, 64 * n, 64) for name in "qkv"}
    t["w"] = torch.randn(1, 2, 64 * n, 64, generator=gen)

    def call(t, group):
        if group is SINGLE:
            return (ft.qat_attention(t["q"], t["k"], t["v"], fvattn.QatConfig(quantize=False)),)
        return (ring_attention(t["q"], t["k"], t["v"]),)  # no config: plain, non-causal attention

    return t, ("q", "k", "v", "w"), ("q", "k", "v"), call


CASES = {
    "ulysses_qat_plain": qat_case(False),
    "ulysses_qat_quantized": qat_case(True),
    "ulysses_vsa_indices": vsa_indices,
    "ulysses_vsa_layer_gate": vsa_layer,
    "ring_plain": ring_case(False),
    "ring_causal": ring_case(True),
    "ring_default": ring_default,
}


SUBGROUP_CASES = ("ulysses_vsa_indices", "ring_causal")


def inputs(case, n):
    gen = torch.Generator().manual_seed(sorted(CASES).index(case) * 10 + n)
    return CASES[case](n, gen)


def compute(case, n, rank=None, group=None):
    """The case's outputs and gradients: single-process (rank None) or the shards of rank `rank`
    of `group` (n ranks; None: the default group)."""
    t, seq, grads, call = inputs(case, n)
    if rank is not None:
        t = {name: x.chunk(n, dim=2)[rank].contiguous() if name in seq else x for name, x in t.items()}
    for name in grads:
        t[name] = t[name].detach().requires_grad_()
    out = call(t, SINGLE if rank is None else group)
    (out[0].float() * t["w"]).sum().backward()
    result = {f"out{i}": o.detach() for i, o in enumerate(out)}
    result.update({"d" + name: t[name].grad for name in grads})
    return result


def refusals():
    """The errors of a head count the group does not divide (6 heads, 4 ranks) and of quantized
    ring attention, as text."""
    got = {}
    q = torch.zeros(1, 6, 64, 64, dtype=torch.bfloat16)
    idx = torch.zeros(1, 6, 4, 1, dtype=torch.int32)
    for name, f in (
            ("ulysses_heads", lambda: ulysses(ft.qat_attention)(q, q, q, fvattn.QatConfig())),
            ("ulysses_head_args", lambda: ulysses(ft.block_sparse_attn_from_indices)(
                q[:, :4], q[:, :4], q[:, :4], idx, idx[..., 0], torch.full((4,), 64, dtype=torch.int32))),
            ("ring_quantized", lambda: ring_attention(q, q, q, fvattn.QatConfig(quantize=True)))):
        try:
            f()
            got[name] = None
        except fvattn.Error as e:
            got[name] = str(e)
    return got


def worker(rank, n, init_file, outdir):
    os.environ["FVATTN_NUM_THREADS"] = "1"  # n processes share CI's two cores
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=n)
    try:
        results = {}
        for case in CASES:
            start = time.perf_counter()
            results[case] = compute(case, n, rank)
            results[case]["seconds"] = time.perf_counter() - start
        if n == 4:
            results["refusals"] = refusals()
            # Process groups other than the default one: ranks {0, 2} and {1, 3}, each a group
            # of 2 (every rank creates every group), peers named by their global ranks.
            groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
            mine = groups[rank % 2]
            for case in SUBGROUP_CASES:
                results["subgroup " + case] = compute(case, 2, dist.get_rank(mine), mine)
        dist.barrier()
        torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


_results = {}


def results_of(n):
    """Every case's shards from n gloo processes: a list of per-rank result dicts."""
    if n not in _results:
        with tempfile.TemporaryDirectory() as d:
            init_file = os.path.join(d, "init")
            ctx = mp.start_processes(worker, args=(n, init_file, d), nprocs=n, join=False,
                                     start_method="spawn")
            deadline = time.monotonic() + TIMEOUT_S
            try:
                while not ctx.join(timeout=1):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{n} gloo workers did not finish in {TIMEOUT_S} s")
            finally:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
            _results[n] = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(n)]
    return _results[n]


def t64(x):
    return x.detach().to(torch.float64).numpy()


def gathered(shards, key):
    """The ranks' values of `key` (an output or an input's gradient) as one tensor: their sequence
    shards joined along dim 2."""
    return torch.cat([s[key] for s in shards], dim=2)


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("case", ["ulysses_qat_plain", "ulysses_qat_quantized", "ulysses_vsa_indices",
                                  "ulysses_vsa_layer_gate"])
def test_ulysses_equals_one_process(n, case):
    shards = [r[case] for r in results_of(n)]
    one = compute(case, n)
    for key, want in one.items():
        got = gathered(shards, key)
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert torch.equal(got, want), f"{key}: relative L2 {rel_l2(t64(got), t64(want)):.3g}"


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("case", ["ring_plain", "ring_causal", "ring_default"])
def test_ring_equals_one_process(n, case):
    shards = [r[case] for r in results_of(n)]
    one = compute(case, n)
    for key, want in one.items():
        got = gathered(shards, key)
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert np.isfinite(t64(got)).all(), key
        assert rel_l2(t64(got), t64(want)) <= 1e-2, key  # SPEC section 4's o, dq, dk, dv bound


@pytest.mark.parametrize("case", SUBGROUP_CASES)
def test_process_group_other_than_the_default(case):
    res = results_of(4)
    one = compute(case, 2)
    for members in ((0, 2), (1, 3)):
        shards = [res[r]["subgroup " + case] for r in members]
        for key, want in one.items():
            got = gathered(shards, key)
            if case.startswith("ulysses"):
                assert torch.equal(got, want), key
            else:
                assert rel_l2(t64(got), t64(want)) <= 1e-2, key


def test_refusals():
    got = results_of(4)[0]["refusals"]
    assert "6 heads" in got["ulysses_heads"] and "4 ranks" in got["ulysses_heads"]
    assert "6 heads" in got["ulysses_head_args"]
    assert "quantize" in got["ring_quantized"] and "running maximum" in got["ring_quantized"]


def test_quantized_ring_is_refused_before_any_communication():
    q = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(fvattn.Error, match="quantize"):
        ring_attention(q, q, q, fvattn.QatConfig())  # no process group here: refused first
