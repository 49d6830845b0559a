// The CUDA context a call launches in, checked against the caller's stream before any work: a call
// launches in the calling thread's current context (the device's primary one when the thread has
// none, kernel_images.h ensure_context), so a stream of another context (another device's, or a
// context the caller created with cuCtxCreate) would make the launches fail halfway, or run against
// memory of the wrong context. Two driver queries per call, no synchronization.
#pragma once

#include "driver.h"

namespace fva::cuda {

// Fails with FVA_ERR_INVALID_ARGUMENT, leaving every output untouched, when the calling thread's
// current context (made the primary one of `device` when there is none) is not on `device`, or when
// `stream` belongs to another context than that one. NULL, CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD are the current context's by definition. FVA_ERR_CUDA when the driver cannot
// answer (e.g. a device error from earlier work on the context).
void check_launch_context(const DeviceInfo& device, void* stream);

}  // namespace fva::cuda
