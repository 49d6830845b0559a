// The VSA layer's block means (SPEC 3b step 1, FastVideo's fused_block_mean): for q, k and v in one
// launch, x_c[b, h, i] = dtype(sum of block i's real slots in fp32 * (1 / its size)), 0 for a block
// of size 0 (FastVideo divides with the GPU's fast division, x times the fp32 reciprocal, and the
// CPU backend, src/cpu/vsa_layer_common.h, multiplies alike).
// A unit of work is one 64-token block of one (tensor, b, h), and a block of 128 threads takes the
// units in order (q's, then k's, then v's), a grid's width apart: the grid holds a few blocks per SM
// (the plan's), so the units finish roughly in order and the coarse forward, which waits on each
// job's count of finished units (LayerMeansParams::done), starts on q's and k's means while v's
// are still being read. A unit's real rows come into shared memory by cp.async (the next unit's
// copy in flight while this one is summed), then thread t sums column t over the rows in slot
// order: the sum of a naive loop over the slots. The first block also clears the reserve's record
// (shared/vsa_layer_params.h), which the forward's last kernel writes.
#include "vsa_layer/layer_common.cuh"

namespace fva::dev::layer {
namespace {

constexpr int kMeansThreads = 128;
static_assert(kMeansThreads >= 128, "a thread per column up to D = 128");

// Where unit u's rows are: its job, (b, h), block and real-token count.
struct MeansUnit {
  int job, b, h, block, n;
  int64_t bh;
};
__device__ __forceinline__ MeansUnit locate_unit(const kern::LayerMeansParams& p, int64_t unit) {
  int j = 0;
#pragma unroll
  for (int i = 1; i < kern::kLayerMeansJobs; ++i)
    if (i < p.num_jobs && unit >= p.job[i].first_unit) j = i;
  const kern::LayerMeansJob& job = p.job[j];
  const int64_t local = unit - job.first_unit;
  MeansUnit u;
  u.job = j;
  u.block = static_cast<int>(local % job.nblocks);
  u.bh = local / job.nblocks;
  u.b = static_cast<int>(u.bh / job.H);
  u.h = static_cast<int>(u.bh % job.H);
  u.n = block_tokens(job.sizes, job.sizes_stride, u.block);
  return u;
}

// Issues and commits the copy of unit's real rows into dst ([64][D], rows past the real ones left
// as they are: never read); past the last unit, an empty group, so that every iteration commits one.
template <int D>
__device__ __forceinline__ void copy_unit_rows(const kern::LayerMeansParams& p, int64_t unit, uint16_t* dst) {
  if (unit < p.units) {
    const MeansUnit u = locate_unit(p, unit);
    const kern::LayerMeansJob& job = p.job[u.job];
    const uint16_t* x = row_of(job.x, u.b, u.h, static_cast<int64_t>(u.block) * 64);
    constexpr int kWords = D / 8;  // 16-byte words of a row
    for (int w = threadIdx.x; w < u.n * kWords; w += kMeansThreads) {
      const int r = w / kWords, c = w % kWords;
      cp_async_16(smem_address(dst + r * D + 8 * c), x + r * job.x.stride_s + 8 * c, true);
    }
  }
  cp_async_commit();
}

template <typename T, int D>
__device__ __forceinline__ void block_means(const kern::LayerMeansParams& p) {
  __shared__ __align__(16) uint16_t rows[2][64 * D];
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.record_magic != nullptr) *p.record_magic = 0u;
  const int64_t step = gridDim.x;
  int64_t unit = blockIdx.x;
  copy_unit_rows<D>(p, unit, rows[0]);
  for (int buf = 0; unit < p.units; unit += step, buf ^= 1) {
    // The next unit's copy goes into the other buffer, consumed before the last iteration's end.
    copy_unit_rows<D>(p, unit + step, rows[buf ^ 1]);
    cp_async_wait<1>();
    __syncthreads();
    const MeansUnit u = locate_unit(p, unit);
    const int t = threadIdx.x;
    if (t < D) {
      const uint16_t* col = rows[buf] + t;
      float s = 0.0f;
#pragma unroll 8
      for (int r = 0; r < u.n; ++r) s += Elem<T>::value(col[r * D]);
      const float inv = u.n > 0 ? 1.0f / static_cast<float>(u.n) : 0.0f;  // IEEE division: the exact reciprocal
      const kern::LayerMeansJob& job = p.job[u.job];
      static_cast<uint16_t*>(job.out)[(u.bh * job.nblocks + u.block) * D + t] = Elem<T>::bits(s * inv);
    }
    // Also the end of this buffer's reads, before the next iteration copies into it.
    if (p.done != nullptr) count_finished_unit(p.done + u.job);
    else __syncthreads();
  }
  cp_async_wait<0>();
}

}  // namespace
}  // namespace fva::dev::layer

#define FVA_LAYER_MEANS(dtype, T, D)                                                       \
  extern "C" __global__ void __launch_bounds__(128)                                        \
      fva_layer_means_##dtype##_d##D(const fva::kern::LayerMeansParams p) {                \
    fva::dev::enter_kernel_chain(); /* primitives/kernel_chain.cuh */                      \
    fva::dev::layer::block_means<T, D>(p);                                                 \
  }
FVA_LAYER_MEANS(bf16, fva::dev::Bf16, 64)
FVA_LAYER_MEANS(bf16, fva::dev::Bf16, 128)
FVA_LAYER_MEANS(f16, fva::dev::F16, 64)
FVA_LAYER_MEANS(f16, fva::dev::F16, 128)
#undef FVA_LAYER_MEANS
