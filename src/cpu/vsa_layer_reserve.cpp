// The CPU VSA layer's reserve (vsa_layer_reserve.h): its size, its regions as views, and the record
// by which the backward recognizes a reserve written by a forward of the same problem.
#include <cstring>

#include "cpu_ops.h"
#include "error.h"
#include "vsa_layer_common.h"

namespace fva::cpu {
namespace vsa_layer {
namespace {

// A contiguous [n0, n1, n2, n3] view over `data`.
template <typename View>
View contiguous(void* data, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
  View v;
  using Data = decltype(v.data);
  v.data = static_cast<Data>(data);
  const int64_t shape[4] = {n0, n1, n2, n3};
  const int64_t stride[4] = {n1 * n2 * n3, n2 * n3, n3, 1};
  for (int i = 0; i < 4; ++i) v.shape[i] = shape[i], v.stride[i] = stride[i];
  return v;
}

AttnView attn_view(void* data, int32_t dtype, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
  AttnView v = contiguous<AttnView>(data, n0, n1, n2, n3);
  v.dtype = dtype;
  return v;
}

}  // namespace

Reserve reserve_views(const VsaLayerProblem& p, void* reserve) {
  const VsaProblem& f = p.fine;
  const VsaLayerReserveLayout l = vsa_layer_reserve_layout(p);
  char* base = static_cast<char*>(reserve);
  const int64_t nq = f.num_q_blocks, nkv = f.num_kv_blocks, S = nq * kBlock;
  Reserve r;
  r.record = reinterpret_cast<kern::LayerReserveHeader*>(base + l.record);
  r.q_c = attn_view(base + l.q_c, f.dtype, f.B, f.Hq, nq, f.D);
  r.k_c = attn_view(base + l.k_c, f.dtype, f.B, f.Hkv, nkv, f.D);
  r.v_c = attn_view(base + l.v_c, f.dtype, f.B, f.Hkv, nkv, f.D);
  r.attn = attn_view(base + l.attn, f.dtype, f.B, f.Hq, nq, nkv);
  r.out_c = attn_view(base + l.out_c, f.dtype, f.B, f.Hq, nq, f.D);
  r.out_s = attn_view(base + l.out_s, f.dtype, f.B, f.Hq, S, f.D);
  r.q2k_idx = contiguous<I32View>(base + l.q2k_idx, f.B, f.Hq, nq, p.topk);
  r.q2k_idx.rank = 4;
  r.q2k_num = contiguous<I32View>(base + l.q2k_num, f.B, f.Hq, nq, 1);
  r.q2k_num.rank = 3;
  r.lse_s = contiguous<F32View>(base + l.lse_s, f.B, f.Hq, S, 1);
  r.lse_s.rank = 3;
  return r;
}

}  // namespace vsa_layer

size_t vsa_layer_reserve_bytes(const VsaLayerProblem& p) { return vsa_layer_reserve_layout(p).bytes; }

// Only the fine branch's backward needs scratch (the forward's fine branch needs none); the coarse
// branch's few values per (batch, head) live on the heap.
size_t vsa_layer_workspace(const VsaLayerProblem& p) { return vsa_backward_workspace(p.fine); }

void check_vsa_layer_reserve(const VsaLayerProblem& p, const void* reserve) {
  kern::LayerReserveHeader got;
  std::memcpy(&got, static_cast<const char*>(reserve) + vsa_layer_reserve_layout(p).record, sizeof got);
  const kern::LayerReserveHeader want = vsa_layer_record(p);
  if (got.magic != want.magic || got.version != want.version)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "reserve: holds no record of fva_vsa_layer_forward (pass the reserve a forward on this "
         "handle's backend filled, unchanged)");
  auto same = [](const char* what, int64_t forward, int64_t now) {
    if (forward != now)
      fail(FVA_ERR_INVALID_ARGUMENT,
           "reserve: was written by a forward with {} = {} but this call has {} = {} (pass the "
           "reserve of the forward with the same q, k, v, config and gate)",
           what, forward, what, now);
  };
  same("B", got.B, want.B);
  same("Hq", got.Hq, want.Hq);
  same("Hkv", got.Hkv, want.Hkv);
  same("num_q_blocks", got.nq, want.nq);
  same("num_kv_blocks", got.nkv, want.nkv);
  same("D", got.D, want.D);
  same("dtype", got.dtype, want.dtype);
  same("topk (at most num_kv_blocks)", got.topk, want.topk);
  if (got.scale_bits != want.scale_bits) {
    float forward_scale;
    std::memcpy(&forward_scale, &got.scale_bits, sizeof forward_scale);
    fail(FVA_ERR_INVALID_ARGUMENT,
         "reserve: was written by a forward with softmax scale {} but this call's is {} (pass the "
         "reserve of the forward with the same config)",
         forward_scale, p.fine.scale);
  }
  if (got.gate != want.gate)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "reserve: was written by a forward {} a gate but this call passes {} (gate must be given "
         "to both calls or to neither)",
         got.gate ? "with" : "without", want.gate ? "one" : "gate = NULL");
}

}  // namespace fva::cpu
