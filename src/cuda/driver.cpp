#include "driver.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/options.h"

namespace fva::cuda {
namespace {

constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81;
constexpr int CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38;

struct Driver {
  bool ok = false;
  std::string why;
  Api api;
  int version = 0;
};

template <typename Fn>
bool bind(void* lib, const char* symbol, Fn* out, std::string* why) {
  void* p = dlsym(lib, symbol);
  if (!p) {
    *why = fmt::format("libcuda.so.1 lacks {}", symbol);
    return false;
  }
  *out = reinterpret_cast<Fn>(p);
  return true;
}

Driver load() {
  Driver d;
  if (env_flag_set("FVATTN_DISABLE_CUDA")) {
    d.why = "the CUDA driver is disabled by FVATTN_DISABLE_CUDA";
    return d;
  }
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace of the host process.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    d.why = fmt::format("no CUDA driver: cannot load libcuda.so.1 ({})", err ? err : "not found");
    return d;
  }
  Api& a = d.api;
  if (!bind(lib, "cuInit", &a.cuInit, &d.why) ||
      !bind(lib, "cuDriverGetVersion", &a.cuDriverGetVersion, &d.why) ||
      !bind(lib, "cuDeviceGetCount", &a.cuDeviceGetCount, &d.why) ||
      !bind(lib, "cuDeviceGet", &a.cuDeviceGet, &d.why) ||
      !bind(lib, "cuDeviceGetName", &a.cuDeviceGetName, &d.why) ||
      !bind(lib, "cuDeviceGetAttribute", &a.cuDeviceGetAttribute, &d.why) ||
      !bind(lib, "cuCtxGetDevice", &a.cuCtxGetDevice, &d.why) ||
      !bind(lib, "cuGetErrorString", &a.cuGetErrorString, &d.why) ||
      !bind(lib, "cuCtxGetCurrent", &a.cuCtxGetCurrent, &d.why) ||
      !bind(lib, "cuCtxSetCurrent", &a.cuCtxSetCurrent, &d.why) ||
      !bind(lib, "cuDevicePrimaryCtxRetain", &a.cuDevicePrimaryCtxRetain, &d.why) ||
      !bind(lib, "cuLibraryLoadData", &a.cuLibraryLoadData, &d.why) ||
      !bind(lib, "cuLibraryGetKernel", &a.cuLibraryGetKernel, &d.why) ||
      !bind(lib, "cuKernelSetAttribute", &a.cuKernelSetAttribute, &d.why) ||
      !bind(lib, "cuLaunchKernel", &a.cuLaunchKernel, &d.why) ||
      !bind(lib, "cuMemsetD32Async", &a.cuMemsetD32Async, &d.why) ||
      !bind(lib, "cuTensorMapEncodeTiled", &a.cuTensorMapEncodeTiled, &d.why)) {
    return d;  // the library handle stays open: harmless, and dlclose of a driver is unsafe
  }
  std::string optional_missing;
  (void)bind(lib, "cuLaunchKernelEx", &a.cuLaunchKernelEx, &optional_missing);
  (void)bind(lib, "cuOccupancyMaxActiveClusters", &a.cuOccupancyMaxActiveClusters,
             &optional_missing);
  (void)bind(lib, "cuStreamGetCtx", &a.cuStreamGetCtx, &optional_missing);
  const CUresult r = a.cuInit(0);
  if (r != CUDA_SUCCESS) {
    d.why = fmt::format("cuInit failed: {}", error_text(a, r));
    return d;
  }
  a.cuDriverGetVersion(&d.version);
  d.ok = true;
  return d;
}

const Driver& driver() {
  static std::once_flag once;
  static Driver* d = nullptr;
  std::call_once(once, [] { d = new Driver(load()); });  // never freed: outlives static destructors
  return *d;
}

}  // namespace

std::string error_text(const Api& api, CUresult r) {
  const char* s = nullptr;
  if (api.cuGetErrorString && api.cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
    return fmt::format("{} (CUresult {})", s, r);
  return fmt::format("CUresult {}", r);
}

const Api* api() {
  const Driver& d = driver();
  return d.ok ? &d.api : nullptr;
}

bool driver_available(std::string* why) {
  const Driver& d = driver();
  if (!d.ok && why) *why = d.why;
  return d.ok;
}

int device_count() {
  const Driver& d = driver();
  if (!d.ok) return 0;
  int n = 0;
  return d.api.cuDeviceGetCount(&n) == CUDA_SUCCESS ? n : 0;
}

int driver_version() { return driver().version; }

bool query_device(int requested, DeviceInfo* info, std::string* why) {
  const Driver& d = driver();
  if (!d.ok) {
    *why = d.why;
    return false;
  }
  const Api& a = d.api;
  int count = 0;
  CUresult r = a.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) {
    *why = fmt::format("cuDeviceGetCount failed: {}", error_text(a, r));
    return false;
  }
  if (count == 0) {
    *why = "the CUDA driver reports no device";
    return false;
  }
  int ordinal = requested;
  if (ordinal < 0) {
    // The device of the calling thread's current context; asking cuCtxGetDevice without one is an
    // API error (compute-sanitizer reports it), so look for a context first.
    CUcontext ctx = nullptr;
    CUdevice current = 0;
    ordinal = a.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr &&
                      a.cuCtxGetDevice(&current) == CUDA_SUCCESS
                  ? current
                  : 0;
  }
  if (ordinal >= count) {
    *why = fmt::format("device {} does not exist (this machine has {} CUDA device{})", ordinal,
                       count, count == 1 ? "" : "s");
    return false;
  }
  CUdevice dev;
  r = a.cuDeviceGet(&dev, ordinal);
  if (r != CUDA_SUCCESS) {
    *why = fmt::format("cuDeviceGet({}) failed: {}", ordinal, error_text(a, r));
    return false;
  }
  char name[256] = {0};
  a.cuDeviceGetName(name, sizeof name - 1, dev);
  info->ordinal = ordinal;
  info->device = dev;
  info->name = name;
  a.cuDeviceGetAttribute(&info->sm_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  a.cuDeviceGetAttribute(&info->sm_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  a.cuDeviceGetAttribute(&info->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  a.cuDeviceGetAttribute(&info->smem_per_sm, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, dev);
  a.cuDeviceGetAttribute(&info->l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev);
  return true;
}

}  // namespace fva::cuda
