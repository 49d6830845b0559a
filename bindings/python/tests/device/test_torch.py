"""fvattn.torch and the ops on torch tensors: on the CPU (always, where torch is installed) and on
CUDA (where there is a GPU). Plain-attention mode against PyTorch's SDPA, QAT on CUDA against the
CPU backend, VSA against masked SDPA, streams, and outputs of the input's kind and device."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import fvattn  # noqa: E402
import fvattn.torch as ft  # noqa: E402
from conftest import rel_l2, vsa_mask  # noqa: E402
from device_helpers import on_device  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device"))]


def t64(x):
    return x.detach().to("cpu", torch.float64).numpy()


def sdpa_reference(q, k, v, causal, scale):
    """float32 SDPA on the same (bf16) values, GQA by repeating kv heads."""
    g = q.shape[1] // k.shape[1]
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(
        qf, kf.repeat_interleave(g, 1), vf.repeat_interleave(g, 1), is_causal=causal, scale=scale)
    return o, (qf, kf, vf)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal,hq,hkv,s", [(False, 2, 2, 128), (True, 4, 2, 96)])
def test_attention_plain_mode_against_sdpa(device, causal, hq, hkv, s):
    gen = torch.Generator().manual_seed(0)
    mk = lambda h: torch.randn(2, h, s, 64, generator=gen).to(device, torch.bfloat16).requires_grad_()
    q, k, v = mk(hq), mk(hkv), mk(hkv)
    w = torch.randn(2, hq, s, 64, generator=gen).to(device)
    o = on_device(ft.attention, q, k, v, causal, 0.125, IS_QAT=False, smooth_k=False)
    assert o.device == q.device and o.dtype == torch.bfloat16
    (o.float() * w).sum().backward()
    o_ref, leaves = sdpa_reference(q, k, v, causal, 0.125)
    (o_ref * w).sum().backward()
    assert rel_l2(t64(o), t64(o_ref)) <= 1e-2
    for got, ref, name in zip((q.grad, k.grad, v.grad), (x.grad for x in leaves), "qkv"):
        assert got.device == q.device and got.dtype == torch.bfloat16
        assert rel_l2(t64(got), t64(ref)) <= 1e-2, name


@pytest.mark.parametrize("device", DEVICES)
def test_return_lse_gives_the_rows_log2_sum(device):
    # lse (base 2) of plain attention against the float64 log-sum-exp of the scaled scores, causal;
    # o is the same tensor as without return_lse, and gradients flow through o alone.
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 96, 64, generator=gen).to(device, torch.bfloat16).requires_grad_()
               for _ in range(3))
    o, lse = on_device(ft.attention, q, k, v, True, 0.125, IS_QAT=False, smooth_k=False, return_lse=True)
    o_only = on_device(ft.attention, q, k, v, True, 0.125, IS_QAT=False, smooth_k=False)
    assert torch.equal(o, o_only)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 96) and not lse.requires_grad
    s = t64(q) @ np.swapaxes(t64(k), -1, -2) * 0.125
    s = np.where(np.tril(np.ones((96, 96), bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    want = (m[..., 0] + np.log(np.exp(s - m).sum(-1))) / np.log(2.0)
    assert np.abs(t64(lse) - want).max() <= 1e-3 * np.abs(want).max()
    o.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()
    cfg = fvattn.QatConfig(quantize=False, causal=True, softmax_scale=0.125, smooth_k=False)
    o2, lse2 = on_device(ft.qat_attention, q, k, v, cfg, return_lse=True)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kwargs", [{}, dict(smooth_k=False, two_level_quant_P=False, use_global_sf_P=False,
                                              use_global_sf_QKV=False, use_high_prec_o=True)])
def test_qat_on_cuda_matches_the_cpu_backend(kwargs):
    gen = torch.Generator().manual_seed(1)
    base = [torch.randn(1, 2, 256, 128, generator=gen).to(torch.bfloat16) for _ in range(4)]
    results = {}
    for device in ("cpu", "cuda"):
        # detach: on the CPU .to() returns the tensor itself, which must not become a graph node
        # the CUDA copies then hang off (their .grad would stay None).
        q, k, v = (x.detach().to(device).requires_grad_() for x in base[:3])
        o = on_device(ft.attention, q, k, v, False, 128 ** -0.5, **kwargs)
        o.backward(base[3].to(device))
        results[device] = [t64(x) for x in (o, q.grad, k.grad, v.grad)]
    for got, ref, name in zip(results["cuda"], results["cpu"], ("o", "dq", "dk", "dv")):
        # SPEC section 4 (o, dq, dk) and the own-lse dV bound of tests/test_golden.cpp (4e-2).
        assert rel_l2(got, ref) <= (4e-2 if name == "dv" else 1e-2), name


@pytest.mark.parametrize("device", DEVICES)
def test_vsa_against_masked_sdpa(device):
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 192, 128, generator=gen).to(device, torch.bfloat16).requires_grad_()
               for _ in range(3))
    idx = torch.tensor([[[[2, 0], [1, 0], [0, 2]], [[1, 1], [2, 0], [0, 1]]]], dtype=torch.int64)
    num = torch.tensor([[[2, 1, 2], [1, 2, 0]]], dtype=torch.int64)  # int64 like FastVideo may pass
    bs = torch.tensor([64, 30, 64], dtype=torch.int64)
    o, lse = on_device(ft.block_sparse_attn_from_indices, q, k, v, idx.to(device), num.to(device), bs.to(device))
    assert lse.dtype == torch.float32 and not lse.requires_grad
    w = torch.randn(q.shape, generator=gen).to(device)
    (o.float() * w).sum().backward()
    mask = torch.from_numpy(vsa_mask(idx.numpy(), num.numpy(), bs.numpy(), 192, 192)).to(device)
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask)
    seen = mask.any(-1, keepdim=True)
    ref = torch.where(seen, ref, torch.zeros_like(ref))  # SDPA gives NaN where nothing is seen
    (ref * w).sum().backward()
    assert rel_l2(t64(o), t64(ref)) <= 1e-2
    assert torch.all(o.float()[~seen.expand_as(o)] == 0)
    for got, r, name in zip((q.grad, k.grad, v.grad), (qf.grad, kf.grad, vf.grad), "qkv"):
        assert rel_l2(t64(got), t64(torch.nan_to_num(r))) <= 1e-2, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_ops_run_on_the_callers_current_stream():
    q = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
    cfg = fvattn.QatConfig(quantize=False, high_precision_o=False)
    # The reference: the same call on the default stream (the CUDA backend is deterministic, so
    # the two must agree bit for bit; the CPU backend sums in another order).
    o_ref, _, _ = on_device(fvattn.qat_attention_forward, q, q, q, cfg)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Work queued first on the side stream: if fvattn launched elsewhere it could read q early.
        x = q * 1.0
        torch.cuda._sleep(50_000_000)
        o, _, _ = on_device(fvattn.qat_attention_forward, x, x, x, cfg)
    side.synchronize()
    assert isinstance(o, torch.Tensor) and o.device == q.device
    np.testing.assert_array_equal(t64(o), t64(o_ref))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cupy_arrays_on_their_device():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 128, 64)).astype(np.float16)
    idx = np.array([[[[0], [1]], [[1], [0]]]], np.int32)
    num = np.ones((1, 2, 2), np.int32)
    bs = np.array([64, 64], np.int32)
    o, lse = on_device(fvattn.vsa_forward, *(cupy.asarray(a) for a in (q, q, q, idx, num, bs)))
    assert isinstance(o, cupy.ndarray)
    o_np, _ = fvattn.vsa_forward(q, q, q, idx, num, bs)
    assert rel_l2(cupy.asnumpy(o), o_np) <= 1e-2
