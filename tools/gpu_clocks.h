// The SM clock and board power while a bench op runs, sampled through NVML (the driver's
// libnvidia-ml.so.1, opened at run time: nothing to link, and a machine without it just reports no
// samples). Why: the H200 caps its power at 700 W, and under a long backward it lowers the SM
// clock from 1980 MHz to 1600-1800 (docs/perf.md), so a figure without its clock does not say
// whether a kernel or the card's power state moved it. Only built when FVATTN_CUDA=ON.
//
// Power is the board's instantaneous reading (the NVML field NVML_FI_DEV_POWER_INSTANT) where the
// driver has it. nvmlDeviceGetPowerUsage, the fallback, returns a trailing one-second average on
// Ampere and later: for an op whose timed calls last a quarter of a second after `--settle`'s idle
// it reports mostly the idle, far below what the op draws. The
// instantaneous field is itself refreshed only about every 100 ms on the H200 (as is the clock):
// an op whose timed calls take less shows the reading from before it.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

namespace fvtool {

// What one sampled interval saw: medians and the lowest clock; NaN when nothing was sampled.
struct ClockStats {
  double sm_mhz_median = NAN, sm_mhz_min = NAN, watts_median = NAN, watts_max = NAN;
  int samples = 0;
  bool instant_power = false;  // watts from NVML_FI_DEV_POWER_INSTANT, else the 1 s average
};

class ClockSampler {
 public:
  // Opens NVML for the CUDA device `device`; valid() says whether sampling works.
  explicit ClockSampler(int device) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    auto sym = [&](const char* name) { return dlsym(lib_, name); };
    init_ = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    shutdown_ = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
    by_bus_ = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
    clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(sym("nvmlDeviceGetClockInfo"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
    fields_ = reinterpret_cast<int (*)(void*, int, FieldValue*)>(sym("nvmlDeviceGetFieldValues"));
    char bus[32] = {0};
    if (!init_ || !shutdown_ || !by_bus_ || !clock_ || !power_ || init_() != 0) return;
    initialized_ = true;
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) return;
    if (by_bus_(bus, &dev_) != 0) dev_ = nullptr;
    unsigned mw = 0;
    instant_ = dev_ != nullptr && instant_power(&mw);
  }
  ~ClockSampler() {
    stop();
    if (initialized_) shutdown_();
    if (lib_ != nullptr) dlclose(lib_);
  }
  ClockSampler(const ClockSampler&) = delete;
  ClockSampler& operator=(const ClockSampler&) = delete;

  bool valid() const { return dev_ != nullptr; }

  // Samples every `period` from now until stop().
  void start(std::chrono::microseconds period = std::chrono::microseconds(2000)) {
    if (!valid() || thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mhz_.clear();
      watts_.clear();
    }
    running_ = true;
    thread_ = std::thread([this, period] {
      while (running_) {
        unsigned mhz = 0, mw = 0;
        const bool ok = clock_(dev_, kNvmlClockSm, &mhz) == 0 &&
                        (instant_ ? instant_power(&mw) : power_(dev_, &mw) == 0);
        if (ok) {
          std::lock_guard<std::mutex> lock(mu_);
          mhz_.push_back(mhz);
          watts_.push_back(mw / 1000.0);
        }
        std::this_thread::sleep_for(period);
      }
    });
  }

  ClockStats stop() {
    if (thread_.joinable()) {
      running_ = false;
      thread_.join();
    }
    std::lock_guard<std::mutex> lock(mu_);
    ClockStats s;
    s.samples = static_cast<int>(mhz_.size());
    if (s.samples == 0) return s;
    s.sm_mhz_median = median(mhz_);
    s.sm_mhz_min = *std::min_element(mhz_.begin(), mhz_.end());
    s.watts_median = median(watts_);
    s.watts_max = *std::max_element(watts_.begin(), watts_.end());
    s.instant_power = instant_;
    return s;
  }

 private:
  static constexpr int kNvmlClockSm = 1;  // NVML_CLOCK_SM
  static constexpr unsigned kFieldPowerInstant = 186;  // NVML_FI_DEV_POWER_INSTANT, in mW
  // nvmlFieldValue_t (nvml.h), whose layout NVML keeps stable: the value is a union of 8 bytes.
  struct FieldValue {
    unsigned field_id, scope_id;
    long long timestamp, latency_us;
    int value_type, result;
    union {
      double d;
      unsigned ui;
      unsigned long long ull;
    } value;
  };
  static_assert(sizeof(FieldValue) == 40, "nvmlFieldValue_t is 40 bytes");
  bool instant_power(unsigned* mw) const {
    if (fields_ == nullptr) return false;
    FieldValue v{};
    v.field_id = kFieldPowerInstant;
    if (fields_(dev_, 1, &v) != 0 || v.result != 0) return false;
    *mw = v.value.ui;
    return true;
  }
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  void* lib_ = nullptr;
  void* dev_ = nullptr;
  bool initialized_ = false;
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  int (*by_bus_)(const char*, void**) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*fields_)(void*, int, FieldValue*) = nullptr;
  bool instant_ = false;  // the instantaneous field answered when the sampler opened
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<double> mhz_, watts_;
};

}  // namespace fvtool
