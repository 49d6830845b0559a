// The VSA layer's block means (SPEC 3b step 1, FastVideo's fused_block_mean): for up to three tensors
// in one launch (the layer's forward runs q's and k's, then v's beside the coarse attention),
// x_c[b, h, i] = dtype(sum of block i's real slots in fp32 * (1 / its size)), 0 for a block
// of size 0 (FastVideo divides with the GPU's fast division, x times the fp32 reciprocal, and the
// CPU backend, src/cpu/vsa_layer_common.h, multiplies alike). A unit of D / 8 threads per (tensor,
// b, h, block), each thread eight columns (one 16-byte word a row, so the unit reads whole rows and
// a warp keeps 8 rows of 2 or 4 units in flight), sums the block's real rows in slot order: the sum
// of a naive loop over the slots. The
// first block also clears the reserve's record (shared/vsa_layer_params.h), which the forward's
// last kernel writes.
#include "vsa_layer/layer_common.cuh"

namespace fva::dev::layer {
namespace {

constexpr int kMeansThreads = 128;

template <typename T, int D>
__device__ __forceinline__ void block_means(const kern::LayerMeansParams& p) {
  constexpr int kThreadsPerUnit = D / 8;
  constexpr int kUnitsPerBlock = kMeansThreads / kThreadsPerUnit;
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.record_magic != nullptr) *p.record_magic = 0u;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kUnitsPerBlock + threadIdx.x / kThreadsPerUnit;
  if (unit >= p.units) return;
  int j = 0;
#pragma unroll
  for (int i = 1; i < kern::kLayerMeansJobs; ++i)
    if (i < p.num_jobs && unit >= p.job[i].first_unit) j = i;
  const kern::LayerMeansJob& job = p.job[j];
  const int64_t local = unit - job.first_unit;
  const int block = static_cast<int>(local % job.nblocks);
  const int64_t bh = local / job.nblocks;
  const int b = static_cast<int>(bh / job.H), h = static_cast<int>(bh % job.H);
  const int n = block_tokens(job.sizes, job.sizes_stride, block);
  const int c = threadIdx.x % kThreadsPerUnit;  // columns 8c .. 8c + 7
  const uint16_t* x = row_of(job.x, b, h, static_cast<int64_t>(block) * 64) + 8 * c;
  float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  constexpr int kBatch = 8;  // rows whose loads are in flight together
  for (int r0 = 0; r0 < n; r0 += kBatch) {
    uint4 w[kBatch];
#pragma unroll
    for (int r = 0; r < kBatch; ++r)
      w[r] = r0 + r < n ? *reinterpret_cast<const uint4*>(x + (r0 + r) * job.x.stride_s)
                        : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      if (r0 + r < n) {
        float f[8];
        unpack8<T>(w[r], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) s[e] += f[e];
      }
    }
  }
  const float inv = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;  // IEEE division: the exact reciprocal
#pragma unroll
  for (int e = 0; e < 8; ++e) s[e] *= inv;
  uint4* out = static_cast<uint4*>(job.out) + ((bh * job.nblocks + block) * D) / 8 + c;
  *out = pack8<T>(s);
}

}  // namespace
}  // namespace fva::dev::layer

// fva_layer_means_beside_*: the same pass beside the kernel before it (v's means, beside the coarse
// attention, which does not touch v_c; it reads the call's inputs only).
#define FVA_LAYER_MEANS(dtype, T, D)                                                       \
  extern "C" __global__ void __launch_bounds__(128)                                        \
      fva_layer_means_##dtype##_d##D(const fva::kern::LayerMeansParams p) {                \
    fva::dev::enter_kernel_chain(); /* primitives/kernel_chain.cuh */                      \
    fva::dev::layer::block_means<T, D>(p);                                                 \
  }                                                                                        \
  extern "C" __global__ void __launch_bounds__(128)                                        \
      fva_layer_means_beside_##dtype##_d##D(const fva::kern::LayerMeansParams p) {         \
    fva::dev::run_beside_prior_kernels([&] { fva::dev::layer::block_means<T, D>(p); });    \
  }
FVA_LAYER_MEANS(bf16, fva::dev::Bf16, 64)
FVA_LAYER_MEANS(bf16, fva::dev::Bf16, 128)
FVA_LAYER_MEANS(f16, fva::dev::F16, 64)
FVA_LAYER_MEANS(f16, fva::dev::F16, 128)
#undef FVA_LAYER_MEANS
