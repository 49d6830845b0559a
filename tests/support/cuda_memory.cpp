#include "support/cuda_memory.h"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>

namespace fvt::cuda {
namespace {

// Driver API types and signatures (cuda.h, ABI-stable); the _v2 names are the 64-bit entry points.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;

struct Api {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuMemAlloc_v2)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree_v2)(CUdeviceptr);
  CUresult (*cuMemsetD8_v2)(CUdeviceptr, unsigned char, size_t);
  CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH_v2)(void*, CUdeviceptr, size_t);
  CUresult (*cuCtxSynchronize)();
};

Api g_api{};
CUcontext g_ctx = nullptr;
bool g_ok = false;
std::string g_why;

template <typename Fn>
bool bind(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!*out) g_why = std::string("libcuda.so.1 lacks ") + name;
  return *out != nullptr;
}

void load(int ordinal) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    g_why = "cannot load libcuda.so.1";
    return;
  }
  Api& a = g_api;
  if (!bind(lib, "cuInit", &a.cuInit) || !bind(lib, "cuDeviceGet", &a.cuDeviceGet) ||
      !bind(lib, "cuDevicePrimaryCtxRetain", &a.cuDevicePrimaryCtxRetain) ||
      !bind(lib, "cuCtxSetCurrent", &a.cuCtxSetCurrent) || !bind(lib, "cuMemAlloc_v2", &a.cuMemAlloc_v2) ||
      !bind(lib, "cuMemFree_v2", &a.cuMemFree_v2) || !bind(lib, "cuMemsetD8_v2", &a.cuMemsetD8_v2) ||
      !bind(lib, "cuMemcpyHtoD_v2", &a.cuMemcpyHtoD_v2) ||
      !bind(lib, "cuMemcpyDtoH_v2", &a.cuMemcpyDtoH_v2) ||
      !bind(lib, "cuCtxSynchronize", &a.cuCtxSynchronize))
    return;
  CUdevice dev = 0;
  CUresult r;
  if ((r = a.cuInit(0)) != 0 || (r = a.cuDeviceGet(&dev, ordinal)) != 0 ||
      (r = a.cuDevicePrimaryCtxRetain(&g_ctx, dev)) != 0) {
    g_why = "driver initialization failed, CUresult " + std::to_string(r);
    return;
  }
  g_ok = true;
}

void require(CUresult r, const char* call) {
  if (r != 0) throw std::runtime_error(std::string(call) + " failed, CUresult " + std::to_string(r));
}

// The primary context, current on the calling thread (a test may move between threads). Before
// init_memory has succeeded there are no driver entry points to call: say so instead of crashing.
void make_current() {
  if (!g_ok) throw std::runtime_error("fvt::cuda: device memory used before init_memory() succeeded");
  require(g_api.cuCtxSetCurrent(g_ctx), "cuCtxSetCurrent");
}

CUdeviceptr dptr(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

}  // namespace

bool init_memory(int ordinal, std::string* why) {
  static std::once_flag once;
  std::call_once(once, [ordinal] { load(ordinal); });
  if (!g_ok) {
    if (why) *why = g_why;
    return false;
  }
  make_current();
  return true;
}

void* alloc(size_t bytes) {
  make_current();
  CUdeviceptr p = 0;
  require(g_api.cuMemAlloc_v2(&p, bytes), "cuMemAlloc");
  return reinterpret_cast<void*>(static_cast<uintptr_t>(p));
}

void release(void* p) noexcept {
  if (p && g_ok) g_api.cuMemFree_v2(dptr(p));
}

void fill(void* dst, uint8_t byte, size_t bytes) {
  make_current();
  require(g_api.cuMemsetD8_v2(dptr(dst), byte, bytes), "cuMemsetD8");
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  make_current();
  require(g_api.cuMemcpyHtoD_v2(dptr(dst), src, bytes), "cuMemcpyHtoD");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  make_current();
  require(g_api.cuMemcpyDtoH_v2(dst, dptr(src), bytes), "cuMemcpyDtoH");
}

void synchronize() {
  make_current();
  require(g_api.cuCtxSynchronize(), "cuCtxSynchronize");
}

}  // namespace fvt::cuda
