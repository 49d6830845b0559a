// The device probes' timing (wgmma_probe.cu, pv_width_probe.cu): `launch(iters)` once with a few
// iterations to warm up, then `reps` timed launches (CUDA events around each); the best time in
// milliseconds, or a negative value after a launch error (printed).
#pragma once

#include <cstdio>
#include <cuda_runtime.h>

template <typename Launch>
float best_launch_ms(Launch&& launch, int warm_iters, int iters, int reps = 5) {
  launch(warm_iters);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e30f;
  for (int rep = 0; rep < reps; ++rep) {
    cudaEventRecord(e0);
    launch(iters);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (ms < best) best = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    printf("error %s\n", cudaGetErrorString(err));
    return -1.0f;
  }
  return best;
}
