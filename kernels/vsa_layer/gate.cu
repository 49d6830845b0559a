// The VSA layer's passes over whole [B, H, S, D] tensors (SPEC 3b), each a single pass that reads
// and writes every element once:
//   - forward, gate: out = dtype(dtype(out_c[block] * gate) + out_s)  (no gate: dtype(out_c + out_s)),
//     torch's two roundings (gate_combine8, layer_common.cuh); the sm_90a VSA forward fuses this
//     pass into its epilogue for the layer (sm90/fused_layer_gate.cuh), so it runs after the
//     portable fine forward only;
//   - backward, gate: dgate = dtype(dout * out_c[block]) and dout_c[i] = dtype(Σ over block i's 64
//     slots of dtype(dout * gate)) (no gate: of dout), the slots summed in order; and, since it
//     reads dout anyway, the fine backward's Delta = rowsum(out_s * dout) (fp32), so that the
//     fine backward needs no pass of its own over dout;
// (The block means' backward takes no pass of its own: the fine branch's backward adds each block's
// term as it writes dq, dk and dv, kern::BlockTerms.)
// A unit of work is one 64-slot block of one (b, h). Both passes move 16 bytes a thread (the API
// guarantees 16-byte aligned rows); in the backward a thread owns eight columns of the unit and
// sums their slots in order. The backward's kernels check the reserve's record first and write
// nothing when it is not this call's.
#include "vsa_layer/layer_common.cuh"

namespace fva::dev::layer {
namespace {

constexpr int kPassThreads = 128;

// ---- forward: out = out_c * gate + out_s -----------------------------------------------------------

template <typename T, int D>
__device__ __forceinline__ void gate_forward(const kern::LayerGateParams& p) {
  constexpr int kVecPerRow = D / 8;
  constexpr int kRowsPerPass = kPassThreads / kVecPerRow;  // 8 (D = 128) or 16 (D = 64)
  const int64_t unit = blockIdx.x;
  // The forward's last kernel: the reserve now holds all it records (shared/vsa_layer_params.h).
  if (unit == 0 && threadIdx.x == 0 && p.record != nullptr) *p.record = p.record_value;
  if (unit >= p.units) return;
  const int i = static_cast<int>(unit % p.nq);
  const int64_t bh = unit / p.nq;
  const int b = static_cast<int>(bh / p.Hq), h = static_cast<int>(bh % p.Hq);
  const int c = threadIdx.x % kVecPerRow, r0 = threadIdx.x / kVecPerRow;
  float oc[8];
  unpack8<T>(reinterpret_cast<const uint4*>(p.out_c)[(bh * p.nq + i) * kVecPerRow + c], oc);
  const uint4* out_s = reinterpret_cast<const uint4*>(p.out_s) + (bh * p.nq + i) * 64 * kVecPerRow + c;
  const bool gated = p.gate.data != nullptr;
#pragma unroll 4
  for (int r = r0; r < 64; r += kRowsPerPass) {
    const int64_t s = static_cast<int64_t>(i) * 64 + r;
    const uint4* gate =
        gated ? reinterpret_cast<const uint4*>(row_of(p.gate, b, h, s) + 8 * c) : nullptr;
    *reinterpret_cast<uint4*>(mutable_row_of(p.out, b, h, s) + 8 * c) =
        gate_combine8<T>(oc, out_s[r * kVecPerRow], gate);
  }
}

// ---- backward: dgate and dout_c ----------------------------------------------------------------------

template <typename T, int D>
__device__ __forceinline__ void gate_backward(const kern::LayerGateBackwardParams& p) {
  if (!reserve_matches(p.check)) return;
  constexpr int kThreadsPerUnit = D / 8;
  constexpr int kUnitsPerBlock = kPassThreads / kThreadsPerUnit;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kUnitsPerBlock + threadIdx.x / kThreadsPerUnit;
  if (unit >= p.units) return;
  const int i = static_cast<int>(unit % p.nq);
  const int64_t bh = unit / p.nq;
  const int b = static_cast<int>(bh / p.Hq), h = static_cast<int>(bh % p.Hq);
  const int c = threadIdx.x % kThreadsPerUnit;  // columns 8c .. 8c + 7
  float oc[8];
  unpack8<T>(reinterpret_cast<const uint4*>(p.out_c)[(bh * p.nq + i) * (D / 8) + c], oc);
  const bool gated = p.gate.data != nullptr;
  const int64_t s0 = static_cast<int64_t>(i) * 64;
  const uint16_t* dout = row_of(p.dout, b, h, s0) + 8 * c;
  const uint16_t* gate = gated ? row_of(p.gate, b, h, s0) + 8 * c : nullptr;
  uint16_t* dgate = gated ? mutable_row_of(p.dgate, b, h, s0) + 8 * c : nullptr;
  // The fine backward's Delta of the unit's 64 rows, where asked: out_s (contiguous) and its rows.
  const bool with_delta = p.delta != nullptr;
  const uint4* out_s =
      with_delta ? reinterpret_cast<const uint4*>(p.out_s) + (bh * p.nq + i) * 64 * (D / 8) + c : nullptr;
  float* delta = with_delta ? p.delta + (bh * p.nq + i) * 64 : nullptr;
  // The unit's lanes: an aligned group of kThreadsPerUnit in the warp, for the rows' sums.
  const unsigned unit_lanes = ((1u << kThreadsPerUnit) - 1u) << ((threadIdx.x & 31) & ~(kThreadsPerUnit - 1));
  float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  constexpr int kBatch = 4;  // slots whose loads are in flight together
  for (int r0 = 0; r0 < 64; r0 += kBatch) {
    uint4 wd[kBatch], wg[kBatch], wo[kBatch];
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      wd[r] = *reinterpret_cast<const uint4*>(dout + (r0 + r) * p.dout.stride_s);
      wg[r] = gated ? *reinterpret_cast<const uint4*>(gate + (r0 + r) * p.gate.stride_s)
                    : make_uint4(0u, 0u, 0u, 0u);
      wo[r] = with_delta ? out_s[(r0 + r) * (D / 8)] : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      float d[8];
      unpack8<T>(wd[r], d);
      if (gated) {
        float g[8], dg[8];
        unpack8<T>(wg[r], g);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          sum[e] += rnd<T>(d[e] * g[e]);
          dg[e] = d[e] * oc[e];
        }
        *reinterpret_cast<uint4*>(dgate + (r0 + r) * p.dgate.stride_s) = pack8<T>(dg);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[e] += d[e];
      }
      if (with_delta) {
        // Delta = rowsum(out_s * dout) in fp32, summed as the Delta kernel sums a row (dot8, then
        // lane_group_sum over the unit's lanes), so the fine backward gets the same bits.
        float o[8];
        unpack8<T>(wo[r], o);
        const float row_sum = lane_group_sum<kThreadsPerUnit>(dot8(o, d), unit_lanes);
        if (c == 0) delta[r0 + r] = row_sum;
      }
    }
  }
  reinterpret_cast<uint4*>(p.dout_c)[(bh * p.nq + i) * (D / 8) + c] = pack8<T>(sum);
}

}  // namespace
}  // namespace fva::dev::layer

#define FVA_LAYER_PASSES(dtype, T, D)                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                           \
      fva_layer_gate_fwd_##dtype##_d##D(const fva::kern::LayerGateParams p) {                 \
    fva::dev::enter_kernel_chain(); /* primitives/kernel_chain.cuh */                          \
    fva::dev::layer::gate_forward<T, D>(p);                                                    \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(128)                                           \
      fva_layer_gate_bwd_##dtype##_d##D(const fva::kern::LayerGateBackwardParams p) {         \
    /* Reads the call's inputs and the reserve, writes what no earlier kernel of the call */   \
    /* touches: it runs beside the kernel before it (the fine backward's k2q inverse). */      \
    fva::dev::run_beside_prior_kernels([&] { fva::dev::layer::gate_backward<T, D>(p); });     \
  }
FVA_LAYER_PASSES(bf16, fva::dev::Bf16, 64)
FVA_LAYER_PASSES(bf16, fva::dev::Bf16, 128)
FVA_LAYER_PASSES(f16, fva::dev::F16, 64)
FVA_LAYER_PASSES(f16, fva::dev::F16, 128)
#undef FVA_LAYER_PASSES
