"""The operations of fvattn.h for Python arrays: each describes its inputs, allocates its outputs
and workspace through the inputs' framework, calls the library, and raises fvattn.Error on failure.

JAX arrays go to fvattn.jax instead (the same library calls as XLA custom calls), so XLA keeps
owning their memory and stream.
"""
import collections
import ctypes
import functools
import operator

import numpy as np

from . import _capi, _handles
from ._call import Call
from ._errors import invalid_argument
from ._frameworks import is_jax_array
from .config import Nvfp4Config, QatConfig, VsaConfig, VsaLayerConfig, coerce


def _jax_inputs(*arrays):
    return any(is_jax_array(a) for a in arrays if a is not None)


def _qat_config(config):
    return coerce(config, QatConfig).to_c()


def _vsa_config(config):
    return coerce(config, VsaConfig).to_c()


def num_kv_blocks_arg(num_kv_blocks):
    """vsa_invert_indices' num_kv_blocks as an int >= 1, or an error that names the argument."""
    try:
        n = operator.index(num_kv_blocks)
    except TypeError:
        raise TypeError(f"num_kv_blocks must be an int (the kv block count, k.shape[2] // 64), "
                        f"not {type(num_kv_blocks).__name__}") from None
    if not 1 <= n < 2**31:
        raise invalid_argument(f"num_kv_blocks is {n} but must be >= 1 (the kv block count, "
                               "k.shape[2] // 64) and fit in int32")
    return n


def qat_attention_forward(q, k, v, config=None):
    """QAT attention forward (fva_qat_forward). q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D], bf16 or
    f16. Returns (o, o_hp or None, lse): o_hp when config.high_precision_o, lse float32 [B, Hq, Sq]
    (base-2 log-sum-exp of the scaled logits)."""
    if _jax_inputs(q, k, v):
        from .jax import _primitives
        return _primitives.qat_forward(q, k, v, config)
    lib, cfg = _capi.lib(), _qat_config(config)
    c = Call({"q": q, "k": k, "v": v})
    nbytes = c.query(lib.fva_qat_forward_workspace_size, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"))
    qs, dt = c.shape("q"), c.dtype("q")
    c.output("o", qs, dt)
    if cfg.high_precision_o:
        c.output("o_hp", qs, dt)
    c.output("lse", qs[:3], _capi.DTYPE_F32)
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_qat_forward(c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"),
                                    c.t("o"), c.t("o_hp"), c.t("lse"), ws, ws_bytes, c.stream))
    return (c.result("o"), c.result("o_hp") if cfg.high_precision_o else None, c.result("lse"))


def qat_attention_backward(q, k, v, o_for_bwd, lse, dout, config=None):
    """QAT attention backward (fva_qat_backward): the forward's q, k, v and config, o_for_bwd (o_hp
    when config.high_precision_o, else o), its lse, and dout. Returns (dq, dk, dv)."""
    if _jax_inputs(q, k, v, o_for_bwd, lse, dout):
        from .jax import _primitives
        return _primitives.qat_backward(q, k, v, o_for_bwd, lse, dout, config)
    lib, cfg = _capi.lib(), _qat_config(config)
    c = Call({"q": q, "k": k, "v": v, "o_for_bwd": o_for_bwd, "lse": lse, "dout": dout})
    nbytes = c.query(lib.fva_qat_backward_workspace_size, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"))
    for g, x in (("dq", "q"), ("dk", "k"), ("dv", "v")):
        c.output(g, c.shape(x), c.dtype(x))
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_qat_backward(c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"),
                                     c.t("o_for_bwd"), c.t("lse"), c.t("dout"), c.t("dq"), c.t("dk"),
                                     c.t("dv"), ws, ws_bytes, c.stream))
    return c.result("dq"), c.result("dk"), c.result("dv")


def vsa_forward(q, k, v, q2k_idx, q2k_num, block_sizes, config=None):
    """VSA block-sparse attention forward (fva_vsa_forward). q [B, Hq, 64*nq, D], k and v
    [B, Hkv, 64*nkv, D] (D 64 or 128), q2k_idx int32 [B, Hq, nq, max_k], q2k_num int32 [B, Hq, nq],
    block_sizes int32 [nkv]. Returns (o, lse)."""
    if _jax_inputs(q, k, v, q2k_idx, q2k_num, block_sizes):
        from .jax import _primitives
        return _primitives.vsa_forward(q, k, v, q2k_idx, q2k_num, block_sizes, config)
    lib, cfg = _capi.lib(), _vsa_config(config)
    c = Call({"q": q, "k": k, "v": v, "q2k_idx": q2k_idx, "q2k_num": q2k_num,
              "block_sizes": block_sizes})
    nbytes = c.query(lib.fva_vsa_forward_workspace_size, ctypes.byref(cfg), c.t("q"), c.t("k"),
                     c.t("v"), c.t("q2k_idx"))
    qs = c.shape("q")
    c.output("o", qs, c.dtype("q"))
    c.output("lse", qs[:3], _capi.DTYPE_F32)
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_vsa_forward(c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"),
                                    c.t("q2k_idx"), c.t("q2k_num"), c.t("block_sizes"), c.t("o"),
                                    c.t("lse"), ws, ws_bytes, c.stream))
    return c.result("o"), c.result("lse")


def vsa_backward(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, config=None):
    """VSA backward (fva_vsa_backward): the forward's inputs, its o and lse, and dout. Returns
    (dq, dk, dv); kv blocks nobody selects get exactly zero dk and dv."""
    if _jax_inputs(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes):
        from .jax import _primitives
        return _primitives.vsa_backward(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, config)
    lib, cfg = _capi.lib(), _vsa_config(config)
    c = Call({"q": q, "k": k, "v": v, "o": o, "lse": lse, "dout": dout, "q2k_idx": q2k_idx,
              "q2k_num": q2k_num, "block_sizes": block_sizes})
    nbytes = c.query(lib.fva_vsa_backward_workspace_size, ctypes.byref(cfg), c.t("q"), c.t("k"),
                     c.t("v"), c.t("q2k_idx"))
    for g, x in (("dq", "q"), ("dk", "k"), ("dv", "v")):
        c.output(g, c.shape(x), c.dtype(x))
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_vsa_backward(c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"),
                                     c.t("o"), c.t("lse"), c.t("dout"), c.t("q2k_idx"),
                                     c.t("q2k_num"), c.t("block_sizes"), c.t("dq"), c.t("dk"),
                                     c.t("dv"), ws, ws_bytes, c.stream))
    return c.result("dq"), c.result("dk"), c.result("dv")


def vsa_invert_indices(q2k_idx, q2k_num, num_kv_blocks):
    """The q->kv block lists inverted (fva_vsa_invert_indices): returns (k2q_idx int32
    [B, H, num_kv_blocks, nq], each row's q blocks ascending and -1 past its count; k2q_num int32
    [B, H, num_kv_blocks])."""
    num_kv_blocks = num_kv_blocks_arg(num_kv_blocks)
    if _jax_inputs(q2k_idx, q2k_num):
        from .jax import _primitives
        return _primitives.vsa_invert_indices(q2k_idx, q2k_num, num_kv_blocks)
    lib = _capi.lib()
    c = Call({"q2k_idx": q2k_idx, "q2k_num": q2k_num})
    B, H, nq = c.shape("q2k_idx")[:3] if c.desc["q2k_idx"].rank >= 3 else (1, 1, 1)
    c.output("k2q_idx", (B, H, int(num_kv_blocks), nq), _capi.DTYPE_I32)
    c.output("k2q_num", (B, H, int(num_kv_blocks)), _capi.DTYPE_I32)
    nbytes = c.query(lib.fva_vsa_invert_indices_workspace_size, c.t("q2k_idx"), c.t("k2q_idx"))
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_vsa_invert_indices(c.handle, c.t("q2k_idx"), c.t("q2k_num"), c.t("k2q_idx"),
                                           c.t("k2q_num"), ws, ws_bytes, c.stream))
    return c.result("k2q_idx"), c.result("k2q_num")


def nvfp4_fake_quantize(x, config=None):
    """NVFP4 fake quantization of x [B, H, S, D] (fva_nvfp4_fake_quantize): what QAT attention
    applies to q, k and v. Returns y, like x."""
    lib = _capi.lib()
    cfg = coerce(config, Nvfp4Config).to_c()
    c = Call({"x": x})
    c.output("y", c.shape("x"), c.dtype("x"))
    _capi.check(lib.fva_nvfp4_fake_quantize(c.handle, ctypes.byref(cfg), c.t("x"), c.t("y"), c.stream))
    return c.result("y")


# ---- the whole VSA layer (FastVideo's video_sparse_attn) -----------------------------------------

VsaLayerResult = collections.namedtuple("VsaLayerResult", "out reserve q2k_idx q2k_num")
VsaLayerResult.__doc__ = """What fvattn.video_sparse_attn returns: out [B, Hq, Sq, D] (q's dtype); reserve,
a 1-D uint8 array of the inputs' kind holding what the backward needs (keep it unchanged, pass it
to video_sparse_attn_backward); q2k_idx int32 [B, Hq, nq, min(topk, nkv)] and q2k_num int32
[B, Hq, nq], the selected kv blocks of each q block, ascending (None unless return_indices)."""


def _layer_config(topk, softmax_scale):
    return VsaLayerConfig(topk=topk, softmax_scale=softmax_scale).to_c()


def _layer_sizes(lib, c, cfg):
    ws, reserve = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _capi.check(_capi.entry("fva_vsa_layer_sizes")(c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"),
                                                    c.t("v"), ctypes.byref(ws), ctypes.byref(reserve)))
    return ws.value, reserve.value


# A stand-in data address for the size query of shapes alone: non-NULL and aligned, never read (the
# query reads shapes, strides and dtypes only).
_NO_DATA = 256


def vsa_layer_sizes(device, dtype_code, q_shape, k_shape, v_shape, topk, softmax_scale=None):
    """(workspace bytes, reserve bytes) of the VSA layer (fva_vsa_layer_sizes) for contiguous q, k, v
    of these shapes and dtype (an fva dtype code, _capi.DTYPE_*) on device ("cpu", -1) or
    ("cuda", ordinal), reading no tensor data: what an output-shape inference (a torch fake
    implementation) needs to size the reserve without running the layer."""

    def desc(shape):
        shape = tuple(int(n) for n in shape)
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        return _capi.tensor(_NO_DATA, dtype_code, shape, strides)

    cfg = _layer_config(topk, softmax_scale)
    descs = [desc(s) for s in (q_shape, k_shape, v_shape)]
    ws, reserve = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _capi.check(_capi.entry("fva_vsa_layer_sizes")(_handles.get(*device), ctypes.byref(cfg),
                                                    *(ctypes.byref(d) for d in descs),
                                                    ctypes.byref(ws), ctypes.byref(reserve)))
    return ws.value, reserve.value


def video_sparse_attn(q, k, v, kv_block_sizes, q_block_sizes, topk, gate=None, *, softmax_scale=None,
                      return_indices=False):
    """The whole VSA layer, forward (fva_vsa_layer_forward; docs/SPEC.md section 3b): block means,
    coarse attention over the blocks, the topk kv blocks of highest coarse score per q block, the
    fine block-sparse attention over them, and out = out_c[block] * gate + out_s (without gate:
    out_c[block] + out_s).

    q [B, Hq, 64*nq, D], k and v [B, Hkv, 64*nkv, D] (bf16 or f16, D 64 or 128, Hq a multiple of
    Hkv), gate like q or None, kv_block_sizes int32 [nkv] and q_block_sizes int32 [nq] (real tokens
    per block, which fill its first slots: vsa_tile_plan's block_sizes), topk >= 1 (more than nkv:
    all), softmax_scale None for 1/sqrt(D). Returns a VsaLayerResult (out, reserve, q2k_idx,
    q2k_num); the reserve is what video_sparse_attn_backward needs."""
    if _jax_inputs(q, k, v, gate, kv_block_sizes, q_block_sizes):
        from .jax import _primitives
        return _primitives.vsa_layer_forward(q, k, v, kv_block_sizes, q_block_sizes, topk, gate,
                                             softmax_scale, return_indices)
    lib, cfg = _capi.lib(), _layer_config(topk, softmax_scale)
    c = Call({"q": q, "k": k, "v": v, "gate": gate, "q_block_sizes": q_block_sizes,
              "kv_block_sizes": kv_block_sizes})
    ws_bytes, reserve_bytes = _layer_sizes(lib, c, cfg)
    qs = c.shape("q")
    c.output("out", qs, c.dtype("q"))
    if return_indices:
        nq, nkv = qs[2] // cfg.block_size, c.shape("k")[2] // cfg.block_size
        c.output("q2k_idx", qs[:2] + (nq, max(1, min(cfg.topk, nkv))), _capi.DTYPE_I32)
        c.output("q2k_num", qs[:2] + (nq,), _capi.DTYPE_I32)
    c.byte_output("reserve", reserve_bytes)
    ws, ws_bytes = c.workspace(ws_bytes)
    reserve_ptr, _ = c.bytes["reserve"]
    _capi.check(_capi.entry("fva_vsa_layer_forward")(
        c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"), c.t("gate"), c.t("q_block_sizes"),
        c.t("kv_block_sizes"), c.t("out"), c.t("q2k_idx"), c.t("q2k_num"), reserve_ptr,
        reserve_bytes, ws, ws_bytes, c.stream))
    return VsaLayerResult(c.result("out"), c.result("reserve"),
                          c.result("q2k_idx") if return_indices else None,
                          c.result("q2k_num") if return_indices else None)


def video_sparse_attn_backward(q, k, v, kv_block_sizes, q_block_sizes, topk, dout, reserve, gate=None,
                               *, softmax_scale=None):
    """The whole VSA layer, backward (fva_vsa_layer_backward): the forward's inputs and topk (and
    softmax_scale), its reserve, and dout like q. Returns (dq, dk, dv, dgate), dgate None without a
    gate. The selection is not differentiated (SPEC 3b); a reserve from another call's shapes,
    config or gate raises fvattn.Error."""
    if _jax_inputs(q, k, v, gate, kv_block_sizes, q_block_sizes, dout, reserve):
        from .jax import _primitives
        return _primitives.vsa_layer_backward(q, k, v, kv_block_sizes, q_block_sizes, topk, dout,
                                              reserve, gate, softmax_scale)
    lib, cfg = _capi.lib(), _layer_config(topk, softmax_scale)
    c = Call({"q": q, "k": k, "v": v, "gate": gate, "q_block_sizes": q_block_sizes,
              "kv_block_sizes": kv_block_sizes, "dout": dout}, byte_inputs={"reserve": reserve})
    ws_bytes, _ = _layer_sizes(lib, c, cfg)
    for g, x in (("dq", "q"), ("dk", "k"), ("dv", "v")) + ((("dgate", "gate"),) if gate is not None else ()):
        c.output(g, c.shape(x), c.dtype(x))
    ws, ws_bytes = c.workspace(ws_bytes)
    reserve_ptr, reserve_bytes = c.bytes["reserve"]
    _capi.check(_capi.entry("fva_vsa_layer_backward")(
        c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"), c.t("gate"), c.t("q_block_sizes"),
        c.t("kv_block_sizes"), c.t("dout"), reserve_ptr, reserve_bytes, c.t("dq"), c.t("dk"),
        c.t("dv"), c.t("dgate"), ws, ws_bytes, c.stream))
    return (c.result("dq"), c.result("dk"), c.result("dv"),
            c.result("dgate") if gate is not None else None)


TilePlan = collections.namedtuple("TilePlan", "grid tile slot_of_token token_of_slot block_sizes")
TilePlan.__doc__ = """Where the tokens of a (T, H, W) grid go in FastVideo's tiled, padded sequence
(fva_vsa_tile_plan), as read-only NumPy arrays:
  slot_of_token int64 [T*H*W]: the slot of token (t, h, w), at index (t*H + h)*W + w;
  token_of_slot int64 [num_blocks * prod(tile)]: its inverse, -1 for a padding slot;
  block_sizes int32 [num_blocks]: real tokens per block (the layer's q/kv block sizes)."""


def _grid3(name, values):
    try:
        out = tuple(int(x) for x in values)
    except TypeError:
        raise invalid_argument(f"{name}: expected 3 integers (T, H, W), got {values!r}") from None
    if len(out) != 3:
        raise invalid_argument(f"{name}: expected 3 integers, got {len(out)}: {values!r}")
    return out


def vsa_tile_plan(grid, tile=(4, 4, 4)):
    """The TilePlan of a (T, H, W) token grid cut into tiles of `tile` (FastVideo's (4, 4, 4): one
    64-token block per tile), from fva_vsa_tile_plan; computed once per (grid, tile) and cached."""
    return _tile_plan(_grid3("grid", grid), _grid3("tile", tile))


@functools.lru_cache(maxsize=64)
def _tile_plan(grid, tile):
    fn = _capi.entry("fva_vsa_tile_plan")
    dims = (ctypes.c_int64 * 3)(*grid)
    tiles = (ctypes.c_int32 * 3)(*tile)
    n = ctypes.c_int64(0)
    _capi.check(fn(dims, tiles, None, None, ctypes.byref(n)))
    slot_of_token = np.empty(grid[0] * grid[1] * grid[2], np.int64)
    block_sizes = np.empty(n.value, np.int32)
    _capi.check(fn(dims, tiles, slot_of_token.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                   block_sizes.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), ctypes.byref(n)))
    token_of_slot = np.full(n.value * tile[0] * tile[1] * tile[2], -1, np.int64)
    token_of_slot[slot_of_token] = np.arange(slot_of_token.size)
    for a in (slot_of_token, token_of_slot, block_sizes):
        a.flags.writeable = False
    return TilePlan(grid, tile, slot_of_token, token_of_slot, block_sizes)
