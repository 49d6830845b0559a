// Inversion of VSA's q2k lists on the GPU, deterministic without a host round trip:
//   1. zero the per-(unit, kv block) counts;                       (unit = (b, q head))
//   2. count the usable entries of every list (atomics on counts: the totals do not depend on order);
//   3. exclusive prefix sums per unit -> offsets, and a fill cursor;
//   4. scatter each entry, encoded as qb << slot_bits | slot (its q block and its place in that q
//      block's list), to its kv block's segment of a scratch copy (atomic cursor: any order);
//   5. sort each segment into place ascending, one warp per segment (every element's rank counted
//      against the whole segment), which makes the result independent of the scatter's order.
// Where a unit's kv-block counters fit in shared memory (kern::vsa_invert_unit_smem_bytes),
// fva_vsa_invert_unit runs steps 1-4 for one unit per block instead, in one launch: each of the four
// kernels is a short pass (2-9 us on the H200 at B=1, H=8, S=16384), mostly launch and one memory
// round trip, so one launch of 8 blocks replaces 25 us of them.
// Sorted by the encoding, a segment lists its q blocks ascending, duplicates kept (one term per
// listed entry, like the CPU reference), each beside the list slot where the sm_90 backward stores
// the pair's dS tile. fva_vsa_invert_indices additionally runs
//   6. emit: each segment's q blocks without duplicates into k2q_idx (padded with -1) and k2q_num.
#include "common/kernel_params.h"
#include "vsa/vsa_schedules.cuh"

namespace {

using fva::kern::InvertParams;

__device__ __forceinline__ int64_t units(const InvertParams& p) {
  return static_cast<int64_t>(p.B) * p.H;
}

}  // namespace

extern "C" __global__ void fva_vsa_invert_zero(const InvertParams p) {
  const int64_t n = units(p) * p.lists.num_kv_blocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p.counts[i] = 0;
}

// The list entry (b, h, qb, slot): its kv block, if the entry is usable.
__device__ __forceinline__ bool usable_entry(const InvertParams& p, int b, int h, int qb, int slot,
                                             int& kv) {
  const fva::kern::VsaLists& v = p.lists;
  const int n = v.q2k_num[b * v.num_stride_b + h * v.num_stride_h + qb * v.num_stride_qb];
  if (slot >= min(max(n, 0), v.max_k)) return false;
  kv = v.q2k_idx[b * v.idx_stride_b + h * v.idx_stride_h + qb * v.idx_stride_qb + slot];
  if (kv < 0 || kv >= v.num_kv_blocks) return false;
  if (p.skip_empty_blocks && fva::dev::vsa_block_tokens(v, kv) == 0) return false;
  return true;
}

// One thread per (unit, q block, list slot).
__device__ __forceinline__ bool entry_at(const InvertParams& p, int64_t i, int64_t& unit, int& qb,
                                         int& kv, int& slot) {
  const int64_t per_unit = static_cast<int64_t>(p.lists.num_q_blocks) * p.lists.max_k;
  if (i >= units(p) * per_unit) return false;
  unit = i / per_unit;
  qb = static_cast<int>((i % per_unit) / p.lists.max_k);
  slot = static_cast<int>(i % p.lists.max_k);
  return usable_entry(p, static_cast<int>(unit / p.H), static_cast<int>(unit % p.H), qb, slot, kv);
}

extern "C" __global__ void fva_vsa_invert_count(const InvertParams p) {
  int64_t unit;
  int qb, kv, slot;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (entry_at(p, i, unit, qb, kv, slot)) atomicAdd(&p.counts[unit * p.lists.num_kv_blocks + kv], 1);
}

// One warp: the exclusive scan of one unit's kv-block counts c into its offsets off (nkv + 1) and
// fill cursors cur, 32 at a time (a running total carried between chunks).
__device__ __forceinline__ void scan_unit(const int32_t* c, int nkv, int32_t* off, int32_t* cur,
                                          int lane) {
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

// One warp per unit. (A thread per unit scanned serially: 21 us for 8 units of 256 kv blocks on the
// H200, with 2% of the GPU busy.)
extern "C" __global__ void fva_vsa_invert_scan(const InvertParams p) {
  const int64_t unit = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (unit >= units(p)) return;
  const int nkv = p.lists.num_kv_blocks;
  scan_unit(p.counts + unit * nkv, nkv, p.offsets + unit * (nkv + 1), p.cursor + unit * nkv,
            threadIdx.x & 31);
}

extern "C" __global__ void fva_vsa_invert_fill(const InvertParams p) {
  int64_t unit;
  int qb, kv, slot;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (!entry_at(p, i, unit, qb, kv, slot)) return;
  const int64_t per_unit = static_cast<int64_t>(p.lists.num_q_blocks) * p.lists.max_k;
  const int pos = atomicAdd(&p.cursor[unit * p.lists.num_kv_blocks + kv], 1);
  // Below 2^31: qb << slot_bits < 2 num_q_blocks max_k <= 2^31 (require_index_size).
  p.scattered[unit * per_unit + pos] = qb << p.lists.slot_bits | slot;
}

// The entries [base, base + kBatch blocks) of unit (b, h) (local index e = base + k blockDim +
// thread), each thread's kBatch read before any is used, so their loads overlap: the entry's code
// and kv block, or kv = -1 where the entry is not usable. 32-bit index arithmetic (a unit holds
// fewer than 2^30 entries, require_index_size): entry_at's 64-bit divisions, run by the 8 SMs of
// this kernel at B=1, H=8 instead of the whole GPU, took 62 us on the H200.
template <int kBatch>
__device__ __forceinline__ void unit_entries(const InvertParams& p, int b, int h, int per_unit,
                                             int base, int (&kv)[kBatch],
                                             int32_t (&code)[kBatch]) {
#pragma unroll
  for (int k = 0; k < kBatch; ++k) {
    const int e = base + k * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);
    const int qb = e / p.lists.max_k, slot = e - qb * p.lists.max_k;
    int at = -1;
    if (e < per_unit && usable_entry(p, b, h, qb, slot, at)) {
      kv[k] = at;
      code[k] = qb << p.lists.slot_bits | slot;
    } else {
      kv[k] = -1;
      code[k] = 0;
    }
  }
}

// Steps 1-4 for the unit blockIdx.x: its counts and fill cursors in shared memory (2 nkv ints, see
// the host's kern::vsa_invert_unit_smem_bytes), the offsets and the scattered entries to p as the
// separate kernels write them (the sort that follows cannot tell the two apart).
extern "C" __global__ void __launch_bounds__(1024) fva_vsa_invert_unit(const InvertParams p) {
  extern __shared__ int32_t unit_counters[];
  constexpr int kBatch = 8;
  const int nkv = p.lists.num_kv_blocks;
  int32_t* count = unit_counters;
  int32_t* cur = unit_counters + nkv;
  const int64_t unit = blockIdx.x;
  const int b = static_cast<int>(unit / p.H), h = static_cast<int>(unit % p.H);
  const int per_unit = p.lists.num_q_blocks * p.lists.max_k;  // below 2^30: require_index_size
  const int64_t first = unit * per_unit;
  for (int i = threadIdx.x; i < nkv; i += blockDim.x) count[i] = 0;
  __syncthreads();
  const int step = kBatch * static_cast<int>(blockDim.x);
  for (int base = 0; base < per_unit; base += step) {
    int kv[kBatch];
    int32_t code[kBatch];
    unit_entries(p, b, h, per_unit, base, kv, code);
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (kv[k] >= 0) atomicAdd(&count[kv[k]], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) scan_unit(count, nkv, p.offsets + unit * (nkv + 1), cur, threadIdx.x);
  __syncthreads();
  for (int base = 0; base < per_unit; base += step) {
    int kv[kBatch];
    int32_t code[kBatch];
    unit_entries(p, b, h, per_unit, base, kv, code);
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (kv[k] >= 0) p.scattered[first + atomicAdd(&cur[kv[k]], 1)] = code[k];
  }
}

// One warp per (unit, kv block): an element's place in the sorted segment is the number of elements
// below it plus the equal ones before it (stable; duplicates keep distinct places). Lanes read the
// same scratch element at each step (a broadcast), and the writes go to the separate sorted copy.
// (This replaced a thread-per-segment insertion sort: 348 us of a 3.5 ms VSA backward on the H200.)
extern "C" __global__ void fva_vsa_invert_sort(const InvertParams p) {
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

extern "C" __global__ void fva_vsa_invert_emit(const InvertParams p) {
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
