"""Trace-time argument checks for the JAX ops: the library's own checks run on shapes and dtypes
alone, so a bad shape raises fvattn.Error with the library's message when the function is traced,
not later inside a compiled computation.

How: descriptors with placeholder data pointers (distinct, aligned, non-overlapping, never read)
are given to the library's workspace-size queries on the CPU handle (the API layer's checks are the
same for every backend). For VSA, whose forward query does not look at q2k_num and block_sizes, the
backward is also called with a workspace one byte too small: fvattn.h promises that every argument
is checked before any work and that a failing call writes nothing, so it either reports a broken
rule or FVA_ERR_WORKSPACE_TOO_SMALL, having touched no memory.
"""
import ctypes

import numpy as np

from .. import _capi, _handles
from .._errors import STATUS_CODES, invalid_argument

_PLACEHOLDER_BASE = 1 << 40  # far from any real mapping; the library never dereferences these


def dtype_code(name, dtype):
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return _capi.DTYPE_BF16
    code = {np.dtype(np.float16): _capi.DTYPE_F16, np.dtype(np.float32): _capi.DTYPE_F32,
            np.dtype(np.int32): _capi.DTYPE_I32, np.dtype(np.int64): _capi.DTYPE_I64}.get(dtype)
    if code is None:
        raise invalid_argument(f"{name}: dtype {dtype} is not one fvattn handles (bfloat16, "
                               "float16, float32, int32, int64)")
    return code


class Placeholders:
    """Descriptors of contiguous tensors of given shapes and dtypes at placeholder addresses."""

    def __init__(self):
        self.next = _PLACEHOLDER_BASE
        self.keep = []

    def __call__(self, name, shape, dtype):
        code = dtype_code(name, dtype)
        shape = tuple(int(n) for n in shape)
        strides, s = [], 1
        for n in reversed(shape):
            strides.insert(0, s)
            s *= max(n, 1)
        t = _capi.tensor(self.next, code, shape, strides)
        self.next += (s * _capi.DTYPE_SIZES[code] + 255) // 256 * 256 + 256
        self.keep.append(t)
        return ctypes.byref(t)

    def raw(self, nbytes):
        """A placeholder address for nbytes of raw memory (the VSA layer's reserve)."""
        at = self.next
        self.next += (int(nbytes) + 255) // 256 * 256 + 256
        return at


def _cpu():
    return _capi.lib(), _handles.get("cpu", -1)


def check_qat(q, k, v, cfg):
    lib, h = _cpu()
    p = Placeholders()
    n = ctypes.c_size_t()
    _capi.check(lib.fva_qat_forward_workspace_size(h, ctypes.byref(cfg), p("q", q.shape, q.dtype),
                                                   p("k", k.shape, k.dtype), p("v", v.shape, v.dtype),
                                                   ctypes.byref(n)))


def check_qat_backward(q, k, v, o_for_bwd, lse, dout, cfg):
    lib, h = _cpu()
    p = Placeholders()
    n = ctypes.c_size_t()
    tq, tk, tv = p("q", q.shape, q.dtype), p("k", k.shape, k.dtype), p("v", v.shape, v.dtype)
    _capi.check(lib.fva_qat_backward_workspace_size(h, ctypes.byref(cfg), tq, tk, tv, ctypes.byref(n)))
    if n.value == 0:
        return
    st = lib.fva_qat_backward(h, ctypes.byref(cfg), tq, tk, tv, p("o_for_bwd", o_for_bwd.shape, o_for_bwd.dtype),
                              p("lse", lse.shape, lse.dtype), p("dout", dout.shape, dout.dtype),
                              p("dq", q.shape, q.dtype), p("dk", k.shape, k.dtype),
                              p("dv", v.shape, v.dtype), None, n.value - 1, None)
    if st != STATUS_CODES["FVA_ERR_WORKSPACE_TOO_SMALL"]:
        _capi.check(st)


def check_vsa(q, k, v, q2k_idx, q2k_num, block_sizes, cfg, o=None, lse=None, dout=None):
    """Checks a VSA forward (o, lse, dout None) or backward call's arguments."""
    lib, h = _cpu()
    p = Placeholders()
    n = ctypes.c_size_t()
    tq, tk, tv = p("q", q.shape, q.dtype), p("k", k.shape, k.dtype), p("v", v.shape, v.dtype)
    ti = p("q2k_idx", q2k_idx.shape, q2k_idx.dtype)
    _capi.check(lib.fva_vsa_forward_workspace_size(h, ctypes.byref(cfg), tq, tk, tv, ti, ctypes.byref(n)))
    _capi.check(lib.fva_vsa_backward_workspace_size(h, ctypes.byref(cfg), tq, tk, tv, ti, ctypes.byref(n)))
    if n.value == 0:
        return
    f32 = np.float32
    o_shape, o_dtype = (q.shape, q.dtype) if o is None else (o.shape, o.dtype)
    lse_shape, lse_dtype = (q.shape[:3], f32) if lse is None else (lse.shape, lse.dtype)
    do_shape, do_dtype = (q.shape, q.dtype) if dout is None else (dout.shape, dout.dtype)
    st = lib.fva_vsa_backward(h, ctypes.byref(cfg), tq, tk, tv, p("o", o_shape, o_dtype),
                              p("lse", lse_shape, lse_dtype), p("dout", do_shape, do_dtype), ti,
                              p("q2k_num", q2k_num.shape, q2k_num.dtype),
                              p("block_sizes", block_sizes.shape, block_sizes.dtype),
                              p("dq", q.shape, q.dtype), p("dk", k.shape, k.dtype),
                              p("dv", v.shape, v.dtype), None, n.value - 1, None)
    if st != STATUS_CODES["FVA_ERR_WORKSPACE_TOO_SMALL"]:
        _capi.check(st)


def check_invert(q2k_idx, q2k_num, num_kv_blocks):
    lib, h = _cpu()
    p = Placeholders()
    n = ctypes.c_size_t()
    shape = tuple(q2k_idx.shape)
    k2q_shape = (shape[0], shape[1], int(num_kv_blocks), shape[2]) if len(shape) == 4 else shape
    _capi.check(lib.fva_vsa_invert_indices_workspace_size(
        h, p("q2k_idx", q2k_idx.shape, q2k_idx.dtype), p("k2q_idx", k2q_shape, np.int32), ctypes.byref(n)))
    # The inversion needs no workspace, so there is no dry run of the call itself: q2k_num, which
    # only the call checks, is compared here, with the rule the library applies.
    dtype_code("q2k_num", q2k_num.dtype)
    if np.dtype(q2k_num.dtype) != np.int32 or tuple(q2k_num.shape) != shape[:3]:
        raise invalid_argument(f"q2k_num: int32 {tuple(q2k_num.shape)} given but it must be int32 "
                               f"with shape q2k_idx.shape[:3] = {shape[:3]}")


# ---- the whole VSA layer -------------------------------------------------------------------------

_RESERVE_ALIGN = 256
_cuda_ordinals = None


def _jax_cuda_ordinals():
    """The CUDA device ordinals of the GPUs this JAX process can run on (none when its GPU platform
    is absent or disabled, e.g. JAX_PLATFORMS=cpu)."""
    global _cuda_ordinals
    if _cuda_ordinals is None:
        import jax
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        ids = {d.local_hardware_id if d.local_hardware_id is not None else d.id for d in gpus}
        _cuda_ordinals = sorted(ids)
    return _cuda_ordinals


def _layer_sizes(h, cfg, tq, tk, tv):
    ws, reserve = ctypes.c_size_t(), ctypes.c_size_t()
    _capi.check(_capi.entry("fva_vsa_layer_sizes")(h, ctypes.byref(cfg), tq, tk, tv, ctypes.byref(ws),
                                                   ctypes.byref(reserve)))
    return ws.value, reserve.value


def _cuda_layer_reserves(cfg, tq, tk, tv):
    """The reserve the CUDA backend of each GPU JAX sees asks for these descriptors (none where no
    CUDA handle can be made)."""
    sizes = []
    for ordinal in _jax_cuda_ordinals():
        try:
            sizes.append(_layer_sizes(_handles.get("cuda", ordinal), cfg, tq, tk, tv)[1])
        except Exception:  # noqa: BLE001 - no usable CUDA handle: the CPU's size stands
            pass
    return sizes


def check_vsa_layer(q, k, v, gate, q_block_sizes, kv_block_sizes, cfg):
    """Checks a VSA layer forward's arguments; returns the reserve's size: the largest any backend
    this process may run it on asks."""
    lib, h = _cpu()
    p = Placeholders()
    tq, tk, tv = p("q", q.shape, q.dtype), p("k", k.shape, k.dtype), p("v", v.shape, v.dtype)
    ws, reserve = _layer_sizes(h, cfg, tq, tk, tv)
    if ws > 0:
        # The call itself, with one byte of workspace too few: it checks every argument (gate, the
        # block sizes, topk) and, if they pass, refuses the workspace having touched nothing.
        shape = tuple(q.shape)
        nq, nkv = shape[2] // cfg.block_size, tuple(k.shape)[2] // cfg.block_size
        st = _capi.entry("fva_vsa_layer_forward")(
            h, ctypes.byref(cfg), tq, tk, tv, None if gate is None else p("gate", gate.shape, gate.dtype),
            p("q_block_sizes", q_block_sizes.shape, q_block_sizes.dtype),
            p("kv_block_sizes", kv_block_sizes.shape, kv_block_sizes.dtype), p("out", shape, q.dtype),
            p("q2k_idx", shape[:2] + (nq, max(1, min(cfg.topk, nkv))), np.int32),
            p("q2k_num", shape[:2] + (nq,), np.int32), p.raw(reserve), reserve, None, ws - 1, None)
        if st != STATUS_CODES["FVA_ERR_WORKSPACE_TOO_SMALL"]:
            _capi.check(st)
    return max([reserve] + _cuda_layer_reserves(cfg, tq, tk, tv))


def layer_reserve_bytes_per_head(q, k, v, cfg, needed):
    """R, the reserve's bytes per batch element and q head (the JAX reserve is uint8 [B, Hq, R]): a
    multiple of 256, at least needed / (B Hq), and at least what one batch element with one q and
    one kv head asks. Every region of the reserve grows linearly with B Hq or B Hkv (Hkv <= Hq),
    each rounded to 64 bytes, so a shard of b batch elements and h q heads needs at most b h times
    the one-head size: the reserve's shard [b, h, R] covers it (_primitives checks that as it
    partitions)."""
    B, Hq, Sq, D = (int(n) for n in q.shape)
    one = layer_reserve_needed((1, 1, Sq, D), q.dtype, (1, 1) + tuple(k.shape)[2:],
                               (1, 1) + tuple(v.shape)[2:], cfg)
    per_head = max(one, -(-int(needed) // max(1, B * Hq)))
    return reserve_result_bytes(per_head)


def reserve_result_bytes(needed):
    """A size rounded up to 256 bytes, so that vmap's slices of a reserve stay aligned."""
    return (needed + _RESERVE_ALIGN - 1) // _RESERVE_ALIGN * _RESERVE_ALIGN


def layer_reserve_needed(q_shape, q_dtype, k_shape, v_shape, cfg):
    """The largest reserve any backend this process may run the layer on (the CPU backend, and the
    CUDA backend of each GPU JAX sees) asks for these shapes; no argument checks (the caller checked
    the whole problem)."""
    p = Placeholders()
    tq, tk, tv = p("q", q_shape, q_dtype), p("k", k_shape, q_dtype), p("v", v_shape, q_dtype)
    return max([_layer_sizes(_cpu()[1], cfg, tq, tk, tv)[1]] + _cuda_layer_reserves(cfg, tq, tk, tv))


def check_vsa_layer_backward(q, k, v, gate, q_block_sizes, kv_block_sizes, dout, reserve, cfg):
    """Checks a VSA layer backward's arguments: the forward's, dout like q, and a uint8 reserve at least
    as large as the backends ask."""
    need = check_vsa_layer(q, k, v, gate, q_block_sizes, kv_block_sizes, cfg)
    if tuple(dout.shape) != tuple(q.shape) or np.dtype(dout.dtype) != np.dtype(q.dtype):
        raise invalid_argument(f"dout: {np.dtype(dout.dtype)} {tuple(dout.shape)} given but it must be "
                               f"like q: {np.dtype(q.dtype)} {tuple(q.shape)}")
    B, Hq = (int(n) for n in tuple(q.shape)[:2])
    rs = tuple(int(n) for n in reserve.shape)
    if (np.dtype(reserve.dtype) != np.uint8 or len(rs) != 3 or rs[:2] != (B, Hq)
            or B * Hq * rs[2] < need):
        raise invalid_argument(f"reserve: {np.dtype(reserve.dtype)} {rs} given but it must be the "
                               f"forward's uint8 reserve [{B}, {Hq}, R] ({need} bytes in all for "
                               "these shapes)")
