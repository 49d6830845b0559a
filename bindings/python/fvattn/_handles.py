"""One library handle per backend and device, created on first use and kept for the process (a
handle may be shared by threads, fvattn.h says, and creating one queries the device).
Read from the environment when a handle is created: FVATTN_KERNELS=portable pins the CUDA handles to
the portable kernels (FVA_KERNELS_PORTABLE; the default, auto, lets the library pick);
FVATTN_DETERMINISTIC=1 makes the handles deterministic (bitwise reproducible results; the default,
0, lets a QAT backward on an H100/H200 too large for the stored-dS budget sum dQ with atomics, which
is faster there). The handles' tuning options stay FVA_OPTION_AUTO, so the library's own
environment defaults (FVATTN_DS_BUDGET_MIB and the others of fvattn.h) apply, read once when the
handle is created; info() reports what they resolved to."""
import ctypes
import os
import threading

from . import _capi

_lock = threading.Lock()
_handles = {}


def _kernels():
    choice = os.environ.get("FVATTN_KERNELS", "auto")
    if choice not in ("auto", "portable"):
        raise ValueError(f"FVATTN_KERNELS={choice!r}: expected 'auto' or 'portable'")
    return _capi.KERNELS_PORTABLE if choice == "portable" else _capi.KERNELS_AUTO


def _deterministic():
    choice = os.environ.get("FVATTN_DETERMINISTIC", "0")
    if choice not in ("0", "1"):
        raise ValueError(f"FVATTN_DETERMINISTIC={choice!r}: expected '0' or '1'")
    return int(choice)


def get(backend, device=-1):
    """The handle for ("cpu", -1) or ("cuda", ordinal); raises fvattn.Error (e.g.
    FVA_ERR_NO_DEVICE with the reason) when it cannot be created."""
    key = (backend, device)
    with _lock:
        h = _handles.get(key)
        if h is None:
            lib = _capi.lib()
            opts = _capi.HandleOptions(struct_size=ctypes.sizeof(_capi.HandleOptions),
                                       backend=_capi.BACKEND_CPU if backend == "cpu" else _capi.BACKEND_CUDA,
                                       device=device, deterministic=_deterministic(),
                                       kernels=_kernels(),
                                       **{name: _capi.OPTION_AUTO for name in _capi.TUNING_OPTIONS})
            out = ctypes.c_void_p()
            _capi.check(lib.fva_create(ctypes.byref(out), ctypes.byref(opts)))
            h = _handles[key] = out
        return h


def info(backend="cpu", device=-1):
    """fva_get_info of that handle, as a dict."""
    i = _capi.HandleInfo(struct_size=ctypes.sizeof(_capi.HandleInfo))
    _capi.check(_capi.lib().fva_get_info(get(backend, device), ctypes.byref(i)))
    names = {_capi.BACKEND_CPU: "cpu", _capi.BACKEND_CUDA: "cuda"}
    return {"backend": names.get(i.backend, str(i.backend)), "device": i.device,
            "sm": (i.sm_major, i.sm_minor), "sm_count": i.sm_count,
            "image": i.image.decode(), "image_reason": i.image_reason.decode(),
            "device_name": i.device_name.decode(),
            "deterministic": i.deterministic, "kernels": i.kernels,
            **{name: getattr(i, name) for name in _capi.TUNING_OPTIONS}}
