"""A float64 NumPy implementation of docs/SPEC.md section 3b (the whole VSA layer), written from the
SPEC alone, and of FastVideo's tiling of a (T, H, W) latent (its documented order and padding), the
oracles of the layer's tests. Intermediates are rounded to the I/O dtype where SPEC 3b rounds them
(block means, the coarse scores, weights and output); the rest is float64."""
import numpy as np

BLOCK = 64


def f64(x):
    return np.asarray(x).astype(np.float64)


def rnd(x, dtype):
    """float64 values rounded to `dtype` (bf16 or f16) and back."""
    return np.asarray(x).astype(dtype).astype(np.float64)


def _sizes(bs):
    return np.clip(np.asarray(bs, np.int64), 0, BLOCK)


def block_means(x, sizes, dtype):
    """[B, H, n, D]: the sum over all 64 slots of each block (fp32) over its real size (an fp32
    division, as SPEC 3b has it; 0 for size 0), rounded to dtype."""
    B, H, S, D = x.shape
    sums = f64(x).reshape(B, H, S // BLOCK, BLOCK, D).sum(3).astype(np.float32)
    n = _sizes(sizes)
    mean = sums / np.maximum(n, 1).astype(np.float32)[:, None]
    return rnd(np.where(n[:, None] > 0, mean, np.float32(0)), dtype)


def coarse(q, k, v, q_bs, kv_bs, scale=None):
    """SPEC 3b steps 1-2: (q_c, k_c, v_c, scores, attn, out_c), GQA heads expanded for k_c, v_c;
    scores of kv blocks of size 0 are -inf (they take no part)."""
    dtype = q.dtype
    D = q.shape[-1]
    g = q.shape[1] // k.shape[1]
    q_c = block_means(q, q_bs, dtype)
    k_c = np.repeat(block_means(k, kv_bs, dtype), g, axis=1)
    v_c = np.repeat(block_means(v, kv_bs, dtype), g, axis=1)
    dots = rnd(np.einsum("bhid,bhjd->bhij", q_c, k_c), dtype)
    scores = rnd(dots / np.sqrt(D) if scale is None else dots * scale, dtype)
    live = _sizes(kv_bs) > 0
    s = np.where(live, scores, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.where(live, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    attn = rnd(e / np.maximum(e.sum(-1, keepdims=True), 1e-300), dtype)
    out_c = rnd(np.einsum("bhij,bhjd->bhid", attn, v_c), dtype)
    return q_c, k_c, v_c, np.where(live, scores, -np.inf), attn, out_c


def select(scores, topk):
    """SPEC 3b step 3: the topk highest scores per row (ties: the lowest index), ascending."""
    k = min(topk, scores.shape[-1])
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    return np.sort(order, axis=-1).astype(np.int32)


def selection_matches(got_idx, scores, topk, dtype):
    """True where a row's selected list equals select()'s; rows whose k-th and (k+1)-th scores lie
    within one step of `dtype` of each other (SPEC 3b's exception) count as matching. Returns the
    boolean array of rows and the number of tie-exempt rows."""
    want = select(scores, topk)
    same = np.all(np.asarray(got_idx) == want, axis=-1)
    k = min(topk, scores.shape[-1])
    if k == scores.shape[-1]:
        return same, 0
    ranked = -np.sort(-scores, axis=-1)
    kth, next_ = ranked[..., k - 1], ranked[..., k]
    step = np.abs(kth) * (2.0 ** -7 if np.dtype(dtype).name == "bfloat16" else 2.0 ** -10)
    tie = np.isfinite(next_) & (kth - next_ <= step + 1e-30)
    return same | tie, int(np.sum(tie & ~same))


def fine_mask(q2k_idx, q2k_num, kv_bs, sq, skv):
    """[B, H, Sq, Skv]: the keys each query sees in the fine branch (SPEC section 3)."""
    B, H, nq, max_k = q2k_idx.shape
    nkv = skv // BLOCK
    n = _sizes(kv_bs)
    mask = np.zeros((B, H, sq, skv), dtype=bool)
    for b in range(B):
        for h in range(H):
            for i in range(nq):
                for j in range(min(int(q2k_num[b, h, i]), max_k)):
                    kb = int(q2k_idx[b, h, i, j])
                    if 0 <= kb < nkv:
                        mask[b, h, i * BLOCK:(i + 1) * BLOCK, kb * BLOCK:kb * BLOCK + n[kb]] = True
    return mask


def _fine_probs(q, k, mask, scale):
    g = q.shape[1] // k.shape[1]
    kf = np.repeat(f64(k), g, axis=1)
    s = np.where(mask, np.einsum("bhqd,bhkd->bhqk", f64(q), kf) * scale, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(mask, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    l = p.sum(-1, keepdims=True)
    return p / np.where(l > 0, l, 1.0)


def _expand(xc):
    return np.repeat(xc, BLOCK, axis=2)


def layer_forward(q, k, v, q_bs, kv_bs, topk, gate=None, scale=None, q2k=None):
    """out (float64) and the intermediates, as a dict. q2k: (q2k_idx, q2k_num) to run the fine
    branch on (e.g. the library's own selection); None: select() on the reference's scores."""
    D = q.shape[-1]
    s = 1.0 / np.sqrt(D) if scale is None else scale
    q_c, k_c, v_c, scores, attn, out_c = coarse(q, k, v, q_bs, kv_bs, scale)
    if q2k is None:
        idx = select(scores, topk)
        q2k = (idx, np.full(idx.shape[:3], idx.shape[3], np.int32))
    mask = fine_mask(q2k[0], q2k[1], kv_bs, q.shape[2], k.shape[2])
    p = _fine_probs(q, k, mask, s)
    g = q.shape[1] // k.shape[1]
    out_s = np.einsum("bhqk,bhkd->bhqd", p, np.repeat(f64(v), g, axis=1))
    oc = _expand(out_c)
    out = (oc * f64(gate) if gate is not None else oc) + out_s
    return dict(out=out, q_c=q_c, k_c=k_c, v_c=v_c, scores=scores, attn=attn, out_c=out_c,
                out_s=out_s, p=p, q2k_idx=q2k[0], q2k_num=q2k[1], scale=s)


def layer_backward(q, k, v, q_bs, kv_bs, topk, dout, gate=None, scale=None, q2k=None):
    """(dq, dk, dv, dgate or None) in float64, SPEC 3b's backward."""
    r = layer_forward(q, k, v, q_bs, kv_bs, topk, gate, scale, q2k)
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    s = r["scale"]
    do = f64(dout)
    fold = lambda x: x.reshape(B, Hkv, g, *x.shape[2:]).sum(2)
    # Coarse branch.
    dgate = do * _expand(r["out_c"]) if gate is not None else None
    do_c_tok = do * f64(gate) if gate is not None else do
    dout_c = do_c_tok.reshape(B, Hq, Sq // BLOCK, BLOCK, D).sum(3)
    attn, v_c, q_c, k_c = r["attn"], r["v_c"], r["q_c"], r["k_c"]
    dv_c = np.einsum("bhij,bhid->bhjd", attn, dout_c)
    dattn = np.einsum("bhid,bhjd->bhij", dout_c, v_c)
    dscores = attn * (dattn - (dattn * attn).sum(-1, keepdims=True))
    dq_c = np.einsum("bhij,bhjd->bhid", dscores, k_c) * s
    dk_c = np.einsum("bhij,bhid->bhjd", dscores, q_c) * s

    def spread(dxc, sizes):
        n = _sizes(sizes)
        per = np.where(n[:, None] > 0, dxc / np.maximum(n, 1)[:, None], 0.0)
        return _expand(per)

    dq = spread(dq_c, q_bs)
    dk = spread(fold(dk_c), kv_bs)
    dv = spread(fold(dv_c), kv_bs)
    # Fine branch.
    p = r["p"]
    kf, vf = np.repeat(f64(k), g, axis=1), np.repeat(f64(v), g, axis=1)
    dp = np.einsum("bhqd,bhkd->bhqk", do, vf)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = dq + np.einsum("bhqk,bhkd->bhqd", ds, kf) * s
    dk = dk + fold(np.einsum("bhqk,bhqd->bhkd", ds, f64(q)) * s)
    dv = dv + fold(np.einsum("bhqk,bhqd->bhkd", p, do))
    return dq, dk, dv, dgate


# ---- FastVideo's tiling ----------------------------------------------------------------------------


def fastvideo_tiling(grid, tile=(4, 4, 4)):
    """(token_of_slot int64 [num_blocks * prod(tile)], -1 for padding; block_sizes int32): tiles in
    (t, h, w) order, each the sub-box of the grid it covers (smaller at the far edges), its tokens in
    (t, h, w) order in the first slots of its block; the rest of the block is padding."""
    T, H, W = grid
    ts, hs, ws = tile
    ids = np.arange(T * H * W).reshape(T, H, W)
    per_block = ts * hs * ws
    slots, sizes = [], []
    for t in range(0, T, ts):
        for h in range(0, H, hs):
            for w in range(0, W, ws):
                box = ids[t:t + ts, h:h + hs, w:w + ws].ravel()
                slots.append(np.concatenate([box, np.full(per_block - box.size, -1)]))
                sizes.append(box.size)
    return np.concatenate(slots).astype(np.int64), np.array(sizes, np.int32)


def tile_ref(x, grid, axis, tile=(4, 4, 4)):
    """x's T*H*W tokens along `axis` moved to FastVideo's tiled, zero-padded sequence."""
    token_of_slot, _ = fastvideo_tiling(grid, tile)
    x = np.moveaxis(np.asarray(x), axis, 0)
    out = np.zeros((token_of_slot.size,) + x.shape[1:], x.dtype)
    real = token_of_slot >= 0
    out[real] = x[token_of_slot[real]]
    return np.moveaxis(out, 0, axis)
