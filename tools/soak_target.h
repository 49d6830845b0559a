// Where `fvattn soak` runs its calls (tools/soak.cpp): the backend under test, with the memory and
// streams its calls take. The CUDA target (soak_target_cuda.cpp, GPU builds) is the soak's purpose;
// the host target (soak_target_host.cpp, every build) runs the same calls on a second CPU handle,
// so that the soak's own bookkeeping is tested in CI, under the sanitizers too.
#pragma once

#include <fvattn/fvattn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace fvtool {

class SoakTarget {
 public:
  virtual ~SoakTarget() = default;
  // The backend's name in messages ("CUDA", "CPU") and its handle options' backend.
  virtual const char* name() const = 0;
  virtual int32_t backend() const = 0;
  // Memory the target's calls read and write (throws std::runtime_error on failure).
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // A stream of the target (nullptr where the target has none) and its end.
  virtual void* new_stream() = 0;
  virtual void delete_stream(void* stream) = 0;
  // Ordered on `stream`: n bytes of `byte` at dst, host bytes to target memory. Throw on failure.
  virtual void fill(void* dst, uint8_t byte, size_t n, void* stream) = 0;
  virtual void upload(void* dst, const void* src, size_t n, void* stream) = 0;
  // Target bytes to the host, once the stream's earlier work is done. Throws on failure.
  virtual void download(void* dst, const void* src, size_t n, void* stream) = 0;
  // Waits for the stream's (or every stream's) work: "" or the error the target reports.
  virtual std::string sync(void* stream) = 0;
  virtual std::string sync_all() = 0;
  // Target memory in use, in MiB, and the total; false where the target cannot say.
  virtual bool memory_in_use(double* used_mib, double* total_mib) = 0;
};

// The host: plain memory, no streams, the CPU backend as the target.
std::unique_ptr<SoakTarget> make_host_target();

// The CUDA device of `device` (the handle's ordinal), through the CUDA runtime; null in a build
// without CUDA.
std::unique_ptr<SoakTarget> make_cuda_target(int device);

}  // namespace fvtool
