// Inversion of VSA's q2k lists on the GPU, deterministic without a host round trip:
//   1. zero the per-(unit, kv block) counts;                       (unit = (b, q head))
//   2. count the usable entries of every list (atomics on counts: the totals do not depend on order);
//   3. exclusive prefix sums per unit -> offsets, and a fill cursor;
//   4. scatter each entry, encoded as qb << slot_bits | slot (its q block and its place in that q
//      block's list), to its kv block's segment of a scratch copy (atomic cursor: any order);
//   5. sort each segment into place ascending, one warp per segment (every element's rank counted
//      against the whole segment), which makes the result independent of the scatter's order.
// Sorted by the encoding, a segment lists its q blocks ascending, duplicates kept (one term per
// listed entry, like the CPU reference), each beside the list slot where the sm_90 backward stores
// the pair's dS tile. fva_vsa_invert_indices additionally runs
//   6. emit: each segment's q blocks without duplicates into k2q_idx (padded with -1) and k2q_num.
// The backward also orders its dK/dV blocks by their lists' lengths (fva_vsa_invert_order).
#include "common/kernel_chain.cuh"
#include "common/kernel_params.h"
#include "vsa/vsa_schedules.cuh"

namespace {

using fva::kern::InvertParams;

__device__ __forceinline__ int64_t units(const InvertParams& p) {
  return static_cast<int64_t>(p.B) * p.H;
}

}  // namespace

extern "C" __global__ void fva_vsa_invert_zero(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  const int64_t n = units(p) * p.lists.num_kv_blocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p.counts[i] = 0;
}

// One thread per (unit, q block, list slot).
__device__ __forceinline__ bool entry_at(const InvertParams& p, int64_t i, int64_t& unit, int& qb,
                                         int& kv, int& slot) {
  const fva::kern::VsaLists& v = p.lists;
  const int64_t per_unit = static_cast<int64_t>(v.num_q_blocks) * v.max_k;
  if (i >= units(p) * per_unit) return false;
  unit = i / per_unit;
  qb = static_cast<int>((i % per_unit) / v.max_k);
  slot = static_cast<int>(i % v.max_k);
  const int b = static_cast<int>(unit / p.H), h = static_cast<int>(unit % p.H);
  const int n = v.q2k_num[b * v.num_stride_b + h * v.num_stride_h + qb * v.num_stride_qb];
  if (slot >= min(max(n, 0), v.max_k)) return false;
  kv = v.q2k_idx[b * v.idx_stride_b + h * v.idx_stride_h + qb * v.idx_stride_qb + slot];
  if (kv < 0 || kv >= v.num_kv_blocks) return false;
  if (p.skip_empty_blocks && fva::dev::vsa_block_tokens(v, kv) == 0) return false;
  return true;
}

extern "C" __global__ void fva_vsa_invert_count(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  int64_t unit;
  int qb, kv, slot;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (entry_at(p, i, unit, qb, kv, slot)) atomicAdd(&p.counts[unit * p.lists.num_kv_blocks + kv], 1);
}

// One warp per unit: an exclusive scan of the unit's kv-block counts, 32 at a time (a running
// total carried between chunks). (A thread per unit scanned serially: 21 us for 8 units of 256
// kv blocks on the H200, with 2% of the GPU busy.)
extern "C" __global__ void fva_vsa_invert_scan(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  const int64_t unit = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (unit >= units(p)) return;
  const int nkv = p.lists.num_kv_blocks;
  const int32_t* c = p.counts + unit * nkv;
  int32_t* off = p.offsets + unit * (nkv + 1);
  int32_t* cur = p.cursor + unit * nkv;
  int32_t base = 0;  // the sum of the chunks before this one
  for (int k0 = 0; k0 < nkv; k0 += 32) {
    const int kv = k0 + lane;
    const int32_t count = kv < nkv ? c[kv] : 0;
    int32_t inclusive = count;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    if (kv < nkv) off[kv] = cur[kv] = base + inclusive - count;
    base += __shfl_sync(0xffffffffu, inclusive, 31);
  }
  if (lane == 0) off[nkv] = base;
}

extern "C" __global__ void fva_vsa_invert_fill(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  int64_t unit;
  int qb, kv, slot;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (!entry_at(p, i, unit, qb, kv, slot)) return;
  const int64_t per_unit = static_cast<int64_t>(p.lists.num_q_blocks) * p.lists.max_k;
  const int pos = atomicAdd(&p.cursor[unit * p.lists.num_kv_blocks + kv], 1);
  // Below 2^31: qb << slot_bits < 2 num_q_blocks max_k <= 2^31 (require_index_size).
  p.scattered[unit * per_unit + pos] = qb << p.lists.slot_bits | slot;
}

// One warp per (unit, kv block): an element's place in the sorted segment is the number of elements
// below it plus the equal ones before it (stable; duplicates keep distinct places). Lanes read the
// same scratch element at each step (a broadcast), and the writes go to the separate sorted copy.
// (This replaced a thread-per-segment insertion sort: 348 us of a 3.5 ms VSA backward on the H200.)
extern "C" __global__ void fva_vsa_invert_sort(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  const int nkv = p.lists.num_kv_blocks;
  const int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= units(p) * nkv) return;
  const int64_t unit = w / nkv;
  const int kv = static_cast<int>(w % nkv);
  const int64_t per_unit = static_cast<int64_t>(p.lists.num_q_blocks) * p.lists.max_k;
  const int32_t* off = p.offsets + unit * (nkv + 1);
  const int64_t base = unit * per_unit + off[kv];
  const int n = off[kv + 1] - off[kv];
  const int32_t* in = p.scattered + base;
  int32_t* out = p.entries + base;
  for (int i = lane; i < n; i += 32) {
    const int32_t x = in[i];
    int rank = 0;
    for (int j = 0; j < n; ++j) {
      const int32_t y = in[j];
      rank += (y < x) || (y == x && j < i);
    }
    out[rank] = x;
  }
}

// The backward's dK/dV block order, one block per (b, kv head) unit: its kv blocks by descending
// work (their inverse lists' lengths, summed over the unit's `group` q heads), ties by index. The
// dK/dV kernels walk a kv block's list in one block and their lists' lengths differ (random 25%
// lists: 64 +- 7 pairs), so launched in index order the last blocks of the grid are as long as
// any and the SMs that finish early idle; launched longest first, the tail is the shortest
// blocks (longest-processing-time-first list scheduling). A block's rank is counted against every
// other (n^2 / blockDim comparisons per thread, from shared memory), so the order is a
// deterministic function of the counts. The host launches it for at most kVsaOrderMaxKvBlocks kv
// blocks (the weights' shared-memory array).
extern "C" __global__ void fva_vsa_invert_order(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  __shared__ int32_t work[fva::kern::kVsaOrderMaxKvBlocks];
  const int nkv = p.lists.num_kv_blocks;
  if (nkv > fva::kern::kVsaOrderMaxKvBlocks) __trap();  // the host's limit, checked
  const int64_t kv_unit = blockIdx.x;
  for (int kv = threadIdx.x; kv < nkv; kv += blockDim.x) {
    int32_t w = 0;
    for (int g = 0; g < p.group; ++g) {
      const int32_t* off = p.offsets + (kv_unit * p.group + g) * (nkv + 1);
      w += off[kv + 1] - off[kv];
    }
    work[kv] = w;
  }
  __syncthreads();
  for (int kv = threadIdx.x; kv < nkv; kv += blockDim.x) {
    const int32_t w = work[kv];
    int rank = 0;
    for (int j = 0; j < nkv; ++j) {
      const int32_t x = work[j];
      rank += (x > w) || (x == w && j < kv);
    }
    p.kv_order[kv_unit * nkv + rank] = kv;
  }
}

extern "C" __global__ void fva_vsa_invert_emit(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  const int nkv = p.lists.num_kv_blocks, nqb = p.lists.num_q_blocks;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= units(p) * nkv) return;
  const int64_t unit = i / nkv;
  const int kv = static_cast<int>(i % nkv);
  const int b = static_cast<int>(unit / p.H), h = static_cast<int>(unit % p.H);
  const int64_t per_unit = static_cast<int64_t>(nqb) * p.lists.max_k;
  const int32_t* off = p.offsets + unit * (nkv + 1);
  const int32_t* seg = p.entries + unit * per_unit + off[kv];
  const int n = off[kv + 1] - off[kv];
  int32_t* out = p.k2q_idx + b * p.k2q_stride_b + h * p.k2q_stride_h + kv * p.k2q_stride_kv;
  int written = 0;
  for (int a = 0; a < n; ++a) {
    const int32_t qb = seg[a] >> p.lists.slot_bits;  // the encoding's q block
    if (written == 0 || out[written - 1] != qb) out[written++] = qb;
  }
  for (int a = written; a < nqb; ++a) out[a] = -1;
  p.k2q_num[b * p.k2q_num_stride_b + h * p.k2q_num_stride_h + kv * p.k2q_num_stride_kv] = written;
}
