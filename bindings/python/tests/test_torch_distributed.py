"""Sequence parallelism in PyTorch (fvattn.torch.distributed) on CPU tensors over torch.distributed's
gloo backend, 2 and 4 processes: Ulysses around QAT attention (plain and quantized, GQA), VSA from
indices (the lists cut to each rank's heads) and the whole VSA layer with its gate gives the
single-process outputs and gradients bit for bit (on the CPU backend a head's numbers do not depend
on where it runs); ring attention (plain, GQA, causal and not) gives them within SPEC's bound (the
partial outputs are rounded to the dtype before their merge); a head count the group does not divide
and NVFP4-quantized ring attention are refused. Under torch.compile(fullgraph=True,
backend="aot_eager") both trace as one graph (torch._dynamo.explain: no graph breaks) and give the
eager shards, outputs and gradients, bit for bit; torch.library.opcheck passes on the ring's custom
ops over a real gloo group.

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
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

import fvattn  # noqa: E402
import fvattn.torch as ft  # noqa: E402
from fvattn.torch import _qat_op_args  # noqa: E402
from fvattn.torch.distributed import CUSTOM_OPS, ring_attention, ulysses  # noqa: E402
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

# The cases also run under torch.compile(fullgraph=True), by world size ("subgroup ..." on the
# groups of 2 of the 4 processes), and those traced by torch._dynamo.explain (2 processes).
COMPILED_CASES = {2: ("ulysses_qat_plain", "ulysses_vsa_layer_gate", "ring_causal", "ring_default"),
                  4: ("ulysses_qat_quantized", "ring_plain", "subgroup ring_causal")}
EXPLAINED_CASES = ("ulysses_qat_plain", "ring_causal")


def inputs(case, n):
    gen = torch.Generator().manual_seed(sorted(CASES).index(case) * 10 + n)
    return CASES[case](n, gen)


def shards(case, n, rank):
    """The case's inputs as rank `rank` of n holds them (rank None: whole), and its call."""
    t, seq, grads, call = inputs(case, n)
    if rank is not None:
        t = {name: x.chunk(n, dim=2)[rank].contiguous() if name in seq else x for name, x in t.items()}
    return t, grads, call


def compute(case, n, rank=None, group=None, compiled=None):
    """The case's outputs and gradients: single-process (rank None) or the shards of rank `rank`
    of `group` (n ranks; None: the default group). With `compiled` (a dict) the call runs under
    torch.compile(fullgraph=True) with the aot_eager backend, the graphs it compiles counted in
    compiled["graphs"]."""
    t, grads, call = shards(case, n, rank)
    for name in grads:
        t[name] = t[name].detach().requires_grad_()
    group = SINGLE if rank is None else group
    if compiled is None:
        out = call(t, group)
    else:
        torch._dynamo.reset()  # a fresh cache: no case reuses another's graphs or meets a limit
        backend = CompileCounterWithBackend("aot_eager")
        out = torch.compile(lambda t: call(t, group), fullgraph=True, backend=backend)(t)
    (out[0].float() * t["w"]).sum().backward()
    if compiled is not None:
        compiled["graphs"] = backend.frame_count
    result = {f"out{i}": o.detach() for i, o in enumerate(out)}
    result.update({"d" + name: t[name].grad for name in grads})
    return result


def explain(case, n, rank):
    """torch._dynamo.explain of the case's forward on rank `rank`'s shards over the default group:
    its graph and graph-break counts, the break reasons as text, and the collectives and fvattn ops
    its graphs call."""
    t, _, call = shards(case, n, rank)
    torch._dynamo.reset()
    # explain counts no break that comes before a frame's first traced op, so the traced function
    # clones the inputs first: a break anywhere in the call then splits a graph and is counted.
    got = torch._dynamo.explain(lambda t: call({name: x.clone() for name, x in t.items()}, None))(t)
    targets = {str(node.target) for g in got.graphs for node in g.graph.nodes
               if node.op == "call_function"}
    return dict(graphs=got.graph_count, breaks=got.graph_break_count,
                reasons=[str(r.reason) for r in got.break_reasons],
                ops=sorted(x for x in targets if x.startswith(("fvattn.", "_c10d_functional."))))


def ring_opchecks(rank):
    """torch.library.opcheck on the ring's custom ops over the default group of 2 (every rank runs
    the same checks, each op call a ring exchange): {sample: opcheck's results, or its error as
    text}."""
    forward, backward = CUSTOM_OPS
    t, _, _ = shards("ring_causal", 2, rank)
    q, k, v = t["q"], t["k"], t["v"]
    dout = t["w"].to(q.dtype)
    got = {}
    for causal in (False, True):
        config = (dist.group.WORLD.group_name,) + _qat_op_args(
            fvattn.QatConfig(quantize=False, causal=causal))
        o, lse = forward(q, k, v, *config)
        for name, op, args in (
                ("forward", forward, [x.detach().clone().requires_grad_() for x in (q, k, v)]),
                ("backward", backward, [q, k, v, o, lse, dout])):
            try:
                got[f"{name} causal={causal}"] = torch.library.opcheck(op, tuple(args) + config)
            except Exception as e:  # noqa: BLE001 - reported by the test, not here
                got[f"{name} causal={causal}"] = f"{type(e).__name__}: {e}"
    return got


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


def compile_case(case, n, rank, group, results):
    """Runs the case compiled into results["compiled " + case] (a subgroup's case: results[
    "compiled subgroup " + case]); returns its compile stats, or the error as text (a trace fails
    on every rank alike, before any exchange, so the other cases still run)."""
    stats = {}
    key = "compiled " + ("subgroup " if group is not None else "") + case
    try:
        results[key] = compute(case, n, rank, group, compiled=stats)
    except Exception as e:  # noqa: BLE001 - reported by the test, not here
        return f"{type(e).__name__}: {e}"
    return stats


def worker(rank, n, init_file, outdir):
    os.environ["FVATTN_NUM_THREADS"] = "1"  # n processes share CI's two cores
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=n)
    try:
        results = {}
        for case in CASES:
            start = time.perf_counter()
            results[case] = compute(case, n, rank)
            results[case]["seconds"] = time.perf_counter() - start
        results["compile"] = {}
        for case in COMPILED_CASES[n]:
            if not case.startswith("subgroup "):
                results["compile"][case] = compile_case(case, n, rank, None, results)
        if n == 2:
            results["explain"] = {case: explain(case, n, rank) for case in EXPLAINED_CASES}
            results["opcheck"] = ring_opchecks(rank)
        if n == 4:
            results["refusals"] = refusals()
            # Process groups other than the default one: ranks {0, 2} and {1, 3}, each a group
            # of 2 (every rank creates every group), peers named by their global ranks.
            groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
            mine = groups[rank % 2]
            for case in SUBGROUP_CASES:
                results["subgroup " + case] = compute(case, 2, dist.get_rank(mine), mine)
                if "subgroup " + case in COMPILED_CASES[n]:
                    results["compile"]["subgroup " + case] = compile_case(case, 2, dist.get_rank(mine),
                                                                          mine, results)
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


def against_one_process(n, case):
    """(key, the ranks' values gathered, the single process's) for every output and gradient of
    `case` run by n ranks, each pair checked for equal dtype and shape."""
    shards = [r[case] for r in results_of(n)]
    for key, want in compute(case, n).items():
        got = gathered(shards, key)
        assert got.dtype == want.dtype and got.shape == want.shape, key
        yield key, got, want


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("case", ["ulysses_qat_plain", "ulysses_qat_quantized", "ulysses_vsa_indices",
                                  "ulysses_vsa_layer_gate"])
def test_ulysses_equals_one_process(n, case):
    for key, got, want in against_one_process(n, case):
        assert torch.equal(got, want), f"{key}: relative L2 {rel_l2(t64(got), t64(want)):.3g}"


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("case", ["ring_plain", "ring_causal", "ring_default"])
def test_ring_equals_one_process(n, case):
    for key, got, want in against_one_process(n, case):
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


# ---- torch.compile ------------------------------------------------------------------------------


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("n,case", [(n, case) for n in WORLDS for case in COMPILED_CASES[n]])
def test_compiled_equals_eager(n, case):
    for rank, res in enumerate(results_of(n)):
        stats = res["compile"][case]
        assert isinstance(stats, dict) and stats["graphs"] == 1, (rank, stats)
        eager, compiled = res[case], res["compiled " + case]
        keys = {key for key, x in eager.items() if isinstance(x, torch.Tensor)}
        assert keys == set(compiled), (rank, keys, set(compiled))
        for key in sorted(keys):
            assert same_bits(compiled[key], eager[key]), (
                f"rank {rank} {key}: relative L2 {rel_l2(t64(compiled[key]), t64(eager[key])):.3g}")


@pytest.mark.parametrize("case", EXPLAINED_CASES)
def test_no_graph_breaks(case):
    for rank, res in enumerate(results_of(2)):
        got = res["explain"][case]
        assert got["breaks"] == 0 and got["graphs"] == 1, (rank, got["reasons"])
        if case.startswith("ring"):
            # One node: the ring's forward op, its exchanges inside.
            assert got["ops"] == ["fvattn.ring_forward.default"], (rank, got["ops"])
        else:
            # The all-to-alls of q, k, v and o are nodes of the graph, around the op.
            assert "fvattn.qat_forward.default" in got["ops"], (rank, got["ops"])
            assert "_c10d_functional.all_to_all_single" in got["ops"], (rank, got["ops"])


def test_ring_opcheck():
    assert {op._qualname for op in CUSTOM_OPS} == {"fvattn::ring_forward", "fvattn::ring_backward"}
    for rank, res in enumerate(results_of(2)):
        assert len(res["opcheck"]) == 4
        for sample, got in res["opcheck"].items():
            assert isinstance(got, dict) and set(got.values()) == {"SUCCESS"}, (rank, sample, got)
