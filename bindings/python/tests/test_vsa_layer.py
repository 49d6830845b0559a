"""The whole VSA layer on NumPy arrays (CPU backend): fvattn.video_sparse_attn and its backward
against vsa_layer_reference.py (a float64 SPEC 3b, itself checked against FastVideo's golden data
first), ragged and empty blocks, GQA, nq != nkv, f16, topk 1 and topk >= nkv; the reserve's rules;
errors with the library's messages; fvattn.vsa_tile_plan against FastVideo's tiling."""
import numpy as np
import pytest

import fvattn
import vsa_layer_reference as R
from conftest import BF16, Golden, golden_cases, rel_l2

TOL = 1e-2  # SPEC section 4


@pytest.mark.parametrize("case", golden_cases("vsa_layer"))
def test_reference_reproduces_fastvideo(case):
    # The oracle must be FastVideo's function before it judges the library: block means bit for
    # bit but for exact ties of the rounding to bf16 (layer_nogate_512's k_c[0, 1, 3, 14] is a
    # quotient exactly halfway between two bf16 values, which FastVideo's GPU division rounds
    # away from even: 1 ulp, in 1 of 2048), the same selection, out and gradients well within
    # SPEC's bound.
    g = Golden("vsa_layer", case)
    gate = g["gate"] if g.meta["gate"] else None
    q, k, v, vbs, topk = g["q"], g["k"], g["v"], g["vbs"], g.meta["topk"]
    r = R.layer_forward(q, k, v, vbs, vbs, topk, gate)
    for name in ("q_c", "k_c", "v_c"):
        ulps = np.abs(r[name].astype(BF16).view(np.uint16).astype(np.int32) - g[name].view(np.uint16))
        assert ulps.max() <= 1 and np.count_nonzero(ulps) <= 1, name
    np.testing.assert_array_equal(r["q2k_idx"], g["q2k_idx"])
    assert rel_l2(r["out"], g["out"]) <= 5e-3
    grads = R.layer_backward(q, k, v, vbs, vbs, topk, g["do"], gate)
    for got, name in zip(grads, ("dq", "dk", "dv", "dgate")):
        if got is not None:
            assert rel_l2(got, g[name]) <= 5e-3, name


def bf16_or(dtype, rng, shape):
    return rng.standard_normal(shape).astype(dtype)


def problem(rng, dtype=BF16, B=1, hq=2, hkv=2, nq=3, nkv=4, D=64, q_sizes=None, kv_sizes=None, gate=True):
    """Inputs as a tiled video gives them: padding slots of q, k, v (and gate) zero."""
    q_bs = np.array(q_sizes if q_sizes is not None else [64] * nq, np.int32)
    kv_bs = np.array(kv_sizes if kv_sizes is not None else [64] * nkv, np.int32)

    def make(h, sizes):
        x = bf16_or(dtype, rng, (B, h, 64 * len(sizes), D))
        real = (np.arange(64)[None, :] < sizes[:, None]).reshape(-1)
        return np.where(real[None, None, :, None], x, np.zeros((), dtype)).astype(dtype)

    q, k, v = make(hq, q_bs), make(hkv, kv_bs), make(hkv, kv_bs)
    g = make(hq, q_bs) if gate else None
    return q, k, v, g, q_bs, kv_bs


def live_selection_agrees(got_idx, got_num, scores, topk, dtype):
    """SPEC 3b's selection, checked on the kv blocks that take part (size > 0): each row's live
    selected blocks are the reference's, rows at a near-tie (k-th and (k+1)-th score within one
    step of the dtype) excepted. Returns the number of tie-exempt rows."""
    want = R.select(scores, topk)
    k = want.shape[-1]
    assert got_idx.shape == want.shape and np.all(got_num == k)
    assert np.all(np.diff(got_idx, axis=-1) > 0), "lists must be ascending, each block once"
    live = np.isfinite(scores)
    ranked = -np.sort(-scores, axis=-1)
    exempt = 0
    for row in np.ndindex(*want.shape[:3]):
        g = {int(j) for j in got_idx[row] if live[row][j]}
        w = {int(j) for j in want[row] if live[row][j]}
        if g == w:
            continue
        kth, nxt = ranked[row][k - 1], ranked[row][k] if k < ranked.shape[-1] else -np.inf
        step = abs(kth) * (2.0 ** -7 if np.dtype(dtype).name == "bfloat16" else 2.0 ** -10)
        assert np.isfinite(nxt) and kth - nxt <= step, (row, sorted(g), sorted(w))
        exempt += 1
    return exempt


CASES = {
    "plain_bf16": dict(hq=2, hkv=2, nq=4, nkv=4, D=64, topk=2),
    "gqa_d128_ragged": dict(hq=4, hkv=2, nq=3, nkv=5, D=128, topk=3,
                            q_sizes=[64, 48, 17], kv_sizes=[64, 30, 64, 1, 40]),
    "empty_blocks_topk1": dict(B=2, hq=2, hkv=1, nq=3, nkv=4, D=64, topk=1,
                               q_sizes=[64, 0, 20], kv_sizes=[0, 64, 33, 0]),
    "topk_all_f16": dict(dtype=np.float16, hq=2, hkv=1, nq=2, nkv=3, D=64, topk=7,
                         q_sizes=[64, 9], kv_sizes=[12, 64, 64]),
}


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_backward_against_the_reference(rng, name, gate):
    cfg = dict(CASES[name])
    topk = cfg.pop("topk")
    q, k, v, g, q_bs, kv_bs = problem(rng, gate=gate, **cfg)
    res = fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, topk, g, return_indices=True)
    assert isinstance(res, fvattn.VsaLayerResult)
    assert res.out.dtype == q.dtype and res.out.shape == q.shape
    assert res.reserve.dtype == np.uint8 and res.reserve.ndim == 1
    assert res.q2k_idx.dtype == np.int32 and res.q2k_idx.shape == q.shape[:2] + (q.shape[2] // 64, min(topk, k.shape[2] // 64))
    scores = R.coarse(q, k, v, q_bs, kv_bs)[3]
    live_selection_agrees(res.q2k_idx, res.q2k_num, scores, topk, q.dtype)

    # The reference on the library's own selection (a near-tie may pick the other block).
    sel = (res.q2k_idx, res.q2k_num)
    ref = R.layer_forward(q, k, v, q_bs, kv_bs, topk, g, q2k=sel)
    assert not np.isnan(res.out.astype(np.float32)).any()
    assert rel_l2(res.out, ref["out"]) <= TOL

    dout = bf16_or(q.dtype, rng, q.shape)
    grads = fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, topk, dout, res.reserve, g)
    want = R.layer_backward(q, k, v, q_bs, kv_bs, topk, dout, g, q2k=sel)
    for got, w, gname in zip(grads, want, ("dq", "dk", "dv", "dgate")):
        if w is None:
            assert got is None
            continue
        assert got.dtype == q.dtype
        assert not np.isnan(got.astype(np.float32)).any(), gname
        assert rel_l2(got, w) <= TOL, gname


def test_results_are_deterministic_and_indices_optional(rng):
    q, k, v, g, q_bs, kv_bs = problem(rng, nq=2, nkv=3)
    a = fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, 2, g)
    b = fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, 2, g, return_indices=True)
    assert a.q2k_idx is None and a.q2k_num is None and b.q2k_idx is not None
    np.testing.assert_array_equal(a.out.view(np.uint16), b.out.view(np.uint16))
    dout = bf16_or(BF16, rng, q.shape)
    ga = fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout, a.reserve, g)
    gb = fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout, b.reserve, g)
    for x, y in zip(ga, gb):
        np.testing.assert_array_equal(x.view(np.uint16), y.view(np.uint16))


def test_explicit_softmax_scale_reaches_both_branches(rng):
    q, k, v, g, q_bs, kv_bs = problem(rng, nq=2, nkv=4, gate=False)
    res = fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, 2, softmax_scale=0.3, return_indices=True)
    ref = R.layer_forward(q, k, v, q_bs, kv_bs, 2, scale=0.3, q2k=(res.q2k_idx, res.q2k_num))
    assert rel_l2(res.out, ref["out"]) <= TOL
    dout = bf16_or(BF16, rng, q.shape)
    dq, dk, dv, dgate = fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout, res.reserve,
                                                          softmax_scale=0.3)
    want = R.layer_backward(q, k, v, q_bs, kv_bs, 2, dout, scale=0.3, q2k=(res.q2k_idx, res.q2k_num))
    assert dgate is None
    for got, w in zip((dq, dk, dv), want[:3]):
        assert rel_l2(got, w) <= TOL


def test_strided_views_match_contiguous_copies(rng):
    # BSHD storage viewed as [B, H, S, D]: the layer takes the strides as they are.
    q, k, v, g, q_bs, kv_bs = problem(rng, nq=2, nkv=2)
    views = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (q, k, v, g)]
    assert not views[0].flags.c_contiguous
    a = fvattn.video_sparse_attn(*views[:3], kv_bs, q_bs, 1, views[3])
    b = fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, 1, g)
    np.testing.assert_array_equal(a.out.view(np.uint16), b.out.view(np.uint16))


# ---- errors: fvattn.Error with the library's status and message ---------------------------------


def test_bad_config_and_block_sizes(rng):
    q, k, v, g, q_bs, kv_bs = problem(rng, nq=2, nkv=3)
    for topk in (0, -2):
        with pytest.raises(fvattn.Error, match=rf"^FVA_ERR_INVALID_ARGUMENT: cfg->topk is {topk}") as e:
            fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, topk, g)
        assert e.value.status == 1
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: kv_block_sizes: shape\[0\] is 2"):
        fvattn.video_sparse_attn(q, k, v, kv_bs[:2], q_bs, 2, g)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: q_block_sizes: "):
        fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs.astype(np.int64), 2, g)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: gate: "):
        fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, 2, g[:, :1])
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: q: shape\[2\] is 96"):
        fvattn.video_sparse_attn(q[:, :, :96], k, v, kv_bs, q_bs, 2, None)


def test_reserve_rules(rng):
    q, k, v, g, q_bs, kv_bs = problem(rng, nq=2, nkv=3)
    dout = bf16_or(BF16, rng, q.shape)
    gated = fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, 2, g)
    plain = fvattn.video_sparse_attn(q, k, v, kv_bs, q_bs, 2)
    # The gate given to the forward but not the backward, and the other way round.
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: reserve: was written by a forward with a gate"):
        fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout, gated.reserve)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: reserve: was written by a forward without a gate"):
        fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout, plain.reserve, g)
    # Another config (topk) and another shape.
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: reserve: was written by a forward with topk"):
        fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 1, dout, gated.reserve, g)
    q2, k2, v2, g2, q_bs2, kv_bs2 = problem(rng, nq=2, nkv=2)
    other = fvattn.video_sparse_attn(q2, k2, v2, kv_bs2, q_bs2, 2, g2)
    # (copied into a buffer as large as this call's reserve, so that only its record can object)
    big = fvattn._frameworks.aligned_numpy_empty((max(gated.reserve.size, other.reserve.size),), np.uint8)
    big[:] = 0
    big[:other.reserve.size] = other.reserve
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: reserve: "):
        fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout, big, g)
    # Too small, not a reserve at all.
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_WORKSPACE_TOO_SMALL: reserve_bytes is "):
        fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout, gated.reserve[:-16], g)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: reserve: must be a 1-D contiguous uint8"):
        fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout, gated.reserve.view(np.int32), g)
    # dout must be like q.
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: dout: "):
        fvattn.video_sparse_attn_backward(q, k, v, kv_bs, q_bs, 2, dout[:, :, :64], gated.reserve, g)


# ---- FastVideo's tiling --------------------------------------------------------------------------


@pytest.mark.parametrize("grid", [(1, 1, 1), (4, 4, 4), (5, 6, 7), (8, 3, 9), (21, 30, 52)])
def test_tile_plan_is_fastvideos_tiling(grid):
    plan = fvattn.vsa_tile_plan(grid)
    token_of_slot, sizes = R.fastvideo_tiling(grid)
    np.testing.assert_array_equal(plan.token_of_slot, token_of_slot)
    np.testing.assert_array_equal(plan.block_sizes, sizes)
    assert plan.block_sizes.dtype == np.int32 and plan.slot_of_token.dtype == np.int64
    real = token_of_slot >= 0
    np.testing.assert_array_equal(plan.slot_of_token[token_of_slot[real]], np.flatnonzero(real))
    assert fvattn.vsa_tile_plan(list(grid)) is plan  # one library call per grid
    if grid == (21, 30, 52):  # Wan2.1 at 81 frames, 480p (docs: 624 blocks, S = 39936)
        assert plan.block_sizes.size == 624 and plan.token_of_slot.size == 39936


def test_tile_plan_other_tiles_and_errors():
    plan = fvattn.vsa_tile_plan((6, 5, 4), tile=(2, 4, 8))
    token_of_slot, sizes = R.fastvideo_tiling((6, 5, 4), (2, 4, 8))
    np.testing.assert_array_equal(plan.token_of_slot, token_of_slot)
    np.testing.assert_array_equal(plan.block_sizes, sizes)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: dims"):
        fvattn.vsa_tile_plan((0, 4, 4))
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: tile"):
        fvattn.vsa_tile_plan((4, 4, 4), tile=(4, 0, 4))
    with pytest.raises(fvattn.Error, match="expected 3 integers"):
        fvattn.vsa_tile_plan((4, 4))
