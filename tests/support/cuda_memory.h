// Device memory for tests that run on the CUDA backend: the few CUDA driver calls they need (alloc,
// free, fill, copies, synchronize), bound at run time with dlopen like the library itself does, so the
// test binaries build and run without a CUDA toolkit and need no CUDA runtime. The GPU tests
// (tests/gpu/, which link cudart for streams and graphs) take their device memory from here too: it
// lives in the device's primary context, the one cudart and the library use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fvt::cuda {

// Loads libcuda.so.1, initializes it and makes the primary context of device `ordinal` current on
// the calling thread. Returns false with *why on failure. Thread-safe; the first call decides.
bool init_memory(int ordinal, std::string* why);

// Each throws std::runtime_error naming the driver call on failure (or init_memory not having
// succeeded). Pointers are device addresses.
void* alloc(size_t bytes);
void release(void* p) noexcept;
// Sets `bytes` bytes at dst to `byte`, on the legacy default stream like cudaMemset: asynchronous
// to the host, ordered before later work on that stream and before the blocking copies below.
void fill(void* dst, uint8_t byte, size_t bytes);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Waits for all work on the device's primary context (the legacy default stream included).
void synchronize();

}  // namespace fvt::cuda
