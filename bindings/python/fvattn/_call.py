"""One library call from Python: the inputs' kind and device, the handle, the stream, the
descriptors, and outputs and workspace allocated through the inputs' framework."""
import ctypes

import numpy as np

from . import _capi, _frameworks as fw, _handles
from ._errors import invalid_argument


def _describe_kind(obj):
    if isinstance(obj, np.ndarray):
        return "a numpy array"
    dev = getattr(obj, "device", None)
    return f"a {type(obj).__module__}.{type(obj).__name__}" + (f" on {dev}" if dev is not None else "")


class Call:
    """inputs: dict name -> array (None entries are skipped). All arrays must be of one kind and
    on one device; that decides the backend (CPU or CUDA) and the stream. byte_inputs: dict name ->
    1-D uint8 array of the same kind and device, passed to the library as (pointer, bytes) rather
    than as a tensor (the VSA layer's reserve)."""

    def __init__(self, inputs, byte_inputs=None):
        byte_names = set(byte_inputs or ())
        inputs = dict(inputs, **(byte_inputs or {}))
        items = [(n, a) for n, a in inputs.items() if a is not None]
        first_name, first = items[0]
        if fw.NumpyKind.matches(first):
            kind = fw.NumpyKind
        elif fw.TorchKind.matches(first):
            kind = fw.TorchKind
        elif fw.CupyKind.matches(first):
            kind = fw.CupyKind
            items = [(n, a if type(a).__module__.startswith("cupy") else fw.as_cupy(a))
                     if fw.CupyKind.matches(a) else (n, a) for n, a in items]
            first = items[0][1]
        elif fw.dlpack_cpu(first):
            kind = fw.DlpackCpuKind
            items = [(n, np.from_dlpack(a) if fw.dlpack_cpu(a) else a) for n, a in items]
        else:
            raise invalid_argument(
                f"{first_name}: {_describe_kind(first)} is not an array fvattn can take (numpy, "
                "torch, CuPy or __cuda_array_interface__ objects, JAX arrays, or host __dlpack__ "
                "objects)")
        # The kind is read off the converted array (a CuPy view of a foreign CUDA array), except for
        # host DLPack producers, whose own module hands the outputs back.
        self.kind = kind(inputs[first_name] if kind is fw.DlpackCpuKind else first)
        self.arrays = dict(items)
        for name, a in items:
            if not self.kind.same_device(a):
                raise invalid_argument(f"{name}: is {_describe_kind(a)} but {first_name} is "
                                       f"{_describe_kind(first)}; every tensor of a call must be "
                                       "of one kind on one device")
        backend, device = self.kind.device
        self.handle = _handles.get(backend, device)
        self.stream = self.kind.stream
        self.desc = {name: self.kind.describe(name, a) for name, a in items if name not in byte_names}
        self.bytes = {name: self.kind.byte_pointer(name, a) for name, a in items if name in byte_names}
        self._keep = []

    def t(self, name):
        """Pointer to the descriptor of `name` (NULL when it is None)."""
        d = self.desc.get(name)
        return None if d is None else ctypes.byref(d)

    def shape(self, name):
        d = self.desc[name]
        return tuple(d.shape[i] for i in range(d.rank))

    def dtype(self, name):
        return self.desc[name].dtype

    def output(self, name, shape, code):
        """A new contiguous output array of the inputs' framework, described as `name`."""
        arr = self.kind.empty(tuple(shape), code)
        self.arrays[name] = arr
        self.desc[name] = self.kind.describe(name, arr)
        return arr

    def byte_output(self, name, nbytes):
        """A new 1-D uint8 output of nbytes (aligned data: 256 bytes, or for torch its allocator's
        alignment); self.bytes[name] = (ptr, n)."""
        arr = self.kind.byte_buffer(nbytes)
        self.arrays[name] = arr
        self.bytes[name] = self.kind.byte_pointer(name, arr)
        return arr

    def workspace(self, nbytes):
        """(pointer, bytes) of workspace from the inputs' framework; kept alive with this call.
        On a GPU it is stream-ordered memory of the framework's allocator, so freeing it after an
        asynchronous launch is safe for torch and CuPy (their caching allocators reuse a block only
        in the order of the stream it was used on)."""
        if nbytes == 0:
            return None, 0
        buf, ptr = self.kind.workspace(nbytes)
        self._keep.append(buf)
        return ptr, nbytes

    def result(self, name):
        return self.kind.wrap_output(self.arrays[name])

    def query(self, fn, *args):
        n = ctypes.c_size_t(0)
        _capi.check(fn(self.handle, *args, ctypes.byref(n)))
        return n.value
