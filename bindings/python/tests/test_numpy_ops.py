"""The NumPy path (CPU backend): every operation against float64 references computed here, strided
views against contiguous copies, f16 and bf16, and NVFP4 fake quantization against FastVideo's own
fake-quantized golden tensors."""
import ml_dtypes
import numpy as np
import pytest

import fvattn
from conftest import (BF16, Golden, attention_grads_ref, attention_ref, f64, masked_attention_ref,
                      random_bf16, rel_l2, vsa_mask)

PLAIN = fvattn.QatConfig(quantize=False, high_precision_o=False)


@pytest.mark.parametrize("dtype", [BF16, np.float16])
@pytest.mark.parametrize("causal,sq,skv,hq,hkv", [(False, 96, 64, 2, 2), (True, 80, 80, 4, 2)])
def test_plain_attention_forward_backward(rng, dtype, causal, sq, skv, hq, hkv):
    q = rng.standard_normal((2, hq, sq, 32)).astype(dtype)
    k = rng.standard_normal((2, hkv, skv, 32)).astype(dtype)
    v = rng.standard_normal((2, hkv, skv, 32)).astype(dtype)
    dout = rng.standard_normal(q.shape).astype(dtype)
    cfg = fvattn.QatConfig(quantize=False, high_precision_o=False, causal=causal, softmax_scale=0.2)
    o, o_hp, lse = fvattn.qat_attention_forward(q, k, v, cfg)
    assert o_hp is None and o.dtype == dtype and o.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == q.shape[:3]
    o_ref, lse_ref = attention_ref(q, k, v, 0.2, causal)
    assert rel_l2(o, o_ref) <= 1e-2
    assert rel_l2(lse, lse_ref) <= 1e-3
    dq, dk, dv = fvattn.qat_attention_backward(q, k, v, o, lse, dout, cfg)
    for got, ref, name in zip((dq, dk, dv), attention_grads_ref(q, k, v, dout, 0.2, causal), "qkv"):
        assert got.dtype == dtype and got.shape == ref.shape
        assert rel_l2(got, ref) <= 1e-2, f"d{name}"


def test_production_preset_returns_o_hp_and_strided_views_match(rng):
    # BSHD storage viewed as [B, H, S, D]: the library gets the strides, not a copy.
    q_bshd = random_bf16(rng, (1, 64, 2, 64))
    kv_bshd = random_bf16(rng, (1, 96, 2, 2, 64))  # k and v interleaved in one buffer
    q = q_bshd.transpose(0, 2, 1, 3)
    k, v = kv_bshd[:, :, :, 0].transpose(0, 2, 1, 3), kv_bshd[:, :, :, 1].transpose(0, 2, 1, 3)
    assert not q.flags.c_contiguous
    o, o_hp, lse = fvattn.qat_attention_forward(q, k, v)  # the production preset: o_hp too
    o_c, o_hp_c, lse_c = fvattn.qat_attention_forward(*(np.ascontiguousarray(x) for x in (q, k, v)))
    assert o_hp is not None
    np.testing.assert_array_equal(o.view(np.uint16), o_c.view(np.uint16))
    np.testing.assert_array_equal(o_hp.view(np.uint16), o_hp_c.view(np.uint16))
    np.testing.assert_array_equal(lse, lse_c)
    # Quantization moves o away from plain attention, but not far (SPEC 4: P unquantized moves o ~5%).
    o_ref, _ = attention_ref(q, k, v)
    assert 1e-3 < rel_l2(o, o_ref) < 0.2
    assert rel_l2(o_hp, o_ref) < rel_l2(o, o_ref)


def _vsa_inputs(rng, D=64, hq=2, hkv=1):
    nq, nkv = 2, 3
    q = random_bf16(rng, (1, hq, 64 * nq, D))
    k = random_bf16(rng, (1, hkv, 64 * nkv, D))
    v = random_bf16(rng, (1, hkv, 64 * nkv, D))
    q2k_idx = np.array([[[[2, 0], [1, -1]], [[0, 7], [2, 1]]]], dtype=np.int32)[:, :hq]
    # head 0 q block 1 lists kv block 1 and an invalid -1 (skipped); head 1 q block 0 lists 0 and
    # an out-of-range 7; head 1 q block 1 attends nothing (count 0: o = 0, lse = -inf).
    q2k_num = np.array([[[2, 2], [2, 0]]], dtype=np.int32)[:, :hq]
    block_sizes = np.array([64, 40, 17], dtype=np.int32)
    return q, k, v, q2k_idx, q2k_num, block_sizes


def test_vsa_forward_backward_against_masked_dense_attention(rng):
    q, k, v, idx, num, bs = _vsa_inputs(rng, hq=2, hkv=1)
    o, lse = fvattn.vsa_forward(q, k, v, idx, num, bs)
    mask = vsa_mask(idx, num, bs, q.shape[2], k.shape[2])
    o_ref, lse_ref = masked_attention_ref(q, k, v, mask)
    assert rel_l2(o, o_ref) <= 1e-2
    finite = np.isfinite(lse_ref)
    assert (~finite).sum() == 64 and np.all(np.isneginf(lse[~finite]))
    assert np.all(f64(o)[~np.broadcast_to(finite[..., None], o.shape)] == 0.0)
    assert rel_l2(lse[finite], lse_ref[finite]) <= 1e-3
    dout = random_bf16(rng, q.shape)
    dq, dk, dv = fvattn.vsa_backward(q, k, v, o, lse, dout, idx, num, bs)
    # Reference gradients: SPEC section 3's formulas in float64, on the masked dense problem.
    qf, kf, vf, df = f64(q), np.repeat(f64(k), 2, 1), np.repeat(f64(v), 2, 1), f64(dout)
    s = np.where(mask, np.einsum("bhqd,bhkd->bhqk", qf, kf) / 8.0, -np.inf)
    with np.errstate(invalid="ignore"):  # rows that see nothing: -inf - -inf, masked out anyway
        p = np.nan_to_num(np.where(mask, np.exp(s - np.log(2) * lse_ref[..., None]), 0.0))
    dp = np.einsum("bhqd,bhkd->bhqk", df, vf)
    delta = (f64(o_ref) * df).sum(-1, keepdims=True)
    ds = p * (dp - delta)
    dq_ref = np.einsum("bhqk,bhkd->bhqd", ds, kf) / 8.0
    dk_ref = np.einsum("bhqk,bhqd->bhkd", ds, qf).sum(1, keepdims=True) / 8.0
    dv_ref = np.einsum("bhqk,bhqd->bhkd", p, df).sum(1, keepdims=True)
    assert rel_l2(dq, dq_ref) <= 1e-2
    assert rel_l2(dk, dk_ref) <= 1e-2
    assert rel_l2(dv, dv_ref) <= 1e-2


def test_vsa_invert_indices(rng):
    _, _, _, idx, num, _ = _vsa_inputs(rng)
    k2q_idx, k2q_num = fvattn.vsa_invert_indices(idx, num, 3)
    assert k2q_idx.dtype == np.int32 and k2q_idx.shape == (1, 2, 3, 2)
    # Built by hand from the lists above (ascending q blocks, -1 past the count).
    np.testing.assert_array_equal(k2q_num, [[[1, 1, 1], [1, 0, 0]]])
    np.testing.assert_array_equal(k2q_idx, [[[[0, -1], [1, -1], [0, -1]], [[0, -1], [-1, -1], [-1, -1]]]])


def test_nvfp4_fake_quantize_is_bit_exact_with_fastvideo_block_mode():
    g = Golden("qat", "prod_self_256")  # block-mode scales: golden fake_q is FastVideo's own
    for x, fake in (("q", "fake_q"), ("v", "fake_v")):
        y = fvattn.nvfp4_fake_quantize(g[x])
        assert y.dtype == BF16
        np.testing.assert_array_equal(y.view(np.uint16), g[fake].view(np.uint16))


def test_f16_and_bf16_outputs_keep_the_input_dtype(rng):
    for dtype in (np.float16, ml_dtypes.bfloat16):
        q = rng.standard_normal((1, 1, 32, 16)).astype(dtype)
        o, _, _ = fvattn.qat_attention_forward(q, q, q, PLAIN)
        assert o.dtype == dtype
        assert o.ctypes.data % 16 == 0


class HostDlpack:
    """A minimal array of some other framework: host memory, exposed through DLPack only."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_other_host_dlpack_producers_are_read_without_a_copy(rng):
    q, k, v = (rng.standard_normal((1, 2, 64, 32)).astype(np.float16) for _ in range(3))
    o, _, lse = fvattn.qat_attention_forward(HostDlpack(q), HostDlpack(k), HostDlpack(v), PLAIN)
    # This module has no from_dlpack, so the results come back as NumPy arrays.
    o_np, _, lse_np = fvattn.qat_attention_forward(q, k, v, PLAIN)
    np.testing.assert_array_equal(o, o_np)
    np.testing.assert_array_equal(lse, lse_np)
