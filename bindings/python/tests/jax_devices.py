"""What the JAX suites on several host devices share (test_jax_parallel.py, test_jax_ring.py,
test_jax_sharding.py): a mesh of the first n devices, skipped without them, random bf16 inputs,
bitwise equality, and a loss whose gradient reaches every output element."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh  # noqa: E402


def mesh_of(n, shape=None, names=("sp",)):
    """The first n host devices as a mesh of `shape` (default (n,)) with axis `names`."""
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} host devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), "
                    f"has {len(jax.devices())}")
    return Mesh(np.array(jax.devices()[:n]).reshape(shape or (n,)), names)


def normal(rng, shape, dtype=jnp.bfloat16):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def assert_same(got, want):
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)))


def loss_of(fn):
    return lambda *args: jnp.sum(fn(*args).astype(jnp.float32) * jnp.linspace(-1, 1, args[0].shape[-1]))
