"""fvattn.Error: every failure of the bindings, with the library's status name and message."""
import re

# Status codes of fvattn.h, in its order (new codes only append, so the table can grow here too).
STATUS_NAMES = {
    0: "FVA_OK",
    1: "FVA_ERR_INVALID_ARGUMENT",
    2: "FVA_ERR_UNSUPPORTED",
    3: "FVA_ERR_WORKSPACE_TOO_SMALL",
    4: "FVA_ERR_NO_DEVICE",
    5: "FVA_ERR_CUDA",
    6: "FVA_ERR_OUT_OF_MEMORY",
    7: "FVA_ERR_INTERNAL",
}
STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}


class Error(Exception):
    """A failed fvattn call.

    status:      the fva_status_t code (an int), or None when the library could not be loaded
    status_name: "FVA_ERR_INVALID_ARGUMENT", ... (or "FVATTN_LIBRARY_NOT_FOUND")
    message:     the library's fva_last_error() text, e.g. "k: shape[2] is 300 but v.shape[2] is 320"
                 (an alignment or stride error ends with how to fix it: a contiguous copy)
    """

    def __init__(self, status, status_name, message):
        super().__init__(f"{status_name}: {message}")
        self.status = status
        self.status_name = status_name
        self.message = message


class LibraryNotFoundError(Error):
    """No libfvattn could be loaded; the message lists every place tried and why each failed."""

    def __init__(self, message):
        super().__init__(None, "FVATTN_LIBRARY_NOT_FOUND", message)


# Raised and documented as fvattn.Error (the package re-exports them): tracebacks and repr() name
# that, not this private module.
Error.__module__ = "fvattn"
LibraryNotFoundError.__module__ = "fvattn"


# The library's messages about a tensor's memory layout, which a copy of the array always fixes:
# strides (a contiguous copy) and a misaligned data pointer (a fresh copy: np.ascontiguousarray and
# .contiguous() return an array that is already contiguous as it is, misaligned or not). ws: and
# reserve: are the bindings' own buffers, not the caller's arrays.
_STRIDES = re.compile(r"^(?!ws:|reserve:)[\w.]+: (strides\[\d+\] is .*(last stride must be 1|strides "
                      r"must be >= 0|not a multiple of \d+ bytes)|stride \d+ is \d+ bytes, not a whole)")
_ALIGNMENT = re.compile(r"^(?!ws:|reserve:)[\w.]+: data \S+ is not \d+-byte aligned")
CONTIGUOUS_HINT = ("; pass a contiguous copy instead: np.ascontiguousarray(x) for NumPy, x.contiguous() "
                   "for torch, cupy.ascontiguousarray(x) for CuPy")
ALIGNED_HINT = ("; pass a fresh copy instead (new arrays are aligned): x.copy() for NumPy and CuPy, "
                "x.clone() for torch")


def with_layout_hint(message):
    """message, plus how to fix it when it is about a tensor's strides or alignment."""
    if _STRIDES.match(message):
        return message + CONTIGUOUS_HINT
    if _ALIGNMENT.match(message):
        return message + ALIGNED_HINT
    return message


def invalid_argument(message):
    """An argument the bindings reject before the library sees it (it could not be described as an
    fva_tensor_t at all): the same status the library would give."""
    return Error(1, "FVA_ERR_INVALID_ARGUMENT", message)
