"""Array kinds the ctypes binding accepts, and for each: how to describe an array to the library
(fva_tensor_t), which device and stream it belongs to, and how to allocate outputs and workspace
through the same framework.

  numpy          host memory, CPU backend (bf16 as ml_dtypes.bfloat16)
  torch.Tensor   CPU tensors on the CPU backend, CUDA tensors on their device with
                 torch.cuda.current_stream(); outputs and workspace from torch.empty
  CuPy arrays    (and other __cuda_array_interface__ objects, read through CuPy without a copy)
                 on their device with CuPy's current stream; outputs and workspace from cupy.empty
  other objects with __dlpack__ on the CPU: read through numpy.from_dlpack; outputs are handed
                 back through their module's from_dlpack when it has one
JAX arrays are not handled here: fvattn.ops sends them to fvattn.jax (XLA owns their memory and
stream).
"""
import math

import numpy as np

from . import _capi
from ._errors import invalid_argument, with_layout_hint

_ALIGN = 256  # bytes; the library needs 16, GPU allocators give 256, so host outputs match them
_LIBRARY_ALIGN = 16  # bytes: what the library requires of every pointer


def _module_root(obj):
    return type(obj).__module__.split(".")[0]


def is_jax_array(obj):
    return _module_root(obj) in ("jax", "jaxlib") and hasattr(obj, "__dlpack__")


# ---- NumPy -------------------------------------------------------------------------------------


def _numpy_dtype_code(dtype):
    if dtype.name == "bfloat16":  # ml_dtypes.bfloat16, by name so ml_dtypes need not be imported
        return _capi.DTYPE_BF16
    return {np.dtype(np.float16): _capi.DTYPE_F16, np.dtype(np.float32): _capi.DTYPE_F32,
            np.dtype(np.int32): _capi.DTYPE_I32, np.dtype(np.int64): _capi.DTYPE_I64}.get(dtype)


def _numpy_dtype(code):
    if code == _capi.DTYPE_BF16:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({_capi.DTYPE_F16: np.float16, _capi.DTYPE_F32: np.float32,
                     _capi.DTYPE_I32: np.int32, _capi.DTYPE_I64: np.int64}[code])


def _element_strides(name, byte_strides, itemsize):
    out = []
    for i, s in enumerate(byte_strides):
        if s % itemsize:
            raise invalid_argument(with_layout_hint(f"{name}: stride {i} is {s} bytes, not a whole "
                                                    f"number of {itemsize}-byte elements"))
        out.append(s // itemsize)
    return out


def aligned_numpy_empty(shape, dtype):
    dtype = np.dtype(dtype)
    nbytes = max(1, math.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    off = (-raw.ctypes.data) % _ALIGN
    return raw[off:off + nbytes].view(dtype)[:math.prod(shape)].reshape(shape)


class NumpyKind:
    name = "numpy"

    def __init__(self, sample):
        self.device = ("cpu", -1)

    @staticmethod
    def matches(obj):
        return isinstance(obj, np.ndarray)

    def describe(self, name, arr):
        code = _numpy_dtype_code(arr.dtype)
        if code is None:
            raise invalid_argument(f"{name}: numpy dtype {arr.dtype} is not one fvattn handles "
                                   "(bfloat16 from ml_dtypes, float16, float32, int32, int64)")
        strides = _element_strides(name, arr.strides, arr.itemsize)
        return _capi.tensor(arr.ctypes.data, code, arr.shape, strides)

    def same_device(self, obj):
        return isinstance(obj, np.ndarray)

    def empty(self, shape, code):
        return aligned_numpy_empty(shape, _numpy_dtype(code))

    def workspace(self, nbytes):
        buf = aligned_numpy_empty((max(nbytes, 1),), np.uint8)
        return buf, buf.ctypes.data

    def byte_buffer(self, nbytes):
        """A new uint8 array of nbytes whose data is _ALIGN-aligned (the VSA layer's reserve)."""
        return aligned_numpy_empty((nbytes,), np.uint8)

    def byte_pointer(self, name, arr):
        """(pointer, bytes) of a 1-D contiguous uint8 array of this kind."""
        if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
            raise invalid_argument(f"{name}: must be a 1-D contiguous uint8 array (the one the "
                                   f"forward returned); got {arr.dtype} of shape {arr.shape}")
        return arr.ctypes.data, arr.nbytes

    stream = None

    def wrap_output(self, arr):
        return arr


# ---- PyTorch -----------------------------------------------------------------------------------


class TorchKind:
    name = "torch"

    def __init__(self, sample):
        import torch
        self.torch = torch
        self.dev = sample.device
        if sample.device.type == "cuda":
            self.device = ("cuda", sample.device.index if sample.device.index is not None
                           else torch.cuda.current_device())
            # The caller's current stream on that device: the library launches on it, so the
            # results are ordered after the caller's earlier work and before its later work.
            self.stream = torch.cuda.current_stream(sample.device).cuda_stream
        elif sample.device.type == "cpu":
            self.device = ("cpu", -1)
            self.stream = None
        else:
            raise invalid_argument(f"torch tensors on {sample.device} are not supported (CPU or "
                                   "CUDA only)")
        self.codes = {torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16,
                      torch.float32: _capi.DTYPE_F32, torch.int32: _capi.DTYPE_I32,
                      torch.int64: _capi.DTYPE_I64}
        self.dtypes = {c: d for d, c in self.codes.items()}

    @staticmethod
    def matches(obj):
        return _module_root(obj) == "torch" and hasattr(obj, "data_ptr")

    def same_device(self, obj):
        return self.matches(obj) and obj.device == self.dev

    def describe(self, name, t):
        code = self.codes.get(t.dtype)
        if code is None:
            raise invalid_argument(f"{name}: torch dtype {t.dtype} is not one fvattn handles "
                                   "(bfloat16, float16, float32, int32, int64)")
        return _capi.tensor(t.data_ptr(), code, tuple(t.shape), tuple(t.stride()))

    def empty(self, shape, code):
        return self.torch.empty(shape, dtype=self.dtypes[code], device=self.dev)

    def workspace(self, nbytes):
        buf = self.torch.empty(max(nbytes, 1) + _ALIGN, dtype=self.torch.uint8, device=self.dev)
        ptr = buf.data_ptr()
        return buf, ptr + (-ptr) % _ALIGN

    def byte_buffer(self, nbytes):
        # A tensor of its own (storage offset 0), so that torch.compile's fake tensors describe it
        # exactly: torch's allocators align each allocation to 64 bytes (CPU) or more (CUDA), above
        # the 16 the library needs. An allocator that gives less gets the over-allocated slice.
        # Not zeroed: a VSA layer reserve is hundreds of MB at video lengths, and the bytes the
        # library leaves unwritten (the padding between its regions) carry no meaning.
        buf = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.dev)
        if nbytes > 0 and buf.data_ptr() % _LIBRARY_ALIGN == 0:
            return buf
        buf = self.torch.empty(max(nbytes, 1) + _ALIGN, dtype=self.torch.uint8, device=self.dev)
        off = (-buf.data_ptr()) % _ALIGN
        return buf[off:off + nbytes]

    def byte_pointer(self, name, t):
        if t.dtype != self.torch.uint8 or t.dim() != 1 or not t.is_contiguous():
            raise invalid_argument(f"{name}: must be a 1-D contiguous uint8 tensor (the one the "
                                   f"forward returned); got {t.dtype} of shape {tuple(t.shape)}")
        return t.data_ptr(), t.numel()

    def wrap_output(self, t):
        return t


# ---- CuPy and other __cuda_array_interface__ objects --------------------------------------------


class CupyKind:
    name = "cupy"

    def __init__(self, sample):
        import cupy
        self.cupy = cupy
        self.device = ("cuda", sample.device.id)
        with sample.device:
            self.stream = cupy.cuda.get_current_stream().ptr
        self.dev = sample.device

    @staticmethod
    def matches(obj):
        return hasattr(obj, "__cuda_array_interface__")

    def same_device(self, obj):
        return self.matches(obj) and getattr(obj, "device", None) == self.dev

    def describe(self, name, arr):
        code = _numpy_dtype_code(arr.dtype)
        if code is None:
            raise invalid_argument(f"{name}: cupy dtype {arr.dtype} is not one fvattn handles "
                                   "(float16, float32, int32, int64)")
        strides = _element_strides(name, arr.strides, arr.itemsize)
        return _capi.tensor(arr.data.ptr, code, arr.shape, strides)

    def empty(self, shape, code):
        with self.dev:
            return self.cupy.empty(shape, dtype=_numpy_dtype(code))

    def workspace(self, nbytes):
        with self.dev:
            buf = self.cupy.empty(max(nbytes, 1), dtype=self.cupy.uint8)
        return buf, buf.data.ptr

    def byte_buffer(self, nbytes):
        with self.dev:
            buf = self.cupy.empty(max(nbytes, 1) + _ALIGN, dtype=self.cupy.uint8)
        off = (-buf.data.ptr) % _ALIGN
        return buf[off:off + nbytes]

    def byte_pointer(self, name, arr):
        if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
            raise invalid_argument(f"{name}: must be a 1-D contiguous uint8 array (the one the "
                                   f"forward returned); got {arr.dtype} of shape {arr.shape}")
        return arr.data.ptr, arr.nbytes

    def wrap_output(self, arr):
        return arr


def as_cupy(obj):
    """A CuPy view of a __cuda_array_interface__ object (no copy)."""
    import cupy
    return cupy.asarray(obj)


# ---- other DLPack producers on the CPU ------------------------------------------------------------


class DlpackCpuKind(NumpyKind):
    """Objects of other frameworks with __dlpack__ on the host: viewed as NumPy arrays without a
    copy, outputs handed back through their module's from_dlpack (NumPy arrays where it has none)."""
    name = "dlpack"

    def __init__(self, sample):
        super().__init__(sample)
        import importlib
        self.module = importlib.import_module(_module_root(sample))

    def wrap_output(self, arr):
        from_dlpack = getattr(self.module, "from_dlpack", None)
        return from_dlpack(arr) if from_dlpack else arr


def dlpack_cpu(obj):
    """True for a DLPack producer whose memory is on the host (kDLCPU = 1)."""
    try:
        return hasattr(obj, "__dlpack__") and obj.__dlpack_device__()[0] == 1
    except Exception:
        return False
