"""fvattn for JAX: QAT attention and VSA as XLA FFI custom calls, differentiable.

    import fvattn.jax as fj
    o = fj.qat_attention(q, k, v)                                     # [B, H, S, D] bf16 or f16
    o = fj.vsa_attention(q, k, v, q2k_idx, q2k_num, block_sizes)

Each is a jax.custom_vjp whose backward is the library's backward (FastVideo's gradients: straight
through the quantizers), so they work under jax.jit, jax.grad / jax.vjp and jax.vmap, on the CPU
(the library's CPU backend) and on CUDA GPUs (XLA's stream and scratch memory). Bad shapes raise
fvattn.Error with the library's message when traced.

The handlers are in libfvattn_jax.so, found through FVATTN_JAX_LIBRARY (a path) or the installed
package; libfvattn.so.1 itself as fvattn finds it.
"""
import functools

import jax
import numpy as np

from ..config import QatConfig, VsaConfig
from . import _primitives
from ._primitives import nvfp4_fake_quantize, register, vsa_invert_indices

__all__ = ["qat_attention", "vsa_attention", "vsa_invert_indices", "nvfp4_fake_quantize",
           "register"]


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
