// Inversion of VSA's q2k lists on the GPU, deterministic without a host round trip or a sort. A
// unit (b, q head) has num_q_blocks lists; they are cut into chunks of consecutive rows
// (kern::invert_chunking), and
//   1. tally: one block per (unit, chunk) counts the chunk's usable entries per kv block in shared
//      memory and writes its column of the unit's [kv block, chunk] tally;
//   2. scan: one block per unit turns the tally, read kv-major, into exclusive prefix sums in
//      place: where each (kv block, chunk) run starts in the unit's entries; a kv block's first
//      run starts its segment (offsets);
//   3. place: one block per (unit, chunk) drops the chunk's entries into per-kv-block buckets in
//      shared memory (in any order) and writes each, encoded as qb << slot_bits | slot (its q
//      block and its place in that q block's list), at its run's start plus the number of
//      entries of its bucket that precede it in (row, slot) order.
// Every kv block's segment thus lists its entries by q block, then slot, ascending: the order the
// encoding sorts to, whatever order the blocks ran in. Duplicates are kept (one term per listed
// entry, like the CPU reference), each beside the list slot where the sm_90 backward stores the
// pair's dS tile. fva_vsa_invert_indices additionally runs
//   4. emit: each segment's q blocks without duplicates into k2q_idx (padded with -1) and k2q_num.
// The backward also orders its dK/dV blocks by their lists' lengths (fva_vsa_invert_order).
// Short lists (kern::invert_in_one_block) take one kernel instead of steps 1-3 and the order,
// fva_vsa_invert_unit: a block per (b, kv head) unit does all of them in shared memory.
#include "primitives/kernel_chain.cuh"
#include "shared/kernel_params.h"
#include "schedules/vsa.cuh"

namespace {

using fva::kern::InvertParams;
using fva::kern::kInvertKvWindow;
using fva::kern::kInvertPlaceBatch;

__device__ __forceinline__ int64_t units(const InvertParams& p) {
  return static_cast<int64_t>(p.B) * p.H;
}

// The chunk a block works on, and its rows [row0, row_end) and entries (rows x max_k, row-major;
// fewer than 2^31: invert_chunking keeps a chunk near max(kInvertChunkEntries, num_kv_blocks)).
struct Chunk {
  int64_t unit;
  int chunk, row0, row_end, num_entries;
};
__device__ __forceinline__ Chunk chunk_of_block(const InvertParams& p) {
  Chunk c;
  c.unit = blockIdx.x / p.num_chunks;
  c.chunk = static_cast<int>(blockIdx.x % p.num_chunks);
  c.row0 = c.chunk * p.rows_per_chunk;
  c.row_end = min(c.row0 + p.rows_per_chunk, p.lists.num_q_blocks);
  c.num_entries = max(c.row_end - c.row0, 0) * p.lists.max_k;
  return c;
}

// The kv blocks of the chunk's entries e0 + j * stride, j < N (entry e: row row0 + e / max_k, slot
// e % max_k), or -1 where an entry is not used: past the chunk, past its row's count, out of
// range, or (skip_empty_blocks) a kv block without a real token. The loads go in three rounds
// (the rows' counts, the entries, the blocks' sizes), each round's N loads in flight together:
// one entry at a time, each round trip waiting for the last, made the inverse latency-bound.
template <int N>
__device__ __forceinline__ void entries_kv(const InvertParams& p, const Chunk& c, int e0,
                                           int stride, int (&kv)[N]) {
  const fva::kern::VsaLists& v = p.lists;
  const int b = static_cast<int>(c.unit / p.H), h = static_cast<int>(c.unit % p.H);
  const int32_t* num = v.q2k_num + b * v.num_stride_b + h * v.num_stride_h;
  const int32_t* idx = v.q2k_idx + b * v.idx_stride_b + h * v.idx_stride_h;
  int qb[N], slot[N], n[N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int e = e0 + j * stride;
    const bool inside = e < c.num_entries;
    qb[j] = c.row0 + (inside ? e / v.max_k : 0);
    slot[j] = inside ? e % v.max_k : 0;
    n[j] = inside ? num[qb[j] * v.num_stride_qb] : 0;
  }
#pragma unroll
  for (int j = 0; j < N; ++j)
    kv[j] = slot[j] < min(max(n[j], 0), v.max_k) ? idx[qb[j] * v.idx_stride_qb + slot[j]] : -1;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (kv[j] < 0 || kv[j] >= v.num_kv_blocks) kv[j] = -1;
    else if (p.skip_empty_blocks && fva::dev::vsa_block_tokens(v, kv[j]) == 0) kv[j] = -1;
  }
}

// Counts the chunk's usable entries per kv block of the window [k0, k0 + width) into `counts`
// (shared memory, zeroed by the caller), kPerThread entries per thread in flight at a time; with
// `kept` (shared memory, one per entry) also keeps every entry's kv block there (-1: not used).
template <int kPerThread>
__device__ __forceinline__ void count_entries(const InvertParams& p, const Chunk& c, int k0,
                                              int width, int32_t* counts, int16_t* kept = nullptr) {
  for (int e0 = 0; e0 < c.num_entries; e0 += kPerThread * blockDim.x) {
    int kv[kPerThread];
    entries_kv(p, c, e0 + threadIdx.x, blockDim.x, kv);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int e = e0 + threadIdx.x + j * blockDim.x;
      if (kept != nullptr && e < c.num_entries) kept[e] = static_cast<int16_t>(kv[j]);
      if (kv[j] >= k0 && kv[j] < k0 + width) atomicAdd(&counts[kv[j] - k0], 1);
    }
  }
}

// The counters [lo, hi) of an array of `width` that this thread of the block scans: consecutive
// runs, in thread order.
struct ThreadCounters {
  int lo, hi;
};
__device__ __forceinline__ ThreadCounters counters_of_thread(int width) {
  const int per_thread = (width + blockDim.x - 1) / blockDim.x;
  const int lo = min(static_cast<int>(threadIdx.x) * per_thread, width);
  return {lo, min(lo + per_thread, width)};
}

}  // namespace

// Step 1, a block of kInvertThreads per (unit, chunk). Dynamic shared memory:
// min(num_kv_blocks, kInvertKvWindow) counters.
extern "C" __global__ void __launch_bounds__(fva::kern::kInvertThreads)
    fva_vsa_invert_tally(const InvertParams p) {
  // No wait for the kernel before it until the end: the tally reads the call's inputs alone and
  // writes a region no earlier kernel of the call touches. Where Delta's count links the chain
  // (the VSA backward: fva_vsa_invert_order waits for the count, which Delta adds to only after the
  // kernels before it completed) it exits at once; otherwise it waits for the kernel before it
  // before it exits, which keeps the chain's order for the kernels after it
  // (primitives/kernel_chain.cuh).
  fva::dev::allow_next_kernel();
  extern __shared__ int32_t counts[];
  const Chunk c = chunk_of_block(p);
  const int nkv = p.lists.num_kv_blocks;
  int32_t* tally = p.tally + c.unit * nkv * p.num_chunks + c.chunk;  // column c.chunk, stride num_chunks
  for (int k0 = 0; k0 < nkv; k0 += kInvertKvWindow) {
    const int width = min(kInvertKvWindow, nkv - k0);
    for (int k = threadIdx.x; k < width; k += blockDim.x) counts[k] = 0;
    __syncthreads();
    count_entries<4>(p, c, k0, width, counts);
    __syncthreads();
    for (int k = threadIdx.x; k < width; k += blockDim.x)
      tally[static_cast<int64_t>(k0 + k) * p.num_chunks] = counts[k];
    __syncthreads();  // the counters are reset for the next window
  }
  if (p.delta_done == nullptr) fva::dev::wait_for_prior_kernels();
}

namespace {

// Exclusive prefix sums over a block's threads, in thread order: returns the sum of the values of
// the threads before this one, and sets *total (shared memory; nullptr: not wanted) to the block's
// sum. warp_sums: 32 ints of shared memory. Every thread of the block calls it; blockDim.x is a
// multiple of 32.
__device__ __forceinline__ int32_t block_exclusive_scan(int32_t value, int32_t* warp_sums,
                                                        int32_t* total = nullptr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  int32_t inclusive = value;  // over the warp's threads
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {  // the warps' totals -> their exclusive bases, and the block's total
    const int32_t w = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0;
    int32_t wi = w;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t up = __shfl_up_sync(0xffffffffu, wi, d);
      if (lane >= d) wi += up;
    }
    warp_sums[lane] = wi - w;
    if (lane == 31 && total != nullptr) *total = wi;
  }
  __syncthreads();
  const int32_t result = warp_sums[warp] + inclusive - value;
  __syncthreads();  // warp_sums and *total may be rewritten by the next call
  return result;
}

constexpr int kScanThreads = 1024;
constexpr int kScanItems = 8;
// A tile's element i sits at padded(i) in shared memory: one pad word per 32, so that a thread's
// kScanItems consecutive elements and its warp's neighbours' fall in distinct banks.
__device__ __forceinline__ int padded(int i) { return i + i / 32; }

}  // namespace

// Step 2, one block of kScanThreads per unit: an exclusive scan of the unit's tally, read as one
// array of num_kv_blocks x num_chunks (kv-major; fewer than 2^31 elements: invert_chunking), in
// tiles of kScanThreads x kScanItems, a running total carried between tiles. A tile goes through
// shared memory both ways, so that global loads and stores are coalesced while each thread scans
// consecutive elements. (Each thread loading its own 16 consecutive elements from global memory
// would stride 64 bytes across the warp.)
extern "C" __global__ void __launch_bounds__(kScanThreads) fva_vsa_invert_scan(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  constexpr int kTile = kScanThreads * kScanItems;
  __shared__ int32_t tile[kTile + kTile / 32];
  __shared__ int32_t warp_sums[32];
  __shared__ int32_t tile_total;
  const int nkv = p.lists.num_kv_blocks, chunks = p.num_chunks;
  const int n = nkv * chunks;
  int32_t* a = p.tally + blockIdx.x * static_cast<int64_t>(n);
  int32_t* off = p.offsets + blockIdx.x * static_cast<int64_t>(nkv + 1);
  int32_t carry = 0;  // the sum of the tiles before this one
  for (int t0 = 0; t0 < n; t0 += kTile) {
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {  // coalesced, into shared memory
      const int i = j * kScanThreads + threadIdx.x;
      tile[padded(i)] = t0 + i < n ? a[t0 + i] : 0;
    }
    __syncthreads();
    const int first = threadIdx.x * kScanItems;  // this thread's elements, within the tile
    int32_t x[kScanItems];
    int32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      x[j] = tile[padded(first + j)];
      mine += x[j];
    }
    int32_t running = carry + block_exclusive_scan(mine, warp_sums, &tile_total);
    int chunk = (t0 + first) % chunks;  // one division per thread, then counted along
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      tile[padded(first + j)] = running;
      if (chunk == 0 && t0 + first + j < n) off[(t0 + first + j) / chunks] = running;  // first run
      running += x[j];
      if (++chunk == chunks) chunk = 0;
    }
    carry += tile_total;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {  // coalesced, back
      const int i = j * kScanThreads + threadIdx.x;
      if (t0 + i < n) a[t0 + i] = tile[padded(i)];
    }
    __syncthreads();  // the tile and tile_total are rewritten by the next tile
  }
  if (threadIdx.x == 0) off[nkv] = carry;
}

namespace {

// One batch of the place step: the entries e = b0 + threadIdx.x + j * blockDim.x (j < kPerThread)
// of the rows from row0, with kv[j] their kv blocks (-1: not used), those in the window [k0, k0 +
// width) each written at its kv block's cursor plus the number of the batch's entries of that kv
// block before it; then the cursors move past the batch. The entries drop, unordered, into their
// kv blocks' buckets in shared memory (counted by shared atomics, the buckets laid out by a block
// scan of the counts); an entry's place in its kv block's run is the number of entries in its
// bucket that come before it in the batch (buckets hold a few entries: a batch spread over the kv
// blocks). So the runs come out in (row, slot) order whatever order the atomics ran in. (A warp
// walking the batch in order with __match_any_sync would serialize its steps.) Shared memory:
// count, bucket_base and cursor (width each), bucket (kPerThread * blockDim.x), warp_sums (32).
// Every thread of the block calls it.
template <int kPerThread>
__device__ __forceinline__ void place_batch(const InvertParams& p, int row0, int b0,
                                            int (&kv)[kPerThread], int k0, int width,
                                            int32_t* count, int32_t* bucket_base, int32_t* cursor,
                                            int32_t* bucket, int32_t* warp_sums, int32_t* out) {
  const int max_k = p.lists.max_k;
  const ThreadCounters own = counters_of_thread(width);
  for (int k = threadIdx.x; k < width; k += blockDim.x) count[k] = 0;
  __syncthreads();
  int in_bucket[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    kv[j] = kv[j] >= k0 && kv[j] < k0 + width ? kv[j] - k0 : -1;  // -1: not in this window
    in_bucket[j] = kv[j] >= 0 ? atomicAdd(&count[kv[j]], 1) : 0;
  }
  __syncthreads();
  int32_t mine = 0;
  for (int k = own.lo; k < own.hi; ++k) mine += count[k];
  int32_t base = block_exclusive_scan(mine, warp_sums);  // the buckets' bases
  for (int k = own.lo; k < own.hi; ++k) {
    bucket_base[k] = base;
    base += count[k];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPerThread; ++j)
    if (kv[j] >= 0) bucket[bucket_base[kv[j]] + in_bucket[j]] = threadIdx.x + j * blockDim.x;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (kv[j] < 0) continue;
    const int i = threadIdx.x + j * blockDim.x;  // the entry's place in the batch
    const int32_t* b = bucket + bucket_base[kv[j]];
    const int n = count[kv[j]];
    int rank = 0;
    for (int x = 0; x < n; ++x) rank += b[x] < i;
    const int e = b0 + i;
    // Below 2^31: qb << slot_bits < 2 num_q_blocks max_k <= 2^31 (require_index_size).
    out[cursor[kv[j]] + rank] = (row0 + e / max_k) << p.lists.slot_bits | e % max_k;
  }
  __syncthreads();  // every entry placed before the cursors move
  for (int k = threadIdx.x; k < width; k += blockDim.x) cursor[k] += count[k];
  __syncthreads();  // the cursors moved before the next batch
}

}  // namespace

// Step 3, a block of kInvertThreads per (unit, chunk), over batches of kInvertPlaceBatch of the
// chunk's entries (place_batch; every thread takes kPerThread entries, their loads in flight
// together). Dynamic shared memory: counts, bucket bases and cursors, min(num_kv_blocks,
// kInvertKvWindow) each, then the buckets.
extern "C" __global__ void __launch_bounds__(fva::kern::kInvertThreads)
    fva_vsa_invert_place(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
  extern __shared__ int32_t place_smem[];
  __shared__ int32_t warp_sums[32];
  constexpr int kPerThread = kInvertPlaceBatch / fva::kern::kInvertThreads;
  const Chunk c = chunk_of_block(p);
  const int nkv = p.lists.num_kv_blocks;
  const int window = min(nkv, kInvertKvWindow);
  int32_t* count = place_smem;
  int32_t* bucket_base = count + window;
  int32_t* cursor = bucket_base + window;
  int32_t* bucket = cursor + window;
  const int32_t* start = p.tally + c.unit * nkv * p.num_chunks + c.chunk;
  int32_t* out = p.entries + c.unit * p.lists.num_q_blocks * p.lists.max_k;
  for (int k0 = 0; k0 < nkv; k0 += kInvertKvWindow) {
    const int width = min(kInvertKvWindow, nkv - k0);
    for (int k = threadIdx.x; k < width; k += blockDim.x)
      cursor[k] = start[static_cast<int64_t>(k0 + k) * p.num_chunks];
    for (int b0 = 0; b0 < c.num_entries; b0 += kInvertPlaceBatch) {
      int kv[kPerThread];
      entries_kv(p, c, b0 + threadIdx.x, blockDim.x, kv);
      place_batch(p, c.row0, b0, kv, k0, width, count, bucket_base, cursor, bucket, warp_sums, out);
    }
  }
}

namespace {

// Returns once `count` reaches `target`: the VSA backward's Delta, launched first and running
// beside the inverse, counts its finished blocks there (portable/attention_backward.cuh). The
// acquire pairs with each block's fence before its count, and the fence after it orders what
// this thread observed before its block's exit, so the dK/dV kernel chained after this one reads
// a finished Delta. Every block of Delta was resident before the tally, and so this kernel, could
// launch (the chain's rule, primitives/kernel_chain.cuh), so the wait ends.
__device__ void wait_for_delta(const int32_t* count, int32_t target) {
  int32_t seen;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
    if (seen >= target) break;
    __nanosleep(256);
  }
  __threadfence();
}

// The rank of kv block `kv` among a unit's nkv blocks by descending work, ties by index.
__device__ __forceinline__ int rank_by_work(const int32_t* work, int nkv, int kv) {
  const int32_t w = work[kv];
  int rank = 0;
#pragma unroll 8
  for (int j = 0; j < nkv; ++j) {
    const int32_t x = work[j];
    rank += (x > w) || (x == w && j < kv);
  }
  return rank;
}

}  // namespace

// The backward's dK/dV block order, per (b, kv head) unit: its kv blocks by descending work (their
// inverse lists' lengths, summed over the unit's `group` q heads), ties by index. The dK/dV
// kernels walk a kv block's list in one block and their lists' lengths differ (random 25% lists:
// 64 +- 7 pairs), so launched in index order the last blocks of the grid are as long as any and
// the SMs that finish early idle; launched longest first, the tail is the shortest blocks
// (longest-processing-time-first list scheduling). A block's rank is counted against every other
// from shared memory, so the order is a deterministic function of the counts. The unit's kv
// blocks are split over ceil(num_kv_blocks / blockDim) blocks of the grid (each loads all the
// weights and ranks its slice): one block per unit would leave most SMs idle.
// The host launches it for at most kVsaOrderMaxKvBlocks kv blocks (the weights' array). In the
// backward it is the inverse's last kernel, and Delta runs beside the inverse (p.delta_done):
// each block's thread 0 then holds the block's exit until Delta is done.
extern "C" __global__ void fva_vsa_invert_order(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
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
  if (kv < nkv) p.kv_order[kv_unit * nkv + rank_by_work(work, nkv, kv)] = kv;
  if (p.delta_done != nullptr && threadIdx.x == 0) wait_for_delta(p.delta_done, p.delta_blocks);
}

// Steps 1-3 and the order in one block of kInvertUnitThreads per (b, kv head) unit, for short
// lists (kern::invert_in_one_block; the host's grid: B * H / group units, group = 1 without
// kv_order). For each of the unit's q heads in turn: every entry's kv block is loaded once, kept
// in shared memory (16 bits) and counted; a block scan of the counts gives the segments' offsets
// and the cursors; the entries are placed from shared memory, place_batch by place_batch. The
// counts summed over the q heads then rank the unit's kv blocks (fva_vsa_invert_order's order).
// Like the tally it does not wait at entry: it reads the call's inputs alone and writes what no
// earlier kernel of the call touches. With Delta's count (the backward) thread 0 holds the
// block's exit until Delta is done, as fva_vsa_invert_order's do; otherwise the block waits for
// the kernel before it before it exits, which keeps the chain's order for the kernels after it.
// Dynamic shared memory: kern::invert_unit_smem_bytes.
extern "C" __global__ void __launch_bounds__(fva::kern::kInvertUnitThreads)
    fva_vsa_invert_unit(const InvertParams p) {
  fva::dev::allow_next_kernel();
  extern __shared__ int32_t unit_smem[];
  __shared__ int32_t warp_sums[32];
  __shared__ int32_t unit_total;
  constexpr int kLoadsPerThread = 8;  // in flight at a time: one round for the most entries
  // Batches of kInvertPlaceBatch: an entry's rank scans its bucket, which grows with the batch.
  constexpr int kBatch = kInvertPlaceBatch;
  constexpr int kPlacePerThread = kBatch / fva::kern::kInvertUnitThreads;
  static_assert(kPlacePerThread * fva::kern::kInvertUnitThreads == kBatch);
  const int nkv = p.lists.num_kv_blocks, nqb = p.lists.num_q_blocks, max_k = p.lists.max_k;
  if (nkv > kInvertKvWindow) __trap();  // the host's limit (kern::invert_in_one_block), checked
  int32_t* count = unit_smem;
  int32_t* bucket_base = count + nkv;
  int32_t* cursor = bucket_base + nkv;
  int32_t* work = cursor + nkv;
  int32_t* bucket = work + nkv;
  int16_t* kvs = reinterpret_cast<int16_t*>(bucket + kBatch);  // one q head's entries
  const int group = p.kv_order != nullptr ? p.group : 1;
  const ThreadCounters own = counters_of_thread(nkv);
  for (int k = own.lo; k < own.hi; ++k) work[k] = 0;
  for (int g = 0; g < group; ++g) {
    Chunk c;  // the q head's lists, whole
    c.unit = static_cast<int64_t>(blockIdx.x) * group + g;
    c.chunk = 0;
    c.row0 = 0;
    c.row_end = nqb;
    c.num_entries = nqb * max_k;
    // 1. Every entry's kv block, kept and counted.
    for (int k = own.lo; k < own.hi; ++k) count[k] = 0;
    __syncthreads();
    count_entries<kLoadsPerThread>(p, c, 0, nkv, count, kvs);
    __syncthreads();
    // 2. The segments' offsets: an exclusive scan of the counts, where the cursors start.
    int32_t mine = 0;
    for (int k = own.lo; k < own.hi; ++k) mine += count[k];
    int32_t base = block_exclusive_scan(mine, warp_sums, &unit_total);
    int32_t* off = p.offsets + c.unit * (nkv + 1);
    for (int k = own.lo; k < own.hi; ++k) {
      off[k] = base;
      cursor[k] = base;
      work[k] += count[k];
      base += count[k];
    }
    if (threadIdx.x == 0) off[nkv] = unit_total;
    __syncthreads();  // the cursors set, the counts free for the batches
    // 3. The entries placed in (row, slot) order.
    int32_t* out = p.entries + c.unit * nqb * max_k;
    for (int b0 = 0; b0 < c.num_entries; b0 += kBatch) {
      int kv[kPlacePerThread];
#pragma unroll
      for (int j = 0; j < kPlacePerThread; ++j) {
        const int e = b0 + threadIdx.x + j * blockDim.x;
        kv[j] = e < c.num_entries ? kvs[e] : -1;
      }
      place_batch(p, 0, b0, kv, 0, nkv, count, bucket_base, cursor, bucket, warp_sums, out);
    }
  }
  // 4. The unit's dK/dV block order (every count is in `work`: step 2 ends on a barrier).
  if (p.kv_order != nullptr)
    for (int kv = threadIdx.x; kv < nkv; kv += blockDim.x)
      p.kv_order[static_cast<int64_t>(blockIdx.x) * nkv + rank_by_work(work, nkv, kv)] = kv;
  if (p.delta_done != nullptr) {
    if (threadIdx.x == 0) wait_for_delta(p.delta_done, p.delta_blocks);
  } else {
    fva::dev::wait_for_prior_kernels();
  }
}

extern "C" __global__ void fva_vsa_invert_emit(const InvertParams p) {
  fva::dev::enter_kernel_chain();  // primitives/kernel_chain.cuh
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
