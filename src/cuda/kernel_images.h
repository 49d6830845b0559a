// The kernel images embedded in libfvattn.so and the kernels in them, loaded lazily through the
// driver: per family (qat, vsa, prep, layer) one fatbin with SASS for every architecture of the build
// (FVATTN_SASS_ARCHS) and PTX for compute_80, from which the driver takes the SASS that fits the
// device or JITs the PTX; and a PTX-only fatbin for handles that ask for the JIT (ptx_jit). The sm90
// family has SASS for sm_90a alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/image_choice.h"
#include "core/options.h"
#include "driver.h"

namespace fva::cuda {

// The image a device runs and why (core/image_choice.h over what this build embeds): "sm_86",
// "sm_90a", "sm_100f", "compute_80" (the PTX, JIT), or "none" (FVA_ERR_UNSUPPORTED on every op).
ImageChoice image_for(int sm_major, int sm_minor, bool ptx_jit);

// True when libfvattn.so was built with kernel images (FVATTN_CUDA=ON).
bool images_built();

// A kernel ready to launch on `device` (its dynamic shared memory limit raised to smem_bytes).
// Throws fva::Failure (FVA_ERR_CUDA / FVA_ERR_UNSUPPORTED) when it cannot be had.
CUkernel kernel(const char* family, const char* name, const DeviceInfo& device, size_t smem_bytes);

// Makes the device's primary context current on the calling thread when the thread has none (the
// context the CUDA runtime, PyTorch and JAX use), so launches work from any thread.
void ensure_context(const DeviceInfo& device);

struct Launch {
  unsigned grid_x = 1, grid_y = 1, grid_z = 1;
  unsigned block = 128;
  size_t smem = 0;
  unsigned cluster_x = 1;  // > 1: thread-block clusters of that many blocks along x (cuLaunchKernelEx)
};

// Whether the driver can launch clusters and say how many fit (cuLaunchKernelEx,
// cuOccupancyMaxActiveClusters: CUDA 12.0 and later).
bool cluster_launch_available();

// How many clusters of dims.cluster_x blocks of the kernel, with dims' threads and shared memory,
// the device runs at once (cuOccupancyMaxActiveClusters, in the context of `stream`), or 0 when
// the driver cannot say (then not cached). Cached per kernel, device and shape. A device whose SMs are spread over
// its GPCs unevenly may leave SMs idle under clusters: the caller compares.
int max_active_clusters(const char* family, const char* name, const DeviceInfo& device,
                        const Launch& dims, void* stream);

// Whether a handle with `options` on `device` chains the kernels of its calls (below): the option
// allows it, the device is sm_90 or later and the driver is CUDA 12.3 or later (stream capture of
// such launches).
bool chained_launches_supported(const DeviceInfo& device, const TuningOptions& options);

// The kernels of one fvattn call as a chain of programmatic dependent launches (PDL): while a
// LaunchChain lives on the calling thread, launch() gives every kernel after the chain's first the
// driver's programmatic-stream-serialization attribute, so that kernel's blocks may become resident
// while the kernel before it runs its last wave, and wait there (kernels/primitives/kernel_chain.cuh:
// every kernel fvattn ships waits for its predecessor before touching memory). The first kernel
// waits for whatever the stream held before the call, as always. Each op of the CUDA backend opens
// one chain before its first launch; where chained_launches_supported says no, every launch is
// ordered by the stream alone. A chain opened while another is open on the thread (an op that runs
// another op's launches inside its own: the VSA layer runs the fine branch's) joins it: the outer
// chain's kernels and the inner op's form one chain, which the outer chain closes.
class LaunchChain {
 public:
  LaunchChain(const DeviceInfo& device, const TuningOptions& options);
  ~LaunchChain();
  LaunchChain(const LaunchChain&) = delete;
  LaunchChain& operator=(const LaunchChain&) = delete;

 private:
  bool opened_ = false;  // this object opened the thread's chain (false: it joined an open one)
};

// cuMemsetD32Async of `words` 32-bit words at `address` on `stream`; `what` names the buffer in the
// error. Within a LaunchChain the next kernel then waits as the stream orders it (a programmatic
// launch follows kernels only).
void memset_words(void* address, uint32_t value, size_t words, void* stream, const char* what);

// Launches `kernel` with one by-value parameter block on `stream` (asynchronous; no sync), chained
// to the kernel before it when a LaunchChain is open.
void launch(CUkernel kernel, const Launch& dims, void* stream, const void* params,
            const char* name);

template <typename Params>
void launch(const char* family, const char* name, const DeviceInfo& device, const Launch& dims,
            void* stream, const Params& params) {
  launch(kernel(family, name, device, dims.smem), dims, stream, &params, name);
}

}  // namespace fva::cuda
