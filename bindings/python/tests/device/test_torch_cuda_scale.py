"""fvattn.torch at scale on a CUDA device: one round of fvattn.torch.distributed over NCCL with a
world of one process (the GPU path of Ulysses' all-to-alls and ring attention's sends), and the
custom ops under torch.compile(fullgraph=True) on CUDA tensors (their fake implementations there,
the layer's reserve sized by a CUDA handle). Skipped without a CUDA device or NCCL; the CPU suites
(tests/test_torch_distributed.py over gloo, tests/test_torch_compile.py) cover the rest."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import fvattn  # noqa: E402
import fvattn.torch as ft  # noqa: E402
from fvattn.torch import distributed as fd  # noqa: E402
from conftest import rel_l2  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def t64(x):
    return x.detach().to("cpu", torch.float64).numpy()


def leaves(shape, n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).to("cuda", torch.bfloat16).requires_grad_() for _ in range(n)]


@pytest.fixture(scope="module")
def nccl_group():
    if not torch.distributed.is_nccl_available():
        pytest.skip("this PyTorch has no NCCL")
    with tempfile.TemporaryDirectory() as d:
        torch.distributed.init_process_group("nccl", init_method=f"file://{os.path.join(d, 'rendezvous')}",
                                             world_size=1, rank=0, device_id=torch.device("cuda", 0))
        try:
            yield torch.distributed.group.WORLD
        finally:
            torch.distributed.destroy_process_group()


def grads_of(fn, inputs, w):
    for x in inputs:
        x.grad = None
    out = fn(*inputs)
    (out.float() * w).sum().backward()
    return out.detach().clone(), [x.grad.detach().clone() for x in inputs]


def test_ulysses_over_nccl_world_of_one(nccl_group):
    q, k, v = leaves((1, 4, 256, 128), 3, 0)
    w = torch.randn(1, 4, 256, 128, device="cuda")
    cfg = fvattn.QatConfig()
    o_ref, g_ref = grads_of(lambda q, k, v: ft.qat_attention(q, k, v, cfg), [q, k, v], w)
    o, g = grads_of(lambda q, k, v: fd.ulysses(ft.qat_attention, nccl_group)(q, k, v, cfg), [q, k, v], w)
    assert torch.equal(o, o_ref)
    for a, b in zip(g, g_ref):
        assert torch.equal(a, b)


def test_ring_attention_over_nccl_world_of_one(nccl_group):
    q, k, v = leaves((1, 4, 256, 64), 3, 1)
    w = torch.randn(1, 4, 256, 64, device="cuda")
    for causal in (False, True):
        cfg = fvattn.QatConfig(quantize=False, causal=causal)
        o_ref, g_ref = grads_of(lambda q, k, v: ft.qat_attention(q, k, v, cfg), [q, k, v], w)
        o, g = grads_of(lambda q, k, v: fd.ring_attention(q, k, v, cfg, group=nccl_group), [q, k, v], w)
        assert rel_l2(t64(o), t64(o_ref)) <= 1e-2
        for a, b, name in zip(g, g_ref, "qkv"):
            assert rel_l2(t64(a), t64(b)) <= 1e-2, name


@pytest.mark.parametrize("which", ["attention", "video_sparse_attn"])
def test_compiled_fullgraph_on_cuda_equals_eager(which):
    if which == "attention":
        inputs = leaves((1, 2, 256, 128), 3, 2)
        fn = lambda q, k, v: ft.attention(q, k, v, False, 0.088)  # noqa: E731
    else:
        grid = (4, 8, 8)
        sizes = ft.tile_block_sizes(grid, "cuda")
        inputs = leaves((1, 2, 64 * sizes.numel(), 128), 4, 3)
        fn = lambda q, k, v, g: ft.video_sparse_attn(q, k, v, sizes, sizes, 3, (4, 4, 4),  # noqa: E731
                                                     compress_attn_weight=g)
    w = torch.randn(inputs[0].shape, device="cuda")
    o_ref, g_ref = grads_of(fn, inputs, w)
    torch._dynamo.reset()
    o, g = grads_of(torch.compile(fn, fullgraph=True, backend="aot_eager"), inputs, w)
    assert torch.equal(o, o_ref)
    for a, b in zip(g, g_ref):
        assert torch.equal(a, b)
