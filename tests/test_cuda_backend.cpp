// The CUDA backend's frame (the kernels themselves are tested by tests/gpu/). Which branch runs
// depends on the machine, and the test says which:
//   - with a driver and a device: AUTO picks CUDA, fva_get_info describes the device and its image,
//     arguments are still checked first (FVA_ERR_INVALID_ARGUMENT), and what the CUDA kernels do
//     not cover (D = 32) returns FVA_ERR_UNSUPPORTED with a message naming the CPU backend, writing
//     nothing;
//   - without: FVA_BACKEND_CUDA gives FVA_ERR_NO_DEVICE with the reason, AUTO gives the CPU backend.
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensor_desc.h"

namespace {

bool cuda_handle(fva_handle_t* h) {
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CUDA;
  return fva_create(h, &o) == FVA_OK;
}

fva_tensor_t bhsd(void* data, int64_t B, int64_t H, int64_t S, int64_t D) {
  return fvadesc::contiguous(data, FVA_DTYPE_BF16, {B, H, S, D});
}

}  // namespace

TEST_CASE("CUDA backend frame") {
  fva_handle_t h = nullptr;
  if (!cuda_handle(&h)) {
    MESSAGE("no CUDA device here: checking the no-device path");
    CHECK(h == nullptr);
    const std::string why = fva_last_error();
    CHECK(why.find("FVA_BACKEND_CUDA requested but no usable CUDA device: ") == 0);
    REQUIRE(fva_create(&h, nullptr) == FVA_OK);
    fva_handle_info_t info;
    info.struct_size = sizeof info;
    REQUIRE(fva_get_info(h, &info) == FVA_OK);
    CHECK(info.backend == FVA_BACKEND_CPU);
    fva_destroy(h);
    return;
  }

  fva_handle_info_t info;
  info.struct_size = sizeof info;
  REQUIRE(fva_get_info(h, &info) == FVA_OK);
  MESSAGE("CUDA device ", info.device, ": ", info.device_name, " sm_", info.sm_major, info.sm_minor,
          ", ", info.sm_count, " SMs, image ", info.image);
  CHECK(info.backend == FVA_BACKEND_CUDA);
  CHECK(info.device >= 0);
  CHECK(info.sm_major >= 7);
  CHECK(info.sm_count > 0);
  CHECK(std::strlen(info.device_name) > 0);
  CHECK(std::strlen(info.image) > 0);

  // AUTO picks the device too.
  fva_handle_t autoh = nullptr;
  REQUIRE(fva_create(&autoh, nullptr) == FVA_OK);
  fva_handle_info_t ainfo;
  ainfo.struct_size = sizeof ainfo;
  REQUIRE(fva_get_info(autoh, &ainfo) == FVA_OK);
  CHECK(ainfo.backend == FVA_BACKEND_CUDA);
  fva_destroy(autoh);

  // A device that does not exist.
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CUDA;
  o.device = 4096;
  fva_handle_t none = nullptr;
  CHECK(fva_create(&none, &o) == FVA_ERR_NO_DEVICE);
  CHECK(std::string(fva_last_error()).find("device 4096 does not exist") != std::string::npos);

  // Host buffers stand in for device memory: no call gets as far as touching them.
  const int64_t B = 1, H = 1, S = 64, D = 32;
  alignas(64) static uint16_t q[B * H * S * D], k[B * H * S * D], v[B * H * S * D];
  alignas(64) static uint16_t out[B * H * S * D];
  alignas(64) static float lse[B * H * S];
  std::memset(out, 0x5a, sizeof out);
  fva_tensor_t tq = bhsd(q, B, H, S, D), tk = bhsd(k, B, H, S, D), tv = bhsd(v, B, H, S, D);
  fva_tensor_t to = bhsd(out, B, H, S, D);
  fva_tensor_t tl = fvadesc::contiguous(lse, FVA_DTYPE_F32, {B, H, S});
  fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
  cfg.high_precision_o = 0;

  size_t bytes = 7;
  CHECK(fva_qat_forward_workspace_size(h, &cfg, &tq, &tk, &tv, &bytes) == FVA_ERR_UNSUPPORTED);
  CHECK(bytes == 7);
  CHECK(std::string(fva_last_error()).find("FVA_BACKEND_CPU") != std::string::npos);

  tv.shape[2] = 32;  // bad arguments are reported as such on every backend
  CHECK(fva_qat_forward(h, &cfg, &tq, &tk, &tv, &to, nullptr, &tl, nullptr, 0, nullptr) ==
        FVA_ERR_INVALID_ARGUMENT);
  tv.shape[2] = S;
  CHECK(fva_qat_forward(h, &cfg, &tq, &tk, &tv, &to, nullptr, &tl, nullptr, 0, nullptr) ==
        FVA_ERR_UNSUPPORTED);
  CHECK(std::string(fva_last_error()).find("FVA_BACKEND_CPU") != std::string::npos);
  fva_vsa_config_t vcfg = FVA_VSA_CONFIG_INIT;
  alignas(64) static int32_t idx[B * H], num[B * H], sizes[1];
  const fva_tensor_t ti = fvadesc::contiguous(idx, FVA_DTYPE_I32, {B, H, 1, 1});
  const fva_tensor_t tn = fvadesc::contiguous(num, FVA_DTYPE_I32, {B, H, 1});
  const fva_tensor_t ts = fvadesc::contiguous(sizes, FVA_DTYPE_I32, {1});
  CHECK(fva_vsa_forward(h, &vcfg, &tq, &tk, &tv, &ti, &tn, &ts, &to, &tl, nullptr, 0, nullptr) ==
        FVA_ERR_UNSUPPORTED);
  for (uint16_t x : out) REQUIRE(x == 0x5a5a);
  CHECK(fva_destroy(h) == FVA_OK);
}
