"""fvattn for JAX: QAT attention and VSA as XLA FFI custom calls, differentiable.

    import fvattn.jax as fj
    o = fj.qat_attention(q, k, v)                                     # [B, H, S, D] bf16 or f16
    o = fj.vsa_attention(q, k, v, q2k_idx, q2k_num, block_sizes)
    out = fj.video_sparse_attn(q, k, v, variable_block_sizes, q_variable_block_sizes, topk,
                               block_size=(4, 4, 4), compress_attn_weight=gate)  # the whole layer
    x = fj.tile(x, (T, H, W)); sizes = fj.tile_block_sizes((T, H, W)); y = fj.untile(y, (T, H, W))
    attn = fj.parallel.ulysses(fj.qat_attention, "sp")   # inside jax.shard_map: sequence parallel

Each is a jax.custom_vjp whose backward is the library's backward (FastVideo's gradients: straight
through the quantizers), so they work under jax.jit, jax.grad / jax.vjp and jax.vmap, on the CPU
(the library's CPU backend) and on CUDA GPUs (XLA's stream and scratch memory). Bad shapes raise
fvattn.Error with the library's message when traced.

The handlers are in libfvattn_jax.so, found through FVATTN_JAX_LIBRARY (a path) or the installed
package; libfvattn.so.1 itself as fvattn finds it.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import ops
from .._errors import invalid_argument
from ..config import QatConfig, VsaConfig, block_tokens
from . import _primitives, parallel
from ._primitives import nvfp4_fake_quantize, register, vsa_invert_indices

__all__ = ["qat_attention", "vsa_attention", "vsa_invert_indices", "nvfp4_fake_quantize",
           "video_sparse_attn", "tile", "untile", "tile_block_sizes", "register", "parallel"]


def _frozen_qat(config):
    c = _primitives.qat_config(config)
    return tuple(getattr(c, name) for name, _ in c._fields_)


def _thaw_qat(fields):
    from .. import _capi
    return _capi.QatConfigC(*fields)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _qat(q, k, v, cfg_fields):
    o, _, _ = _primitives.qat_forward_c(q, k, v, _thaw_qat(cfg_fields))
    return o


def _qat_fwd(q, k, v, cfg_fields):
    cfg = _thaw_qat(cfg_fields)
    o, o_hp, lse = _primitives.qat_forward_c(q, k, v, cfg)
    # The backward's Delta uses o_hp when the config keeps it (FastVideo's use_high_prec_o).
    return o, (q, k, v, o_hp if o_hp is not None else o, lse)


def _qat_bwd(cfg_fields, res, g):
    q, k, v, o_for_bwd, lse = res
    return _primitives.qat_backward_c(q, k, v, o_for_bwd, lse, g.astype(q.dtype), _thaw_qat(cfg_fields))


_qat.defvjp(_qat_fwd, _qat_bwd)


def qat_attention(q, k, v, config=None):
    """NVFP4 QAT attention (plain attention with config.quantize = False): o [B, Hq, Sq, D].
    q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D], bf16 or f16, D in {16, 32, 64, 128, 256}.
    config: fvattn.QatConfig (None: FastVideo's production preset)."""
    return _qat(q, k, v, _frozen_qat(config))


def _frozen_vsa(config):
    c = _primitives.vsa_config(config)
    return (c.struct_size, c.softmax_scale, c.block_size)


def _thaw_vsa(fields):
    from .. import _capi
    return _capi.VsaConfigC(*fields)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _vsa(q, k, v, q2k_idx, q2k_num, block_sizes, cfg_fields):
    o, _ = _primitives.vsa_forward_c(q, k, v, q2k_idx, q2k_num, block_sizes, _thaw_vsa(cfg_fields))
    return o


def _vsa_fwd(q, k, v, q2k_idx, q2k_num, block_sizes, cfg_fields):
    o, lse = _primitives.vsa_forward_c(q, k, v, q2k_idx, q2k_num, block_sizes, _thaw_vsa(cfg_fields))
    return o, (q, k, v, o, lse, q2k_idx, q2k_num, block_sizes)


def _int_zero_cotangent(x):
    # Integer inputs have no gradient; JAX's cotangent type for them is float0.
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


def _vsa_bwd(cfg_fields, res, g):
    q, k, v, o, lse, q2k_idx, q2k_num, block_sizes = res
    dq, dk, dv = _primitives.vsa_backward_c(q, k, v, o, lse, g.astype(q.dtype), q2k_idx, q2k_num,
                                            block_sizes, _thaw_vsa(cfg_fields))
    return (dq, dk, dv, _int_zero_cotangent(q2k_idx), _int_zero_cotangent(q2k_num),
            _int_zero_cotangent(block_sizes))


_vsa.defvjp(_vsa_fwd, _vsa_bwd)


def vsa_attention(q, k, v, q2k_idx, q2k_num, block_sizes, config=None):
    """VSA block-sparse attention: o [B, Hq, 64*nq, D]. q [B, Hq, 64*nq, D], k and v
    [B, Hkv, 64*nkv, D] (bf16 or f16, D 64 or 128), q2k_idx int32 [B, Hq, nq, max_k], q2k_num int32
    [B, Hq, nq], block_sizes int32 [nkv]. config: fvattn.VsaConfig (None: 1/sqrt(D), 64)."""
    return _vsa(q, k, v, q2k_idx, q2k_num, block_sizes, _frozen_vsa(config))


# ---- the whole VSA layer (FastVideo's video_sparse_attn) -----------------------------------------


def _thaw_layer(fields):
    from .. import _capi
    return _capi.VsaLayerConfigC(*fields)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _layer(q, k, v, gate, kv_block_sizes, q_block_sizes, cfg_fields):
    out, _, _, _ = _primitives.vsa_layer_forward_c(q, k, v, kv_block_sizes, q_block_sizes, gate,
                                                   _thaw_layer(cfg_fields))
    return out


def _layer_fwd(q, k, v, gate, kv_block_sizes, q_block_sizes, cfg_fields):
    out, _, _, reserve = _primitives.vsa_layer_forward_c(q, k, v, kv_block_sizes, q_block_sizes, gate,
                                                         _thaw_layer(cfg_fields))
    return out, (q, k, v, gate, kv_block_sizes, q_block_sizes, reserve)


def _layer_bwd(cfg_fields, res, g):
    q, k, v, gate, kv_block_sizes, q_block_sizes, reserve = res
    dq, dk, dv, dgate = _primitives.vsa_layer_backward_c(
        q, k, v, kv_block_sizes, q_block_sizes, g.astype(q.dtype), reserve, gate,
        _thaw_layer(cfg_fields), check=False)
    return (dq, dk, dv, dgate, _int_zero_cotangent(kv_block_sizes), _int_zero_cotangent(q_block_sizes))


_layer.defvjp(_layer_fwd, _layer_bwd)


def _sizes(x):
    # FastVideo passes int32 or int64 block sizes; the library reads int32 (other dtypes reach its
    # check and its message).
    x = jnp.asarray(x)
    return x.astype(jnp.int32) if jnp.issubdtype(x.dtype, jnp.integer) else x


def video_sparse_attn(q, k, v, variable_block_sizes, q_variable_block_sizes, topk, block_size=64,
                      compress_attn_weight=None):
    """The whole VSA layer with FastVideo's `video_sparse_attn` arguments (as fvattn.torch's):
    q [B, Hq, 64*nq, D], k and v [B, Hkv, 64*nkv, D] (bf16 or f16, D 64 or 128, Hq a multiple of
    Hkv); variable_block_sizes [nkv] and q_variable_block_sizes [nq], real tokens per block
    (tile_block_sizes()); topk, a Python int; block_size (4, 4, 4) (or 64); compress_attn_weight, the
    gate, like q, or None. Returns out like q: out_c[block] * gate + out_s (without gate: out_c +
    out_s; docs/SPEC.md section 3b). A jax.custom_vjp: gradients of q, k, v and the gate by
    fva_vsa_layer_backward on the forward's reserve (the selection is not differentiated); works
    under jit, grad/vjp and vmap, on the CPU and on CUDA GPUs."""
    block_tokens(block_size)
    cfg = _primitives.vsa_layer_config(int(topk))
    return _layer(q, k, v, compress_attn_weight, _sizes(variable_block_sizes),
                  _sizes(q_variable_block_sizes), tuple(getattr(cfg, n) for n, _ in cfg._fields_))


# ---- FastVideo's tiling of a (T, H, W) latent ----------------------------------------------------


def _axis(x, axis):
    if not -x.ndim <= axis < x.ndim:
        raise invalid_argument(f"x: axis {axis} is out of range for an array of rank {x.ndim}")
    return axis % x.ndim


def tile(x, grid, axis=-2, tile_size=(4, 4, 4)):
    """FastVideo's tiling of a (T, H, W) latent's tokens: x holds T*H*W tokens in (t, h, w) order
    along `axis` (-2: [B, H, S, D] as the layer takes, or [B, S, C]; 1 for [B, S, H, D]); returns
    them cut into tile_size tiles, tiles in (t, h, w) order, each tile's tokens in (t, h, w) order in
    the first slots of its block of prod(tile_size) slots, the rest zero (fva_vsa_tile_plan, one call
    per grid, cached). Differentiable; traceable (the index map is a constant)."""
    a = _axis(x, axis)
    plan = ops.vsa_tile_plan(grid, tile_size)
    if x.shape[a] != plan.slot_of_token.size:
        raise invalid_argument(f"x: shape[{a}] is {x.shape[a]} but the grid {plan.grid} has "
                               f"{plan.slot_of_token.size} tokens")
    real = plan.token_of_slot >= 0
    gathered = jnp.take(x, np.where(real, plan.token_of_slot, 0), axis=a)
    shape = [1] * x.ndim
    shape[a] = real.size
    return jnp.where(real.reshape(shape), gathered, jnp.zeros((), x.dtype))


def untile(x, grid, axis=-2, tile_size=(4, 4, 4)):
    """The inverse of tile(): the grid's T*H*W tokens back in (t, h, w) order along `axis`, the
    padding slots dropped. Differentiable."""
    a = _axis(x, axis)
    plan = ops.vsa_tile_plan(grid, tile_size)
    if x.shape[a] != plan.token_of_slot.size:
        raise invalid_argument(f"x: shape[{a}] is {x.shape[a]} but the tiled grid {plan.grid} has "
                               f"{plan.token_of_slot.size} slots")
    return jnp.take(x, plan.slot_of_token, axis=a)


def tile_block_sizes(grid, tile_size=(4, 4, 4)):
    """int32 [num_blocks]: the real tokens of each block of tile(x, grid), the variable_block_sizes
    (and q_variable_block_sizes) to pass to video_sparse_attn."""
    return jnp.asarray(ops.vsa_tile_plan(grid, tile_size).block_sizes)
