// A handle's life as fvattn.h defines it: after fva_destroy (on this thread or another) every call
// with the handle fails with FVA_ERR_INVALID_ARGUMENT and a message, a second fva_destroy is refused
// (nothing freed twice), fva_destroy(NULL) is a no-op, and a pointer fva_create never returned is
// refused the same way. Outputs stay untouched. CPU backend (tests/gpu/test_gpu_faults.cpp: CUDA).
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/api_fixtures.h"
#include "support/host_tensor.h"

using namespace fvt;

namespace {

fva_handle_t cpu_handle() {
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CPU;
  fva_handle_t h = nullptr;
  REQUIRE_OK(fva_create(&h, &o));
  return h;
}

}  // namespace

TEST_CASE("a handle destroyed on another thread is refused by every later call") {
  fva_handle_t h = cpu_handle();
  std::thread([h] { CHECK(fva_destroy(h) == FVA_OK); }).join();

  HostTensor x(FVA_DTYPE_BF16, {1, 1, 16, 64}), y(FVA_DTYPE_BF16, {1, 1, 16, 64});
  x.fill(std::vector<double>(static_cast<size_t>(x.numel()), 1.0));
  const std::vector<uint16_t> before = y.bits16();
  CHECK(fva_nvfp4_fake_quantize(h, nullptr, x.t(), y.t(), nullptr) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(fva_last_error()).find("not a live handle") != std::string::npos);
  CHECK(y.bits16() == before);

  size_t bytes = 7;
  CHECK(fva_qat_forward_workspace_size(h, nullptr, x.t(), x.t(), x.t(), &bytes) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(bytes == 7);
  fva_handle_info_t info{};
  info.struct_size = sizeof info;
  CHECK(fva_get_info(h, &info) == FVA_ERR_INVALID_ARGUMENT);
}

TEST_CASE("fva_destroy: NULL is a no-op, a second destroy and a stranger are refused") {
  CHECK(fva_destroy(nullptr) == FVA_OK);
  fva_handle_t h = cpu_handle();
  CHECK(fva_destroy(h) == FVA_OK);
  CHECK(fva_destroy(h) == FVA_ERR_INVALID_ARGUMENT);
  CHECK(std::string(fva_last_error()).find("nothing was destroyed") != std::string::npos);
  alignas(64) char not_a_handle[256] = {};
  CHECK(fva_destroy(reinterpret_cast<fva_handle_t>(not_a_handle)) == FVA_ERR_INVALID_ARGUMENT);
  fva_handle_info_t info{};
  info.struct_size = sizeof info;
  CHECK(fva_get_info(reinterpret_cast<fva_handle_t>(not_a_handle), &info) == FVA_ERR_INVALID_ARGUMENT);
}

TEST_CASE("handles created and destroyed on many threads stay independent") {
  fva_handle_t keep = cpu_handle();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 50; ++i) {
        fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
        o.backend = FVA_BACKEND_CPU;
        fva_handle_t h = nullptr;
        if (fva_create(&h, &o) == FVA_OK) fva_destroy(h);
      }
    });
  for (std::thread& t : threads) t.join();
  fva_handle_info_t info{};
  info.struct_size = sizeof info;
  CHECK(fva_get_info(keep, &info) == FVA_OK);
  CHECK(fva_destroy(keep) == FVA_OK);
}

TEST_CASE("more live handles than the registry's table holds: each is live until destroyed, once") {
  // The lock-free table holds 4096 (src/core/handle_registry.cpp); the rest overflow.
  std::vector<fva_handle_t> hs(4500, nullptr);
  for (fva_handle_t& h : hs) h = cpu_handle();
  int live = 0;
  for (fva_handle_t h : hs) {
    fva_handle_info_t info{};
    info.struct_size = sizeof info;
    live += fva_get_info(h, &info) == FVA_OK;
  }
  CHECK(live == 4500);
  int destroyed = 0, refused = 0;
  for (fva_handle_t h : hs) destroyed += fva_destroy(h) == FVA_OK;
  for (fva_handle_t h : hs) refused += fva_destroy(h) == FVA_ERR_INVALID_ARGUMENT;
  CHECK(destroyed == 4500);
  CHECK(refused == 4500);
}

TEST_CASE("two threads destroying one handle: one succeeds, the other is refused") {
  for (int round = 0; round < 200; ++round) {
    fva_handle_t h = cpu_handle();
    std::atomic<int> ok{0};
    std::thread a([&] { ok += fva_destroy(h) == FVA_OK; });
    std::thread b([&] { ok += fva_destroy(h) == FVA_OK; });
    a.join();
    b.join();
    REQUIRE(ok.load() == 1);
  }
}
