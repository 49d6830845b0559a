// The CUDA driver, opened at run time with dlopen so libfvattn.so loads (and its CPU backend works)
// on machines without a driver. Only what the library uses is bound.
#pragma once

#include <cstddef>
#include <string>

namespace fva::cuda {

// The few driver types and entry points fvattn needs, declared here so that building the library
// needs no CUDA toolkit. Signatures follow the CUDA driver API (cuda.h), which is ABI-stable;
// handles are opaque pointers.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUlibrary = void*;
using CUkernel = void*;
using CUstream = void*;
constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NO_BINARY_FOR_GPU = 209;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4;
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;

// cuLaunchKernelEx's configuration (cuda.h's CUlaunchAttribute and CUlaunchConfig, same layout:
// an attribute is its id, padded to 8 bytes, and a 64-byte union of values).
struct CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    void* align;  // the union holds pointers: 8-byte aligned
    struct {
      unsigned x, y, z;
    } cluster_dim;  // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    int programmatic_stream_serialization_allowed;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_...
  } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72 && offsetof(CUlaunchAttribute, value) == 8,
              "cuda.h's CUlaunchAttribute layout");
struct CUlaunchConfig {
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned shared_bytes;
  CUstream stream;
  CUlaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(CUlaunchConfig) == 56 && offsetof(CUlaunchConfig, stream) == 32 &&
                  offsetof(CUlaunchConfig, num_attrs) == 48,
              "cuda.h's CUlaunchConfig layout");

struct Api {
  CUresult (*cuInit)(unsigned int) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuCtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuLibraryLoadData)(CUlibrary*, const void*, void*, void*, unsigned int, void*, void*,
                                unsigned int) = nullptr;
  CUresult (*cuLibraryGetKernel)(CUkernel*, CUlibrary, const char*) = nullptr;
  CUresult (*cuKernelSetAttribute)(int, int, CUkernel, CUdevice) = nullptr;
  CUresult (*cuLaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**) = nullptr;
  // Launches with attributes: the QAT forward's clusters of two blocks, and a call's kernels after
  // its first as programmatic dependent launches (kernel_images.h, LaunchChain). Optional (null
  // when the driver predates it, CUDA 12.0): the forward then runs without clusters, and every
  // kernel waits for the one before it as the stream orders them.
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, void*, void**, void**) = nullptr;
  // How many clusters of a launch can run at once (its kernel a CUkernel cast to CUfunction, the
  // context the config's stream's). Optional too: the QAT forward clusters only where the
  // clusters keep every SM busy, and without the query it does not cluster.
  CUresult (*cuOccupancyMaxActiveClusters)(int*, void*, const CUlaunchConfig*) = nullptr;
  // cuMemsetD32Async(address, value, count of 32-bit words, stream): the fused backward's fp32 dQ
  // accumulator is zeroed with it.
  CUresult (*cuMemsetD32Async)(unsigned long long, unsigned int, size_t, CUstream) = nullptr;
  // cuTensorMapEncodeTiled(map, dtype, rank, address, dims, strides (bytes, rank - 1), box,
  // element strides, interleave, swizzle, L2 promotion, OOB fill): the sm_90a kernels' TMA maps.
  CUresult (*cuTensorMapEncodeTiled)(void*, int, unsigned, void*, const unsigned long long*,
                                     const unsigned long long*, const unsigned*, const unsigned*,
                                     int, int, int, int) = nullptr;
  // The context a stream belongs to (stream_check.h). Optional: without it the stream's context
  // is not checked.
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*) = nullptr;
};

// The bound entry points, or null when the driver is unavailable (see driver_available).
const Api* api();

// "message (CUresult n)" for a driver error code.
std::string error_text(const Api& api, CUresult r);

struct DeviceInfo {
  int ordinal = -1;
  CUdevice device = 0;  // the driver's handle of the ordinal (cuDeviceGet), fixed at fva_create
  int sm_major = 0;
  int sm_minor = 0;
  int sm_count = 0;
  // Shared memory of one SM in bytes (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR): how
  // many blocks of a kernel's shared-memory footprint an SM holds. 0 when unknown.
  int smem_per_sm = 0;
  // The L2 cache in bytes (CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE): whether a launch's operands stay in
  // it whatever order its blocks run in. 0 when unknown.
  int l2_bytes = 0;
  std::string name;
  // The handle's image choice (fva_handle_options_t.ptx_jit): load the families' PTX-only fatbins,
  // which the driver JIT-compiles, instead of the fatbins with SASS. Set by fva_create.
  bool ptx_jit = false;
};

// Loads libcuda.so.1 and runs cuInit once per process (thread-safe). Returns true when the driver is
// usable; otherwise *why says what failed. FVATTN_DISABLE_CUDA=1 in the environment makes it report
// the driver absent, to exercise the no-device path on a GPU machine.
bool driver_available(std::string* why);

// Number of CUDA devices (0 when the driver is unavailable).
int device_count();

// The ordinal to use for `requested` (-1: the device of the calling thread's current context, or 0),
// and its properties. Returns false with *why on failure.
bool query_device(int requested, DeviceInfo* info, std::string* why);

// Driver version as MAJOR*1000 + MINOR*10 (0 when unavailable).
int driver_version();

}  // namespace fva::cuda
