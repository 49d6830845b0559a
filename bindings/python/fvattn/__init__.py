"""fvattn: FastVideo's video-attention kernels (NVFP4 QAT attention, VSA block-sparse attention and
the whole VSA layer) from Python, through ctypes over the library's C API (libfvattn.so.1).

NumPy arrays run on the CPU backend; torch tensors and CuPy arrays on the device they live on, with
the caller's current stream; JAX arrays through fvattn.jax's XLA custom calls. Outputs come back as
the inputs' kind. Every failure raises fvattn.Error with the library's status name and message.
fvattn.torch (autograd functions) and fvattn.jax (custom_vjp functions) are imported on demand.
"""
from ._errors import Error, LibraryNotFoundError
from ._handles import info
from .config import Nvfp4Config, QatConfig, VsaConfig, VsaLayerConfig
from .ops import (TilePlan, VsaLayerResult, nvfp4_fake_quantize, qat_attention_backward,
                  qat_attention_forward, video_sparse_attn, video_sparse_attn_backward, vsa_backward,
                  vsa_forward, vsa_invert_indices, vsa_tile_plan)

__version__ = "0.1.0"


def library_path():
    """The path libfvattn was loaded from (loading it if needed)."""
    from . import _library
    return _library.core()[1]


def library_version():
    """fva_version() of the loaded library, MAJOR*10000 + MINOR*100 + PATCH."""
    from . import _capi
    return _capi.lib().fva_version()


__all__ = ["Error", "LibraryNotFoundError", "QatConfig", "VsaConfig", "Nvfp4Config",
           "qat_attention_forward", "qat_attention_backward", "vsa_forward", "vsa_backward",
           "vsa_invert_indices", "nvfp4_fake_quantize", "video_sparse_attn", "video_sparse_attn_backward",
           "VsaLayerConfig", "VsaLayerResult", "vsa_tile_plan", "TilePlan", "info", "library_path",
           "library_version"]
