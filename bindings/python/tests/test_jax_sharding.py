"""fvattn's JAX ops under jax.jit with inputs sharded over batch and heads (custom_partitioning,
fvattn/jax/_sharding.py), on 8 host devices as a 2 x 4 mesh: each device runs its own shard, so the
compiled program holds no all-gather or all-to-all, forward and gradients; results equal one
device's bit for bit (on the CPU backend a head's numbers do not depend on where it runs) and keep
the inputs' sharding; a head count the mesh does not divide is gathered instead, and the result is
still right.

Needs host devices: CTest runs this suite with XLA_FLAGS=--xla_force_host_platform_device_count=8
(bindings/python/tests/pytest_suites.cmake)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import fvattn  # noqa: E402
import fvattn.jax as fj  # noqa: E402
from fvattn.jax import _primitives  # noqa: E402
from jax_devices import assert_same, loss_of, mesh_of, normal  # noqa: E402

COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce")


@pytest.fixture(scope="module")
def mesh():
    return mesh_of(8, (2, 4), ("dp", "tp"))


def put(mesh, x, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def collectives(fn, *args):
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    return [c for c in COLLECTIVES if c in hlo]


@pytest.mark.parametrize("quantize", [False, True])
def test_qat_attention_runs_per_shard(mesh, quantize):
    rng = np.random.default_rng()
    B, Hq, Hkv, S, D = 2, 8, 4, 192, 64  # GQA: both head counts split over tp = 4
    q, k, v = normal(rng, (B, Hq, S, D)), normal(rng, (B, Hkv, S, D)), normal(rng, (B, Hkv, S, D))
    cfg = fvattn.QatConfig(quantize=quantize)
    attn = lambda q, k, v: fj.qat_attention(q, k, v, cfg)  # noqa: E731
    qs, ks, vs = (put(mesh, x, P("dp", "tp")) for x in (q, k, v))
    o = jax.jit(attn)(qs, ks, vs)
    assert_same(o, attn(q, k, v))
    assert o.sharding.is_equivalent_to(NamedSharding(mesh, P("dp", "tp")), o.ndim)
    assert collectives(attn, qs, ks, vs) == []
    grad = jax.grad(loss_of(attn), argnums=(0, 1, 2))
    for a, b in zip(jax.jit(grad)(qs, ks, vs), grad(q, k, v)):
        assert_same(a, b)
    assert collectives(grad, qs, ks, vs) == []


def test_vsa_attention_runs_per_shard(mesh):
    rng = np.random.default_rng()
    B, Hq, Hkv, nq, nkv, D, max_k = 2, 4, 4, 3, 4, 64, 2
    q, k, v = (normal(rng, (B, Hq, 64 * nq, D)), normal(rng, (B, Hkv, 64 * nkv, D)),
               normal(rng, (B, Hkv, 64 * nkv, D)))
    idx = np.stack([np.sort(rng.choice(nkv, max_k, replace=False)) for _ in range(B * Hq * nq)])
    idx = jnp.asarray(idx.reshape(B, Hq, nq, max_k).astype(np.int32))
    num = jnp.asarray(rng.integers(0, max_k + 1, (B, Hq, nq)).astype(np.int32))
    sizes = jnp.asarray(np.array([64, 40, 64, 7], np.int32))
    attn = lambda q, k, v, i, n, s: fj.vsa_attention(q, k, v, i, n, s)  # noqa: E731
    args = [put(mesh, x, P("dp", "tp")) for x in (q, k, v, idx, num)] + [put(mesh, sizes, P())]
    o = jax.jit(attn)(*args)
    assert_same(o, attn(q, k, v, idx, num, sizes))
    assert collectives(attn, *args) == []
    grad = jax.grad(loss_of(attn), argnums=(0, 1, 2))
    for a, b in zip(jax.jit(grad)(*args), grad(q, k, v, idx, num, sizes)):
        assert_same(a, b)
    assert collectives(grad, *args) == []


@pytest.mark.parametrize("gated", [True, False])
def test_vsa_layer_runs_per_shard(mesh, gated):
    """The whole VSA layer (block means, coarse attention, selection, gate, fine branch) and its
    gradients, GQA, ragged and empty blocks: per shard, no collective, one device's bits. Its reserve
    [B, Hq, R] is split with q."""
    rng = np.random.default_rng()
    B, Hq, Hkv, D, topk = 2, 8, 4, 64, 2
    q_bs, kv_bs = np.array([64, 40, 7], np.int32), np.array([64, 0, 33, 64], np.int32)

    def make(h, sizes):
        real = (np.arange(64)[None, :] < sizes[:, None]).reshape(-1)
        return jnp.where(real[None, None, :, None], normal(rng, (B, h, 64 * len(sizes), D)),
                         0).astype(jnp.bfloat16)

    q, k, v, g = make(Hq, q_bs), make(Hkv, kv_bs), make(Hkv, kv_bs), make(Hq, q_bs)
    q_bs, kv_bs = jnp.asarray(q_bs), jnp.asarray(kv_bs)
    if gated:
        layer = lambda q, k, v, g: fj.video_sparse_attn(q, k, v, kv_bs, q_bs, topk, (4, 4, 4), g)  # noqa: E731
    else:
        layer = lambda q, k, v, g: fj.video_sparse_attn(q, k, v, kv_bs, q_bs, topk, (4, 4, 4))  # noqa: E731
    args = [put(mesh, x, P("dp", "tp")) for x in (q, k, v, g)]
    o = jax.jit(layer)(*args)
    assert_same(o, layer(q, k, v, g))
    assert o.sharding.is_equivalent_to(NamedSharding(mesh, P("dp", "tp")), o.ndim)
    assert collectives(layer, *args) == []
    argnums = (0, 1, 2, 3) if gated else (0, 1, 2)
    grad = jax.grad(loss_of(layer), argnums=argnums)
    for a, b in zip(jax.jit(grad)(*args), grad(q, k, v, g)):
        assert_same(a, b)
    assert collectives(grad, *args) == []
    # The low-level forward's reserve is [B, Hq, R] and keeps q's sharding.
    forward = lambda q, k, v, g: _primitives.vsa_layer_forward(q, k, v, kv_bs, q_bs, topk, g).reserve  # noqa: E731
    res = jax.jit(forward)(*args)
    assert res.shape[:2] == (B, Hq) and res.dtype == jnp.uint8
    assert res.sharding.is_equivalent_to(NamedSharding(mesh, P("dp", "tp")), res.ndim)


def test_batch_only_and_undivided_heads(mesh):
    """Batch over dp with heads whole, then heads over tp with too few kv heads: both right."""
    rng = np.random.default_rng()
    B, Hq, Hkv, S, D = 2, 4, 2, 128, 64
    q, k, v = normal(rng, (B, Hq, S, D)), normal(rng, (B, Hkv, S, D)), normal(rng, (B, Hkv, S, D))
    attn = lambda q, k, v: fj.qat_attention(q, k, v, fvattn.QatConfig(quantize=False))  # noqa: E731
    want = attn(q, k, v)
    batch = [put(mesh, x, P("dp")) for x in (q, k, v)]
    assert_same(jax.jit(attn)(*batch), want)
    assert collectives(attn, *batch) == []
    # 2 kv heads over tp = 4: the heads are gathered (and only they), the result is unchanged.
    heads = [put(mesh, x, P(None, "tp")) for x in (q,)] + [put(mesh, x, P()) for x in (k, v)]
    assert_same(jax.jit(attn)(*heads), want)


def test_invert_and_nvfp4_run_per_shard(mesh):
    rng = np.random.default_rng()
    B, H, nq, nkv, max_k = 2, 4, 5, 6, 3
    idx = jnp.asarray(rng.integers(-1, nkv, (B, H, nq, max_k)).astype(np.int32))
    num = jnp.asarray(rng.integers(0, max_k + 1, (B, H, nq)).astype(np.int32))
    inv = lambda i, n: fj.vsa_invert_indices(i, n, nkv)  # noqa: E731
    args = [put(mesh, x, P("dp", "tp")) for x in (idx, num)]
    for a, b in zip(jax.jit(inv)(*args), inv(idx, num)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert collectives(inv, *args) == []
    x = normal(rng, (B, H, 128, 64))
    xs = put(mesh, x, P("dp", "tp"))
    assert_same(jax.jit(fj.nvfp4_fake_quantize)(xs), fj.nvfp4_fake_quantize(x))
    assert collectives(fj.nvfp4_fake_quantize, xs) == []
