"""fvattn.torch under torch.compile, on CPU tensors (the CPU backend): the public functions trace with
fullgraph=True and no graph breaks, compiled forward and gradients equal eager's bit for bit (the
same library calls), eager equals the functional layer (fvattn.ops) bit for bit, and
torch.library.opcheck passes on every custom op (schema, fake implementation, autograd
registration, AOT dispatch with static and dynamic shapes)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import fvattn  # noqa: E402
import fvattn.torch as ft  # noqa: E402
from fvattn.torch import _custom_ops as C  # noqa: E402
from fvattn import _frameworks  # noqa: E402

def randn(*shape, seed, dtype=torch.bfloat16, grad=True):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).requires_grad_(grad)


# ---- the three public functions and their problems -----------------------------------------------


def qat_problem():
    return [randn(1, 2, 128, 64, seed=s) for s in (1, 2, 3)], {}


def vsa_problem():
    q, k, v = (randn(1, 2, 128, 64, seed=s) for s in (4, 5, 6))
    # int64 metadata as FastVideo may pass it (the function converts to int32 inside the graph).
    idx = torch.tensor([[[[1, 0], [0, -1]], [[0, 1], [1, -1]]]], dtype=torch.int64)
    num = torch.tensor([[[2, 1], [2, 1]]], dtype=torch.int64)
    bs = torch.tensor([64, 40], dtype=torch.int64)
    return [q, k, v], dict(q2k_idx=idx, q2k_num=num, variable_block_sizes=bs)


def layer_problem(gated):
    q, k, v = (randn(1, 2, 128, 64, seed=s) for s in (7, 8, 9))
    args = [q, k, v] + ([randn(1, 2, 128, 64, seed=10)] if gated else [])
    return args, dict(variable_block_sizes=torch.tensor([64, 40]), q_variable_block_sizes=torch.tensor([64, 9]))


def qat_fn(q, k, v):
    return ft.attention(q, k, v, False, 0.125)


def qat_plain_causal_fn(q, k, v):
    return ft.attention(q, k, v, True, 0.125, IS_QAT=False, smooth_k=False, use_high_prec_o=True)


def qat_config_fn(q, k, v):
    return ft.qat_attention(q, k, v, fvattn.QatConfig(causal=True, qkv_scale="tile", p_scale="row"))


def make_vsa_fn(meta):
    def vsa_fn(q, k, v):
        o, lse = ft.block_sparse_attn_from_indices(q, k, v, meta["q2k_idx"], meta["q2k_num"],
                                                   meta["variable_block_sizes"])
        return o, lse
    return vsa_fn


def make_layer_fn(meta):
    def layer_fn(q, k, v, gate=None):
        return ft.video_sparse_attn(q, k, v, meta["variable_block_sizes"], meta["q_variable_block_sizes"],
                                    1, block_size=(4, 4, 4), compress_attn_weight=gate)
    return layer_fn


def cases():
    (qkv, _), (vqkv, vmeta) = qat_problem(), vsa_problem()
    (lg, lmeta), (ln, nmeta) = layer_problem(True), layer_problem(False)
    return {"attention": (qat_fn, qkv), "attention_plain_causal_hp_o": (qat_plain_causal_fn, qkv),
            "qat_attention_config": (qat_config_fn, qkv), "block_sparse_attn_from_indices":
            (make_vsa_fn(vmeta), vqkv), "video_sparse_attn_gated": (make_layer_fn(lmeta), lg),
            "video_sparse_attn": (make_layer_fn(nmeta), ln)}


CASES = list(cases())


def run(fn, leaves, seed=11):
    """fn's outputs and the gradients of sum(o * w) over the leaves, all detached."""
    leaves = [x.detach().clone().requires_grad_() for x in leaves]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    w = randn(*outs[0].shape, seed=seed, dtype=torch.float32, grad=False)
    (outs[0].float() * w).sum().backward()
    return [o.detach() for o in outs], [x.grad for x in leaves]


def assert_same_bits(got, want, what):
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        assert a is not None and b is not None, f"{what}[{i}]"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}[{i}]"
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.uint8) if b.dtype == torch.bfloat16 else b), f"{what}[{i}]"


@pytest.mark.parametrize("case", CASES)
def test_no_graph_breaks(case):
    fn, leaves = cases()[case]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*leaves)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    # Each fvattn call is one node of the graph: the custom op.
    ops_seen = {str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any(name.startswith("fvattn.") for name in ops_seen), ops_seen


# inductor on one case of each public function: its first CPU compile builds C++ (seconds each).
INDUCTOR_CASES = ["attention", "block_sparse_attn_from_indices", "video_sparse_attn_gated"]


@pytest.mark.parametrize("case,backend", [(c, "aot_eager") for c in CASES] +
                         [(c, "inductor") for c in INDUCTOR_CASES])
def test_compiled_equals_eager(case, backend):
    fn, leaves = cases()[case]
    torch._dynamo.reset()
    want_out, want_grads = run(fn, leaves)
    got_out, got_grads = run(torch.compile(fn, fullgraph=True, backend=backend), leaves)
    assert_same_bits(got_out, want_out, "outputs")
    assert_same_bits(got_grads, want_grads, "gradients")


@pytest.mark.parametrize("case", INDUCTOR_CASES)
def test_compiled_with_dynamic_shapes(case):
    # Under dynamic shapes the layer's fake implementation cannot ask the library for the reserve's
    # size (a function of concrete shapes) and gives it a symbolic one; the results are the same.
    fn, leaves = cases()[case]
    torch._dynamo.reset()
    want_out, want_grads = run(fn, leaves)
    got_out, got_grads = run(torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True), leaves)
    assert_same_bits(got_out, want_out, "outputs")
    assert_same_bits(got_grads, want_grads, "gradients")


# ---- eager equals the functional layer (what the former autograd.Functions called) ---------------


def test_attention_equals_the_functional_layer():
    (q, k, v), _ = qat_problem()
    out, grads = run(qat_plain_causal_fn, [q, k, v])
    cfg = fvattn.QatConfig(softmax_scale=0.125, causal=True, quantize=False, smooth_k=False,
                           qkv_scale="tile", p_scale="row", high_precision_o=True)
    qd, kd, vd = (x.detach() for x in (q, k, v))
    o, o_hp, lse = fvattn.ops.qat_attention_forward(qd, kd, vd, cfg)
    w = randn(*o.shape, seed=11, dtype=torch.float32, grad=False)
    dout = w.to(torch.bfloat16)  # d(sum(o.float() * w))/do, rounded to o's dtype as autograd does
    want = fvattn.ops.qat_attention_backward(qd, kd, vd, o_hp, lse, dout, cfg)
    assert_same_bits(out, [o], "o")
    assert_same_bits(grads, list(want), "gradients")


def test_vsa_equals_the_functional_layer():
    leaves, meta = vsa_problem()
    out, grads = run(make_vsa_fn(meta), leaves)
    qd, kd, vd = (x.detach() for x in leaves)
    idx, num, bs = (meta[n].to(torch.int32) for n in ("q2k_idx", "q2k_num", "variable_block_sizes"))
    o, lse = fvattn.ops.vsa_forward(qd, kd, vd, idx, num, bs)
    dout = randn(*o.shape, seed=11, dtype=torch.float32, grad=False).to(torch.bfloat16)
    want = fvattn.ops.vsa_backward(qd, kd, vd, o, lse, dout, idx, num, bs)
    assert_same_bits(out, [o, lse], "o, lse")
    assert_same_bits(grads, list(want), "gradients")


# ---- torch.library.opcheck on every custom op ----------------------------------------------------


def qat_config_args(**overrides):
    cfg = dict(softmax_scale=0.0, causal=False, quantize=True, smooth_k=True, qkv_scale=1, p_scale=2,
               quantize_p_backward=True, high_precision_o=False, quantized_qkv_backward=True)
    cfg.update(overrides)
    return tuple(cfg.values())


def opcheck_samples():
    """(op, args) pairs: each forward op on leaves that require grad (so opcheck checks its autograd
    registration), each backward op on its forward's results."""
    samples = []
    (q, k, v), _ = qat_problem()
    for over in ({}, dict(high_precision_o=True, causal=True), dict(quantize=False, smooth_k=False)):
        cfg = qat_config_args(**over)
        samples.append((C.qat_forward, (q, k, v) + cfg))
        o, o_hp, lse = C.qat_forward(q.detach(), k.detach(), v.detach(), *cfg)
        dout = randn(*q.shape, seed=12, grad=False)
        o_for_bwd = o_hp if over.get("high_precision_o") else o
        samples.append((C.qat_backward, (q.detach(), k.detach(), v.detach(), o_for_bwd, lse, dout) + cfg))

    (q, k, v), meta = vsa_problem()
    idx, num, bs = (meta[n].to(torch.int32) for n in ("q2k_idx", "q2k_num", "variable_block_sizes"))
    for scale in (0.0, 0.1):
        samples.append((C.vsa_forward, (q, k, v, idx, num, bs, scale, 64)))
        o, lse = C.vsa_forward(q.detach(), k.detach(), v.detach(), idx, num, bs, scale, 64)
        dout = randn(*q.shape, seed=13, grad=False)
        samples.append((C.vsa_backward, (q.detach(), k.detach(), v.detach(), o, lse, dout, idx, num, bs,
                                         scale, 64)))

    for gated, topk in ((True, 1), (False, 2), (True, 5)):
        leaves, meta = layer_problem(gated)
        q, k, v = leaves[:3]
        gate = leaves[3] if gated else None
        kv_bs, q_bs = (meta[n].to(torch.int32) for n in ("variable_block_sizes", "q_variable_block_sizes"))
        samples.append((C.vsa_layer_forward, (q, k, v, gate, kv_bs, q_bs, topk, 0.0)))
        det = [x.detach() if x is not None else None for x in (q, k, v, gate)]
        _, reserve = C.vsa_layer_forward(*det, kv_bs, q_bs, topk, 0.0)
        dout = randn(*q.shape, seed=14, grad=False)
        samples.append((C.vsa_layer_backward, (*det, kv_bs, q_bs, dout, reserve, topk, 0.0)))
    return samples


SAMPLES = opcheck_samples()


@pytest.mark.parametrize("i", range(len(SAMPLES)),
                         ids=[f"{op._name}-{i}" for i, (op, _) in enumerate(SAMPLES)])
def test_opcheck(i, monkeypatch):
    op, args = SAMPLES[i]
    # opcheck runs each op twice and compares every output; the layer's reserve leaves the padding
    # between its regions unwritten (bytes without meaning), so here reserves start zeroed.
    kind = _frameworks.TorchKind
    allocate = kind.byte_buffer
    monkeypatch.setattr(kind, "byte_buffer", lambda self, n: allocate(self, n).zero_())
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


def test_every_op_is_registered_and_checked():
    names = {op._qualname for op in ft.CUSTOM_OPS}
    assert names == {f"fvattn::{n}" for n in ("qat_forward", "qat_backward", "vsa_forward", "vsa_backward",
                                              "vsa_layer_forward", "vsa_layer_backward")}
    assert {op._qualname for op, _ in SAMPLES} == names
    for name in names:
        assert hasattr(torch.ops.fvattn, name.split("::")[1])


def test_fake_reserve_size_is_the_librarys():
    leaves, meta = layer_problem(True)
    kv_bs, q_bs = (meta[n].to(torch.int32) for n in ("variable_block_sizes", "q_variable_block_sizes"))
    det = [x.detach() for x in leaves]
    _, reserve = C.vsa_layer_forward(det[0], det[1], det[2], det[3], kv_bs, q_bs, 1, 0.0)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(x) for x in det + [kv_bs, q_bs]]
        _, fake_reserve = C.vsa_layer_forward(*fake[:4], fake[4], fake[5], 1, 0.0)
    assert fake_reserve.shape == reserve.shape and fake_reserve.dtype == torch.uint8
    assert reserve.storage_offset() == 0


def test_library_errors_keep_their_type_through_the_ops():
    (q, k, v), _ = qat_problem()
    with pytest.raises(fvattn.Error, match="D = 64 or 128"):
        ft.block_sparse_attn_from_indices(q[..., :32], k[..., :32], v[..., :32],
                                          torch.zeros(1, 2, 2, 1, dtype=torch.int32),
                                          torch.ones(1, 2, 2, dtype=torch.int32), torch.tensor([64, 64]))
    np.testing.assert_equal(len(ft.CUSTOM_OPS), 6)
