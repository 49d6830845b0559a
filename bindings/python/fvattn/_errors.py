"""fvattn.Error: every failure of the bindings, with the library's status name and message."""

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


def invalid_argument(message):
    """An argument the bindings reject before the library sees it (it could not be described as an
    fva_tensor_t at all): the same status the library would give."""
    return Error(1, "FVA_ERR_INVALID_ARGUMENT", message)
