// The backward of the VSA layer's coarse attention (SPEC 3b), rounded where FastVideo's torch
// autograd rounds (every tensor it materializes is in the dtype; products and reductions accumulate
// in fp32):
//   dattn = dtype(dout_c v_cᵀ);  dscores = dtype(attn ⊙ (dattn - rowsum(attn ⊙ dattn)));
//   dmm = dtype(dscores * scale);  dq_c = dtype(dmm k_c);
//   dv_c = dtype(attnᵀ dout_c),  dk_c = dtype(dmmᵀ q_c), each summed over the kv head's q heads (GQA)
//   in fp32 before its one rounding.
// What they write is the block means' backward of those: each block's term dtype(dx_c / size) (-0
// for a block of size 0, which passes the fine gradient unchanged), which the fine branch's
// backward adds to every row of the block as it writes dq, dk and dv (kern::BlockTerms).
// Two launches of 512-thread blocks: the q side (a block per (b, q head, 16 q blocks): dattn, the
// softmax's backward into dmm (shared memory while the tile's rows fit, then the workspace), dq_c),
// then the kv side (a block per (b, kv head, 16 kv blocks)). Both first check the
// reserve's record and do nothing when it is not this call's (the outputs stay untouched).
#include "vsa_layer/coarse_tiles.cuh"

namespace fva::dev::layer {
namespace {

// The block mean's backward of a coarse gradient g (fp32, before its rounding to the dtype) for a
// block of n real tokens: dtype(dtype(g) / n), the reciprocal as block_means.cu takes it; -0 for n
// = 0, which leaves any fine gradient it is added to as it is.
template <typename T>
__device__ __forceinline__ float mean_term(float g, int n) {
  return n > 0 ? rnd<T>(rnd<T>(g) * (1.0f / static_cast<float>(n))) : -0.0f;
}

template <typename T, int D>
__device__ __forceinline__ void coarse_backward_q(const kern::LayerCoarseBackwardParams& p) {
  if (!reserve_matches(p.check)) return;  // every warp of the block decides alike
  __shared__ __align__(16) float a[kRows * D];
  __shared__ __align__(16) float work[TileSmem<D>::kWorkFloats];
  extern __shared__ __align__(16) uint16_t tile_rows[];  // [16][nkv] when p.rows_in_smem
  const int bh = blockIdx.y;
  const int b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
  const int i0 = blockIdx.x * kRows;
  const int rows = min(kRows, p.nq - i0);
  if (rows <= 0) return;
  const int64_t q_row0 = static_cast<int64_t>(bh) * p.nq + i0;
  const int64_t kv0 = (static_cast<int64_t>(b) * p.Hkv + hk) * p.nkv;
  const int nkv = p.nkv;
  const TileRows dmm(tile_rows, static_cast<uint16_t*>(p.dmm) + q_row0 * nkv, nkv, p.rows_in_smem != 0);
  const uint16_t* attn = static_cast<const uint16_t*>(p.attn) + q_row0 * nkv;
  load_rows<T, D>(static_cast<const uint16_t*>(p.dout_c) + q_row0 * D, rows, a);
  rows_dot_matrix<T, D>(a, rows, static_cast<const uint16_t*>(p.v_c) + kv0 * D, nkv, work,
                        [&](int r, int j, float s) { dmm.row(r)[j] = Elem<T>::bits(s); });
  // The softmax's backward, a warp per row: rowsum(attn ⊙ dattn), then dmm over dattn.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = p.scale;
  if (warp < rows) {
    const uint16_t* ar = attn + static_cast<int64_t>(warp) * nkv;
    uint16_t* dr = dmm.row(warp);
    float dot = 0.0f;
    for (int j = lane; j < nkv; j += 32) dot = step(dot, Elem<T>::value(ar[j]), Elem<T>::value(dr[j]));
    dot = warp_sum(dot);
    for (int j = lane; j < nkv; j += 32) {
      const float at = Elem<T>::value(ar[j]);
      const float ds = rnd<T>(at * (Elem<T>::value(dr[j]) - dot));
      dr[j] = Elem<T>::bits(ds * scale);
    }
  }
  __syncthreads();
  dmm.copy_home(rows);  // the kv side reads dmm from the workspace
  uint16_t* dq_term = static_cast<uint16_t*>(p.dq_term) + q_row0 * D;
  rows_times_matrix<T, D>(dmm.base, nkv, rows, static_cast<const uint16_t*>(p.k_c) + kv0 * D, nkv, work,
                          [&](int r, int d, float o) {
                            const int n = block_tokens(p.q_sizes, p.q_sizes_stride, i0 + r);
                            dq_term[r * D + d] = Elem<T>::bits(mean_term<T>(o, n));
                          });
}

// The terms of dv_c and dk_c of 16 kv blocks: for each q head of the group and each tile of 32 q
// blocks, the weights attn and dmm of the tile's [32 x 16] window and the rows of dout_c and q_c,
// then thread t adds column t % D of its 16 D / 512 kv blocks' sums, (q head, q block) ascending.
template <typename T, int D>
__device__ __forceinline__ void coarse_backward_kv(const kern::LayerCoarseBackwardParams& p) {
  if (!reserve_matches(p.check)) return;
  constexpr int kGroups = kThreads / D;
  constexpr int kPerThread = kRows / kGroups;
  __shared__ float xo[kSumTile * D];  // dout_c rows
  __shared__ float xq[kSumTile * D];  // q_c rows
  __shared__ __align__(16) float wa[kSumTile * kRows];  // attn window, [q block][kv block]
  __shared__ __align__(16) float wd[kSumTile * kRows];  // dmm window
  const int bhk = blockIdx.y;
  const int b = bhk / p.Hkv, hk = bhk % p.Hkv;
  const int group = p.Hq / p.Hkv;
  const int j0 = blockIdx.x * kRows;
  const int cols = min(kRows, p.nkv - j0);
  if (cols <= 0) return;
  const int nq = p.nq, nkv = p.nkv;
  const int d = threadIdx.x % D, g = threadIdx.x / D;
  float acc_v[kPerThread], acc_k[kPerThread];
#pragma unroll
  for (int m = 0; m < kPerThread; ++m) acc_v[m] = acc_k[m] = 0.0f;
  // The (q head, tile of 32 q blocks) steps in order; the next step's loads are issued before this
  // step's FMAs, so their latency hides under them.
  constexpr int kXLoads = kSumTile * D / 2 / kThreads;  // 32-bit words of dout_c (and of q_c)
  constexpr int kWLoads = kSumTile * kRows / kThreads;  // weights of attn (and of dmm)
  static_assert(kXLoads * kThreads == kSumTile * D / 2 && kWLoads * kThreads == kSumTile * kRows,
                "whole tiles per thread");
  const int tiles_per_head = (nq + kSumTile - 1) / kSumTile;
  const int steps = group * tiles_per_head;
  uint32_t next_o[kXLoads], next_q[kXLoads];
  uint16_t next_a[kWLoads], next_d[kWLoads];
  auto fetch = [&](int step_index) {
    const int hq = hk * group + step_index / tiles_per_head;
    const int i0 = (step_index % tiles_per_head) * kSumTile;
    const int64_t q_row0 = (static_cast<int64_t>(b) * p.Hq + hq) * nq;
    const uint32_t* dout_c = static_cast<const uint32_t*>(p.dout_c) + q_row0 * (D / 2);
    const uint32_t* q_c = static_cast<const uint32_t*>(p.q_c) + q_row0 * (D / 2);
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int e = threadIdx.x + i * kThreads, ii = e / (D / 2), c = e % (D / 2);
      const bool in = i0 + ii < nq;
      const int64_t at = static_cast<int64_t>(i0 + ii) * (D / 2) + c;
      next_o[i] = in ? dout_c[at] : 0u;
      next_q[i] = in ? q_c[at] : 0u;
    }
    const uint16_t* attn = static_cast<const uint16_t*>(p.attn) + q_row0 * nkv + j0;
    const uint16_t* dmm = static_cast<const uint16_t*>(p.dmm) + q_row0 * nkv + j0;
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {
      const int e = threadIdx.x + i * kThreads, ii = e / kRows, jj = e % kRows;
      const bool in = i0 + ii < nq && jj < cols;
      const int64_t at = static_cast<int64_t>(i0 + ii) * nkv + jj;
      next_a[i] = in ? attn[at] : uint16_t{0};
      next_d[i] = in ? dmm[at] : uint16_t{0};
    }
  };
  fetch(0);
  for (int st = 0; st < steps; ++st) {
    const int i0 = (st % tiles_per_head) * kSumTile;
    __syncthreads();  // the previous step's tile is consumed
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int e = threadIdx.x + i * kThreads, ii = e / (D / 2), c = e % (D / 2);
      xo[ii * D + 2 * c] = lo<T>(next_o[i]);
      xo[ii * D + 2 * c + 1] = hi<T>(next_o[i]);
      xq[ii * D + 2 * c] = lo<T>(next_q[i]);
      xq[ii * D + 2 * c + 1] = hi<T>(next_q[i]);
    }
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {
      const int e = threadIdx.x + i * kThreads;
      wa[e] = Elem<T>::value(next_a[i]);  // 0 bits (+0) outside the window
      wd[e] = Elem<T>::value(next_d[i]);
    }
    __syncthreads();
    if (st + 1 < steps) fetch(st + 1);
    const int count = min(kSumTile, nq - i0);
    for (int ii = 0; ii < count; ++ii) {
      const float o = xo[ii * D + d], q = xq[ii * D + d];
      const float* ra = wa + ii * kRows + g * kPerThread;  // broadcast within the warp
      const float* rd = wd + ii * kRows + g * kPerThread;
#pragma unroll
      for (int m = 0; m < kPerThread; ++m) {
        acc_v[m] = step(acc_v[m], ra[m], o);
        acc_k[m] = step(acc_k[m], rd[m], q);
      }
    }
  }
  const int64_t kv0 = (static_cast<int64_t>(b) * p.Hkv + hk) * nkv + j0;
  uint16_t* dv_term = static_cast<uint16_t*>(p.dv_term) + kv0 * D;
  uint16_t* dk_term = static_cast<uint16_t*>(p.dk_term) + kv0 * D;
#pragma unroll
  for (int m = 0; m < kPerThread; ++m) {
    const int jj = g * kPerThread + m;
    if (jj < cols) {
      const int n = block_tokens(p.kv_sizes, p.kv_sizes_stride, j0 + jj);
      dv_term[jj * D + d] = Elem<T>::bits(mean_term<T>(acc_v[m], n));
      dk_term[jj * D + d] = Elem<T>::bits(mean_term<T>(acc_k[m], n));
    }
  }
}

}  // namespace
}  // namespace fva::dev::layer

#define FVA_LAYER_COARSE_BACKWARD(dtype, T, D)                                                 \
  extern "C" __global__ void __launch_bounds__(fva::kern::kLayerCoarseThreads, 2)              \
      fva_layer_coarse_bwd_q_##dtype##_d##D(const fva::kern::LayerCoarseBackwardParams p) {   \
    fva::dev::enter_kernel_chain(); /* primitives/kernel_chain.cuh */                          \
    fva::dev::layer::coarse_backward_q<T, D>(p);                                               \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(fva::kern::kLayerCoarseThreads, 2)              \
      fva_layer_coarse_bwd_kv_##dtype##_d##D(const fva::kern::LayerCoarseBackwardParams p) {  \
    fva::dev::enter_kernel_chain(); /* primitives/kernel_chain.cuh */                          \
    fva::dev::layer::coarse_backward_kv<T, D>(p);                                              \
  }
FVA_LAYER_COARSE_BACKWARD(bf16, fva::dev::Bf16, 64)
FVA_LAYER_COARSE_BACKWARD(bf16, fva::dev::Bf16, 128)
FVA_LAYER_COARSE_BACKWARD(f16, fva::dev::F16, 64)
FVA_LAYER_COARSE_BACKWARD(f16, fva::dev::F16, 128)
#undef FVA_LAYER_COARSE_BACKWARD
