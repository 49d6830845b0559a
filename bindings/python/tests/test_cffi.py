"""The header's promise to cffi users, kept: include/fvattn/fvattn.h, run through the C
preprocessor, is accepted by cffi.FFI().cdef as it is; the library opens with ffi.dlopen; a CPU
handle and a VSA forward work through it, and agree bit for bit with the ctypes package. The ctypes
structs of the package are checked against the sizes cffi computes from the header."""
import ctypes
import os
import subprocess

import cffi
import numpy as np
import pytest

import fvattn
from fvattn import _capi
from conftest import masked_attention_ref, random_bf16, rel_l2, vsa_mask


@pytest.fixture(scope="module")
def ffi_lib():
    with open(os.environ["FVATTN_HEADER"]) as f:
        # System headers are left out: cffi knows the fixed-width integer types and size_t.
        text = "".join(line for line in f if not line.startswith("#include"))
    cc = os.environ.get("FVATTN_CC", "cc")
    source = subprocess.run([cc, "-E", "-P", "-std=c99", "-x", "c", "-"], input=text, text=True,
                            capture_output=True, check=True).stdout
    ffi = cffi.FFI()
    ffi.cdef(source)
    return ffi, ffi.dlopen(os.environ["FVATTN_LIBRARY"])


def test_version_and_handle(ffi_lib):
    ffi, lib = ffi_lib
    assert lib.fva_version() == 100 and lib.fva_abi_version() == 1
    # FVA_BACKEND_CPU; the tuning options FVA_OPTION_AUTO (-1), as FVA_HANDLE_OPTIONS_INIT sets them
    # (0 is out of range for some of them).
    opts = ffi.new("fva_handle_options_t*", {"struct_size": ffi.sizeof("fva_handle_options_t"),
                                             "backend": 2, "device": -1,
                                             **{name: -1 for name in _capi.TUNING_OPTIONS}})
    handle = ffi.new("fva_handle_t*")
    assert lib.fva_create(handle, opts) == 0, ffi.string(lib.fva_last_error())
    info = ffi.new("fva_handle_info_t*", {"struct_size": ffi.sizeof("fva_handle_info_t")})
    assert lib.fva_get_info(handle[0], info) == 0
    assert ffi.string(info.image) == b"cpu"
    assert lib.fva_destroy(handle[0]) == 0


def _tensor(ffi, arr, dtype):
    t = ffi.new("fva_tensor_t*")
    t.data = ffi.cast("void*", arr.ctypes.data)
    t.dtype = dtype
    t.rank = arr.ndim
    for i in range(arr.ndim):
        t.shape[i] = arr.shape[i]
        t.strides[i] = arr.strides[i] // arr.itemsize
    return t


def test_vsa_forward_through_cffi(ffi_lib, rng):
    ffi, lib = ffi_lib
    q, k, v = (random_bf16(rng, (1, 2, 128, 64)) for _ in range(3))
    idx = np.array([[[[1, 0], [1, 0]], [[0, 0], [1, 0]]]], dtype=np.int32)
    num = np.array([[[2, 1], [1, 0]]], dtype=np.int32)
    bs = np.array([64, 50], dtype=np.int32)
    o = fvattn._frameworks.aligned_numpy_empty(q.shape, q.dtype)
    lse = fvattn._frameworks.aligned_numpy_empty(q.shape[:3], np.float32)
    BF16, F32, I32 = 1, 3, 4
    ts = [_tensor(ffi, a, d) for a, d in ((q, BF16), (k, BF16), (v, BF16), (idx, I32), (num, I32),
                                          (bs, I32), (o, BF16), (lse, F32))]
    handle = ffi.new("fva_handle_t*")
    opts = ffi.new("fva_handle_options_t*", {"struct_size": 16, "backend": 2, "device": -1})
    assert lib.fva_create(handle, opts) == 0
    cfg = ffi.new("fva_vsa_config_t*", {"struct_size": ffi.sizeof("fva_vsa_config_t"),
                                        "softmax_scale": 0.0, "block_size": 64})
    nbytes = ffi.new("size_t*")
    assert lib.fva_vsa_forward_workspace_size(handle[0], cfg, ts[0], ts[1], ts[2], ts[3], nbytes) == 0
    ws = fvattn._frameworks.aligned_numpy_empty((max(nbytes[0], 1),), np.uint8)
    st = lib.fva_vsa_forward(handle[0], cfg, *ts, ffi.cast("void*", ws.ctypes.data), nbytes[0], ffi.NULL)
    assert st == 0, ffi.string(lib.fva_last_error())
    lib.fva_destroy(handle[0])

    o_ref, lse_ref = masked_attention_ref(q, k, v, vsa_mask(idx, num, bs, 128, 128))
    assert rel_l2(o, o_ref) <= 1e-2
    o2, lse2 = fvattn.vsa_forward(q, k, v, idx, num, bs)  # the ctypes package: same library, same bits
    np.testing.assert_array_equal(o.view(np.uint16), o2.view(np.uint16))
    np.testing.assert_array_equal(lse, lse2)


def test_errors_through_cffi(ffi_lib):
    ffi, lib = ffi_lib
    assert lib.fva_create(ffi.NULL, ffi.NULL) == 1
    assert ffi.string(lib.fva_status_string(1)) == b"FVA_ERR_INVALID_ARGUMENT"
    assert ffi.string(lib.fva_last_error()) == b"out: is NULL"


@pytest.mark.parametrize("c_name,py_struct", [
    ("fva_tensor_t", _capi.Tensor), ("fva_handle_options_t", _capi.HandleOptions),
    ("fva_handle_info_t", _capi.HandleInfo), ("fva_qat_config_t", _capi.QatConfigC),
    ("fva_vsa_config_t", _capi.VsaConfigC), ("fva_nvfp4_config_t", _capi.Nvfp4ConfigC),
    ("fva_vsa_layer_config_t", _capi.VsaLayerConfigC)])
def test_ctypes_structs_match_the_header(ffi_lib, c_name, py_struct):
    ffi, _ = ffi_lib
    assert ctypes.sizeof(py_struct) == ffi.sizeof(c_name)
    for field, _ in py_struct._fields_:
        assert getattr(py_struct, field).offset == ffi.offsetof(c_name, field), field
