// The VSA layer's coarse attention and selection (SPEC 3b steps 2-3) in one launch, a block of 512
// threads per (b, q head, tile of 16 q blocks), with no host round trip and no sort (the products
// on tensor cores, k_c and v_c staged a chunk at a time, vsa_layer/coarse_tiles.cuh):
//   1. scores[i][j] = dtype(dtype(q_c[i]·k_c[j]) * scale) for the tile's rows and every kv block,
//      into the tile's rows (shared memory while they fit, else the reserve's attn rows);
//   2. a warp per row: softmax over the kv blocks of nonzero size (fp32, rounded to the dtype) over
//      the scores, and the topk kv blocks of highest score (ties: the lower index) as an ascending
//      list, by a two-pass radix select on the scores' 16 bits (the k-th largest key, then the ties
//      it needs in index order) and a ballot scan that writes the list in order; the weights then go
//      to the reserve's attn rows;
//   3. out_c[i] = dtype(attn[i]·v_c), in a launch of its own (coarse_output), after v's block means,
//      which run beside steps 1-2.
// kv blocks of size 0 take no part: weight 0, never selected; a row lists min(topk, the blocks of
// nonzero size) blocks, then -1 (the CPU backend's lists, src/cpu/vsa_layer_forward.cpp).
#include "shared/layer_coarse_plan.h"
#include "vsa_layer/coarse_tiles.cuh"

namespace fva::dev::layer {
namespace {

// The order key of a 16-bit score (bf16 or f16 bits) among the kv blocks that take part: unsigned
// order is the values' order with -0 equal to +0, and a NaN (key 1) ranks after every number, as
// the CPU backend ranks them. Key 0: a kv block of size 0, which is never picked.
template <typename T>
__device__ __forceinline__ uint32_t score_key(uint16_t bits) {
  if ((bits & 0x7fffu) > Elem<T>::kInfBits) return 1u;  // NaN
  if (bits == 0x8000u) bits = 0;
  return (bits & 0x8000u) ? (~bits & 0xffffu) : (bits | 0x8000u);  // >= 0x007f (-inf) for bf16
}

// In hist[256] (a warp's), the largest bin b whose count with the bins above it reaches `need`
// (>= 1, at most the total): returns b and sets *above to the count of the bins above b.
__device__ __forceinline__ int find_bin(const int* hist, int need, int* above) {
  const int lane = threadIdx.x & 31;
  int mine = 0;  // bins 8 * lane .. 8 * lane + 7
#pragma unroll
  for (int i = 0; i < 8; ++i) mine += hist[8 * lane + i];
  int suffix = mine;  // over lanes >= this one
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int up = __shfl_down_sync(0xffffffffu, suffix, o);
    if (lane + o < 32) suffix += up;
  }
  const int beyond = suffix - mine;  // over lanes > this one
  const unsigned owner = __ballot_sync(0xffffffffu, suffix >= need && beyond < need);
  const int src = __ffs(owner) - 1;  // exactly one lane
  int bin = 0, count_above = 0;
  if (lane == src) {
    int acc = beyond;
    bin = 8 * lane;
    for (int i = 7; i >= 0; --i) {
      const int c = hist[8 * lane + i];
      if (acc + c >= need) {
        bin = 8 * lane + i;
        break;
      }
      acc += c;
    }
    count_above = acc;
  }
  *above = __shfl_sync(0xffffffffu, count_above, src);
  return __shfl_sync(0xffffffffu, bin, src);
}

// Where row i of (b, h) lists its kv blocks: the reserve's list and, when given, the caller's copy.
struct RowLists {
  int32_t* list;
  int32_t* user;
  int64_t list_row;
  __device__ __forceinline__ RowLists(const kern::LayerCoarseForwardParams& p, int b, int h, int i)
      : list_row((static_cast<int64_t>(b) * p.Hq + h) * p.nq + i) {
    list = p.q2k_idx + list_row * p.topk;
    user = p.user_idx != nullptr
               ? p.user_idx + b * p.user_idx_stride_b + h * p.user_idx_stride_h + i * p.user_idx_stride_qb
               : nullptr;
  }
  // The 32 kv blocks j0 + lane (keys `key`, 0 past nkv): those above the threshold and, in index
  // order, as many of those equal to it as the ties still need, into the list in index order.
  // taken and ties_seen count over the warp's earlier calls.
  __device__ __forceinline__ void pick(int j0, uint32_t key, uint32_t threshold, int ties_needed,
                                       int k, int& taken, int& ties_seen) const {
    const int lane = threadIdx.x & 31;
    const unsigned lt = (1u << lane) - 1u;
    const bool gt = key > threshold, eq = key == threshold;
    const unsigned eq_mask = __ballot_sync(0xffffffffu, eq);
    const bool take = gt || (eq && ties_seen + __popc(eq_mask & lt) < ties_needed);
    const unsigned take_mask = __ballot_sync(0xffffffffu, take);
    if (take) {
      const int at = taken + __popc(take_mask & lt);
      if (at < k) {
        list[at] = j0 + lane;
        if (user != nullptr) user[at] = j0 + lane;
      }
    }
    ties_seen += __popc(eq_mask);
    taken += __popc(take_mask);
  }
  // The list's unused slots (-1) and its count.
  __device__ __forceinline__ void finish(const kern::LayerCoarseForwardParams& p, int b, int h, int i,
                                         int k) const {
    const int lane = threadIdx.x & 31;
    for (int t = k + lane; t < p.topk; t += 32) {
      list[t] = -1;
      if (user != nullptr) user[t] = -1;
    }
    if (lane == 0) {
      p.q2k_num[list_row] = k;
      if (p.user_num != nullptr)
        p.user_num[b * p.user_num_stride_b + h * p.user_num_stride_h + i * p.user_num_stride_qb] = k;
    }
  }
};

// The rows of at most kShortRowBlocks kv blocks (the lane's kv blocks lane + 32 n, n < 8) keep their
// keys and exponentials in registers (softmax_and_select_short).
constexpr int kShortRowSlots = 8;
constexpr int kShortRowBlocks = 32 * kShortRowSlots;

// softmax_and_select for a row of at most kShortRowBlocks kv blocks: the same results, with each
// lane's keys and exponentials in registers. The k-th largest key comes bit by bit from the top
// (the largest t with at least k keys >= t: 16 warp-wide counts), not from histograms, whose
// shared-memory atomics serialize on a row's few distinct high bytes (its scores share their
// exponents); the softmax's exponentials are computed once, for its sum, and the weights reuse
// them.
template <typename T>
__device__ __forceinline__ void softmax_and_select_short(const kern::LayerCoarseForwardParams& p,
                                                         int b, int h, int i, uint16_t* row) {
  const int lane = threadIdx.x & 31;
  const int nkv = p.nkv;
  uint32_t key[kShortRowSlots];  // 0: past nkv, or a kv block of size 0
  uint32_t taking = 0;           // bit n: the lane's n-th kv block takes part
  float mx = -__builtin_huge_valf();
#pragma unroll
  for (int n = 0; n < kShortRowSlots; ++n) {
    const int j = lane + 32 * n;
    key[n] = 0u;
    if (j < nkv && block_tokens(p.kv_sizes, p.kv_sizes_stride, j) > 0) {
      const uint16_t s = row[j];
      key[n] = score_key<T>(s);
      mx = fmaxf(mx, Elem<T>::value(s));  // NaN scores are passed over
      taking |= 1u << n;
    }
  }
  const int taking_part = __reduce_add_sync(0xffffffffu, __popc(taking));
  mx = warp_max(mx);
  const int k = min(p.topk, taking_part);
  // The k-th largest key (>= 1 for k > 0: no block of size 0 is picked), and how many are above it.
  uint32_t threshold = 0x10000u;
  int above = 0;
  if (k > 0) {  // k is the warp's: every lane takes the branch
    uint32_t t = 0;
    for (int bit = 15; bit >= 0; --bit) {
      const uint32_t candidate = t | (1u << bit);
      int count = 0;
#pragma unroll
      for (int n = 0; n < kShortRowSlots; ++n) count += key[n] >= candidate ? 1 : 0;
      if (__reduce_add_sync(0xffffffffu, count) >= k) t = candidate;
    }
    threshold = t;
#pragma unroll
    for (int n = 0; n < kShortRowSlots; ++n) above += key[n] > t ? 1 : 0;
    above = __reduce_add_sync(0xffffffffu, above);
  }
  // The softmax's sum (each lane in index order, then the butterfly), its exponentials kept (the
  // keys are read again from the scores below: both in registers would spill).
  float e[kShortRowSlots];
  float sum = 0.0f;
#pragma unroll
  for (int n = 0; n < kShortRowSlots; ++n) {
    const bool part = (taking >> n) & 1u;
    e[n] = part ? expf(Elem<T>::value(row[lane + 32 * n]) - mx) : 0.0f;
    if (part) sum += e[n];
  }
  sum = warp_sum(sum);
  // The weights over the scores, and the list in index order.
  const RowLists lists(p, b, h, i);
  int taken = 0, ties_seen = 0;
#pragma unroll
  for (int n = 0; n < kShortRowSlots; ++n) {
    const int j0 = 32 * n;
    if (j0 >= nkv) break;  // the warp's: every lane breaks
    const bool part = (taking >> n) & 1u;
    uint32_t key_n = 0;
    if (part) {
      key_n = score_key<T>(row[j0 + lane]);
      row[j0 + lane] = Elem<T>::bits(e[n] / sum);
    } else if (j0 + lane < nkv) {
      row[j0 + lane] = Elem<T>::bits(0.0f);
    }
    lists.pick(j0, key_n, threshold, k - above, k, taken, ties_seen);
  }
  lists.finish(p, b, h, i, k);
}

// Row i of (b, h): softmax over the scores in `row` (overwritten by the weights) and the selection,
// by one warp. The kv blocks that take part are those of nonzero size; the list holds
// min(topk, their count) of them, ascending, then -1 up to topk, and q2k_num that count.
template <typename T>
__device__ __forceinline__ void softmax_and_select(const kern::LayerCoarseForwardParams& p, int b,
                                                   int h, int i, uint16_t* row, int* hist) {
  const int lane = threadIdx.x & 31;
  const int nkv = p.nkv;
  auto valid = [&](int j) { return block_tokens(p.kv_sizes, p.kv_sizes_stride, j) > 0; };
  // Pass 1 reads the blocks' sizes; the passes after it take their answers from these bits (bit n:
  // the lane's n-th kv block, lane + 32 n, for the first 32 of them), and read again past those.
  uint32_t valid_bits = 0;
  auto valid_at = [&](int n, int j) { return n < 32 ? ((valid_bits >> n) & 1u) != 0 : valid(j); };
  // Pass 1: the largest score, the blocks that take part, and the keys' high bytes counted. The
  // warp's previous row read hist last (find_bin); its lanes finish those reads before any clears.
  __syncwarp();
  for (int e = lane; e < 256; e += 32) hist[e] = 0;
  __syncwarp();
  float mx = -__builtin_huge_valf();
  int taking_part = 0;
  for (int n = 0, j = lane; j < nkv; ++n, j += 32) {
    const uint16_t s = row[j];
    const bool ok = valid(j);
    if (ok && n < 32) valid_bits |= 1u << n;
    if (ok) {
      mx = fmaxf(mx, Elem<T>::value(s));  // NaN scores are passed over
      ++taking_part;
    }
    atomicAdd(&hist[(ok ? score_key<T>(s) : 0u) >> 8], 1);
  }
  __syncwarp();
  mx = warp_max(mx);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) taking_part += __shfl_xor_sync(0xffffffffu, taking_part, o);
  const int k = min(p.topk, taking_part);
  int above_hi = 0, above_lo = 0, key_hi = 0, key_lo = 0;
  if (k > 0) key_hi = find_bin(hist, k, &above_hi);  // k is the warp's: every lane takes the branch
  __syncwarp();
  // Pass 2: the low bytes of the keys in that bin.
  for (int e = lane; e < 256; e += 32) hist[e] = 0;
  __syncwarp();
  for (int n = 0, j = lane; j < nkv; ++n, j += 32) {
    const uint32_t key = valid_at(n, j) ? score_key<T>(row[j]) : 0u;
    if (static_cast<int>(key >> 8) == key_hi) atomicAdd(&hist[key & 0xffu], 1);
  }
  __syncwarp();
  if (k > 0) key_lo = find_bin(hist, k - above_hi, &above_lo);
  // k > 0: the threshold is the k-th largest key, >= 1, so no block of size 0 is picked.
  const uint32_t threshold = k > 0 ? static_cast<uint32_t>(key_hi << 8 | key_lo) : 0x10000u;
  const int ties_needed = k - above_hi - above_lo;  // keys equal to the threshold, lowest index first
  // Pass 3: the softmax's sum (each lane in index order, then the butterfly).
  float sum = 0.0f;
  for (int n = 0, j = lane; j < nkv; ++n, j += 32)
    if (valid_at(n, j)) sum += expf(Elem<T>::value(row[j]) - mx);
  sum = warp_sum(sum);
  // Pass 4: the weights over the scores, and the list in index order.
  const RowLists lists(p, b, h, i);
  int taken = 0, ties_seen = 0;
  for (int j0 = 0; j0 < nkv; j0 += 32) {
    const int j = j0 + lane;
    uint32_t key = 0;  // past nkv: never picked
    if (j < nkv) {
      const uint16_t s = row[j];
      const bool ok = valid_at(j0 / 32, j);
      key = ok ? score_key<T>(s) : 0u;
      row[j] = Elem<T>::bits(ok ? expf(Elem<T>::value(s) - mx) / sum : 0.0f);
    }
    lists.pick(j0, key, threshold, ties_needed, k, taken, ties_seen);
  }
  lists.finish(p, b, h, i, k);
}

template <typename T, int D>
__device__ __forceinline__ void coarse_forward(const kern::LayerCoarseForwardParams& p) {
  __shared__ __align__(16) uint16_t a[TileSmem<D>::kRowElems];
  __shared__ int hist[kWarps * 256];  // a histogram per warp
  static_assert(sizeof(a) + sizeof(hist) == kern::layer_coarse_static_bytes(D),
                "the host's plan of the coarse kernels' shared memory (shared/layer_coarse_plan.h)");
  // Dynamic: the stage [stage_rows][D + 8], then the tile's rows when p.rows_in_smem (TileRows).
  extern __shared__ __align__(16) uint16_t dynamic_smem[];
  uint16_t* const stage = dynamic_smem;
  const int stage_rows = p.stage_rows;
  const CoarseQTile tile(p);
  const int rows = tile.rows;
  if (rows <= 0) return;
  const int nkv = p.nkv;
  const int64_t q_row0 = tile.q_row0, kv0 = tile.kv0;
  const TileRows attn(stage + stage_rows * TileSmem<D>::kPitch,
                      static_cast<uint16_t*>(p.attn) + q_row0 * nkv, nkv, p.rows_in_smem != 0);
  attn.zero_padding(rows);
  const uint16_t* k_c = static_cast<const uint16_t*>(p.k_c) + kv0 * D;
  // The tile's q_c rows and the first chunk of k_c, one copy in flight.
  copy_rows_async<D>(static_cast<const uint16_t*>(p.q_c) + q_row0 * D, rows, 0, kRows, a);
  issue_first_chunk<D>(k_c, nkv, stage, stage_rows);
  const float scale = p.scale;
  rows_dot_matrix<T, D>(a, rows, k_c, nkv, stage, stage_rows,
                        [&](int r, int j, float s) { attn.row(r)[j] = Elem<T>::bits(rnd<T>(s) * scale); });
  const int warp = threadIdx.x >> 5;
  if (warp < rows) {
    if (nkv <= kShortRowBlocks) {
      softmax_and_select_short<T>(p, tile.b, tile.h, tile.i0 + warp, attn.row(warp));
    } else {
      softmax_and_select<T>(p, tile.b, tile.h, tile.i0 + warp, attn.row(warp),
                            hist + 256 * warp);
    }
  }
  __syncthreads();
  attn.copy_home(rows);
}

// Step 3, out_c = dtype(attn·v_c), a block of 512 threads per (b, q head, tile of 16 q blocks) as
// in coarse_forward, after it: v's block means run beside coarse_forward (v_c is first read here),
// so that their pass over v overlaps the coarse attention instead of preceding it. The tile's
// weights come from the reserve's attn rows (into shared memory where the plan keeps rows there).
template <typename T, int D>
__device__ __forceinline__ void coarse_output(const kern::LayerCoarseForwardParams& p) {
  extern __shared__ __align__(16) uint16_t dynamic_smem[];
  uint16_t* const stage = dynamic_smem;
  const int stage_rows = p.stage_rows;
  const CoarseQTile tile(p);
  const int rows = tile.rows;
  if (rows <= 0) return;
  const int nkv = p.nkv;
  const int64_t q_row0 = tile.q_row0, kv0 = tile.kv0;
  const TileRows attn(stage + stage_rows * TileSmem<D>::kPitch,
                      static_cast<uint16_t*>(p.attn) + q_row0 * nkv, nkv, p.rows_in_smem != 0);
  const uint16_t* v_c = static_cast<const uint16_t*>(p.v_c) + kv0 * D;
  issue_first_chunk<D>(v_c, nkv, stage, stage_rows);
  attn.copy_from_home(rows);  // the weights into their rows (where the plan keeps them there)
  attn.zero_padding(rows);
  __syncthreads();
  uint16_t* out_c = static_cast<uint16_t*>(p.out_c) + q_row0 * D;
  rows_times_matrix<T, D>(attn, rows, v_c, nkv, stage, stage_rows,
                          [&](int r, int d, float o) { out_c[r * D + d] = Elem<T>::bits(o); });
}

}  // namespace
}  // namespace fva::dev::layer

#define FVA_LAYER_COARSE_FORWARD(dtype, T, D)                                             \
  extern "C" __global__ void __launch_bounds__(fva::kern::kLayerCoarseThreads, 2)         \
      fva_layer_coarse_fwd_##dtype##_d##D(const fva::kern::LayerCoarseForwardParams p) { \
    fva::dev::enter_kernel_chain(); /* primitives/kernel_chain.cuh */                     \
    fva::dev::layer::coarse_forward<T, D>(p);                                             \
  }                                                                                       \
  extern "C" __global__ void __launch_bounds__(fva::kern::kLayerCoarseThreads, 2)         \
      fva_layer_coarse_out_##dtype##_d##D(const fva::kern::LayerCoarseForwardParams p) { \
    /* Waits, then lets the fine forward launch: it runs beside this kernel on the lists */ \
    /* and means complete by then (kern::Sm90FusedLayerGate::out_c_beside). */           \
    fva::dev::wait_for_prior_kernels();                                                   \
    fva::dev::allow_next_kernel();                                                        \
    fva::dev::layer::coarse_output<T, D>(p);                                              \
  }
FVA_LAYER_COARSE_FORWARD(bf16, fva::dev::Bf16, 64)
FVA_LAYER_COARSE_FORWARD(bf16, fva::dev::Bf16, 128)
FVA_LAYER_COARSE_FORWARD(f16, fva::dev::F16, 64)
FVA_LAYER_COARSE_FORWARD(f16, fva::dev::F16, 128)
#undef FVA_LAYER_COARSE_FORWARD
