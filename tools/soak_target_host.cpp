// `fvattn soak`'s host target (tools/soak_target.h): the CPU backend over plain host memory.
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "soak_target.h"

namespace fvtool {
namespace {

class HostTarget final : public SoakTarget {
 public:
  const char* name() const override { return "CPU"; }
  int32_t backend() const override { return FVA_BACKEND_CPU; }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    if (posix_memalign(&p, 256, bytes == 0 ? 1 : bytes) != 0) throw std::bad_alloc();
    return p;
  }
  void release(void* p) override { std::free(p); }
  void* new_stream() override { return nullptr; }
  void delete_stream(void*) override {}
  void fill(void* dst, uint8_t byte, size_t n, void*) override { std::memset(dst, byte, n); }
  void upload(void* dst, const void* src, size_t n, void*) override { std::memcpy(dst, src, n); }
  void download(void* dst, const void* src, size_t n, void*) override { std::memcpy(dst, src, n); }
  std::string sync(void*) override { return ""; }
  std::string sync_all() override { return ""; }
  bool memory_in_use(double*, double*) override { return false; }  // malloc keeps what it frees
};

}  // namespace

std::unique_ptr<SoakTarget> make_host_target() { return std::make_unique<HostTarget>(); }

#if !FVATTN_TOOLS_GPU
std::unique_ptr<SoakTarget> make_cuda_target(int) { return nullptr; }
#endif

}  // namespace fvtool
