// The CUDA backend's environment switches, read at every call that they govern (so that a process
// may compare settings without restarting), and refused when malformed rather than ignored.
#pragma once

#include <cstdint>

namespace fva::cuda {

// The environment variable `name` as a whole number, or `fallback` when it is unset or empty;
// anything but a number from 0 to `max` is FVA_ERR_INVALID_ARGUMENT ("name='value': expected ...").
int64_t env_whole_number(const char* name, int64_t fallback, int64_t max, const char* expected);

// An on/off switch that is on by default: unset, empty, "auto" or "1" is on, "0" off, anything
// else FVA_ERR_INVALID_ARGUMENT.
bool env_switch_on(const char* name);

}  // namespace fva::cuda
