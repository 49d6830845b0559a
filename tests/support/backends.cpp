#include "support/backends.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "support/cuda_memory.h"

#if defined(__SANITIZE_ADDRESS__)
#define FVT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FVT_ASAN 1
#endif
#endif
#ifdef FVT_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace fvt {

Backend::~Backend() { fva_destroy(h_); }

void Backend::protect(void*, size_t, bool) noexcept {}

bool Backend::is_cuda() const { return name() == "cuda"; }

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
    o.backend = FVA_BACKEND_CPU;
    if (fva_create(&h_, &o) != FVA_OK) throw std::runtime_error(fva_last_error());
  }
  std::string name() const override { return "cpu"; }
  void* alloc(size_t bytes) override {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void release(void* p) noexcept override { std::free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
#ifdef FVT_ASAN
  void protect(void* p, size_t bytes, bool on) noexcept override {
    if (on) ASAN_POISON_MEMORY_REGION(p, bytes);
    else ASAN_UNPOISON_MEMORY_REGION(p, bytes);
  }
#endif
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(fva_handle_t h) { h_ = h; }
  std::string name() const override { return "cuda"; }
  void* alloc(size_t bytes) override { return cuda::alloc(bytes); }
  void release(void* p) noexcept override { cuda::release(p); }
  void upload(void* dst, const void* src, size_t bytes) override { cuda::copy_to_device(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { cuda::copy_to_host(dst, src, bytes); }
  void synchronize() override { cuda::synchronize(); }
};

}  // namespace

std::vector<std::unique_ptr<Backend>> available_backends() {
  std::vector<std::unique_ptr<Backend>> all;
  all.push_back(std::make_unique<CpuBackend>());
  fva_handle_options_t o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = FVA_BACKEND_CUDA;
  // FVATTN_TEST_KERNELS=portable pins the portable kernels, as for the GPU suites (gpu_fixtures.h).
  const char* kernels = std::getenv("FVATTN_TEST_KERNELS");
  if (kernels != nullptr && std::string(kernels) == "portable") o.kernels = FVA_KERNELS_PORTABLE;
  fva_handle_t h = nullptr;
  if (fva_create(&h, &o) != FVA_OK) {
    MESSAGE("CUDA backend skipped: " << std::string(fva_last_error()));
    return all;
  }
  fva_handle_info_t info;
  info.struct_size = sizeof info;
  std::string why;
  if (fva_get_info(h, &info) != FVA_OK || !cuda::init_memory(info.device, &why)) {
    fva_destroy(h);
    FAIL("a CUDA handle exists but the test cannot allocate device memory: " << why);
    return all;
  }
  MESSAGE("CUDA backend: device " << info.device << " (" << std::string(info.device_name) << "), image " << std::string(info.image));
  all.push_back(std::make_unique<CudaBackend>(h));
  return all;
}

bool skip_unsupported(const Backend& b, fva_status_t st, const char* what) {
  if (st != FVA_ERR_UNSUPPORTED || !b.is_cuda()) return false;
  MESSAGE(b.name() << ": " << what << " skipped, FVA_ERR_UNSUPPORTED: " << std::string(fva_last_error()));
  return true;
}

BackendBuffer::BackendBuffer(Backend& b, size_t bytes) : b_(b), bytes_(bytes) {
  base_ = b_.alloc(bytes + 2 * kGuard);
  std::vector<uint8_t> fill(bytes + 2 * kGuard, kGuardByte);
  b_.upload(base_, fill.data(), fill.size());
  set_guards(true);
}

BackendBuffer::~BackendBuffer() {
  set_guards(false);
  b_.release(base_);
}

void BackendBuffer::set_guards(bool on) const noexcept {
  b_.protect(base_, kGuard, on);
  b_.protect(static_cast<char*>(base_) + kGuard + bytes_, kGuard, on);
}

void BackendBuffer::upload(const void* src) { b_.upload(data(), src, bytes_); }

void BackendBuffer::download(void* dst) const { b_.download(dst, data(), bytes_); }

bool BackendBuffer::guards_intact() const {
  std::vector<uint8_t> head(kGuard), tail(kGuard);
  set_guards(false);
  b_.download(head.data(), base_, kGuard);
  b_.download(tail.data(), static_cast<char*>(base_) + kGuard + bytes_, kGuard);
  set_guards(true);
  for (size_t i = 0; i < kGuard; ++i)
    if (head[i] != kGuardByte || tail[i] != kGuardByte) return false;
  return true;
}

BackendTensor::BackendTensor(Backend& b, const HostTensor& host) : buf_(b, host.bytes()), desc_(host.desc()) {
  desc_.data = buf_.data();
  buf_.upload(host.data());
}

void BackendTensor::download_into(HostTensor& host) const {
  if (host.bytes() != buf_.bytes()) throw std::invalid_argument("BackendTensor::download_into: size");
  buf_.download(host.data());
}

std::vector<uint8_t> BackendTensor::download() const {
  std::vector<uint8_t> bytes(buf_.bytes());
  buf_.download(bytes.data());
  return bytes;
}

}  // namespace fvt
