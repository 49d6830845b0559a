// The Hopper-native VSA forward (sm_90a): one warpgroup per block and no producer warpgroup, four
// blocks per SM (ThunderKittens' VSA forward is built this way). Each block is one 64-row q block
// and walks its q2k list, so the list is the schedule:
//     S = Q Kᵀ (wgmma, shared-memory operands) -> ragged mask -> online softmax -> o += P·V (wgmma,
//     P from registers, V in shared memory)
// then stores its rows (sm90/forward_epilogue.cuh, store_forward_outputs_tma) and, for the VSA
// layer's call, the layer's output beside them, the gate rows loaded into the K tile after the last
// S and out stored from the V tile (sm90/fused_layer_gate.cuh).
// The softmax rescales lazily (primitives/online_softmax.cuh): o and l are rescaled only when a
// row's max passes its reference by more than 2^8, not whenever some row's max rises, which also
// frees the registers for the one-FMA exponent.
// One K and one V buffer, no ring: warp 0's lane 0 issues the TMA for the next listed block's K
// as soon as this block's S has read K, and the next V once P·V has read V, so each load runs
// under the softmax or the next S. Under this kernel's L2 traffic (near the L2's read bandwidth)
// a load takes a little longer than that lead, so a tile's period is a load's latency plus the
// product that holds its buffer, and the softmax is off that path; a second buffer does not fit
// four blocks per SM. The overlap of one q block's softmax with tensor-core work comes from the
// other three blocks on the SM, which the warp schedulers interleave.
// Per tile, a warp issues few instructions besides the softmax's: the list comes from registers
// (VsaKeyTiles::Window), the rows' sums from the tensor cores (P against a region of ones, in
// P·V's own product), V's descriptors from uniform registers, and each warp votes on its own
// rescale. The K and V tiles then stream from the L2 near its read bandwidth, but that is not the
// bound: the products' shapes set the rate (S as m64n64k16 products).
//
// Why not the warp-specialized forward (sm90/attention_forward.cuh), as QAT: a VSA q block has its
// own list, so two consumers cannot share K/V tiles, and a producer warpgroup per consumer leaves
// an SM two consumers (two blocks of 3-stage rings). Here 48 KiB of shared memory and 128
// registers per thread buy four. Nor a persistent grid (four blocks per SM striding over the q
// blocks): the hardware's block scheduler, which starts a q block wherever one finishes, already
// balances the lists' different lengths at the grain of one q block.
//
// Shared memory: CompactTiles (sm90/compact_tiles.cuh) of three tiles, Q | K | V, and a region of
// ones after V (holding the barriers in bytes no product reads); the Q tile stages o for its TMA
// store at the end.
#pragma once

#include <math_constants.h>

#include "shared/kernel_params.h"
#include "primitives/online_softmax.cuh"
#include "sm90/compact_tiles.cuh"
#include "sm90/forward_epilogue.cuh"
#include "sm90/fused_layer_gate.cuh"
#include "sm90/zero_tile_rows.cuh"

// Per-block timestamps for tools/lab/vsa_fwd_timeline.cu, which defines this before including
// the kernel: FVA_VSA_FWD_TRACE(event) with event 0 (the block starts), 1 (its Q has landed),
// 2 (its last tile is done), 3 (its outputs are stored). Nothing in the library.
// FVA_VSA_FWD_TILE_TRACE(event, index) marks the steps of the listed tile at list index `index`:
// 0 the tile's top, 1 its K has landed, 2 S is done, 3 the softmax is done, 4 its V has landed,
// 5 P·V is done.
#ifndef FVA_VSA_FWD_TRACE
#define FVA_VSA_FWD_TRACE(event)
#endif
#ifndef FVA_VSA_FWD_TILE_TRACE
#define FVA_VSA_FWD_TILE_TRACE(event, index)
#endif

namespace fva::dev::sm90 {

template <typename T, int D, typename Schedule>
__device__ __forceinline__ void attention_forward_compact_sm90(const kern::Sm90ForwardParams& P,
                                                               char* smem) {
  using L = CompactTiles<D, 3, /*kOnesTile=*/true>;
  static_assert(Schedule::kSubTile == 64, "one softmax step per 64-key tile (VSA)");
  constexpr int kNT = 8;
  constexpr int kQ = 0, kK = 1, kV = 2;  // tiles
  const kern::AttentionParams& p = P.a;

  FVA_VSA_FWD_TRACE(0);
  const L tiles{smem_addr(smem)};
  if (tiles.base & 1023) __trap();  // the 128-byte swizzle needs 1024-byte aligned regions
  const uint32_t q_tile = tiles.tile(kQ), k_tile = tiles.tile(kK), v_tile = tiles.tile(kV);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  tiles.template fill_ones_region<T>();  // complete at setup's barrier
  const CompactBlock at(p);
  const int b = at.b, h = at.h, hk = at.hk, row0 = at.row0;
  tiles.setup([&] {
    tma_prefetch_descriptor(&P.q);
    tma_prefetch_descriptor(&P.k);
    tma_prefetch_descriptor(&P.v);
    tiles.load(kQ, &P.q, tiles.bar_query(), row0, h, b);
  });
  const Schedule sched(p, b, h, row0);
  // The list walked by each warp in step (Schedule::Window): a tile and its size come from
  // registers, and the next tile is taken while this one's S runs.
  typename Schedule::Window list(sched);
  auto tile = list.pop();
  tiles.load_first_keys(&P.k, &P.v, at, tile.valid() ? tile.key0() : -1);
  // The layer's gate rows go to the K tile once no K needs it: here where the list is empty, else
  // after the last listed tile's S (sm90/fused_layer_gate.cuh).
  if (!tile.valid() && tid == 0 && fuses_layer_gate_load(P.layer_gate))
    issue_layer_gate_load(P.layer_gate, p, tiles, kK);
  // Warp 0 alone issues the loads (its lane 0): a warp-uniform branch the other warps skip.
  const bool loader = __shfl_sync(0xffffffffu, warp, 0) == 0;

  // o, then the rows' sums l by the tensor cores, as in the QAT forward: P·V is one m64n(D+8)k16
  // product per k16 step against V and the region of ones after it (CompactTiles), so its last n8
  // block (o[D / 2 .. D / 2 + 3]) holds each row's sum of P and is rescaled with o. It sums
  // bf16(p), the operand P·V reads, and takes 32 adds and the quad's shuffles per tile off the
  // ALUs. (Not as m64n8k16 products of their own: an n8 product costs the tensor pipe far more
  // than its 8 columns.)
  constexpr int kAcc = D / 2 + 4;
  float o[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) o[i] = 0.0f;
  fence_registers(o);  // distinct registers (see fence_registers)
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F};
  float s[8][4];
  float(&s_flat)[32] = reinterpret_cast<float(&)[32]>(s);
  // P of the tile's 4 k16 steps as A operands of P·V, kept alive until the wait that covers P·V
  // (the tensor cores read them after the issuing instruction).
  uint32_t a_hp[4][4], a_none[1][4];

  mbar_wait</*kSuspend=*/false>(tiles.bar_query(), 0);
  FVA_VSA_FWD_TRACE(1);
  uint32_t phase = 0;  // of the K and V barriers, which complete once per listed block
  while (tile.valid()) {
    FVA_VSA_FWD_TILE_TRACE(0, tile.index);
    mbar_wait</*kSuspend=*/false>(tiles.bar_k(), phase);
    FVA_VSA_FWD_TILE_TRACE(1, tile.index);
    wgmma_fence();
    wgmma_tiles_abt<T, D>(s_flat, q_tile, k_tile);
    wgmma_commit();
    // The next tile, while S runs: the pop (a find-first-set, a shuffle and the window's test;
    // once per 32 tiles also the window's reads of the list's next entries and their blocks'
    // sizes, two dependent L2 round trips) overlaps the product instead of preceding the K wait.
    const auto next = list.pop();
    wgmma_wait<0>();
    fence_registers(s_flat);
    warpgroup_sync();
    FVA_VSA_FWD_TILE_TRACE(2, tile.index);
    if (loader && lane == 0) {
      if (next.valid())
        tiles.load(kK, &P.k, tiles.bar_k(), next.key0(), hk, b);
      else if (fuses_layer_gate_load(P.layer_gate))
        issue_layer_gate_load(P.layer_gate, p, tiles, kK);
    }

    // Mask (ragged blocks), softmax, P as the A operands of P·V.
    const int n_valid = tile.tokens();
    if (n_valid < 64) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (j * 8 + 2 * t + (e & 1) >= n_valid) s[j][e] = Schedule::kMaskedLogit;
    }
    float alpha[2];
    float l_unused[2] = {0.0f, 0.0f};  // kSumRows = false: o's last n8 block holds the sums
    online_softmax_step<T, kNT, /*kQuantizeP=*/false, /*kSumRows=*/false, /*kLazyRescale=*/true>(
        s, m, l_unused, alpha, p.scale_log2, a_hp, a_none, BlockScalesOnly{});
    // Skipped when no row of the warp moved its reference max (alpha exactly 1): with the lazy
    // rescale, rarely after a list's first tile. Each warp decides for its own rows (o is
    // complete: P·V was waited for), as the QAT forward does.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
      fence_registers(o);
      // Row g's elements are i with (i >> 1) & 1 == 0, the sums' block included (D / 2 % 4 == 0).
#pragma unroll
      for (int i = 0; i < kAcc; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    FVA_VSA_FWD_TILE_TRACE(3, tile.index);
    mbar_wait</*kSuspend=*/false>(tiles.bar_v(), phase);
    FVA_VSA_FWD_TILE_TRACE(4, tile.index);
    // 0 * NaN is not 0. (Its copy of V's address is opaque to the compiler: so the descriptors
    // below derive from a value of their own, which ptxas keeps in uniform registers.)
    // (tid too: otherwise the compiler hoists the zeroing's address arithmetic out of the loop, and
    // those registers are kept across every tile.)
    if (n_valid < 64)
      zero_tile_rows<L::kRegions>(opaque(v_tile), n_valid, static_cast<int>(opaque(tid)));
    {  // [o | l] += P·[V | ones]: the tile's 4 k16 steps (16 keys, 2048 bytes of V each)
      const uint64_t v_desc = mnmajor_tile_descriptor(v_tile);
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < 4; ++step)
        wgmma_rs_mn<T, D + 8>(o, a_hp[step], smem_descriptor_advance(v_desc, step * 2048));
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(o);
      keep_operands_alive(a_hp);
    }
    warpgroup_sync();
    FVA_VSA_FWD_TILE_TRACE(5, tile.index);
    if (loader && next.valid() && lane == 0)
      tiles.load(kV, &P.v, tiles.bar_v(), next.key0(), hk, b);
    phase ^= 1;
    tile = next;
  }

  FVA_VSA_FWD_TRACE(2);
  if (fuses_layer_output(P.layer_gate)) {
    // The VSA layer's call: its output pass beside o's (sm90/fused_layer_gate.cuh), the gate
    // from the K tile (K's barrier one phase after the last listed K: `phase`), out staged in
    // the V tile.
    const LayerOutputStage<T, D, L> layer(P.layer_gate, p, tiles, k_tile, v_tile, phase, t);
    store_forward_outputs_tma<T, D, L>(P, o, m, q_tile, tid, warp, g, t, layer);
  } else {
    store_forward_outputs_tma<T, D, L>(P, o, m, q_tile, tid, warp, g, t);
  }
  FVA_VSA_FWD_TRACE(3);
}

}  // namespace fva::dev::sm90
