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
