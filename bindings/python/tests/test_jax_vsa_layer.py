"""fvattn.jax.video_sparse_attn (the whole VSA layer as a custom_vjp over XLA FFI calls) and
fvattn.jax.tile / untile on the CPU: jax.grad against the NumPy path's backward (one library, one
backend: bit for bit) and against the float64 SPEC 3b of vsa_layer_reference.py; jit, vmap, the
eager ops on JAX arrays; trace-time errors with the library's message; the tiling against a direct
NumPy implementation of FastVideo's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fvattn
import fvattn.jax as fj
import vsa_layer_reference as R
from conftest import rel_l2


def normal(key, shape, dtype=jnp.bfloat16):
    return jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32).astype(dtype)


def bits(x):
    return np.asarray(x).view(np.uint16)


def problem(seed=0, B=1, hq=2, hkv=1, q_sizes=(64, 40, 7), kv_sizes=(64, 0, 33, 64), D=64, gate=True):
    """Padding slots zero, as tiling leaves them."""
    q_bs, kv_bs = np.array(q_sizes, np.int32), np.array(kv_sizes, np.int32)

    def make(key, h, sizes):
        x = normal(key, (B, h, 64 * len(sizes), D))
        real = (np.arange(64)[None, :] < sizes[:, None]).reshape(-1)
        return jnp.where(real[None, None, :, None], x, 0).astype(jnp.bfloat16)

    q, k, v = make(seed, hq, q_bs), make(seed + 1, hkv, kv_bs), make(seed + 2, hkv, kv_bs)
    g = make(seed + 3, hq, q_bs) if gate else None
    return q, k, v, g, jnp.asarray(q_bs), jnp.asarray(kv_bs)


@pytest.mark.parametrize("gated", [True, False])
def test_grad_equals_the_numpy_backward(gated):
    q, k, v, g, q_bs, kv_bs = problem(gate=gated)
    w = normal(9, q.shape, jnp.float32)
    topk = 2

    def loss(q, k, v, g):
        out = fj.video_sparse_attn(q, k, v, kv_bs, q_bs, topk, (4, 4, 4), g)
        return jnp.sum(out.astype(jnp.float32) * w), out

    argnums = (0, 1, 2, 3) if gated else (0, 1, 2)
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))(q, k, v, g)
    # The NumPy path on the same inputs: the same library on the same backend, so the same bits.
    npa = lambda x: None if x is None else np.asarray(x)
    res = fvattn.video_sparse_attn(npa(q), npa(k), npa(v), npa(kv_bs), npa(q_bs), topk, npa(g),
                                   return_indices=True)
    np.testing.assert_array_equal(bits(out), bits(res.out))
    dout = np.asarray(w.astype(jnp.bfloat16))  # d loss / d out, as the custom_vjp casts it
    want = fvattn.video_sparse_attn_backward(npa(q), npa(k), npa(v), npa(kv_bs), npa(q_bs), topk, dout,
                                             res.reserve, npa(g))
    for got, w_, name in zip(grads, want, ("dq", "dk", "dv", "dgate")):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(bits(got), bits(w_), err_msg=name)
    # ... and the float64 SPEC 3b on the library's selection.
    sel = (res.q2k_idx, res.q2k_num)
    ref = R.layer_forward(npa(q), npa(k), npa(v), npa(q_bs), npa(kv_bs), topk, npa(g), q2k=sel)
    assert rel_l2(out, ref["out"]) <= 1e-2
    ref_grads = R.layer_backward(npa(q), npa(k), npa(v), npa(q_bs), npa(kv_bs), topk, dout, npa(g), q2k=sel)
    for got, w_, name in zip(grads, ref_grads, ("dq", "dk", "dv", "dgate")):
        assert rel_l2(got, w_) <= 1e-2, name


def test_gqa_f16_nq_ne_nkv_and_topk_above_nkv():
    q = normal(20, (2, 4, 128, 128), jnp.float16)
    k, v = normal(21, (2, 2, 192, 128), jnp.float16), normal(22, (2, 2, 192, 128), jnp.float16)
    q_bs, kv_bs = jnp.array([64, 64], jnp.int32), jnp.array([64, 50, 3], jnp.int32)
    f = jax.jit(lambda q, k, v: fj.video_sparse_attn(q, k, v, kv_bs, q_bs, 9, (4, 4, 4)))
    out = f(q, k, v)
    assert out.dtype == jnp.float16 and out.shape == q.shape
    res = fvattn.video_sparse_attn(*(np.asarray(x) for x in (q, k, v, kv_bs, q_bs)), 9, return_indices=True)
    np.testing.assert_array_equal(np.asarray(out).view(np.uint16), res.out.view(np.uint16))
    assert res.q2k_idx.shape[-1] == 3  # min(topk, nkv): every kv block
    grads = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))(q, k, v)
    assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in grads)


def test_block_sizes_as_int64_numpy_and_vmap():
    q, k, v, g, q_bs, kv_bs = problem(seed=30, gate=True)
    qs = jnp.stack([q, normal(31, q.shape)])
    f = lambda q: fj.video_sparse_attn(q, k, v, np.asarray(kv_bs, np.int64), np.asarray(q_bs, np.int64), 2,
                                       (4, 4, 4), g)
    batched = jax.jit(jax.vmap(f))(qs)
    for i in range(2):
        np.testing.assert_array_equal(bits(batched[i]), bits(f(qs[i])))
    # vmap of the gradient (the reserve is batched with it).
    grad = jax.grad(lambda q: jnp.sum(f(q).astype(jnp.float32)))
    gq = jax.vmap(grad)(qs)
    for i in range(2):
        np.testing.assert_array_equal(bits(gq[i]), bits(grad(qs[i])))


def test_eager_ops_take_jax_arrays():
    q, k, v, g, q_bs, kv_bs = problem(seed=40)
    res = fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, 3, g, return_indices=True)
    assert isinstance(res.out, jax.Array) and res.reserve.dtype == jnp.uint8
    res_np = fvattn.video_sparse_attn(*(np.asarray(x) for x in (q, k, v, kv_bs, q_bs)), 3, np.asarray(g),
                                      return_indices=True)
    np.testing.assert_array_equal(bits(res.out), bits(res_np.out))
    np.testing.assert_array_equal(np.asarray(res.q2k_idx), res_np.q2k_idx)
    np.testing.assert_array_equal(np.asarray(res.q2k_num), res_np.q2k_num)
    dout = normal(41, q.shape)
    got = fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 3, dout, res.reserve, g)
    want = fvattn.video_sparse_attn_backward(*(np.asarray(x) for x in (q, k, v, kv_bs, q_bs)), 3,
                                             np.asarray(dout), res_np.reserve, np.asarray(g))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(bits(a), bits(b))


def test_bad_arguments_raise_at_trace_time_with_the_library_message():
    q = jax.ShapeDtypeStruct((1, 2, 128, 64), jnp.bfloat16)
    bs2 = jax.ShapeDtypeStruct((2,), jnp.int32)
    lower = lambda *a, **kw: jax.jit(lambda *x: fj.video_sparse_attn(*x, **kw)).lower(*a)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: cfg->topk is 0"):
        lower(q, q, q, bs2, bs2, topk=0)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: kv_block_sizes: shape\[0\] is 3"):
        lower(q, q, q, jax.ShapeDtypeStruct((3,), jnp.int32), bs2, topk=1)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: gate: "):
        lower(q, q, q, bs2, bs2, topk=1, compress_attn_weight=jnp.zeros((1, 2, 64, 64), jnp.bfloat16))
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_UNSUPPORTED: q: head dim"):
        d48 = jax.ShapeDtypeStruct((1, 2, 128, 48), jnp.bfloat16)
        lower(d48, d48, d48, bs2, bs2, topk=1)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_UNSUPPORTED: block_size \(8, 8, 8\)"):
        fj.video_sparse_attn(*(jnp.zeros((1, 1, 64, 64), jnp.bfloat16),) * 3, jnp.ones(1, jnp.int32),
                             jnp.ones(1, jnp.int32), 1, (8, 8, 8))


# ---- tile / untile -------------------------------------------------------------------------------


@pytest.mark.parametrize("grid", [(4, 4, 4), (5, 6, 7), (3, 9, 2)])
def test_tile_is_fastvideos_tiling_and_untile_inverts_it(grid):
    n = int(np.prod(grid))
    x = normal(50, (2, 3, n, 8), jnp.float32)  # [B, H, S, D]
    t = fj.tile(x, grid)
    np.testing.assert_array_equal(np.asarray(t), R.tile_ref(np.asarray(x), grid, axis=2))
    np.testing.assert_array_equal(np.asarray(fj.untile(t, grid)), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(fj.tile_block_sizes(grid)), R.fastvideo_tiling(grid)[1])
    # FastVideo's own layout, [B, S, H, D], tiled along axis 1; bf16 kept.
    xb = x.transpose(0, 2, 1, 3).astype(jnp.bfloat16)
    tb = jax.jit(lambda x: fj.tile(x, grid, axis=1))(xb)
    assert tb.dtype == jnp.bfloat16
    np.testing.assert_array_equal(bits(tb), R.tile_ref(np.asarray(xb), grid, axis=1).view(np.uint16))
    np.testing.assert_array_equal(bits(fj.untile(tb, grid, axis=1)), bits(xb))


def test_tile_gradients_and_the_layer_on_a_latent():
    grid = (5, 6, 7)
    n = int(np.prod(grid))
    x = normal(60, (1, 2, n, 64), jnp.float32)
    w = normal(61, (1, 2, 64 * fj.tile_block_sizes(grid).size, 64), jnp.float32)
    gx = jax.grad(lambda x: jnp.sum(fj.tile(x, grid) * w))(x)
    np.testing.assert_array_equal(np.asarray(gx), np.asarray(fj.untile(w, grid)))
    # tile -> layer -> untile, differentiated end to end.
    bs = fj.tile_block_sizes(grid)

    def layer(x):
        q = fj.tile(x, grid).astype(jnp.bfloat16)
        out = fj.video_sparse_attn(q, q, q, bs, bs, 3, (4, 4, 4))
        return jnp.sum(fj.untile(out, grid).astype(jnp.float32) ** 2)

    g = jax.jit(jax.grad(layer))(x)
    assert g.shape == x.shape and np.isfinite(np.asarray(g)).all() and np.any(np.asarray(g) != 0)


def test_tile_shape_errors():
    with pytest.raises(fvattn.Error, match=r"x: shape\[2\] is 10 but the grid \(2, 2, 2\) has 8 tokens"):
        fj.tile(jnp.zeros((1, 1, 10, 4)), (2, 2, 2))
    with pytest.raises(fvattn.Error, match=r"x: shape\[2\] is 8 but the tiled grid \(2, 2, 2\) has 64 slots"):
        fj.untile(jnp.zeros((1, 1, 8, 4)), (2, 2, 2))
