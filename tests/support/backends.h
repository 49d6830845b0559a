// The backends a test runs on, so one test body checks the CPU backend everywhere and the CUDA
// backend where there is a device: CPU always; CUDA when fva_create(FVA_BACKEND_CUDA) succeeds (on a
// machine without a device the test says that CUDA was skipped, and why). Each backend owns a
// handle and knows where its tensors live (host memory, or device memory through the driver).
#pragma once

#include <fvattn/fvattn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/host_tensor.h"

namespace fvt {

class Backend {
 public:
  virtual ~Backend();
  virtual std::string name() const = 0;
  fva_handle_t handle() const { return h_; }
  bool is_cuda() const;

  // Memory of this backend's kind, at least 256-byte aligned.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // Waits for the calls made so far (a no-op on the CPU backend, which runs synchronously).
  virtual void synchronize() = 0;
  // Marks [p, p + bytes) as out of bounds (on) or usable again (off) where a tool can enforce it:
  // host memory under AddressSanitizer, so reads of guard bytes are reported too. Else a no-op.
  virtual void protect(void* p, size_t bytes, bool on) noexcept;

 protected:
  fva_handle_t h_ = nullptr;
};

// Every backend usable here, CPU first. Reports through doctest's MESSAGE when CUDA is skipped.
// FVATTN_TEST_KERNELS=portable gives the CUDA handle FVA_KERNELS_PORTABLE.
std::vector<std::unique_ptr<Backend>> available_backends();

// True (with a MESSAGE) when `st` is FVA_ERR_UNSUPPORTED on a CUDA handle: an operation this build
// has no kernel for yet; the test skips that backend instead of failing.
bool skip_unsupported(const Backend& b, fva_status_t st, const char* what);

// Memory for one tensor on a backend, with guard bytes on both sides: any stray write by a kernel
// near the tensor shows up in guards_intact(), on the GPU as on the CPU (and under ASan, any access
// to a guard is reported on the spot; compute-sanitizer does that for device memory only at the
// allocation's ends).
class BackendBuffer {
 public:
  static constexpr size_t kGuard = 256;
  static constexpr uint8_t kGuardByte = 0x5C;

  BackendBuffer(Backend& b, size_t bytes);
  ~BackendBuffer();
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  void* data() const { return base_ == nullptr ? nullptr : static_cast<char*>(base_) + kGuard; }
  size_t bytes() const { return bytes_; }
  void upload(const void* src);
  void download(void* dst) const;
  bool guards_intact() const;

 private:
  void set_guards(bool on) const noexcept;

  Backend& b_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

// A HostTensor's contents on a backend: the same descriptor (shape, strides, dtype) pointing at
// backend memory, uploaded on construction. download_into() brings the bytes back into a host
// tensor of the same geometry; download() returns them.
class BackendTensor {
 public:
  BackendTensor(Backend& b, const HostTensor& host);
  const fva_tensor_t* t() const { return &desc_; }
  void download_into(HostTensor& host) const;
  std::vector<uint8_t> download() const;
  bool guards_intact() const { return buf_.guards_intact(); }

 private:
  BackendBuffer buf_;
  fva_tensor_t desc_;
};

}  // namespace fvt
