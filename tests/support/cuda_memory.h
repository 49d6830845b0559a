// Device memory for tests that run on the CUDA backend: the few CUDA driver calls they need (alloc,
// free, copies, synchronize), bound at run time with dlopen like the library itself does, so the
// test binaries build and run without a CUDA toolkit and need no CUDA runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fvt::cuda {

// Loads libcuda.so.1, initializes it and makes the primary context of device `ordinal` current on
// the calling thread. Returns false with *why on failure. Thread-safe; the first call decides.
bool init_memory(int ordinal, std::string* why);

// Each throws std::runtime_error naming the driver call on failure. Pointers are device addresses.
void* alloc(size_t bytes);
void release(void* p) noexcept;
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Waits for all work on the device's primary context (the legacy default stream included).
void synchronize();

}  // namespace fvt::cuda
