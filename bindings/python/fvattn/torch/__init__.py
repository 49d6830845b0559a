"""PyTorch functions over fvattn, with FastVideo's call shapes, so that a FastVideo user switches by
changing an import:

    from fvattn.torch import attention                       # FastVideo's Attn-QAT `attention`
    o = attention(q, k, v, causal, sm_scale)                 # same positional and keyword arguments
    from fvattn.torch import block_sparse_attn_from_indices  # VSA
    o, lse = block_sparse_attn_from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes)
    from fvattn.torch import video_sparse_attn               # the whole VSA layer
    out = video_sparse_attn(q, k, v, variable_block_sizes, q_variable_block_sizes, topk,
                            block_size=(4, 4, 4), compress_attn_weight=gate)
    from fvattn.torch import tile, untile, tile_block_sizes  # FastVideo's 4x4x4 tiling, padded
    q = tile(q, (T, H, W)); sizes = tile_block_sizes((T, H, W), q.device); o = untile(o, (T, H, W))

CUDA tensors run on their device with torch's current stream, CPU tensors on the library's CPU
backend. Backward is the library's (FastVideo's gradients: straight through the quantizers). The
operations are torch.library custom ops (fvattn::qat_forward, fvattn::vsa_forward,
fvattn::vsa_layer_forward and their *_backward ops; _custom_ops.py), so torch.compile traces models
that call them with fullgraph=True.
Importing this module needs PyTorch; `import fvattn` does not.
"""
import threading

import torch

from .. import ops
from .._errors import Error, invalid_argument
from ..config import QatConfig, VsaConfig, _scale, _scale_code, block_tokens, coerce
from . import _custom_ops
from ._custom_ops import OPS as CUSTOM_OPS


def _qat_op_args(config):
    """A QatConfig (or a dict of its fields) as the custom ops' config arguments."""
    c = coerce(config, QatConfig)
    return (_scale(c.softmax_scale), bool(c.causal), bool(c.quantize), bool(c.smooth_k),
            _scale_code("qkv_scale", c.qkv_scale), _scale_code("p_scale", c.p_scale),
            bool(c.quantize_p_backward), bool(c.high_precision_o), bool(c.quantized_qkv_backward))


def _qat(q, k, v, config, return_lse=False):
    o, _, lse = _custom_ops.qat_forward(q, k, v, *_qat_op_args(config))
    return (o, lse) if return_lse else o


def attention(q, k, v, causal, sm_scale, use_qat_qkv_backward=True, smooth_k=True,
              warp_specialize=True, IS_QAT=True, two_level_quant_P=True, fake_quant_P=True,
              use_high_prec_o=False, smooth_q=False, use_global_sf_P=True, use_global_sf_QKV=True,
              return_lse=False):
    """FastVideo's Attn-QAT `attention` (same arguments and defaults: the kernel's own defaults,
    tile/row scales and smooth_k; its ATTN_QAT_TRAIN backend passes the production preset).
    warp_specialize is a kernel-tuning switch and is ignored; smooth_q is not offered (broken in
    FastVideo, SPEC.md section 2). return_lse=True (an addition to FastVideo's arguments) returns
    (o, lse): lse float32 [B, H, S], base 2, not differentiable, what a merge of partial attentions
    (ring attention, split keys) needs. The custom op fvattn::qat_forward (backward
    fvattn::qat_backward)."""
    del warp_specialize
    if smooth_q:
        raise Error(2, "FVA_ERR_UNSUPPORTED", "smooth_q: not offered (FastVideo's smooth_q is broken, "
                    "docs/SPEC.md section 2)")
    config = QatConfig(
        softmax_scale=sm_scale, causal=bool(causal), quantize=bool(IS_QAT), smooth_k=bool(smooth_k),
        qkv_scale="tile" if use_global_sf_QKV else "block",
        p_scale="row" if two_level_quant_P else "tile" if use_global_sf_P else "block",
        quantize_p_backward=bool(fake_quant_P), high_precision_o=bool(use_high_prec_o),
        quantized_qkv_backward=bool(use_qat_qkv_backward))
    return _qat(q, k, v, config, return_lse)


def qat_attention(q, k, v, config=None, return_lse=False):
    """o = QAT attention under a fvattn.QatConfig (None: FastVideo's production preset), or (o, lse)
    with return_lse=True (lse float32 [B, H, S], base 2, not differentiable); the custom op
    fvattn::qat_forward (backward fvattn::qat_backward)."""
    return _qat(q, k, v, config, return_lse)


def _int32(t):
    # FastVideo passes int32 or int64 metadata (its wrappers convert); the library reads int32.
    return t.to(torch.int32).contiguous()


def _vsa(q, k, v, q2k_idx, q2k_num, block_sizes, config):
    c = coerce(config, VsaConfig)
    return _custom_ops.vsa_forward(q, k, v, _int32(q2k_idx), _int32(q2k_num), _int32(block_sizes),
                                   _scale(c.softmax_scale), int(c.block_size))


def block_sparse_attn_from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes, sm_scale=None):
    """FastVideo's VSA entry point: q, k, v [B, H, 64*n, D] (bf16, D 64 or 128), q2k_idx
    [B, H, nq, max_k], q2k_num [B, H, nq], variable_block_sizes [nkv]. Returns (o, lse), lse in
    FastVideo's base-2 "M" format (not differentiable). The custom op fvattn::vsa_forward (backward
    fvattn::vsa_backward)."""
    return _vsa(q, k, v, q2k_idx, q2k_num, variable_block_sizes, VsaConfig(softmax_scale=sm_scale))


def _block_sizes(sizes, like):
    # FastVideo builds its block sizes as int32 or int64 tensors on the model's device; the library
    # reads int32 on the device of q.
    if not isinstance(sizes, torch.Tensor):
        sizes = torch.as_tensor(sizes)
    return sizes.to(device=like.device, dtype=torch.int32).contiguous()


def _vsa_layer(q, k, v, gate, kv_block_sizes, q_block_sizes, topk, softmax_scale):
    out, _ = _custom_ops.vsa_layer_forward(q, k, v, gate, _block_sizes(kv_block_sizes, q),
                                           _block_sizes(q_block_sizes, q), int(topk),
                                           _scale(softmax_scale))
    return out


def video_sparse_attn(q, k, v, variable_block_sizes, q_variable_block_sizes, topk, block_size=64,
                      compress_attn_weight=None):
    """FastVideo's `video_sparse_attn` (fastvideo_kernel), same arguments, defaults and result: the
    whole VSA layer over [B, H, S, D] tensors, S a multiple of 64 (tiled with tile()), bf16 or f16,
    D 64 or 128 (GQA too: H of q a multiple of H of k, v). variable_block_sizes [nkv] and
    q_variable_block_sizes [nq]: real tokens of each kv / q block (tile_block_sizes()); topk: kv
    blocks each q block attends; block_size: (4, 4, 4) (or 64); compress_attn_weight: the gate, like
    q, or None. Returns out like q: out_c[block] * gate + out_s (without gate: out_c[block] + out_s).
    Differentiable in q, k, v and the gate; where FastVideo's torch code would compute NaN (a block
    of size 0), the library defines the result (docs/SPEC.md section 3b). The custom op
    fvattn::vsa_layer_forward (backward fvattn::vsa_layer_backward)."""
    block_tokens(block_size)
    return _vsa_layer(q, k, v, compress_attn_weight, variable_block_sizes, q_variable_block_sizes,
                      topk, None)


class QatAttentionFunction:
    """The former autograd.Function of QAT attention, kept for its callers:
    QatAttentionFunction.apply(q, k, v, config) is qat_attention(q, k, v, config)."""

    @staticmethod
    def apply(q, k, v, config):
        return _qat(q, k, v, config)


class VsaFunction:
    """The former autograd.Function of VSA, kept for its callers: VsaFunction.apply(q, k, v, q2k_idx,
    q2k_num, block_sizes, config) returns (o, lse) as block_sparse_attn_from_indices does."""

    @staticmethod
    def apply(q, k, v, q2k_idx, q2k_num, block_sizes, config):
        return _vsa(q, k, v, q2k_idx, q2k_num, block_sizes, config)


class VsaLayerFunction:
    """The former autograd.Function of the whole VSA layer, kept for its callers:
    VsaLayerFunction.apply(q, k, v, gate, kv_block_sizes, q_block_sizes, topk, softmax_scale)
    (softmax_scale None: 1/sqrt(D)) returns out as video_sparse_attn does."""

    @staticmethod
    def apply(q, k, v, gate, kv_block_sizes, q_block_sizes, topk, softmax_scale):
        return _vsa_layer(q, k, v, gate, kv_block_sizes, q_block_sizes, topk, softmax_scale)


# ---- FastVideo's tiling of a (T, H, W) latent ----------------------------------------------------

_plan_lock = threading.Lock()
_plan_tensors = {}


def _plan(grid, tile_size, device):
    """(slot_of_token int64, block_sizes int32) tensors on `device`, from ops.vsa_tile_plan (one
    fva_vsa_tile_plan call per grid), cached per (grid, tile, device)."""
    plan = ops.vsa_tile_plan(grid, tile_size)
    key = (plan.grid, plan.tile, str(device))
    with _plan_lock:
        cached = _plan_tensors.get(key)
        if cached is None:
            cached = _plan_tensors[key] = (
                torch.from_numpy(plan.slot_of_token.copy()).to(device),
                torch.from_numpy(plan.block_sizes.copy()).to(device))
        return plan, cached


def _seq_dim(x, dim):
    if not -x.dim() <= dim < x.dim():
        raise invalid_argument(f"x: dim {dim} is out of range for a tensor of rank {x.dim()}")
    return dim % x.dim()


def tile(x, grid, dim=-2, tile_size=(4, 4, 4)):
    """FastVideo's tiling of a (T, H, W) latent's tokens: x holds T*H*W tokens in (t, h, w) order
    along `dim` (-2: [B, H, S, D] as the layer takes, or [B, S, C]; 1 for FastVideo's [B, S, H, D]);
    returns them cut into tile_size tiles, tiles in (t, h, w) order, each tile's tokens in (t, h, w)
    order in the first slots of its block of prod(tile_size) slots, the rest zero. Differentiable.
    Its length along dim is 64 * len(tile_block_sizes(grid))."""
    d = _seq_dim(x, dim)
    plan, (slot_of_token, _) = _plan(grid, tile_size, x.device)
    if x.shape[d] != slot_of_token.numel():
        raise invalid_argument(f"x: shape[{d}] is {x.shape[d]} but the grid {plan.grid} has "
                               f"{slot_of_token.numel()} tokens")
    shape = list(x.shape)
    shape[d] = plan.token_of_slot.size
    return x.new_zeros(shape).index_copy(d, slot_of_token, x)


def untile(x, grid, dim=-2, tile_size=(4, 4, 4)):
    """The inverse of tile(): the grid's T*H*W tokens back in (t, h, w) order along `dim`, the
    padding slots dropped. Differentiable."""
    d = _seq_dim(x, dim)
    plan, (slot_of_token, _) = _plan(grid, tile_size, x.device)
    if x.shape[d] != plan.token_of_slot.size:
        raise invalid_argument(f"x: shape[{d}] is {x.shape[d]} but the tiled grid {plan.grid} has "
                               f"{plan.token_of_slot.size} slots")
    return x.index_select(d, slot_of_token)


def tile_block_sizes(grid, device=None, tile_size=(4, 4, 4)):
    """int32 [num_blocks]: the real tokens of each block of tile(x, grid), the variable_block_sizes
    (and q_variable_block_sizes) to pass to video_sparse_attn."""
    return _plan(grid, tile_size, torch.device("cpu") if device is None else device)[1][1].clone()


__all__ = ["attention", "qat_attention", "block_sparse_attn_from_indices", "video_sparse_attn", "tile",
           "untile", "tile_block_sizes", "CUSTOM_OPS", "QatAttentionFunction", "VsaFunction",
           "VsaLayerFunction"]
