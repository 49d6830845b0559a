"""Sequence parallelism in JAX (fvattn.jax.parallel.ulysses) on host devices: under jax.shard_map
with the sequence sharded over 2 and 4 devices, QAT attention (plain and quantized), VSA from
indices and the whole VSA layer give the single-device outputs and gradients (bit for bit: on the
CPU backend a head's numbers do not depend on where it runs), the compiled program exchanges
shards by all-to-all, and a head count the devices do not divide is refused.

Needs host devices: CTest runs this suite with XLA_FLAGS=--xla_force_host_platform_device_count=8
(bindings/python/tests/pytest_suites.cmake)."""
import ml_dtypes
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import fvattn  # noqa: E402
import fvattn.jax as fj  # noqa: E402
from jax_devices import assert_same, loss_of, mesh_of, normal  # noqa: E402

SEQ = P(None, None, "sp")  # [B, H, S, D] with S sharded
WHOLE = P()


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("quantize", [False, True])
def test_ulysses_qat_attention_equals_one_device(n, quantize):
    mesh = mesh_of(n)
    rng = np.random.default_rng()
    B, Hq, Hkv, S, D = 1, 8, 4, 256, 64  # GQA: both head counts split over n
    q, k, v = normal(rng, (B, Hq, S, D)), normal(rng, (B, Hkv, S, D)), normal(rng, (B, Hkv, S, D))
    cfg = fvattn.QatConfig(quantize=quantize)

    def attn(q, k, v):
        return fj.qat_attention(q, k, v, cfg)

    sharded = jax.jit(jax.shard_map(fj.parallel.ulysses(attn, "sp"), mesh=mesh,
                                    in_specs=(SEQ, SEQ, SEQ), out_specs=SEQ))
    assert_same(sharded(q, k, v), attn(q, k, v))
    g_sharded = jax.grad(loss_of(sharded), argnums=(0, 1, 2))(q, k, v)
    g_one = jax.grad(loss_of(attn), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_sharded, g_one):
        assert_same(a, b)


def test_ulysses_vsa_attention_cuts_the_lists_to_each_device_heads():
    mesh = mesh_of(4)
    rng = np.random.default_rng()
    B, H, nq, nkv, k_max, D = 1, 4, 4, 4, 2, 64
    q, k, v = (normal(rng, (B, H, 64 * nq, D)), normal(rng, (B, H, 64 * nkv, D)),
               normal(rng, (B, H, 64 * nkv, D)))
    idx = np.stack([np.sort(rng.permutation(nkv)[:k_max]) for _ in range(B * H * nq)])
    q2k_idx = jnp.asarray(idx.reshape(B, H, nq, k_max).astype(np.int32))
    q2k_num = jnp.asarray(rng.integers(0, k_max + 1, (B, H, nq)).astype(np.int32))
    sizes = jnp.asarray(np.array([64, 64, 40, 64], np.int32))

    def attn(q, k, v, q2k_idx, q2k_num, sizes):
        return fj.vsa_attention(q, k, v, q2k_idx, q2k_num, sizes)

    sharded = jax.jit(jax.shard_map(fj.parallel.ulysses(attn, "sp", head_args=(3, 4)), mesh=mesh,
                                    in_specs=(SEQ, SEQ, SEQ, WHOLE, WHOLE, WHOLE), out_specs=SEQ))
    assert_same(sharded(q, k, v, q2k_idx, q2k_num, sizes), attn(q, k, v, q2k_idx, q2k_num, sizes))
    g_sharded = jax.grad(loss_of(sharded), argnums=(0, 1, 2))(q, k, v, q2k_idx, q2k_num, sizes)
    g_one = jax.grad(loss_of(attn), argnums=(0, 1, 2))(q, k, v, q2k_idx, q2k_num, sizes)
    for a, b in zip(g_sharded, g_one):
        assert_same(a, b)


def test_ulysses_whole_vsa_layer_with_gate():
    mesh = mesh_of(2)
    rng = np.random.default_rng()
    grid = (4, 8, 12)  # 24 blocks of 64 tokens, some partial: 12 per device
    sizes = jnp.asarray(fj.tile_block_sizes(grid))
    S = 64 * sizes.shape[0]
    B, H, D = 1, 4, 64
    real = np.repeat(np.arange(64)[None, :] < np.asarray(sizes)[:, None], 1, axis=0).reshape(S)
    mask = jnp.asarray(real[None, None, :, None])
    q, k, v, gate = (normal(rng, (B, H, S, D)) * mask.astype(jnp.bfloat16) for _ in range(4))

    def layer(q, k, v, gate):
        return fj.video_sparse_attn(q, k, v, sizes, sizes, 6, (4, 4, 4), compress_attn_weight=gate)

    sharded = jax.jit(jax.shard_map(fj.parallel.ulysses(layer, "sp", seq_args=(0, 1, 2, 3)), mesh=mesh,
                                    in_specs=(SEQ, SEQ, SEQ, SEQ), out_specs=SEQ))
    assert_same(sharded(q, k, v, gate), layer(q, k, v, gate))
    g_sharded = jax.grad(loss_of(sharded), argnums=(0, 1, 2, 3))(q, k, v, gate)
    g_one = jax.grad(loss_of(layer), argnums=(0, 1, 2, 3))(q, k, v, gate)
    for a, b in zip(g_sharded, g_one):
        assert_same(a, b)


def test_ulysses_exchanges_shards_by_all_to_all():
    mesh = mesh_of(4)
    q = jnp.zeros((1, 4, 256, 64), jnp.bfloat16)
    attn = lambda q, k, v: fj.qat_attention(q, k, v, fvattn.QatConfig(quantize=False))  # noqa: E731
    f = jax.jit(jax.shard_map(fj.parallel.ulysses(attn, "sp"), mesh=mesh, in_specs=(SEQ, SEQ, SEQ),
                              out_specs=SEQ))
    hlo = f.lower(q, q, q).compile().as_text()
    assert "all-to-all" in hlo
    assert "all-gather" not in hlo  # no device ever holds the whole q, k or v


def test_ulysses_refuses_heads_the_devices_do_not_split():
    mesh = mesh_of(4)
    rng = np.random.default_rng()
    q = normal(rng, (1, 6, 256, 64))  # 6 heads over 4 devices
    idx = jnp.zeros((1, 6, 4, 1), jnp.int32)
    attn = fj.parallel.ulysses(lambda q, k, v, i, n, s: fj.vsa_attention(q, k, v, i, n, s), "sp",
                               head_args=(3, 4))
    f = jax.shard_map(attn, mesh=mesh, in_specs=(SEQ, SEQ, SEQ, WHOLE, WHOLE, WHOLE), out_specs=SEQ)
    with pytest.raises(Exception):
        f(q, q, q, idx, jnp.ones((1, 6, 4), jnp.int32), jnp.full((4,), 64, jnp.int32))
