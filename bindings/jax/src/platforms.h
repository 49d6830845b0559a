// The two platforms each handler is registered for: "cpu" (the library's CPU backend, host
// workspace) and "CUDA" (the GPU backend on XLA's stream, workspace from XLA's scratch allocator).
#pragma once

#include <cstring>
#include <memory>
#include <utility>

#include "ffi_support.h"

namespace fvattn_jax {

// Runs body(exec) on the CPU backend; workspace is host memory held for the duration of the call.
template <typename Body>
ffi::Error on_cpu(Body&& body) {
  ffi::Error err = ffi::Error::Success();
  Exec ex;
  ex.handle = cpu_handle(&err);
  if (!err.success()) return err;
  std::unique_ptr<char[]> buffer;
  ex.workspace = [&buffer](size_t bytes) -> void* {
    constexpr size_t kAlign = 256;  // the library needs 16; 256 matches the GPU side
    buffer.reset(new (std::nothrow) char[bytes + kAlign]);
    if (!buffer) return nullptr;
    const auto p = reinterpret_cast<uintptr_t>(buffer.get());
    return buffer.get() + ((kAlign - p % kAlign) % kAlign);
  };
  ex.copy = [](void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
    return true;
  };
  return body(ex);
}

// Device-to-device copy on `stream` through the CUDA driver's cuMemcpyAsync (opened with dlopen:
// the driver is already loaded in any process XLA runs CUDA in, and nothing here links CUDA).
bool cuda_copy_async(void* dst, const void* src, size_t bytes, void* stream);

// Stream-ordered device memory (cuMemAllocAsync / cuMemFreeAsync through the driver): valid for the
// work queued on `stream` between the two calls, and legal inside CUDA-graph capture.
void* cuda_alloc_async(size_t bytes, void* stream);
void cuda_free_async(void* p, void* stream);

// Runs body(exec) on the CUDA device XLA runs this computation on, on XLA's stream, with workspace
// from XLA's scratch allocator (released when the handler returns; XLA orders that after the
// stream's work, like any of its temporary buffers).
template <typename Body>
ffi::Error on_cuda(void* stream, ffi::ScratchAllocator& scratch, int32_t device, Body&& body) {
  ffi::Error err = ffi::Error::Success();
  Exec ex;
  ex.handle = cuda_handle(device, &err);
  if (!err.success()) return err;
  ex.stream = stream;
  // XLA's scratch allocator first; where it has none to give (seen on an H200 with jax 0.7: every
  // request refused), stream-ordered driver memory, freed on the same stream once the op's work is
  // queued.
  void* owned = nullptr;
  ex.workspace = [&scratch, &owned, stream](size_t bytes) -> void* {
    // 64: XLA's FFI allocator refuses alignments above its allocator's (64 bytes); the library
    // needs 16.
    auto p = scratch.Allocate(bytes, 64);
    if (p.has_value() && *p != nullptr) return *p;
    owned = cuda_alloc_async(bytes, stream);
    return owned;
  };
  ex.copy = [stream](void* dst, const void* src, size_t bytes) {
    return cuda_copy_async(dst, src, bytes, stream);
  };
  ffi::Error result = body(ex);
  cuda_free_async(owned, stream);
  return result;
}

// The binding's context part per platform; the op's own binding (arguments, attributes, results)
// follows it.
inline auto cpu_binding() { return ffi::Ffi::Bind(); }
inline auto cuda_binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<void*>>()
      .Ctx<ffi::ScratchAllocator>()
      .Ctx<ffi::DeviceOrdinal>();
}

}  // namespace fvattn_jax

// Defines the exported handler symbols <Name>Cpu and <Name>Cuda for an op: `impl` is
// ffi::Error impl(const Exec&, <the op's bound parameters>...), `bind` adds the op's arguments,
// attributes and results to a binding. The library is built with hidden visibility, so the two
// symbols Python looks up are declared exported first.
#define FVATTN_JAX_EXPORT extern "C" __attribute__((visibility("default")))
#define FVATTN_JAX_HANDLERS(Name, impl, bind)                                                  \
  FVATTN_JAX_EXPORT XLA_FFI_Error* Name##Cpu(XLA_FFI_CallFrame*);                              \
  FVATTN_JAX_EXPORT XLA_FFI_Error* Name##Cuda(XLA_FFI_CallFrame*);                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                               \
      Name##Cpu,                                                                               \
      [](auto... a) {                                                                          \
        return ::fvattn_jax::on_cpu([&](const ::fvattn_jax::Exec& ex) { return impl(ex, a...); }); \
      },                                                                                       \
      bind(::fvattn_jax::cpu_binding()));                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                               \
      Name##Cuda,                                                                              \
      [](void* stream, ::xla::ffi::ScratchAllocator scratch, int32_t device, auto... a) {      \
        return ::fvattn_jax::on_cuda(stream, scratch, device,                                  \
                                     [&](const ::fvattn_jax::Exec& ex) { return impl(ex, a...); }); \
      },                                                                                       \
      bind(::fvattn_jax::cuda_binding()))
