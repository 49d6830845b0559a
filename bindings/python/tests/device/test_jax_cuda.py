"""fvattn.jax on a CUDA GPU: values and gradients against the same functions on the CPU, vmap
(which stages unaligned slices through cuMemcpyAsync), and a jitted training step."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import fvattn  # noqa: E402
import fvattn.jax as fj  # noqa: E402
from conftest import rel_l2  # noqa: E402
from device_helpers import on_device  # noqa: E402

try:
    GPU = jax.devices("gpu")[0]
except RuntimeError:
    GPU = None
pytestmark = pytest.mark.skipif(GPU is None, reason="JAX sees no GPU (jax[cuda] not installed or no device)")
CPU = jax.devices("cpu")[0]


def inputs(seed, shapes, device):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    return [jax.device_put(jax.random.normal(kk, s).astype(jnp.bfloat16), device) for kk, s in zip(keys, shapes)]


def both(fn, args_fn):
    """fn on GPU inputs and on the same inputs on the CPU."""
    out = {}
    for name, dev in (("gpu", GPU), ("cpu", CPU)):
        out[name] = on_device(lambda: jax.block_until_ready(fn(*args_fn(dev))))
    return out["gpu"], out["cpu"]


@pytest.mark.parametrize("config", [None, fvattn.QatConfig(quantize=False, causal=True)])
def test_qat_values_and_grads_match_the_cpu(config):
    shapes = [(1, 2, 256, 128)] * 4
    f = jax.jit(lambda q, k, v, w: jax.value_and_grad(
        lambda q, k, v: jnp.sum(fj.qat_attention(q, k, v, config).astype(jnp.float32) * w.astype(jnp.float32)),
        argnums=(0, 1, 2))(q, k, v))
    (lg, gg), (lc, gc) = both(f, lambda dev: inputs(0, shapes, dev))
    # The forward against the CPU: SPEC section 4's bound on o itself. The loss, a sum of o * w
    # with random signs, cancels heavily (sum |o w| is about 600 times |loss| here), so o's own
    # GPU-CPU difference (quantized P: about 2e-3 relative) moves it by about 1% at random (0.76%
    # rms for random errors of 2e-3): each loss is checked against its own backend's o instead,
    # which tests that value_and_grad carries the forward through.
    og, oc = both(jax.jit(lambda q, k, v: fj.qat_attention(q, k, v, config)), lambda dev: inputs(0, shapes, dev)[:3])
    og64, oc64 = np.asarray(og, np.float64), np.asarray(oc, np.float64)
    assert rel_l2(og64, oc64) <= 1e-2
    w = np.asarray(inputs(0, shapes, CPU)[3], np.float64)
    for loss, o in ((lg, og64), (lc, oc64)):
        assert abs(float(loss) - (o * w).sum()) <= 1e-5 * np.abs(o * w).sum()
    for a, b, name in zip(gg, gc, "qkv"):
        assert a.devices() == {GPU}
        # SPEC section 4 for dq, dk; dV with quantized P from the run's own lse: 4e-2 (SPEC-notes 4).
        tol = 4e-2 if name == "v" and config is None else 1e-2
        assert rel_l2(np.asarray(a, np.float64), np.asarray(b, np.float64)) <= tol, name


def test_vsa_and_vmap_on_gpu():
    q, k, v = inputs(1, [(1, 2, 192, 128)] * 3, GPU)
    idx = jnp.array([[[[2, 0], [1, 0], [0, 2]], [[1, 1], [2, 0], [0, 1]]]], jnp.int32)
    num = jnp.array([[[2, 1, 2], [1, 2, 0]]], jnp.int32)
    bss = jnp.array([[64, 30, 64], [5, 64, 33]], jnp.int32)  # rows of 12 bytes: staged copies
    out = on_device(jax.jit(jax.vmap(lambda bs: fj.vsa_attention(q, k, v, idx, num, bs))), bss)
    for i in range(2):
        one = fj.vsa_attention(*(jax.device_put(x, CPU) for x in (q, k, v, idx, num, bss[i])))
        assert rel_l2(np.asarray(out[i], np.float64), np.asarray(one, np.float64)) <= 1e-2


def test_jitted_training_step_on_gpu():
    B, S, E, H, D = 2, 128, 128, 2, 64
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    params = {n: jax.device_put(jax.random.normal(keys[i], (E, H * D) if n != "wo" else (H * D, E)) / np.sqrt(E), GPU)
              for i, n in enumerate(("wq", "wk", "wv", "wo"))}
    x = jax.device_put(jax.random.normal(keys[4], (B, S, E)), GPU)
    y = jax.device_put(jax.random.normal(keys[5], (B, S, E)), GPU)

    def loss(p):
        heads = lambda w: (x @ w).reshape(B, S, H, D).transpose(0, 2, 1, 3).astype(jnp.bfloat16)
        o = fj.qat_attention(heads(p["wq"]), heads(p["wk"]), heads(p["wv"]))
        return jnp.mean((o.astype(jnp.float32).transpose(0, 2, 1, 3).reshape(B, S, H * D) @ p["wo"] - y) ** 2)

    @jax.jit
    def step(p):
        value, grads = jax.value_and_grad(loss)(p)
        return jax.tree_util.tree_map(lambda w, g: w - 0.5 * g, p, grads), value

    losses = []
    for _ in range(10):
        params, value = on_device(step, params)
        losses.append(float(value))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("gated", [True, False])
def test_vsa_layer_values_and_grads_match_the_cpu(gated):
    # The whole VSA layer (fj.video_sparse_attn), ragged blocks, GQA: GPU against the CPU backend.
    q_bs, kv_bs = jnp.array([64, 40, 9], jnp.int32), jnp.array([64, 0, 33, 64], jnp.int32)
    shapes = [(1, 4, 192, 128), (1, 2, 256, 128), (1, 2, 256, 128), (1, 4, 192, 128), (1, 4, 192, 128)]

    def f(q, k, v, g, w):
        def loss(q, k, v, g):
            out = fj.video_sparse_attn(q, k, v, kv_bs, q_bs, 2, (4, 4, 4), g if gated else None)
            return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32)), out
        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, g)

    ((_, og), gg), ((_, oc), gc) = both(jax.jit(f), lambda dev: inputs(7, shapes, dev))
    assert rel_l2(np.asarray(og, np.float64), np.asarray(oc, np.float64)) <= 1e-2
    for a, b, name in zip(gg, gc, ("dq", "dk", "dv", "dgate")):
        if name == "dgate" and not gated:
            assert not np.any(np.asarray(a, np.float32))
            continue
        assert a.devices() == {GPU}
        assert rel_l2(np.asarray(a, np.float64), np.asarray(b, np.float64)) <= 1e-2, name
