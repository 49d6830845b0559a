// The CUDA driver, opened at run time with dlopen so libfvattn.so loads (and its CPU backend works)
// on machines without a driver. Only what the library uses is bound; kernels (next release) will add
// module loading and launch entry points here.
#pragma once

#include <string>

namespace fva::cuda {

struct DeviceInfo {
  int ordinal = -1;
  int sm_major = 0;
  int sm_minor = 0;
  int sm_count = 0;
  std::string name;
};

// Loads libcuda.so.1 and runs cuInit once per process (thread-safe). Returns true when the driver is
// usable; otherwise *why says what failed. FVATTN_DISABLE_CUDA=1 in the environment makes it report
// the driver absent, to exercise the no-device path on a GPU machine.
bool driver_available(std::string* why);

// Number of CUDA devices (0 when the driver is unavailable).
int device_count();

// The ordinal to use for `requested` (-1: the device of the calling thread's current context, or 0),
// and its properties. Returns false with *why on failure.
bool query_device(int requested, DeviceInfo* info, std::string* why);

// Driver version as MAJOR*1000 + MINOR*10 (0 when unavailable).
int driver_version();

}  // namespace fva::cuda
