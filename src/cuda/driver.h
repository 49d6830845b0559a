// The CUDA driver, opened at run time with dlopen so libfvattn.so loads (and its CPU backend works)
// on machines without a driver. Only what the library uses is bound.
#pragma once

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
  // cuMemsetD32Async(address, value, count of 32-bit words, stream): the fused backward's fp32 dQ
  // accumulator is zeroed with it.
  CUresult (*cuMemsetD32Async)(unsigned long long, unsigned int, size_t, CUstream) = nullptr;
  // cuTensorMapEncodeTiled(map, dtype, rank, address, dims, strides (bytes, rank - 1), box,
  // element strides, interleave, swizzle, L2 promotion, OOB fill): the sm_90a kernels' TMA maps.
  CUresult (*cuTensorMapEncodeTiled)(void*, int, unsigned, void*, const unsigned long long*,
                                     const unsigned long long*, const unsigned*, const unsigned*,
                                     int, int, int, int) = nullptr;
};

// The bound entry points, or null when the driver is unavailable (see driver_available).
const Api* api();

// "message (CUresult n)" for a driver error code.
std::string error_text(const Api& api, CUresult r);

struct DeviceInfo {
  int ordinal = -1;
  int sm_major = 0;
  int sm_minor = 0;
  int sm_count = 0;
  std::string name;
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
