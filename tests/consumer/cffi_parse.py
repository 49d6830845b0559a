"""The public header is usable from cffi after preprocessing: cdef() accepts it as is, the library
loads through it, and the struct sizes cffi computes are the ABI's.

usage: cffi_parse.py <fvattn.h> <libfvattn.so> <cc>   (exit 77: cffi not installed, test skipped)
"""
import subprocess
import sys

try:
    import cffi
except ImportError:
    print("SKIPPED: cffi is not installed")
    sys.exit(77)

header, library, cc = sys.argv[1:4]
with open(header) as f:
    # cffi knows the fixed-width integer types and size_t itself; system headers are left out.
    text = "".join(line for line in f if not line.startswith("#include"))
source = subprocess.run([cc, "-E", "-P", "-std=c99", "-x", "c", "-"], input=text, text=True,
                        capture_output=True, check=True).stdout

ffi = cffi.FFI()
ffi.cdef(source)
lib = ffi.dlopen(library)

# fva_handle_options_t: 16 bytes in ABI 1, then `kernels` and the tuning options appended;
# fva_handle_info_t: 296 bytes in ABI 1, then the resolved options and image_reason (struct_size
# versioning).
expect = {"fva_tensor_t": 112, "fva_handle_options_t": 44, "fva_handle_info_t": 520,
          "fva_qat_config_t": 40, "fva_vsa_config_t": 12, "fva_nvfp4_config_t": 12,
          "fva_vsa_layer_config_t": 16}
bad = {name: ffi.sizeof(name) for name, size in expect.items() if ffi.sizeof(name) != size}
assert not bad, f"struct sizes differ from the ABI: {bad}"
assert lib.fva_abi_version() == 1
assert ffi.string(lib.fva_status_string(1)) == b"FVA_ERR_INVALID_ARGUMENT"

# One real call through cffi: a CPU handle and its info.
opts = ffi.new("fva_handle_options_t*", {"struct_size": 16, "backend": 2, "device": -1})
handle = ffi.new("fva_handle_t*")
assert lib.fva_create(handle, opts) == 0, ffi.string(lib.fva_last_error())
info = ffi.new("fva_handle_info_t*", {"struct_size": ffi.sizeof("fva_handle_info_t")})
assert lib.fva_get_info(handle[0], info) == 0
assert ffi.string(info.image) == b"cpu"
lib.fva_destroy(handle[0])
print(f"cffi {cffi.__version__}: header parsed ({source.count('fva_')} fva_ names), library "
      f"{lib.fva_version()} loaded, struct sizes match the ABI")
