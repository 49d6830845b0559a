// Where a VSA forward block's time goes: the library's sm_90a VSA forward kernel
// (sm90/attention_forward_compact.cuh), built here with per-block timestamps at its four
// trace points (FVA_VSA_FWD_TRACE: the block starts, its Q has landed, its last tile is done, its
// outputs are stored), run at the bench's shape (B=1, H=8, D=128, bf16, random top-k lists at the
// given density), and summarized:
//   - per block, in SM cycles (%clock64): start -> Q landed (the block's start), Q -> last tile
//     (the list, also per tile), last tile -> stored (the epilogue);
//   - per SM, from %globaltimer: how many of its four slots hold a block over the kernel's span
//     (a block's exit and the next one's launch, and the last wave, show as empty slots);
//   - the kernel's time (CUDA events, median of 5 after 3 warm-ups) and TFLOPS as the bench counts.
//   - with -DFVA_TRACE_TILES, per traced tile (the lists' entries 0, 1, 2 and 24), the cycles of
//     its steps: the K wait, S, the softmax, the V wait, P·V (FVA_VSA_FWD_TILE_TRACE);
// It says where in a block its fixed cost (the start and the epilogue) sits, beside its tiles.
// Runs on the device machine, from the repo root:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels -o /tmp/vsa_fwd_timeline \
//     tools/lab/vsa_fwd_timeline.cu -lcuda && /tmp/vsa_fwd_timeline 16384 0.25
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

// Five words per block: clock64 at events 0-3, then the block's SM (%smid). Two more per block:
// globaltimer at events 0 and 3.
__device__ uint64_t* g_trace;
__device__ uint64_t* g_wall;
#define FVA_VSA_FWD_TRACE(event)                                                       \
  do {                                                                                 \
    if (threadIdx.x == 0) {                                                            \
      const size_t blk_ = static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x;    \
      g_trace[blk_ * 5 + (event)] = clock64();                                         \
      if ((event) == 0 || (event) == 3) {                                              \
        uint64_t wall_;                                                                \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(wall_));                      \
        g_wall[blk_ * 2 + ((event) == 3)] = wall_;                                     \
      }                                                                                \
      if ((event) == 0) {                                                              \
        uint32_t sm_;                                                                  \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_));                               \
        g_trace[blk_ * 5 + 4] = sm_;                                                   \
      }                                                                                \
    }                                                                                  \
  } while (0)

// With -DFVA_TRACE_TILES only (the steps' traces slow the kernel by a few percent per tile):
// six words per traced tile (the list's entries 0, 1, 2 and 24 of each block, or the four from
// FVA_TRACED_FROM), clock64 at the tile's steps 0-5 (FVA_VSA_FWD_TILE_TRACE: top, K landed, S
// done, softmax done, V landed, P·V done).
// -DFVA_TRACED_FROM=n traces entries n .. n + 3 instead (e.g. 29: the list window's switch,
// VsaKeyTiles::Window, reads entries 32-63 in the pop at the top of entry 31). (A number, not a
// list: nvcc splits its options at commas.)
#ifdef FVA_TRACED_FROM
#define FVA_TRACED_ENTRIES FVA_TRACED_FROM, FVA_TRACED_FROM + 1, FVA_TRACED_FROM + 2, FVA_TRACED_FROM + 3
#else
#define FVA_TRACED_ENTRIES 0, 1, 2, 24
#endif
__device__ uint64_t* g_tiles;
__device__ __forceinline__ int traced_tile_slot(int index) {
  constexpr int traced[4] = {FVA_TRACED_ENTRIES};
  for (int k = 0; k < 4; ++k)
    if (index == traced[k]) return k;
  return -1;
}
#ifdef FVA_TRACE_TILES
#define FVA_VSA_FWD_TILE_TRACE(event, index)                                           \
  do {                                                                                 \
    const int slot_ = traced_tile_slot(index);                                         \
    if (threadIdx.x == 0 && slot_ >= 0) {                                              \
      const size_t blk_ = static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x;    \
      g_tiles[(blk_ * 4 + slot_) * 6 + (event)] = clock64();                           \
    }                                                                                  \
  } while (0)
#endif

#include "sm90/attention_forward_compact.cuh"
#include "schedules/vsa.cuh"

constexpr int kD = 128;

extern "C" __global__ void __launch_bounds__(128, 4)
    vsa_fwd_traced(const __grid_constant__ fva::kern::Sm90ForwardParams p) {
  extern __shared__ __align__(1024) char smem[];
  fva::dev::sm90::attention_forward_compact_sm90<fva::dev::Bf16, kD, fva::dev::VsaKeyTiles>(p, smem);
}

#define CK(x)                                                                       \
  do {                                                                              \
    const cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                        \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

// [B, H, S, D] bf16, contiguous, as a 4-d map over (D, S, H, B): boxes of 64 x 64, 128-byte
// swizzle (src/cuda/sm90_kernels.cpp's encoding).
static fva::kern::TensorMap encode(void* data, int B, int H, int S) {
  fva::kern::TensorMap map{};
  const cuuint64_t dims[4] = {kD, static_cast<cuuint64_t>(S), static_cast<cuuint64_t>(H),
                              static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {kD * 2ull, static_cast<cuuint64_t>(S) * kD * 2,
                                 static_cast<cuuint64_t>(H) * S * kD * 2};
  const cuuint32_t box[4] = {64, 64, 1, 1}, elem[4] = {1, 1, 1, 1};
  const CUresult r = cuTensorMapEncodeTiled(
      reinterpret_cast<CUtensorMap*>(&map), CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, data, dims, strides,
      box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
    std::exit(1);
  }
  return map;
}

// The library's VSA forward stores o through a map (Sm90ForwardParams::o); a tree before that (an
// A/B's base) has no such field.
template <typename Params>
auto set_output_map(Params& p, const fva::kern::TensorMap& map, int) -> decltype(p.o, void()) {
  p.o = map;
}
template <typename Params>
void set_output_map(Params&, const fva::kern::TensorMap&, long) {}

static double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[static_cast<size_t>(q * (v.size() - 1))];
}

int main(int argc, char** argv) {
  const int S = argc > 1 ? std::atoi(argv[1]) : 16384;
  const double density = argc > 2 ? std::atof(argv[2]) : 0.25;
  const int B = 1, H = 8, nb = S / 64, topk = std::max(1, static_cast<int>(nb * density));
  const size_t n = static_cast<size_t>(B) * H * S * kD;
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> host(n);
  std::vector<void*> qkv(3);
  for (auto& t : qkv) {
    for (auto& x : host) {
      const float f = normal(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      x = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // bf16, to nearest even
    }
    CK(cudaMalloc(&t, n * 2));
    CK(cudaMemcpy(t, host.data(), n * 2, cudaMemcpyHostToDevice));
  }
  // Random ascending top-k lists per q block (the bench's default), every block 64 tokens.
  std::vector<int32_t> idx(static_cast<size_t>(B) * H * nb * topk), num(static_cast<size_t>(B) * H * nb, topk),
      sizes(nb, 64), all(nb);
  for (size_t r = 0; r < num.size(); ++r) {
    for (int i = 0; i < nb; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + topk);
    std::copy(all.begin(), all.begin() + topk, idx.begin() + r * topk);
  }
  int32_t *d_idx, *d_num, *d_sizes;
  CK(cudaMalloc(&d_idx, idx.size() * 4));
  CK(cudaMalloc(&d_num, num.size() * 4));
  CK(cudaMalloc(&d_sizes, sizes.size() * 4));
  CK(cudaMemcpy(d_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_num, num.data(), num.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_sizes, sizes.data(), sizes.size() * 4, cudaMemcpyHostToDevice));
  void* o;
  float* lse;
  CK(cudaMalloc(&o, n * 2));
  CK(cudaMemset(o, 0xff, n * 2));  // poisoned: 0xffff is a bf16 NaN, so an unwritten output shows
  CK(cudaMalloc(&lse, static_cast<size_t>(B) * H * S * 4));

  fva::kern::Sm90ForwardParams P{};
  fva::kern::AttentionParams& a = P.a;
  const int64_t sb = static_cast<int64_t>(H) * S * kD, sh = static_cast<int64_t>(S) * kD;
  a.q = {qkv[0], sb, sh, kD};
  a.k = {qkv[1], sb, sh, kD};
  a.v = {qkv[2], sb, sh, kD};
  a.o = {o, sb, sh, kD};
  a.o_hp = {nullptr, 0, 0, 0};
  a.lse = {lse, static_cast<int64_t>(H) * S, S, 1};
  a.B = B;
  a.Hq = a.Hkv = H;
  a.Sq = a.Skv = S;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kD));
  a.scale_log2 = a.scale * 1.4426950408889634f;
  a.vsa.q2k_idx = d_idx;
  a.vsa.idx_stride_b = static_cast<int64_t>(H) * nb * topk;
  a.vsa.idx_stride_h = static_cast<int64_t>(nb) * topk;
  a.vsa.idx_stride_qb = topk;
  a.vsa.q2k_num = d_num;
  a.vsa.num_stride_b = static_cast<int64_t>(H) * nb;
  a.vsa.num_stride_h = nb;
  a.vsa.num_stride_qb = 1;
  a.vsa.block_sizes = d_sizes;
  a.vsa.block_sizes_stride = 1;
  a.vsa.num_q_blocks = a.vsa.num_kv_blocks = nb;
  a.vsa.max_k = topk;
  P.q = encode(qkv[0], B, H, S);
  P.k = encode(qkv[1], B, H, S);
  P.v = encode(qkv[2], B, H, S);
  set_output_map(P, encode(o, B, H, S), 0);

  const dim3 grid(nb, B * H);
  const size_t blocks = static_cast<size_t>(grid.x) * grid.y;
  uint64_t *trace, *wall;
  CK(cudaMalloc(&trace, blocks * 5 * 8));
  CK(cudaMalloc(&wall, blocks * 2 * 8));
  CK(cudaMemcpyToSymbol(g_trace, &trace, sizeof trace));
  CK(cudaMemcpyToSymbol(g_wall, &wall, sizeof wall));
  uint64_t* tiles;
  CK(cudaMalloc(&tiles, blocks * 24 * 8));
  CK(cudaMemset(tiles, 0, blocks * 24 * 8));  // 0: not reached (a list too short)
  CK(cudaMemcpyToSymbol(g_tiles, &tiles, sizeof tiles));
  const int smem = fva::kern::sm90_compact_smem_bytes(kD, 3, true);
  CK(cudaFuncSetAttribute(vsa_fwd_traced, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0, sms = 0, clock_khz = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, vsa_fwd_traced, 128, smem));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));

  auto run = [&] {
    vsa_fwd_traced<<<grid, 128, smem>>>(P);
    CK(cudaGetLastError());
  };
  for (int i = 0; i < 3; ++i) run();
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms(5);
  for (float& m : ms) {
    CK(cudaEventRecord(e0));
    run();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&m, e0, e1));
  }
  std::sort(ms.begin(), ms.end());
  const double flops = 4.0 * B * H * kD * 64.0 * 64.0 * static_cast<double>(nb) * topk;
  std::vector<uint64_t> t(blocks * 5), w(blocks * 2);
  CK(cudaMemcpy(t.data(), trace, t.size() * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(w.data(), wall, w.size() * 8, cudaMemcpyDeviceToHost));

  // Every output written (the poison gone) and finite: the run is also a smoke test of the harness.
  std::vector<uint16_t> out(n);
  CK(cudaMemcpy(out.data(), o, n * 2, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (uint16_t x : out) bad += (x & 0x7f80u) == 0x7f80u;  // inf or NaN
  std::printf("S=%d density %.3f: %d q blocks of %d tiles, %d blocks per SM x %d SMs; %zu non-finite outputs\n",
              S, density, static_cast<int>(blocks), topk, per_sm, sms, bad);
  std::printf("kernel %.3f ms (median of 5), %.1f TFLOPS\n", ms[2], flops / (ms[2] * 1e9));

  std::vector<double> start, list, per_tile, epi, life;
  for (size_t b = 0; b < blocks; ++b) {
    const uint64_t* c = &t[b * 5];
    start.push_back(static_cast<double>(c[1] - c[0]));
    list.push_back(static_cast<double>(c[2] - c[1]));
    per_tile.push_back(static_cast<double>(c[2] - c[1]) / topk);
    epi.push_back(static_cast<double>(c[3] - c[2]));
    life.push_back(static_cast<double>(c[3] - c[0]));
  }
  std::printf("per block, SM cycles (p10 / p50 / p90; %d kHz nominal):\n", clock_khz);
  auto row = [&](const char* what, const std::vector<double>& v) {
    std::printf("  %-28s %10.0f %10.0f %10.0f\n", what, pct(v, 0.1), pct(v, 0.5), pct(v, 0.9));
  };
  row("start -> Q landed", start);
  row("Q landed -> last tile", list);
  row("  per tile", per_tile);
  row("last tile -> stored", epi);
  row("whole block", life);
  const double p50_tile = pct(per_tile, 0.5);
  // The traced tiles' steps (p50 over the blocks that reached them).
#ifdef FVA_TRACE_TILES
  std::vector<uint64_t> tt(blocks * 24);
  CK(cudaMemcpy(tt.data(), tiles, tt.size() * 8, cudaMemcpyDeviceToHost));
  std::printf("  traced tiles, p50 cycles: %8s %8s %8s %8s %8s %8s\n", "top->K", "K->S", "S->smax",
              "smax->V", "V->PV", "whole");
  const int traced[4] = {FVA_TRACED_ENTRIES};
  for (int k = 0; k < 4; ++k) {
    std::vector<double> step[6];
    for (size_t b = 0; b < blocks; ++b) {
      const uint64_t* c = &tt[(b * 4 + k) * 6];
      if (c[0] == 0 || c[5] == 0) continue;
      for (int e = 0; e < 5; ++e) step[e].push_back(static_cast<double>(c[e + 1] - c[e]));
      step[5].push_back(static_cast<double>(c[5] - c[0]));
    }
    if (step[5].empty()) continue;
    std::printf("    tile %2d                 %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f\n", traced[k],
                pct(step[0], 0.5), pct(step[1], 0.5), pct(step[2], 0.5), pct(step[3], 0.5),
                pct(step[4], 0.5), pct(step[5], 0.5));
  }
#endif
  std::printf("  start + epilogue = %.2f tiles of the median tile\n",
              (pct(start, 0.5) + pct(epi, 0.5)) / p50_tile);

  // Slot occupancy per SM from the global timer: blocks' lifetimes over per_sm slots across the
  // kernel's span; and the same after the SM's first block starts and before its last ends.
  uint64_t k0 = UINT64_MAX, k1 = 0;
  for (size_t b = 0; b < blocks; ++b) k0 = std::min(k0, w[b * 2]), k1 = std::max(k1, w[b * 2 + 1]);
  // %smid need not be dense (an SM's id can pass the count): index by id, count those seen.
  size_t ids = 0;
  for (size_t b = 0; b < blocks; ++b) ids = std::max<size_t>(ids, t[b * 5 + 4] + 1);
  std::vector<double> busy(ids, 0.0), first(ids, 1e300), last(ids, -1.0);
  for (size_t b = 0; b < blocks; ++b) {
    const int sm = static_cast<int>(t[b * 5 + 4]);
    const double s0 = static_cast<double>(w[b * 2] - k0), s1 = static_cast<double>(w[b * 2 + 1] - k0);
    busy[sm] += s1 - s0;
    first[sm] = std::min(first[sm], s0);
    last[sm] = std::max(last[sm], s1);
  }
  double all_busy = 0, inner = 0, end_min = 1e300, end_max = 0;
  int seen = 0;
  for (size_t sm = 0; sm < ids; ++sm) {
    if (last[sm] < 0) continue;
    ++seen;
    all_busy += busy[sm];
    inner += last[sm] - first[sm];
    end_min = std::min(end_min, last[sm]);
    end_max = std::max(end_max, last[sm]);
  }
  const double span = static_cast<double>(k1 - k0);
  std::printf("slots (%d SMs seen): %.1f%% occupied over the kernel's %.1f us (global timer); %.1f%% "
              "between each SM's first start and last end; the SMs' last blocks end at %.1f-%.1f us\n",
              seen, 100.0 * all_busy / (per_sm * seen * span), span / 1e3,
              100.0 * all_busy / (per_sm * inner), end_min / 1e3, end_max / 1e3);
  return bad == 0 ? 0 : 1;
}
