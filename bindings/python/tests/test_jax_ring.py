"""Ring attention in JAX (fvattn.jax.parallel.ring_attention) on host devices: under jax.shard_map
with the sequence sharded over 2 and 4 devices, plain attention (GQA, causal and not) gives the
single-device output and gradients within SPEC's bound (the partial outputs are rounded to the dtype
before their merge), the compiled program moves k and v by collective-permute and gathers nothing,
and NVFP4-quantized attention is refused.

Needs host devices: CTest runs this suite with XLA_FLAGS=--xla_force_host_platform_device_count=8
(bindings/python/tests/pytest_suites.cmake)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import fvattn  # noqa: E402
import fvattn.jax as fj  # noqa: E402
from jax_devices import loss_of, mesh_of, normal  # noqa: E402

SEQ = P(None, None, "sp")


def rel_l2(got, want):
    g, w = np.asarray(got.astype(jnp.float32), np.float64), np.asarray(want.astype(jnp.float32), np.float64)
    assert np.isfinite(g).all()
    return np.linalg.norm(g - w) / np.linalg.norm(w)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_equals_one_device(n, causal):
    mesh = mesh_of(n)
    rng = np.random.default_rng()
    B, Hq, Hkv, S, D = 2, 4, 2, 96 * n, 64  # GQA; 96-token shards: no tile boundary lines up
    q, k, v = normal(rng, (B, Hq, S, D)), normal(rng, (B, Hkv, S, D)), normal(rng, (B, Hkv, S, D))
    cfg = fvattn.QatConfig(quantize=False, causal=causal)

    def one(q, k, v):
        return fj.qat_attention(q, k, v, cfg)

    ring = jax.jit(jax.shard_map(lambda q, k, v: fj.parallel.ring_attention(q, k, v, "sp", cfg),
                                 mesh=mesh, in_specs=(SEQ, SEQ, SEQ), out_specs=SEQ))
    assert rel_l2(ring(q, k, v), one(q, k, v)) <= 1e-2
    g_ring = jax.grad(loss_of(ring), argnums=(0, 1, 2))(q, k, v)
    g_one = jax.grad(loss_of(one), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip(("dq", "dk", "dv"), g_ring, g_one):
        assert rel_l2(a, b) <= 1e-2, name
    hlo = jax.jit(jax.grad(loss_of(ring), argnums=(0, 1, 2))).lower(q, k, v).compile().as_text()
    assert "collective-permute" in hlo
    assert "all-gather" not in hlo and "all-to-all" not in hlo


def test_ring_default_is_plain_attention():
    mesh = mesh_of(2)
    rng = np.random.default_rng()
    q = normal(rng, (1, 2, 256, 64))
    ring = jax.jit(jax.shard_map(lambda q: fj.parallel.ring_attention(q, q, q, "sp"), mesh=mesh,
                                 in_specs=(SEQ,), out_specs=SEQ))
    assert rel_l2(ring(q), fj.qat_attention(q, q, q, fvattn.QatConfig(quantize=False))) <= 1e-2


def test_ring_refuses_quantized_attention():
    mesh = mesh_of(2)
    q = jnp.zeros((1, 2, 128, 64), jnp.bfloat16)
    ring = jax.shard_map(lambda q: fj.parallel.ring_attention(q, q, q, "sp", fvattn.QatConfig()),
                         mesh=mesh, in_specs=(SEQ,), out_specs=SEQ)
    with pytest.raises(fvattn.Error, match="quantize"):
        ring(q)
