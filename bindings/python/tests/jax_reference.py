"""A small pure-JAX implementation of docs/SPEC.md, the oracle of test_jax.py: NVFP4 block-mode
fake quantization (section 1), QAT attention forward and backward (section 2) with 32-key tiles,
and VSA as masked dense attention (section 3). Written from SPEC.md alone; test_jax.py checks its
quantizer bit for bit against FastVideo's golden fake_q before trusting it.

Rounding to E4M3 and E2M1 uses JAX's float8_e4m3fn and float4_e2m1fn conversions (round to nearest
even) after clamping to the formats' largest values, which is SPEC's saturation.
"""
import jax
import jax.numpy as jnp

LOG2E = 1.4426950408889634
TILE = 32


def fake_quantize_block(x, dtype=jnp.bfloat16):
    """NVFP4 fake quantization, block scales, groups of 16 along the last axis; x holds values of
    `dtype`; returns float32 values of `dtype`."""
    x = x.astype(jnp.float32)
    g = x.reshape(x.shape[:-1] + (x.shape[-1] // 16, 16))
    amax = jnp.max(jnp.abs(g), axis=-1, keepdims=True)
    s = jnp.clip(amax / 6.0, -448.0, 448.0).astype(jnp.float8_e4m3fn).astype(jnp.float32)
    r = jnp.where(s > 0, 1.0 / jnp.where(s > 0, s, 1.0), 0.0)
    y = jnp.clip(g * r, -6.0, 6.0).astype(jnp.float4_e2m1fn).astype(jnp.float32)
    out = jnp.where(s > 0, y * s, 0.0).astype(dtype).astype(jnp.float32)
    return out.reshape(x.shape)


def _fq_p(p):
    """FQ_P in block mode: groups of 16 keys along the last axis (P >= 0, rounded like Q/K/V)."""
    return fake_quantize_block(p, jnp.float32)


def _heads(k, hq):
    return jnp.repeat(k, hq // k.shape[1], axis=1)


def qat_forward(q, k, v, scale, quantize=True):
    """Production preset, not causal (Skv a multiple of 32): (o, o_hp, lse) as float32 values
    rounded to q's dtype (lse float32)."""
    dt = q.dtype
    f = (lambda t: fake_quantize_block(t, dt)) if quantize else (lambda t: t.astype(jnp.float32))
    fq, fk, fv = f(q), _heads(f(k), q.shape[1]), _heads(f(v), q.shape[1])
    shape = q.shape[:3]
    m = jnp.full(shape, -jnp.inf)
    l = jnp.zeros(shape)
    acc = jnp.zeros(q.shape)
    acc_hp = jnp.zeros(q.shape)
    rnd = lambda t: t.astype(dt).astype(jnp.float32)
    for j in range(0, k.shape[2], TILE):
        s = jnp.einsum("bhqd,bhkd->bhqk", fq, fk[:, :, j:j + TILE])
        m_new = jnp.maximum(m, s.max(-1) * scale * LOG2E)
        p = jnp.exp2(s * scale * LOG2E - m_new[..., None])
        pq = _fq_p(p) if quantize else p
        alpha = jnp.exp2(m - m_new)
        l = l * alpha + rnd(p).sum(-1)
        vj = fv[:, :, j:j + TILE]
        acc = acc * alpha[..., None] + jnp.einsum("bhqk,bhkd->bhqd", rnd(pq), vj)
        acc_hp = acc_hp * alpha[..., None] + jnp.einsum("bhqk,bhkd->bhqd", rnd(p), vj)
        m = m_new
    return rnd(acc / l[..., None]), rnd(acc_hp / l[..., None]), m + jnp.log2(l)


def qat_backward(q, k, v, o_for_bwd, lse, dout, scale):
    """Production preset backward (SPEC section 2), GQA gradients summed over shared heads."""
    dt = q.dtype
    hq, hkv = q.shape[1], k.shape[1]
    fq = fake_quantize_block(q, dt)
    fk, fv = _heads(fake_quantize_block(k, dt), hq), _heads(fake_quantize_block(v, dt), hq)
    rnd = lambda t: t.astype(dt).astype(jnp.float32)
    do = dout.astype(jnp.float32)
    delta = (o_for_bwd.astype(jnp.float32) * do).sum(-1, keepdims=True)
    p = jnp.exp2(jnp.einsum("bhqd,bhkd->bhqk", fq, fk) * scale * LOG2E - lse[..., None])
    dv = jnp.einsum("bhqk,bhqd->bhkd", rnd(_fq_p(p)), do)
    dp = jnp.einsum("bhqd,bhkd->bhqk", do, fv)
    ds = rnd(p * (dp - delta))
    dq = scale * jnp.einsum("bhqk,bhkd->bhqd", ds, fk)
    dk = scale * jnp.einsum("bhqk,bhqd->bhkd", ds, fq)
    fold = lambda t: t.reshape(t.shape[0], hkv, hq // hkv, *t.shape[2:]).sum(2)
    return dq, fold(dk), fold(dv)


def attention(q, k, v, scale, causal=False, mask=None):
    """Plain softmax attention in float32, differentiable by JAX; rows with no visible key give 0."""
    qf, kf, vf = (t.astype(jnp.float32) for t in (q, k, v))
    kf, vf = _heads(kf, q.shape[1]), _heads(vf, q.shape[1])
    s = jnp.einsum("bhqd,bhkd->bhqk", qf, kf) * scale
    if causal:
        sq, skv = s.shape[-2:]
        mask = jnp.arange(skv)[None, :] <= jnp.arange(sq)[:, None]
    if mask is not None:
        s = jnp.where(mask, s, -1e30)
    p = jax.nn.softmax(s, axis=-1)
    if mask is not None:
        p = jnp.where(jnp.any(mask, axis=-1, keepdims=True), p, 0.0)
    return jnp.einsum("bhqk,bhkd->bhqd", p, vf)
