// Handle creation: backend selection (AUTO, CUDA, CPU), device query, fva_get_info.
#include <cstddef>
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "checks.h"
#include "core/handle_registry.h"
#include "core/image_choice.h"
#include "cuda/kernel_images.h"
#include "error.h"
#include "handle.h"

namespace fva {

const fva_handle& checked_handle(fva_handle_t h) {
  if (h == nullptr) fail(FVA_ERR_INVALID_ARGUMENT, "h: is NULL (create a handle with fva_create)");
  if (!is_live_handle(h))
    fail(FVA_ERR_INVALID_ARGUMENT,
         "h: {} is not a live handle (fva_destroy destroyed it, or fva_create never returned it)",
         static_cast<const void*>(h));
  return *h;
}

void require_backend_support(const fva_handle& h, const char* op) {
  if (h.backend == FVA_BACKEND_CPU || h.image != "none") return;
  fail(FVA_ERR_UNSUPPORTED,
       "{}: this libfvattn has no kernel image for device {} \"{}\" (sm_{}{}){}; create the handle "
       "with FVA_BACKEND_CPU and pass host pointers to use the CPU reference backend",
       op, h.device.ordinal, h.device.name, h.device.sm_major, h.device.sm_minor,
       cuda::images_built() ? ": " + h.image_reason : std::string(" (it was built with FVATTN_CUDA=OFF)"));
}

namespace {

void init_cpu(fva_handle& h) {
  h.backend = FVA_BACKEND_CPU;
  h.image = "cpu";
}

}  // namespace
}  // namespace fva

extern "C" {

fva_status_t fva_create(fva_handle_t* out, const fva_handle_options_t* opts) {
  if (out) *out = nullptr;
  return fva::guard([&] {
    using namespace fva;
    check_not_null(out, "out");
    fva_handle_options_t defaults = FVA_HANDLE_OPTIONS_INIT;
    const fva_handle_options_t o =
        read_config(opts, defaults, "opts", "fva_handle_options_t",
                    offsetof(fva_handle_options_t, kernels));  // ABI 1 ended before `kernels`
    if (o.backend != FVA_BACKEND_AUTO && o.backend != FVA_BACKEND_CUDA &&
        o.backend != FVA_BACKEND_CPU)
      fail(FVA_ERR_INVALID_ARGUMENT,
           "opts->backend is {} but must be FVA_BACKEND_AUTO (0), FVA_BACKEND_CUDA (1) or "
           "FVA_BACKEND_CPU (2)",
           o.backend);
    if (o.device < -1)
      fail(FVA_ERR_INVALID_ARGUMENT, "opts->device is {} but must be -1 (current) or >= 0",
           o.device);
    check_flag(o.deterministic, "opts->deterministic");
    if (o.kernels != FVA_KERNELS_AUTO && o.kernels != FVA_KERNELS_PORTABLE)
      fail(FVA_ERR_INVALID_ARGUMENT,
           "opts->kernels is {} but must be FVA_KERNELS_AUTO (0) or FVA_KERNELS_PORTABLE (1)",
           o.kernels);

    auto h = std::make_unique<fva_handle>();
    h->deterministic = o.deterministic;
    h->kernels = o.kernels;
    h->tuning = resolve_tuning_options(o);  // the environment's defaults, read here only
    h->threads = h->tuning.cpu_threads;
    if (o.backend == FVA_BACKEND_CPU) {
      init_cpu(*h);
    } else {
      std::string why;
      if (cuda::query_device(o.device, &h->device, &why)) {
        h->backend = FVA_BACKEND_CUDA;
        h->device.ptx_jit = h->tuning.ptx_jit;
        const ImageChoice image = cuda::image_for(h->device.sm_major, h->device.sm_minor, h->tuning.ptx_jit);
        h->image = image.image;
        h->image_reason = image.reason;
      } else if (o.backend == FVA_BACKEND_CUDA) {
        fail(FVA_ERR_NO_DEVICE, "FVA_BACKEND_CUDA requested but no usable CUDA device: {}", why);
      } else {
        init_cpu(*h);  // AUTO on a machine without a driver or device
      }
    }
    register_handle(h.get());
    *out = h.release();
  });
}

fva_status_t fva_destroy(fva_handle_t handle) {
  if (handle == nullptr) return FVA_OK;
  if (!fva::unregister_handle(handle))
    return fva::set_last_error(
        FVA_ERR_INVALID_ARGUMENT,
        fmt::format("handle: {} is not a live handle (already destroyed, or never created by "
                    "fva_create); nothing was destroyed",
                    static_cast<const void*>(handle)));
  delete handle;
  return FVA_OK;
}

fva_status_t fva_get_info(fva_handle_t handle, fva_handle_info_t* info) {
  return fva::guard([&] {
    using namespace fva;
    const fva_handle& h = checked_handle(handle);
    check_not_null(info, "info");
    // The version-1 struct ends after device_name; later fields are written when the caller's
    // struct has room for them.
    constexpr size_t kInfoSizeAbi1 = offsetof(fva_handle_info_t, deterministic);
    if (info->struct_size < kInfoSizeAbi1)
      fail(FVA_ERR_INVALID_ARGUMENT,
           "info->struct_size is {} but must be at least {} (sizeof(fva_handle_info_t) in ABI {})",
           info->struct_size, kInfoSizeAbi1, FVA_ABI_VERSION);
    fva_handle_info_t r;
    std::memset(&r, 0, sizeof r);
    r.backend = h.backend;
    if (h.backend == FVA_BACKEND_CUDA) {
      r.device = h.device.ordinal;
      r.sm_major = h.device.sm_major;
      r.sm_minor = h.device.sm_minor;
      r.sm_count = h.device.sm_count;
      std::strncpy(r.device_name, h.device.name.c_str(), sizeof r.device_name - 1);
    } else {
      r.device = -1;
      r.sm_count = h.threads;
      std::strncpy(r.device_name, "CPU reference backend", sizeof r.device_name - 1);
    }
    std::strncpy(r.image, h.image.c_str(), sizeof r.image - 1);
    r.deterministic = h.deterministic;
    r.kernels = h.kernels;
    r.qat_forward_split = h.tuning.qat_forward_split;
    r.qat_forward_clusters = h.tuning.qat_forward_clusters ? 1 : 0;
    r.ds_budget_mib = h.tuning.ds_budget_mib;
    r.chained_launches =
        h.backend == FVA_BACKEND_CUDA && cuda::chained_launches_supported(h.device, h.tuning) ? 1 : 0;
    r.cpu_threads = h.threads;
    r.ptx_jit = h.backend == FVA_BACKEND_CUDA && h.device.ptx_jit ? 1 : 0;
    std::strncpy(r.image_reason, h.image_reason.c_str(), sizeof r.image_reason - 1);
    const size_t n = std::min<size_t>(info->struct_size, sizeof r);
    r.struct_size = static_cast<uint32_t>(n);
    std::memcpy(info, &r, n);  // struct_size becomes what this library filled
  });
}

}  // extern "C"
