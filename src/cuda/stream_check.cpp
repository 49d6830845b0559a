#include "stream_check.h"

#include <cstdint>
#include <string>

#include "error.h"
#include "kernel_images.h"

namespace fva::cuda {

void check_launch_context(const DeviceInfo& device, void* stream) {
  const Api* a = api();
  if (a == nullptr) {
    std::string why;
    driver_available(&why);
    fail(FVA_ERR_NO_DEVICE, "the CUDA driver is unavailable: {}", why);
  }
  ensure_context(device);
  CUcontext current = nullptr;
  CUdevice current_device = -1;
  const CUdevice want = device.device;
  CUresult r = a->cuCtxGetCurrent(&current);
  if (r == CUDA_SUCCESS) r = a->cuCtxGetDevice(&current_device);
  if (r != CUDA_SUCCESS)
    fail(FVA_ERR_CUDA, "cannot query the calling thread's CUDA context: {}", error_text(*a, r));
  if (current_device != want)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "the calling thread's current CUDA context {} is on device {} but this handle runs on device "
         "{} (make a context of device {} current, or use a handle of device {})",
         current, current_device, device.ordinal, device.ordinal, current_device);
  const uintptr_t s = reinterpret_cast<uintptr_t>(stream);
  if (s == 0 || s == 1 || s == 2 || a->cuStreamGetCtx == nullptr) return;
  CUcontext owner = nullptr;
  r = a->cuStreamGetCtx(stream, &owner);
  if (r != CUDA_SUCCESS)
    fail(FVA_ERR_CUDA, "stream: cannot tell which CUDA context {} belongs to: {}", stream,
         error_text(*a, r));
  if (owner != current)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "stream: {} belongs to CUDA context {} but this call launches in context {}, the calling "
         "thread's current one on device {} (pass a stream of that context, or make the stream's "
         "context current before the call)",
         stream, owner, current, device.ordinal);
}

}  // namespace fva::cuda
