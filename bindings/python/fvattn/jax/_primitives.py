"""fvattn's operations as XLA FFI custom calls (jax.ffi.ffi_call), one per library call, for the
"cpu" and "CUDA" platforms. The handlers live in libfvattn_jax.so (bindings/jax/), found through
FVATTN_JAX_LIBRARY or the installed package. Arguments are checked at trace time (_checks.py).

Under jax.vmap the calls use vmap_method="expand_dims": the handler gets the batch as leading
dimensions (size 1 for an unbatched argument) and runs the library once per batch element. Under
jax.jit with inputs sharded over batch or heads, the attention calls, the index inversion and the
NVFP4 quantizer and the VSA layer's calls run on each device's shard (_sharding.py).
"""
import threading

import jax
import jax.numpy as jnp
import numpy as np

from .. import _capi, _library
from ..config import QatConfig, VsaConfig, VsaLayerConfig, coerce
from . import _checks, _sharding
from ._sharding import KV, Q, WHOLE

# target name -> handler symbol prefix in libfvattn_jax.so (+ "Cpu" / "Cuda")
_TARGETS = {
    "fvattn_qat_forward": "FvattnQatForward",
    "fvattn_qat_forward_hp": "FvattnQatForwardHp",
    "fvattn_qat_backward": "FvattnQatBackward",
    "fvattn_vsa_forward": "FvattnVsaForward",
    "fvattn_vsa_backward": "FvattnVsaBackward",
    "fvattn_vsa_invert_indices": "FvattnVsaInvertIndices",
    "fvattn_nvfp4_fake_quantize": "FvattnNvfp4FakeQuantize",
    "fvattn_vsa_layer_forward": "FvattnVsaLayerForward",
    "fvattn_vsa_layer_forward_gated": "FvattnVsaLayerForwardGated",
    "fvattn_vsa_layer_backward": "FvattnVsaLayerBackward",
    "fvattn_vsa_layer_backward_gated": "FvattnVsaLayerBackwardGated",
}
_lock = threading.Lock()
_registered = False


def register():
    """Registers every handler with XLA (once per process)."""
    global _registered
    with _lock:
        if _registered:
            return
        lib, _ = _library.jax_handlers()
        for target, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol + "Cpu")),
                                        platform="cpu")
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol + "Cuda")),
                                        platform="CUDA")
        _registered = True


def _varying_axes(x):
    """The mesh axes over which x varies inside jax.shard_map (empty outside it)."""
    t = jax.typeof(x)
    mat = getattr(t, "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(t, "vma", ()))


def _vary(x, axes):
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, tuple(sorted(axes)), to="varying")
    return jax.lax.pvary(x, tuple(sorted(axes)))


def _call(target, results, *args, **attrs):
    register()
    out = jax.ffi.ffi_call(target, results, vmap_method="expand_dims")(*args, **attrs)
    # Inside jax.shard_map a custom call's results vary over the mesh axes its inputs vary over
    # (each device computes its own), which XLA's FFI does not infer: say so, so that a custom_vjp
    # backward's gradients have their inputs' types (fvattn.jax.parallel).
    axes = frozenset().union(*(_varying_axes(a) for a in args if hasattr(a, "shape")))
    if not axes:
        return out
    fix = lambda r: _vary(r, axes - _varying_axes(r)) if axes - _varying_axes(r) else r  # noqa: E731
    return type(out)(fix(r) for r in out) if isinstance(out, (tuple, list)) else fix(out)


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def qat_config(config):
    """The C config of a QatConfig (None: the defaults)."""
    return coerce(config, QatConfig).to_c()


def vsa_config(config):
    return coerce(config, VsaConfig).to_c()


def qat_attrs(cfg):
    flags = np.array([cfg.causal, cfg.quantize, cfg.smooth_k, cfg.qkv_scale, cfg.p_scale,
                      cfg.quantize_p_backward, cfg.high_precision_o, cfg.quantized_qkv_backward],
                     dtype=np.int32)
    return {"softmax_scale": np.float32(cfg.softmax_scale), "flags": flags}


def vsa_attrs(cfg):
    return {"softmax_scale": np.float32(cfg.softmax_scale), "block_size": np.int32(cfg.block_size)}


def _fields(cfg):
    """A C config as a hashable tuple (a static argument of the partitioned calls)."""
    return tuple(getattr(cfg, name) for name, _ in cfg._fields_)


# ---- the calls on whatever shard they are given (no checks: the callers checked the whole) -------


def _qat_forward_local(q, k, v, fields):
    cfg = _capi.QatConfigC(*fields)
    o, lse = _sds(q.shape, q.dtype), _sds(q.shape[:3], jnp.float32)
    return tuple(_call("fvattn_qat_forward", (o, lse), q, k, v, **qat_attrs(cfg)))


def _qat_forward_hp_local(q, k, v, fields):
    cfg = _capi.QatConfigC(*fields)
    o, lse = _sds(q.shape, q.dtype), _sds(q.shape[:3], jnp.float32)
    return tuple(_call("fvattn_qat_forward_hp", (o, o, lse), q, k, v, **qat_attrs(cfg)))


def _qat_backward_local(q, k, v, o_for_bwd, lse, dout, fields):
    cfg = _capi.QatConfigC(*fields)
    outs = (_sds(q.shape, q.dtype), _sds(k.shape, k.dtype), _sds(v.shape, v.dtype))
    return tuple(_call("fvattn_qat_backward", outs, q, k, v, o_for_bwd, lse, dout, **qat_attrs(cfg)))


def _vsa_forward_local(q, k, v, q2k_idx, q2k_num, block_sizes, fields):
    cfg = _capi.VsaConfigC(*fields)
    outs = (_sds(q.shape, q.dtype), _sds(q.shape[:3], jnp.float32))
    return tuple(_call("fvattn_vsa_forward", outs, q, k, v, q2k_idx, q2k_num, block_sizes,
                       **vsa_attrs(cfg)))


def _vsa_backward_local(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, fields):
    cfg = _capi.VsaConfigC(*fields)
    outs = (_sds(q.shape, q.dtype), _sds(k.shape, k.dtype), _sds(v.shape, v.dtype))
    return tuple(_call("fvattn_vsa_backward", outs, q, k, v, o, lse, dout, q2k_idx, q2k_num,
                       block_sizes, **vsa_attrs(cfg)))


def _invert_local(q2k_idx, q2k_num, num_kv_blocks):
    B, H, nq = q2k_idx.shape[:3]
    outs = (_sds((B, H, num_kv_blocks, nq), jnp.int32), _sds((B, H, num_kv_blocks), jnp.int32))
    return tuple(_call("fvattn_vsa_invert_indices", outs, q2k_idx, q2k_num))


def _nvfp4_local(x, scale_mode, tile_tokens):
    return _call("fvattn_nvfp4_fake_quantize", _sds(x.shape, x.dtype), x,
                 scale_mode=np.int32(scale_mode), tile_tokens=np.int32(tile_tokens))


_part = _sharding.partitioned
_QAT_FORWARD = _part(_qat_forward_local, (Q, KV, KV), (Q, Q), (4, 4, 4), (4, 3), 1)
_QAT_FORWARD_HP = _part(_qat_forward_hp_local, (Q, KV, KV), (Q, Q, Q), (4, 4, 4), (4, 4, 3), 1)
_QAT_BACKWARD = _part(_qat_backward_local, (Q, KV, KV, Q, Q, Q), (Q, KV, KV), (4, 4, 4, 4, 3, 4),
                      (4, 4, 4), 1)
_VSA_FORWARD = _part(_vsa_forward_local, (Q, KV, KV, Q, Q, WHOLE), (Q, Q), (4, 4, 4, 4, 3, 1), (4, 3), 1)
_VSA_BACKWARD = _part(_vsa_backward_local, (Q, KV, KV, Q, Q, Q, Q, Q, WHOLE), (Q, KV, KV),
                      (4, 4, 4, 4, 3, 4, 4, 3, 1), (4, 4, 4), 1)
_INVERT = _part(_invert_local, (Q, Q), (Q, Q), (4, 3), (4, 3), 1)
_NVFP4 = _part(_nvfp4_local, (Q,), (Q,), (4,), (4,), 2)


# ---- checked calls on the whole arrays (C configs) -----------------------------------------------


def qat_forward_c(q, k, v, cfg):
    """(o, o_hp or None, lse) for a C config."""
    _checks.check_qat(q, k, v, cfg)
    if cfg.high_precision_o:
        return _QAT_FORWARD_HP(q, k, v, _fields(cfg))
    o, lse = _QAT_FORWARD(q, k, v, _fields(cfg))
    return o, None, lse


def qat_backward_c(q, k, v, o_for_bwd, lse, dout, cfg):
    _checks.check_qat_backward(q, k, v, o_for_bwd, lse, dout, cfg)
    return _QAT_BACKWARD(q, k, v, o_for_bwd, lse, dout, _fields(cfg))


def vsa_forward_c(q, k, v, q2k_idx, q2k_num, block_sizes, cfg):
    _checks.check_vsa(q, k, v, q2k_idx, q2k_num, block_sizes, cfg)
    return _VSA_FORWARD(q, k, v, q2k_idx, q2k_num, block_sizes, _fields(cfg))


def vsa_backward_c(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, cfg):
    _checks.check_vsa(q, k, v, q2k_idx, q2k_num, block_sizes, cfg, o=o, lse=lse, dout=dout)
    return _VSA_BACKWARD(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, _fields(cfg))


# ---- the fvattn.ops entry points for JAX arrays (configs as dataclasses) -------------------------


def qat_forward(q, k, v, config=None):
    return qat_forward_c(q, k, v, qat_config(config))


def qat_backward(q, k, v, o_for_bwd, lse, dout, config=None):
    return qat_backward_c(q, k, v, o_for_bwd, lse, dout, qat_config(config))


def vsa_forward(q, k, v, q2k_idx, q2k_num, block_sizes, config=None):
    return vsa_forward_c(q, k, v, q2k_idx, q2k_num, block_sizes, vsa_config(config))


def vsa_backward(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, config=None):
    return vsa_backward_c(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, vsa_config(config))


def vsa_invert_indices(q2k_idx, q2k_num, num_kv_blocks):
    from ..ops import num_kv_blocks_arg
    num_kv_blocks = num_kv_blocks_arg(num_kv_blocks)
    _checks.check_invert(q2k_idx, q2k_num, num_kv_blocks)
    return _INVERT(q2k_idx, q2k_num, int(num_kv_blocks))


def nvfp4_fake_quantize(x, config=None):
    from ..config import Nvfp4Config
    cfg = coerce(config, Nvfp4Config).to_c()
    _checks.dtype_code("x", x.dtype)
    if x.ndim != 4:  # the partitioned call splits [B, H, S, D]; other ranks run whole
        return _nvfp4_local(x, int(cfg.scale_mode), int(cfg.tile_tokens))
    return _NVFP4(x, int(cfg.scale_mode), int(cfg.tile_tokens))


# ---- the whole VSA layer -------------------------------------------------------------------------


def vsa_layer_config(topk, softmax_scale=None):
    return VsaLayerConfig(topk=topk, softmax_scale=softmax_scale).to_c()


def vsa_layer_attrs(cfg):
    return {"softmax_scale": np.float32(cfg.softmax_scale), "block_size": np.int32(cfg.block_size),
            "topk": np.int32(cfg.topk)}


def _layer_outputs(q, k, cfg, reserve_per_head):
    B, H, Sq, _ = q.shape
    nq, nkv = Sq // cfg.block_size, k.shape[2] // cfg.block_size
    return (_sds(q.shape, q.dtype), _sds((B, H, nq, min(cfg.topk, nkv)), jnp.int32),
            _sds((B, H, nq), jnp.int32), _sds((B, H, reserve_per_head), jnp.uint8))


def _check_layer_shard(q, k, v, cfg, reserve_per_head):
    """The reserve's shard covers what the backends ask for this shard's shapes (a partitioned call
    runs on a shard; see _checks.layer_reserve_bytes_per_head for why it always does)."""
    B, H = q.shape[:2]
    need = _checks.layer_reserve_needed(q.shape, q.dtype, k.shape, v.shape, cfg)
    if B * H * reserve_per_head < need:
        raise RuntimeError(f"fvattn internal error: a VSA layer shard {tuple(q.shape)} needs a "
                           f"reserve of {need} bytes, its share holds {B * H * reserve_per_head}")


def _layer_forward_local(q, k, v, q_block_sizes, kv_block_sizes, fields, reserve_per_head):
    cfg = _capi.VsaLayerConfigC(*fields)
    _check_layer_shard(q, k, v, cfg, reserve_per_head)
    return tuple(_call("fvattn_vsa_layer_forward", _layer_outputs(q, k, cfg, reserve_per_head), q, k,
                       v, q_block_sizes, kv_block_sizes, **vsa_layer_attrs(cfg)))


def _layer_forward_gated_local(q, k, v, gate, q_block_sizes, kv_block_sizes, fields, reserve_per_head):
    cfg = _capi.VsaLayerConfigC(*fields)
    _check_layer_shard(q, k, v, cfg, reserve_per_head)
    return tuple(_call("fvattn_vsa_layer_forward_gated", _layer_outputs(q, k, cfg, reserve_per_head),
                       q, k, v, gate, q_block_sizes, kv_block_sizes, **vsa_layer_attrs(cfg)))


def _layer_backward_local(q, k, v, q_block_sizes, kv_block_sizes, dout, reserve, fields):
    cfg = _capi.VsaLayerConfigC(*fields)
    outs = (_sds(q.shape, q.dtype), _sds(k.shape, k.dtype), _sds(v.shape, v.dtype))
    return tuple(_call("fvattn_vsa_layer_backward", outs, q, k, v, q_block_sizes, kv_block_sizes,
                       dout, reserve, **vsa_layer_attrs(cfg)))


def _layer_backward_gated_local(q, k, v, gate, q_block_sizes, kv_block_sizes, dout, reserve, fields):
    cfg = _capi.VsaLayerConfigC(*fields)
    outs = (_sds(q.shape, q.dtype), _sds(k.shape, k.dtype), _sds(v.shape, v.dtype),
            _sds(gate.shape, gate.dtype))
    return tuple(_call("fvattn_vsa_layer_backward_gated", outs, q, k, v, gate, q_block_sizes,
                       kv_block_sizes, dout, reserve, **vsa_layer_attrs(cfg)))


# The layer never mixes batch elements or heads (SPEC 3b: block means, coarse attention, selection
# and gate are per head), so it partitions like attention; its reserve [B, Hq, R] is split with q.
_LAYER_FORWARD = _part(_layer_forward_local, (Q, KV, KV, WHOLE, WHOLE), (Q, Q, Q, Q),
                       (4, 4, 4, 1, 1), (4, 4, 3, 3), 2)
_LAYER_FORWARD_GATED = _part(_layer_forward_gated_local, (Q, KV, KV, Q, WHOLE, WHOLE), (Q, Q, Q, Q),
                             (4, 4, 4, 4, 1, 1), (4, 4, 3, 3), 2)
_LAYER_BACKWARD = _part(_layer_backward_local, (Q, KV, KV, WHOLE, WHOLE, Q, Q), (Q, KV, KV),
                        (4, 4, 4, 1, 1, 4, 3), (4, 4, 4), 1)
_LAYER_BACKWARD_GATED = _part(_layer_backward_gated_local, (Q, KV, KV, Q, WHOLE, WHOLE, Q, Q),
                              (Q, KV, KV, Q), (4, 4, 4, 4, 1, 1, 4, 3), (4, 4, 4, 4), 1)


def vsa_layer_forward_c(q, k, v, kv_block_sizes, q_block_sizes, gate, cfg):
    """(out, q2k_idx, q2k_num, reserve) for a C config; the reserve is uint8 [B, Hq, R]
    (_checks.layer_reserve_bytes_per_head)."""
    needed = _checks.check_vsa_layer(q, k, v, gate, q_block_sizes, kv_block_sizes, cfg)
    per_head = _checks.layer_reserve_bytes_per_head(q, k, v, cfg, needed)
    if gate is None:
        return _LAYER_FORWARD(q, k, v, q_block_sizes, kv_block_sizes, _fields(cfg), per_head)
    return _LAYER_FORWARD_GATED(q, k, v, gate, q_block_sizes, kv_block_sizes, _fields(cfg), per_head)


def vsa_layer_backward_c(q, k, v, kv_block_sizes, q_block_sizes, dout, reserve, gate, cfg, check=True):
    """(dq, dk, dv, dgate or None). check=False: the arguments are known to be consistent (the
    custom_vjp's own residuals)."""
    if check:
        _checks.check_vsa_layer_backward(q, k, v, gate, q_block_sizes, kv_block_sizes, dout, reserve, cfg)
    if gate is None:
        dq, dk, dv = _LAYER_BACKWARD(q, k, v, q_block_sizes, kv_block_sizes, dout, reserve, _fields(cfg))
        return dq, dk, dv, None
    return _LAYER_BACKWARD_GATED(q, k, v, gate, q_block_sizes, kv_block_sizes, dout, reserve,
                                 _fields(cfg))


def vsa_layer_forward(q, k, v, kv_block_sizes, q_block_sizes, topk, gate=None, softmax_scale=None,
                      return_indices=False):
    """fvattn.video_sparse_attn for JAX arrays: a VsaLayerResult of JAX arrays."""
    from ..ops import VsaLayerResult
    out, idx, num, reserve = vsa_layer_forward_c(q, k, v, kv_block_sizes, q_block_sizes, gate,
                                                 vsa_layer_config(topk, softmax_scale))
    return VsaLayerResult(out, reserve, idx if return_indices else None, num if return_indices else None)


def vsa_layer_backward(q, k, v, kv_block_sizes, q_block_sizes, topk, dout, reserve, gate=None,
                       softmax_scale=None):
    return vsa_layer_backward_c(q, k, v, kv_block_sizes, q_block_sizes, dout, reserve, gate,
                                vsa_layer_config(topk, softmax_scale))
