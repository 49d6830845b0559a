// Lets one header serve nvcc (device and host code) and a plain C++ compiler (the CPU backend).
#pragma once

#if defined(__CUDACC__)
#define FVA_HD __host__ __device__ __forceinline__
#else
#define FVA_HD inline
#endif
