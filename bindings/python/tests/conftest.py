"""Shared helpers of the bindings' tests: golden data, float64 references, error measures."""
import json
import os

import ml_dtypes
import numpy as np
import pytest

BF16 = ml_dtypes.bfloat16
GOLDEN_DIR = os.environ.get("FVATTN_GOLDEN_DIR",
                            os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "golden"))
LOG2E = 1.4426950408889634


def rel_l2(got, ref):
    """||got - ref|| / ||ref|| in float64; NaN anywhere in got never passes (inf)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if np.isnan(got).any():
        return float("inf")
    return float(np.linalg.norm((got - ref).ravel()) / np.linalg.norm(ref.ravel()))


def f64(x):
    return np.asarray(x).astype(np.float64)


def random_bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF16)


class Golden:
    """One case of tests/golden: tensors by name (bf16 ones as ml_dtypes.bfloat16) and case.json."""

    def __init__(self, family, name):
        self.name = name
        self.dir = os.path.join(GOLDEN_DIR, family, name)
        with open(os.path.join(self.dir, "case.json")) as f:
            self.meta = json.load(f)

    def __getitem__(self, tensor):
        a = np.load(os.path.join(self.dir, tensor + ".npy"))
        if self.meta["tensors"][tensor]["dtype"] == "bfloat16":
            a = a.view(BF16)  # stored as uint16 bit patterns
        return a


def golden_cases(family):
    path = os.path.join(GOLDEN_DIR, family)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


# ---- float64 references (independent of the library) -------------------------------------------


def attention_ref(q, k, v, scale=None, causal=False):
    """Plain softmax attention in float64 with GQA: (o, lse base 2)."""
    q, k, v = f64(q), f64(k), f64(v)
    hq, hkv = q.shape[1], k.shape[1]
    k = np.repeat(k, hq // hkv, axis=1)
    v = np.repeat(v, hq // hkv, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = np.where(np.arange(skv)[None, :] <= np.arange(sq)[:, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bhkd->bhqd", p / l, v)
    lse = (m[..., 0] + np.log(l[..., 0])) * LOG2E
    return o, lse


def attention_grads_ref(q, k, v, dout, scale=None, causal=False):
    """Exact gradients of plain attention in float64 (GQA: summed over the shared heads)."""
    q, k, v, dout = f64(q), f64(k), f64(v), f64(dout)
    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, kk) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = np.where(np.arange(skv)[None, :] <= np.arange(sq)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dv = np.einsum("bhqk,bhqd->bhkd", p, dout)
    dp = np.einsum("bhqd,bhkd->bhqk", dout, vv)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = np.einsum("bhqk,bhkd->bhqd", ds, kk) * scale
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q) * scale
    b, _, skv, d = k.shape
    return dq, dk.reshape(b, hkv, g, skv, d).sum(2), dv.reshape(b, hkv, g, skv, d).sum(2)


def vsa_mask(q2k_idx, q2k_num, block_sizes, sq, skv, block=64):
    """[B, H, Sq, Skv] boolean: which keys each query sees under VSA's rules (SPEC section 3)."""
    B, H, nq, max_k = q2k_idx.shape
    nkv = skv // block
    mask = np.zeros((B, H, sq, skv), dtype=bool)
    for b in range(B):
        for h in range(H):
            for qb in range(nq):
                for j in range(min(int(q2k_num[b, h, qb]), max_k)):
                    kb = int(q2k_idx[b, h, qb, j])
                    if 0 <= kb < nkv:
                        n = max(0, min(int(block_sizes[kb]), block))
                        mask[b, h, qb * block:(qb + 1) * block, kb * block:kb * block + n] = True
    return mask


def masked_attention_ref(q, k, v, mask, scale=None):
    """float64 attention under a boolean mask; rows that see nothing get o = 0, lse = -inf."""
    q, k, v = f64(q), f64(k), f64(v)
    hq, hkv = q.shape[1], k.shape[1]
    k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.where(mask, np.einsum("bhqd,bhkd->bhqk", q, k) * scale, -np.inf)
    m = s.max(-1, keepdims=True)
    any_row = np.isfinite(m)
    p = np.where(mask, np.exp(s - np.where(any_row, m, 0.0)), 0.0)
    l = p.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bhkd->bhqd", p / np.where(l > 0, l, 1.0), v)
    lse = np.where(any_row[..., 0], (m[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0))) * LOG2E, -np.inf)
    return o, lse


@pytest.fixture
def rng():
    seed = int(os.environ.get("FVATTN_TEST_SEED", "20261130"))
    return np.random.default_rng(seed)
