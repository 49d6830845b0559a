// Inversion of VSA's q2k lists on the GPU, deterministic without a host round trip or a sort. A
// unit (b, q head) has num_q_blocks lists; they are cut into chunks of consecutive rows
// (kern::invert_chunking), and
//   1. tally: one block per (unit, chunk) counts the chunk's usable entries per kv block in shared
//      memory and writes its column of the unit's [kv block, chunk] tally;
//   2. scan: one block per unit turns the tally, read kv-major, into exclusive prefix sums in
//      place: where each (kv block, chunk) run starts in the unit's entries; a kv block's first
//      run starts its segment (offsets);
//   3. place: one warp per (unit, chunk) walks the chunk's entries in (row, slot) order, 32 at a
//      time, and writes each, encoded as qb << slot_bits | slot (its q block and its place in that
//      q block's list), at its kv block's cursor; lanes with the same kv block take consecutive
//      places in lane order (__match_any_sync), so duplicates keep their slot order.
// Every kv block's segment thus lists its entries by q block, then slot, ascending: the order the
// encoding sorts to, whatever order the blocks ran in. Duplicates are kept (one term per listed
// entry, like the CPU reference), each beside the list slot where the sm_90 backward stores the
// pair's dS tile. fva_vsa_invert_indices additionally runs
//   4. emit: each segment's q blocks without duplicates into k2q_idx (padded with -1) and k2q_num.
// The backward also orders its dK/dV blocks by their lists' lengths (fva_vsa_invert_order).
// (Before: zero, count and fill by global atomics, a scan per unit and a rank sort per segment,
// 83 us at S=32768, H=8 on the H200.)
#include "common/kernel_chain.cuh"
#include "common/kernel_params.h"
#include "vsa/vsa_schedules.cuh"

namespace {

using fva::kern::InvertParams;
using fva::kern::kInvertKvWindow;
using fva::kern::kInvertPlaceBatch;

__device__ __forceinline__ int64_t units(const InvertParams& p) {
  return static_cast<int64_t>(p.B) * p.H;
}

// The chunk a block works on, and its rows [row0, row_end) and entries (rows x max_k, row-major).
struct Chunk {
  int64_t unit;
  int chunk, row0, row_end;
  int64_t num_entries;
};
__device__ __forceinline__ Chunk chunk_of_block(const InvertParams& p) {
  Chunk c;
  c.unit = blockIdx.x / p.num_chunks;
  c.chunk = static_cast<int>(blockIdx.x % p.num_chunks);
  c.row0 = c.chunk * p.rows_per_chunk;
  c.row_end = min(c.row0 + p.rows_per_chunk, p.lists.num_q_blocks);
  c.num_entries = static_cast<int64_t>(max(c.row_end - c.row0, 0)) * p.lists.max_k;
  return c;
}

// The kv block of entry e of the chunk (row row0 + e / max_k, slot e % max_k), or -1 where the
// entry is not used: past the row's count, out of range, or (skip_empty_blocks) a kv block
// without a real token.
__device__ __forceinline__ int entry_kv(const InvertParams& p, const Chunk& c, int64_t e) {
  const fva::kern::VsaLists& v = p.lists;
  const int qb = c.row0 + static_cast<int>(e / v.max_k);
  const int slot = static_cast<int>(e % v.max_k);
  const int b = static_cast<int>(c.unit / p.H), h = static_cast<int>(c.unit % p.H);
  const int n = v.q2k_num[b * v.num_stride_b + h * v.num_stride_h + qb * v.num_stride_qb];
  if (slot >= min(max(n, 0), v.max_k)) return -1;
  const int kv = v.q2k_idx[b * v.idx_stride_b + h * v.idx_stride_h + qb * v.idx_stride_qb + slot];
  if (kv < 0 || kv >= v.num_kv_blocks) return -1;
  if (p.skip_empty_blocks && fva::dev::vsa_block_tokens(v, kv) == 0) return -1;
  return kv;
}

}  // namespace

// Step 1. Dynamic shared memory: min(num_kv_blocks, kInvertKvWindow) counters.
extern "C" __global__ void fva_vsa_invert_tally(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  extern __shared__ int32_t counts[];
  const Chunk c = chunk_of_block(p);
  const int nkv = p.lists.num_kv_blocks;
  int32_t* tally = p.tally + c.unit * nkv * p.num_chunks + c.chunk;  // column c.chunk, stride num_chunks
  for (int k0 = 0; k0 < nkv; k0 += kInvertKvWindow) {
    const int width = min(kInvertKvWindow, nkv - k0);
    for (int k = threadIdx.x; k < width; k += blockDim.x) counts[k] = 0;
    __syncthreads();
    for (int64_t e = threadIdx.x; e < c.num_entries; e += blockDim.x) {
      const int kv = entry_kv(p, c, e) - k0;
      if (kv >= 0 && kv < width) atomicAdd(&counts[kv], 1);
    }
    __syncthreads();
    for (int k = threadIdx.x; k < width; k += blockDim.x)
      tally[static_cast<int64_t>(k0 + k) * p.num_chunks] = counts[k];
    __syncthreads();  // the counters are reset for the next window
  }
}

// Step 2, one block of kScanThreads per unit: an exclusive scan of the unit's tally, read as one
// array of num_kv_blocks x num_chunks (kv-major), in tiles of kScanThreads x 4, a running total
// carried between tiles.
namespace {
constexpr int kScanThreads = 1024;
constexpr int kScanItems = 4;
}  // namespace
extern "C" __global__ void __launch_bounds__(kScanThreads) fva_vsa_invert_scan(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  __shared__ int32_t warp_base[kScanThreads / 32];
  __shared__ int32_t tile_total;
  const int64_t unit = blockIdx.x;
  const int nkv = p.lists.num_kv_blocks;
  const int64_t n = static_cast<int64_t>(nkv) * p.num_chunks;
  int32_t* a = p.tally + unit * n;
  int32_t* off = p.offsets + unit * (nkv + 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  int32_t carry = 0;  // the sum of the tiles before this one
  for (int64_t t0 = 0; t0 < n; t0 += kScanThreads * kScanItems) {
    const int64_t i0 = t0 + static_cast<int64_t>(threadIdx.x) * kScanItems;
    int32_t x[kScanItems];
    int32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      x[j] = i0 + j < n ? a[i0 + j] : 0;
      mine += x[j];
    }
    int32_t inclusive = mine;  // over the warp's threads
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    if (lane == 31) warp_base[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {  // the warps' totals -> their exclusive bases, and the tile's total
      const int32_t w = warp_base[lane];
      int32_t wi = w;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int32_t up = __shfl_up_sync(0xffffffffu, wi, d);
        if (lane >= d) wi += up;
      }
      warp_base[lane] = wi - w;
      if (lane == 31) tile_total = wi;
    }
    __syncthreads();
    int32_t running = carry + warp_base[warp] + inclusive - mine;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      const int64_t i = i0 + j;
      if (i < n) {
        a[i] = running;
        if (i % p.num_chunks == 0) off[i / p.num_chunks] = running;  // the kv block's first run
      }
      running += x[j];
    }
    carry += tile_total;
    __syncthreads();  // warp_base and tile_total are rewritten by the next tile
  }
  if (threadIdx.x == 0) off[nkv] = carry;
}

// Step 3, one warp per (unit, chunk). Dynamic shared memory: min(num_kv_blocks, kInvertKvWindow)
// cursors, then kInvertPlaceBatch staged kv blocks.
extern "C" __global__ void __launch_bounds__(32) fva_vsa_invert_place(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  extern __shared__ int32_t place_smem[];
  const Chunk c = chunk_of_block(p);
  const int nkv = p.lists.num_kv_blocks;
  const int lane = threadIdx.x;
  int32_t* cursor = place_smem;
  int32_t* staged = place_smem + min(nkv, kInvertKvWindow);
  const int32_t* start = p.tally + c.unit * nkv * p.num_chunks + c.chunk;
  int32_t* out = p.entries + c.unit * p.lists.num_q_blocks * p.lists.max_k;
  const unsigned below_me = (1u << lane) - 1u;
  for (int k0 = 0; k0 < nkv; k0 += kInvertKvWindow) {
    const int width = min(kInvertKvWindow, nkv - k0);
    for (int k = lane; k < width; k += 32)
      cursor[k] = start[static_cast<int64_t>(k0 + k) * p.num_chunks];
    for (int64_t b0 = 0; b0 < c.num_entries; b0 += kInvertPlaceBatch) {
      // Stage the batch's kv blocks (-1: not used, or outside this window): every lane's loads in
      // flight at once, not one round trip per step of the ordered walk below.
      const int64_t left = c.num_entries - b0;
      const int batch = static_cast<int>(left < kInvertPlaceBatch ? left : kInvertPlaceBatch);
      for (int i = lane; i < batch; i += 32) {
        const int kv = entry_kv(p, c, b0 + i) - k0;
        staged[i] = kv >= 0 && kv < width ? kv : -1;
      }
      __syncwarp();
      for (int i0 = 0; i0 < batch; i0 += 32) {
        const int i = i0 + lane;
        const int kv = i < batch ? staged[i] : -1;
        const unsigned same = __match_any_sync(0xffffffffu, kv);
        int32_t base = 0;
        if (kv >= 0) {
          base = cursor[kv];
          const int64_t e = b0 + i;
          const int qb = c.row0 + static_cast<int>(e / p.lists.max_k);
          const int slot = static_cast<int>(e % p.lists.max_k);
          // Below 2^31: qb << slot_bits < 2 num_q_blocks max_k <= 2^31 (require_index_size).
          out[base + __popc(same & below_me)] = qb << p.lists.slot_bits | slot;
        }
        __syncwarp();  // every lane has read its cursor before the group's last lane moves it
        if (kv >= 0 && (same >> lane) == 1u) cursor[kv] = base + __popc(same);
        __syncwarp();
      }
    }
    __syncwarp();  // the cursors and the staging buffer are rewritten by the next window
  }
}

// The backward's dK/dV block order, per (b, kv head) unit: its kv blocks by descending work (their
// inverse lists' lengths, summed over the unit's `group` q heads), ties by index. The dK/dV
// kernels walk a kv block's list in one block and their lists' lengths differ (random 25% lists:
// 64 +- 7 pairs), so launched in index order the last blocks of the grid are as long as any and
// the SMs that finish early idle; launched longest first, the tail is the shortest blocks
// (longest-processing-time-first list scheduling). A block's rank is counted against every other
// from shared memory, so the order is a deterministic function of the counts. The unit's kv
// blocks are split over ceil(num_kv_blocks / blockDim) blocks of the grid (each loads all the
// weights and ranks its slice): one block per unit left most SMs idle (13 us at 512 kv blocks).
// The host launches it for at most kVsaOrderMaxKvBlocks kv blocks (the weights' array).
extern "C" __global__ void fva_vsa_invert_order(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // common/kernel_chain.cuh
  __shared__ int32_t work[fva::kern::kVsaOrderMaxKvBlocks];
  const int nkv = p.lists.num_kv_blocks;
  if (nkv > fva::kern::kVsaOrderMaxKvBlocks) __trap();  // the host's limit, checked
  const int slices = (nkv + blockDim.x - 1) / blockDim.x;
  const int64_t kv_unit = blockIdx.x / slices;
  for (int kv = threadIdx.x; kv < nkv; kv += blockDim.x) {
    int32_t w = 0;
    for (int g = 0; g < p.group; ++g) {
      const int32_t* off = p.offsets + (kv_unit * p.group + g) * (nkv + 1);
      w += off[kv + 1] - off[kv];
    }
    work[kv] = w;
  }
  __syncthreads();
  const int kv = static_cast<int>(blockIdx.x % slices) * blockDim.x + threadIdx.x;
  if (kv >= nkv) return;
  const int32_t w = work[kv];
  int rank = 0;
#pragma unroll 8
  for (int j = 0; j < nkv; ++j) {
    const int32_t x = work[j];
    rank += (x > w) || (x == w && j < kv);
  }
  p.kv_order[kv_unit * nkv + rank] = kv;
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
