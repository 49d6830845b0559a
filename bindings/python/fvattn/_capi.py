"""ctypes declarations of include/fvattn/fvattn.h (ABI version 1) and the status check.

The structs mirror the header field for field; tests/test_capi.py compares their sizes with what
cffi computes from the header itself, so a drift between the two fails a test.
"""
import ctypes
from ctypes import POINTER, c_char, c_char_p, c_float, c_int32, c_int64, c_size_t, c_uint32, c_void_p

from . import _library
from ._errors import Error, STATUS_NAMES, with_layout_hint

ABI_VERSION = 1
MAX_RANK = 6

DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_I32, DTYPE_I64 = 1, 2, 3, 4, 5
DTYPE_SIZES = {DTYPE_BF16: 2, DTYPE_F16: 2, DTYPE_F32: 4, DTYPE_I32: 4, DTYPE_I64: 8}
BACKEND_AUTO, BACKEND_CUDA, BACKEND_CPU = 0, 1, 2
KERNELS_AUTO, KERNELS_PORTABLE = 0, 1
SCALE_BLOCK, SCALE_TILE, SCALE_ROW = 0, 1, 2


class Tensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_int32), ("rank", c_int32),
                ("shape", c_int64 * MAX_RANK), ("strides", c_int64 * MAX_RANK)]


OPTION_AUTO = -1  # FVA_OPTION_AUTO
TUNING_OPTIONS = ("qat_forward_split", "qat_forward_clusters", "ds_budget_mib", "chained_launches",
                  "cpu_threads", "ptx_jit")


class HandleOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("backend", c_int32), ("device", c_int32),
                ("deterministic", c_int32), ("kernels", c_int32)] + \
               [(name, c_int32) for name in TUNING_OPTIONS]


class HandleInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("backend", c_int32), ("device", c_int32),
                ("sm_major", c_int32), ("sm_minor", c_int32), ("sm_count", c_int32),
                ("image", c_char * 16), ("device_name", c_char * 256),
                ("deterministic", c_int32), ("kernels", c_int32)] + \
               [(name, c_int32) for name in TUNING_OPTIONS] + [("image_reason", c_char * 192)]


class QatConfigC(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("softmax_scale", c_float), ("causal", c_int32),
                ("quantize", c_int32), ("smooth_k", c_int32), ("qkv_scale", c_int32),
                ("p_scale", c_int32), ("quantize_p_backward", c_int32),
                ("high_precision_o", c_int32), ("quantized_qkv_backward", c_int32)]


class VsaConfigC(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("softmax_scale", c_float), ("block_size", c_int32)]


class Nvfp4ConfigC(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("scale_mode", c_int32), ("tile_tokens", c_int32)]


class VsaLayerConfigC(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("softmax_scale", c_float), ("block_size", c_int32),
                ("topk", c_int32)]


_T = POINTER(Tensor)
_H = c_void_p  # fva_handle_t
_QC, _VC, _NC = POINTER(QatConfigC), POINTER(VsaConfigC), POINTER(Nvfp4ConfigC)
_LC = POINTER(VsaLayerConfigC)
_SZ = POINTER(c_size_t)

# name: (restype, argtypes)
_PROTOTYPES = {
    "fva_version": (c_int32, []),
    "fva_abi_version": (c_int32, []),
    "fva_status_string": (c_char_p, [c_int32]),
    "fva_last_error": (c_char_p, []),
    "fva_create": (c_int32, [POINTER(c_void_p), POINTER(HandleOptions)]),
    "fva_destroy": (c_int32, [_H]),
    "fva_get_info": (c_int32, [_H, POINTER(HandleInfo)]),
    "fva_qat_forward_workspace_size": (c_int32, [_H, _QC, _T, _T, _T, _SZ]),
    "fva_qat_forward": (c_int32, [_H, _QC, _T, _T, _T, _T, _T, _T, c_void_p, c_size_t, c_void_p]),
    "fva_qat_backward_workspace_size": (c_int32, [_H, _QC, _T, _T, _T, _SZ]),
    "fva_qat_backward": (c_int32, [_H, _QC, _T, _T, _T, _T, _T, _T, _T, _T, _T, c_void_p, c_size_t,
                                   c_void_p]),
    "fva_nvfp4_fake_quantize": (c_int32, [_H, _NC, _T, _T, c_void_p]),
    "fva_vsa_forward_workspace_size": (c_int32, [_H, _VC, _T, _T, _T, _T, _SZ]),
    "fva_vsa_forward": (c_int32, [_H, _VC, _T, _T, _T, _T, _T, _T, _T, _T, c_void_p, c_size_t,
                                  c_void_p]),
    "fva_vsa_backward_workspace_size": (c_int32, [_H, _VC, _T, _T, _T, _T, _SZ]),
    "fva_vsa_backward": (c_int32, [_H, _VC, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T,
                                   c_void_p, c_size_t, c_void_p]),
    "fva_vsa_invert_indices_workspace_size": (c_int32, [_H, _T, _T, _SZ]),
    "fva_vsa_invert_indices": (c_int32, [_H, _T, _T, _T, _T, c_void_p, c_size_t, c_void_p]),
}

# Entry points added after the first release of ABI 1 (the whole VSA layer): declared when the loaded
# library has them, so that an older libfvattn.so.1 still serves every other operation; calling one
# it lacks raises fvattn.Error (FVA_ERR_UNSUPPORTED) naming the symbol (see entry()).
_LATER_PROTOTYPES = {
    "fva_vsa_layer_sizes": (c_int32, [_H, _LC, _T, _T, _T, _SZ, _SZ]),
    "fva_vsa_layer_forward": (c_int32, [_H, _LC, _T, _T, _T, _T, _T, _T, _T, _T, _T, c_void_p,
                                        c_size_t, c_void_p, c_size_t, c_void_p]),
    "fva_vsa_layer_backward": (c_int32, [_H, _LC, _T, _T, _T, _T, _T, _T, _T, c_void_p, c_size_t,
                                         _T, _T, _T, _T, c_void_p, c_size_t, c_void_p]),
    "fva_vsa_tile_plan": (c_int32, [POINTER(c_int64), POINTER(c_int32), POINTER(c_int64),
                                    POINTER(c_int32), POINTER(c_int64)]),
}
_missing = set()

_lib = None


def lib():
    """The loaded library with every prototype declared (loaded on first use, so that importing
    fvattn works, and fvattn.QatConfig can be built, without it)."""
    global _lib
    if _lib is None:
        handle, path = _library.core()
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = restype, argtypes
        for name, (restype, argtypes) in _LATER_PROTOTYPES.items():
            try:
                fn = getattr(handle, name)
            except AttributeError:
                _missing.add(name)
                continue
            fn.restype, fn.argtypes = restype, argtypes
        abi = handle.fva_abi_version()
        if abi != ABI_VERSION:
            raise Error(None, "FVATTN_ABI_MISMATCH",
                        f"{path} has ABI version {abi}; these bindings speak version {ABI_VERSION}")
        _lib = handle
    return _lib


def entry(name):
    """The library function `name`; fvattn.Error (FVA_ERR_UNSUPPORTED) when the loaded library is
    older than it."""
    handle = lib()
    if name in _missing:
        raise Error(2, "FVA_ERR_UNSUPPORTED",
                    f"{_library.core()[1]} has no {name} (a libfvattn older than these bindings)")
    return getattr(handle, name)


def check(status):
    """Raises fvattn.Error for a status other than FVA_OK, with the calling thread's message (read
    at once: it is per thread and the next fvattn call on this thread may replace it)."""
    if status != 0:
        message = with_layout_hint(lib().fva_last_error().decode("utf-8", "replace"))
        raise Error(status, STATUS_NAMES.get(status, f"status {status}"), message)


def tensor(data, dtype, shape, strides):
    """An fva_tensor_t (shape and strides in elements)."""
    if len(shape) > MAX_RANK:
        from ._errors import invalid_argument
        raise invalid_argument(f"rank {len(shape)} is above FVA_MAX_RANK ({MAX_RANK})")
    t = Tensor()
    t.data = data
    t.dtype = dtype
    t.rank = len(shape)
    for i, (n, s) in enumerate(zip(shape, strides)):
        t.shape[i] = n
        t.strides[i] = s
    return t


def ref(t):
    """Pointer argument for an optional tensor (None -> NULL)."""
    return None if t is None else ctypes.byref(t)
