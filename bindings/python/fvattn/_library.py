"""Finding and loading libfvattn.so.1 (and, for fvattn.jax, libfvattn_jax.so).

Where the library is looked for, in order:
  1. FVATTN_LIBRARY, a path: an explicit choice wins over anything installed;
  2. the copy bundled in the installed package (fvattn/_lib/, put there by
     `FVATTN_BUNDLE_DIR=<dir> pip install ./bindings/python`);
  3. the dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache, ...), by its SONAME.
When none loads, LibraryNotFoundError lists each candidate and why it failed.
"""
import ctypes
import os
import threading

from ._errors import LibraryNotFoundError

SONAME = "libfvattn.so.1"
JAX_LIBRARY = "libfvattn_jax.so"
_BUNDLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib")

_lock = threading.Lock()
_loaded = {}


def _candidates(env, filename, loader_name):
    out = []
    if os.environ.get(env):
        out.append((f"{env}={os.environ[env]}", os.environ[env]))
    out.append(("the installed package", os.path.join(_BUNDLE_DIR, filename)))
    if loader_name:
        out.append(("the loader's search path", loader_name))
    return out


def _load(key, env, filename, loader_name, mode):
    with _lock:
        if key in _loaded:
            return _loaded[key]
        tried = []
        for where, path in _candidates(env, filename, loader_name):
            if os.sep in path and not os.path.exists(path):
                tried.append(f"  {where}: {path} does not exist")
                continue
            try:
                lib = ctypes.CDLL(path, mode=mode)
            except OSError as e:
                tried.append(f"  {where}: {path}: {e}")
                continue
            _loaded[key] = (lib, path)
            return _loaded[key]
        raise LibraryNotFoundError(f"could not load {filename}; tried:\n" + "\n".join(tried))


def core():
    """(ctypes.CDLL of libfvattn, the path it was loaded from)."""
    # RTLD_GLOBAL: libfvattn_jax.so names libfvattn.so.1 as a dependency; with this copy already
    # loaded under that SONAME, the dynamic linker reuses it, so one process has one libfvattn.
    return _load("core", "FVATTN_LIBRARY", SONAME, SONAME, ctypes.RTLD_GLOBAL)


def jax_handlers():
    """(ctypes.CDLL of libfvattn_jax.so, its path). Loads the core library first (see core())."""
    core()
    return _load("jax", "FVATTN_JAX_LIBRARY", JAX_LIBRARY, None, ctypes.RTLD_LOCAL)
