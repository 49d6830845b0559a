"""fvattn.torch.video_sparse_attn (FastVideo's signature, the whole VSA layer as an autograd
function) and fvattn.torch.tile / untile / tile_block_sizes, on CPU tensors (the CPU backend) and
CUDA tensors (where there is a GPU): autograd against the NumPy path on the CPU backend (the same
bits on the CPU, SPEC section 4's bounds on CUDA), FastVideo's golden data, and the tiling against
a direct NumPy implementation of FastVideo's."""
import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import fvattn  # noqa: E402
import fvattn.torch as ft  # noqa: E402
import vsa_layer_reference as R  # noqa: E402
from conftest import BF16, Golden, golden_cases, rel_l2  # noqa: E402
from device_helpers import on_device  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device"))]


def t64(x):
    return x.detach().to("cpu", torch.float64).numpy()


def to_torch(a, device):
    """A NumPy array (bf16 through its bits) as a torch tensor on `device`."""
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def to_numpy(t):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def problem(seed, hq=2, hkv=1, q_sizes=(64, 40, 9), kv_sizes=(64, 0, 33, 64), D=128, gate=True):
    rng = np.random.default_rng(seed)
    q_bs, kv_bs = np.array(q_sizes, np.int32), np.array(kv_sizes, np.int32)

    def make(h, sizes):
        x = rng.standard_normal((1, h, 64 * len(sizes), D)).astype(BF16)
        real = (np.arange(64)[None, :] < sizes[:, None]).reshape(-1)
        return np.where(real[None, None, :, None], x, np.zeros((), BF16)).astype(BF16)

    q, k, v = make(hq, q_bs), make(hkv, kv_bs), make(hkv, kv_bs)
    return q, k, v, (make(hq, q_bs) if gate else None), q_bs, kv_bs


def test_signature_is_fastvideos():
    # fastvideo_kernel.video_sparse_attn(q, k, v, variable_block_sizes, q_variable_block_sizes, topk,
    # block_size=64, compress_attn_weight=None) -> out
    params = inspect.signature(ft.video_sparse_attn).parameters
    assert list(params) == ["q", "k", "v", "variable_block_sizes", "q_variable_block_sizes", "topk",
                            "block_size", "compress_attn_weight"]
    assert params["block_size"].default == 64 and params["compress_attn_weight"].default is None
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params.values())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gated", [True, False])
def test_autograd_against_the_cpu_backend(device, gated):
    q, k, v, g, q_bs, kv_bs = problem(1, gate=gated)
    dout = np.random.default_rng(2).standard_normal(q.shape).astype(BF16)
    leaves = [to_torch(x, device).requires_grad_() for x in (q, k, v) + ((g,) if gated else ())]
    # Block sizes as FastVideo may hold them: int64, on the CPU even for CUDA tensors.
    out = on_device(ft.video_sparse_attn, *leaves[:3], torch.from_numpy(kv_bs.astype(np.int64)),
                    torch.from_numpy(q_bs.astype(np.int64)), 2, block_size=(4, 4, 4),
                    compress_attn_weight=leaves[3] if gated else None)
    assert out.device == leaves[0].device and out.dtype == torch.bfloat16 and out.shape == leaves[0].shape
    on_device(out.backward, to_torch(dout, device))
    res = fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, 2, g)
    want = fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout, res.reserve, g)
    got = [to_numpy(out)] + [to_numpy(x.grad) for x in leaves]
    for a, b, name in zip(got, (res.out,) + want, ("out", "dq", "dk", "dv", "dgate")):
        assert not np.isnan(a.astype(np.float32)).any(), name
        if device == "cpu":  # one library, one backend: the same bits
            np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16), err_msg=name)
        else:
            assert rel_l2(a, b) <= 1e-2, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", golden_cases("vsa_layer"))
def test_fastvideo_golden(device, case):
    g = Golden("vsa_layer", case)
    gated = g.meta["gate"]
    leaves = [to_torch(g[n], device).requires_grad_() for n in ("q", "k", "v") + (("gate",) if gated else ())]
    vbs = to_torch(g["vbs"], device)
    out = on_device(ft.video_sparse_attn, *leaves[:3], vbs, vbs, g.meta["topk"], (4, 4, 4),
                    leaves[3] if gated else None)
    on_device(out.backward, to_torch(g["do"], device))
    assert rel_l2(t64(out), g["out"]) <= 1e-2
    for x, name in zip(leaves, ("dq", "dk", "dv", "dgate")):
        assert rel_l2(t64(x.grad), g[name]) <= 1e-2, name


def test_block_size_argument():
    q, k, v, g, q_bs, kv_bs = problem(3, gate=False)
    args = [to_torch(x, "cpu") for x in (q, k, v)] + [torch.from_numpy(kv_bs), torch.from_numpy(q_bs), 1]
    ref = ft.video_sparse_attn(*args, block_size=(4, 4, 4))
    for bs in (64, 4, [4, 4, 4]):  # FastVideo's int b means (b, b, b); 64 also means 64 tokens
        assert torch.equal(ft.video_sparse_attn(*args, block_size=bs), ref)
    for bs in ((8, 8, 8), 128, (4, 4, 8)):
        with pytest.raises(fvattn.Error, match="supports 64-token blocks only") as e:
            ft.video_sparse_attn(*args, block_size=bs)
        assert e.value.status_name == "FVA_ERR_UNSUPPORTED"


def test_library_errors_reach_the_caller():
    q, k, v, g, q_bs, kv_bs = problem(4)
    tq, tk, tv = (to_torch(x, "cpu") for x in (q, k, v))
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: cfg->topk is 0"):
        ft.video_sparse_attn(tq, tk, tv, torch.from_numpy(kv_bs), torch.from_numpy(q_bs), 0)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: kv_block_sizes: shape\[0\]"):
        ft.video_sparse_attn(tq, tk, tv, torch.from_numpy(kv_bs[:2]), torch.from_numpy(q_bs), 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grid", [(4, 4, 4), (5, 6, 7), (3, 9, 2)])
def test_tile_untile(device, grid):
    n = int(np.prod(grid))
    x = np.random.default_rng(5).standard_normal((2, n, 3, 8)).astype(np.float32)  # FastVideo's [B, S, H, D]
    tx = to_torch(x, device).requires_grad_()
    tiled = ft.tile(tx, grid, dim=1)
    np.testing.assert_array_equal(to_numpy(tiled), R.tile_ref(x, grid, axis=1))
    np.testing.assert_array_equal(to_numpy(ft.untile(tiled, grid, dim=1)), x)
    w = torch.randn(tiled.shape, device=device)
    (tiled * w).sum().backward()
    assert torch.equal(tx.grad, ft.untile(w, grid, dim=1))
    # [B, H, S, D] as the layer takes (dim -2, the default), bf16.
    xb = to_torch(x.transpose(0, 2, 1, 3).astype(BF16), device)
    np.testing.assert_array_equal(to_numpy(ft.tile(xb, grid)).view(np.uint16),
                                  R.tile_ref(to_numpy(xb), grid, axis=2).view(np.uint16))
    sizes = ft.tile_block_sizes(grid, device)
    assert sizes.dtype == torch.int32 and sizes.device.type == torch.device(device).type
    np.testing.assert_array_equal(sizes.cpu().numpy(), R.fastvideo_tiling(grid)[1])


@pytest.mark.parametrize("device", DEVICES)
def test_tile_layer_untile_end_to_end(device):
    grid = (5, 6, 7)
    x = torch.randn(1, 2, int(np.prod(grid)), 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    bs = ft.tile_block_sizes(grid, device)
    q = ft.tile(x, grid)
    out = on_device(ft.video_sparse_attn, q, q, q, bs, bs, 3, (4, 4, 4), q)
    y = ft.untile(out, grid)
    on_device(y.float().pow(2).sum().backward)
    assert y.shape == x.shape and torch.isfinite(x.grad.float()).all() and x.grad.abs().sum() > 0
