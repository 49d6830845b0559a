// The backward of the VSA layer's coarse attention (SPEC 3b), rounded where FastVideo's torch
// autograd rounds (every tensor it materializes is in the dtype; products and reductions accumulate
// in fp32):
//   dattn = dtype(dout_c v_cᵀ);  dscores = dtype(attn ⊙ (dattn - rowsum(attn ⊙ dattn)));
//   dmm = dtype(dscores * scale);  dq_c = dtype(dmm k_c);
//   dv_c = dtype(attnᵀ dout_c),  dk_c = dtype(dmmᵀ q_c), each summed over the kv head's q heads (GQA)
//   in fp32 before its one rounding.
// The products run on tensor cores (vsa_layer/coarse_tiles.cuh), fp32 accumulation.
// What they write is the block means' backward of those: each block's term dtype(dx_c / size) (-0
// for a block of size 0, which passes the fine gradient unchanged), which the fine branch's
// backward adds to every row of the block as it writes dq, dk and dv (kern::BlockTerms).
// Two launches of 512-thread blocks: the q side (a block per (b, q head, 16 q blocks): dattn, the
// softmax's backward into dmm (shared memory while the tile's rows fit, then the workspace), dq_c,
// with v_c and k_c staged a chunk at a time), then the kv side (a block per (b, kv head, 16 kv
// blocks), the q blocks' rows staged a chunk at a time). Both first check the
// reserve's record and do nothing when it is not this call's (the outputs stay untouched).
// Both run beside the kernel before them in the call's chain until they need its output: what the
// forward left in the reserve (the coarse weights, block means) and the block sizes start on their
// way first, then they wait for the earlier kernels (the gate pass's dout_c, the q side's dmm).
#include "shared/layer_coarse_plan.h"
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
  __shared__ __align__(16) uint16_t a[TileSmem<D>::kRowElems];
  __shared__ int row_tokens[kRows];  // the tile's q blocks' sizes, for their terms
  static_assert(sizeof(a) + sizeof(row_tokens) <= kern::layer_coarse_static_bytes(D),
                "the host plans the q sides' static shared memory as the forward's");
  // Dynamic: the stage [stage_rows][D + 8], then the tile's rows when p.rows_in_smem (TileRows).
  extern __shared__ __align__(16) uint16_t dynamic_smem[];
  uint16_t* const stage = dynamic_smem;
  const int stage_rows = p.stage_rows;
  const CoarseQTile tile(p);
  const int i0 = tile.i0, rows = tile.rows;
  if (rows <= 0) return;
  const int64_t q_row0 = tile.q_row0, kv0 = tile.kv0;
  const int nkv = p.nkv;
  const TileRows dmm(stage + stage_rows * TileSmem<D>::kPitch,
                     static_cast<uint16_t*>(p.dmm) + q_row0 * nkv, nkv, p.rows_in_smem != 0);
  dmm.zero_padding(rows);
  const uint16_t* attn = static_cast<const uint16_t*>(p.attn) + q_row0 * nkv;
  const uint16_t* k_c = static_cast<const uint16_t*>(p.k_c) + kv0 * D;
  const uint16_t* v_c = static_cast<const uint16_t*>(p.v_c) + kv0 * D;
  // Before the wait: the first chunk of v_c, the tile's weights into L1 (the softmax's backward
  // reads them twice, a warp per row) and the tile's sizes (the forward's, or the call's inputs).
  issue_first_chunk<D>(v_c, nkv, stage, stage_rows);
  for (int64_t at = 64 * threadIdx.x; at < static_cast<int64_t>(rows) * nkv; at += 64 * kThreads)
    prefetch_l1(attn + at);  // a 128-byte line each
  load_tile_tokens(row_tokens, p.q_sizes, p.q_sizes_stride, i0, rows);
  wait_for_prior_kernels();  // dout_c is the gate pass's
  // Only now may the kv side launch: the fine backward's first gradient kernel, which launches once
  // every block of the kv side runs, runs beside both coarse kernels and reads Delta, which the gate
  // pass writes (kern::BlockTerms::written_beside).
  allow_next_kernel();
  // The tile's dout_c rows, the second copy in flight.
  copy_rows_async<D>(static_cast<const uint16_t*>(p.dout_c) + q_row0 * D, rows, 0, kRows, a);
  cp_async_commit();
  rows_dot_matrix<T, D>(a, rows, v_c, nkv, stage, stage_rows,
                        [&](int r, int j, float s) { dmm.row(r)[j] = Elem<T>::bits(s); });
  // k_c's first chunk flies during the softmax's backward, a warp per row: rowsum(attn ⊙ dattn),
  // then dmm over dattn.
  issue_first_chunk<D>(k_c, nkv, stage, stage_rows);
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
  rows_times_matrix<T, D>(dmm, rows, k_c, nkv, stage, stage_rows,
                          [&](int r, int d, float o) {
                            dq_term[r * D + d] = Elem<T>::bits(mean_term<T>(o, row_tokens[r]));
                          });
}

// Where column jj of a window row ii sits: a window row is 32 bytes, two 16-byte halves, and rows
// with bit 2 of ii set keep their halves swapped, so that the eight rows one ldmatrix reads of
// one half fall in distinct banks (unswapped, rows ii and ii + 4 share theirs).
__device__ __forceinline__ int window_slot(int ii, int jj) {
  return ii * kRows + (jj ^ (((ii >> 2) & 1) << 3));
}

// The terms of dv_c and dk_c of 16 kv blocks (one m16 row block of attnᵀ and dmmᵀ): for each q
// head of the group, a chunk of p.kv_chunk_rows q blocks at a time, the chunk's rows of dout_c and
// q_c (cp.async) and the window of attn and dmm at the block's 16 kv columns are staged, then warp
// w < D / 8 adds its n8 block of columns 8w .. 8w + 7 of both sums with two MMAs per k16 step,
// their operands by three ldmatrix.trans: attnᵀ's and dmmᵀ's A fragments from the windows
// ([q block][kv block], k-major), dout_c's and q_c's B fragments from the staged rows.
// Dynamic shared memory: dout_c's rows, q_c's rows ([kv_chunk_rows][D + 8] each), then the attn and
// dmm windows ([kv_chunk_rows][16] each, window_slot).
template <typename T, int D>
__device__ __forceinline__ void coarse_backward_kv(const kern::LayerCoarseBackwardParams& p) {
  if (!reserve_matches(p.check)) return;
  constexpr int kP = TileSmem<D>::kPitch;
  __shared__ int col_tokens[kRows];  // the block's kv blocks' sizes, for their terms
  static_assert(sizeof(col_tokens) == kern::layer_coarse_kv_static_bytes(),
                "the host's plan of the kv side's shared memory (shared/layer_coarse_plan.h)");
  extern __shared__ __align__(16) uint16_t dynamic_smem[];
  const int chunk = p.kv_chunk_rows;  // a multiple of 16
  uint16_t* const xo = dynamic_smem;       // dout_c rows
  uint16_t* const xq = xo + chunk * kP;    // q_c rows
  uint16_t* const wa = xq + chunk * kP;    // attn window, [q block][kv block]
  uint16_t* const wd = wa + chunk * kRows;  // dmm window
  const int bhk = blockIdx.y;
  const int b = bhk / p.Hkv, hk = bhk % p.Hkv;
  const int group = p.Hq / p.Hkv;
  const int j0 = blockIdx.x * kRows;
  const int cols = min(kRows, p.nkv - j0);
  if (cols <= 0) return;
  const int nq = p.nq, nkv = p.nkv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const bool owns = warp < D / 8;
  const uint16_t* attn = static_cast<const uint16_t*>(p.attn);
  const uint16_t* dmm = static_cast<const uint16_t*>(p.dmm);
  // Where the block's 16 columns all exist and every row of attn and dmm starts 16-byte aligned
  // (nkv a multiple of 8), the windows come by cp.async with the rows; else element by element.
  const bool windows_by_copy = cols == kRows && nkv % 8 == 0 &&
                               ((reinterpret_cast<uintptr_t>(attn) | reinterpret_cast<uintptr_t>(dmm)) & 15) == 0;
  load_tile_tokens(col_tokens, p.kv_sizes, p.kv_sizes_stride, j0, cols);
  // ldmatrix lanes, matrix l / 8, its row l % 8. A (x4.trans of a window): matrix q holds k rows
  // 8 (q / 2) .. + 7 at kv columns 8 (q % 2) .. + 7, so that the fragment is attnᵀ's a0 .. a3.
  // B (x4.trans of the staged rows): matrices 0, 1 are dout_c's k rows 0 .. 7 and 8 .. 15 at the
  // warp's 8 columns, 2 and 3 the same of q_c's: dv's b0, b1, then dk's.
  const int mq = lane >> 3, mr = lane & 7;
  const uint32_t a_lane_attn = smem_address(wa + window_slot(8 * (mq >> 1) + mr, 8 * (mq & 1)));
  const uint32_t a_lane_dmm = smem_address(wd + window_slot(8 * (mq >> 1) + mr, 8 * (mq & 1)));
  const uint32_t b_lane = smem_address((mq < 2 ? xo : xq) + (8 * (mq & 1) + mr) * kP + 8 * warp);
  float acc_v[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc_k[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // A chunk's operands, issued (cp.async, uncommitted) in two parts: what the forward left in the
  // reserve (q_c's rows, attn's window) and what the earlier kernels of this call write (dout_c's
  // rows, dmm's window). Windows that do not come by cp.async come element by element, both
  // matrices after the wait.
  auto copy_window = [&](const uint16_t* m, uint16_t* window, int64_t q_row0, int i0, int count) {
    for (int w = threadIdx.x; w < count * 2; w += kThreads) {  // a window row: two 16-byte words
      const int ii = w >> 1, half = w & 1;
      const bool in = i0 + ii < nq;
      const int64_t at = (q_row0 + i0 + (in ? ii : 0)) * nkv + j0 + 8 * half;
      cp_async_16(smem_address(window + window_slot(ii, 8 * half)), m + at, in);
    }
  };
  auto issue_forward_part = [&](int64_t q_row0, int i0, int count) {
    copy_rows_async<D>(static_cast<const uint16_t*>(p.q_c) + q_row0 * D, nq, i0, count, xq);
    if (windows_by_copy) copy_window(attn, wa, q_row0, i0, count);
  };
  auto issue_gradient_part = [&](int64_t q_row0, int i0, int count) {
    copy_rows_async<D>(static_cast<const uint16_t*>(p.dout_c) + q_row0 * D, nq, i0, count, xo);
    if (windows_by_copy) copy_window(dmm, wd, q_row0, i0, count);
  };
  const int64_t first_row0 = (static_cast<int64_t>(b) * p.Hq + hk * group) * nq;
  issue_forward_part(first_row0, 0, round16(min(chunk, nq)));
  wait_for_prior_kernels();  // dout_c is the gate pass's, dmm the q side's
  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const int64_t q_row0 = (static_cast<int64_t>(b) * p.Hq + hq) * nq;
    for (int i0 = 0; i0 < nq; i0 += chunk) {
      const int count = round16(min(chunk, nq - i0));
      if (q_row0 != first_row0 || i0 > 0) {
        __syncthreads();  // the previous chunk is consumed
        issue_forward_part(q_row0, i0, count);
      }
      issue_gradient_part(q_row0, i0, count);
      cp_async_commit();
      if (!windows_by_copy) {
#pragma unroll 4
        for (int e = threadIdx.x; e < count * kRows; e += kThreads) {
          const int ii = e / kRows, jj = e % kRows;
          const bool in = i0 + ii < nq && jj < cols;
          const int64_t at = (q_row0 + i0 + ii) * nkv + j0 + jj;
          wa[window_slot(ii, jj)] = in ? attn[at] : uint16_t{0};
          wd[window_slot(ii, jj)] = in ? dmm[at] : uint16_t{0};
        }
      }
      cp_async_wait<0>();
      __syncthreads();
      if (!owns) continue;
      for (int k0 = 0; k0 < count; k0 += 16) {
        // A = a window transposed (row m = kv block, column k = q block); B = the staged rows
        // (k = q block, n = column). A k16 step moves 16 window rows (the swizzle repeats every
        // 8) and 16 staged rows.
        uint32_t fa[4], fd[4], fb[4];
        ldmatrix_x4_trans(fa, a_lane_attn + 2 * k0 * kRows);
        ldmatrix_x4_trans(fd, a_lane_dmm + 2 * k0 * kRows);
        ldmatrix_x4_trans(fb, b_lane + 2 * k0 * kP);
        mma_16816<T>(acc_v, fa, fb[0], fb[1]);
        mma_16816<T>(acc_k, fd, fb[2], fb[3]);
      }
    }
  }
  if (!owns) return;
  const int64_t kv0 = (static_cast<int64_t>(b) * p.Hkv + hk) * nkv + j0;
  uint16_t* dv_term = static_cast<uint16_t*>(p.dv_term) + kv0 * D;
  uint16_t* dk_term = static_cast<uint16_t*>(p.dk_term) + kv0 * D;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int jj = g + 8 * (e >> 1), d = 8 * warp + 2 * t + (e & 1);
    if (jj < cols) {
      dv_term[jj * D + d] = Elem<T>::bits(mean_term<T>(acc_v[e], col_tokens[jj]));
      dk_term[jj * D + d] = Elem<T>::bits(mean_term<T>(acc_k[e], col_tokens[jj]));
    }
  }
}

}  // namespace
}  // namespace fva::dev::layer

#define FVA_LAYER_COARSE_BACKWARD(dtype, T, D)                                                 \
  extern "C" __global__ void __launch_bounds__(fva::kern::kLayerCoarseThreads, 2)              \
      fva_layer_coarse_bwd_q_##dtype##_d##D(const fva::kern::LayerCoarseBackwardParams p) {   \
    /* waits inside once the reserve's operands are on their way, then lets the next */        \
    /* kernel launch; waits on every path before it exits (primitives/kernel_chain.cuh) */     \
    fva::dev::layer::coarse_backward_q<T, D>(p);                                               \
    fva::dev::wait_for_prior_kernels();                                                        \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(fva::kern::kLayerCoarseThreads, 2)              \
      fva_layer_coarse_bwd_kv_##dtype##_d##D(const fva::kern::LayerCoarseBackwardParams p) {  \
    fva::dev::run_beside_prior_kernels([&] { fva::dev::layer::coarse_backward_kv<T, D>(p); }); \
  }
FVA_LAYER_COARSE_BACKWARD(bf16, fva::dev::Bf16, 64)
FVA_LAYER_COARSE_BACKWARD(bf16, fva::dev::Bf16, 128)
FVA_LAYER_COARSE_BACKWARD(f16, fva::dev::F16, 64)
FVA_LAYER_COARSE_BACKWARD(f16, fva::dev::F16, 128)
#undef FVA_LAYER_COARSE_BACKWARD
