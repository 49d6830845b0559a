// XLA FFI handlers of the whole VSA layer (fva_vsa_layer_forward / fva_vsa_layer_backward), with
// and without the gate, for the cpu and CUDA platforms. The config arrives as attributes
// softmax_scale (f32), block_size and topk (int32). The reserve is a uint8 buffer [B, Hq, R]
// (R bytes per batch element and q head, a multiple of 256, chosen at trace time so that the whole
// buffer, and the buffer of any batch and head shard, covers what fva_vsa_layer_sizes asks): a
// result of the forward, an operand of the backward, passed on as one block of B * Hq * R bytes;
// under vmap each batch element has its own [B, Hq, R] slice.
#include <utility>

#include "platforms.h"

namespace fvattn_jax {
namespace {

using ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

fva_vsa_layer_config_t layer_config(float softmax_scale, int32_t block_size, int32_t topk) {
  fva_vsa_layer_config_t c = FVA_VSA_LAYER_CONFIG_INIT;
  c.softmax_scale = softmax_scale;
  c.block_size = block_size;
  c.topk = topk;
  return c;
}

// The bytes of a byte operand's slice (the product of its base dimensions).
size_t slice_bytes(const fva_tensor_t* t) {
  size_t n = 1;
  for (int i = 0; i < t->rank; ++i) n *= static_cast<size_t>(t->shape[i]);
  return n;
}

// The reserve's base rank: [B, Hq, R].
constexpr int kReserveRank = 3;

ffi::Error forward(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, const AnyBuffer* gate,
                   AnyBuffer q_block_sizes, AnyBuffer kv_block_sizes, float scale,
                   int32_t block_size, int32_t topk, Ret out, Ret q2k_idx, Ret q2k_num,
                   Ret reserve) {
  const fva_vsa_layer_config_t cfg = layer_config(scale, block_size, topk);
  Operand oq, ok, ov, og, oqbs, okvbs, oo, oi, on, ores;
  FVATTN_JAX_TRY(make_operand("q", q, 4, &oq));
  FVATTN_JAX_TRY(make_operand("k", k, 4, &ok));
  FVATTN_JAX_TRY(make_operand("v", v, 4, &ov));
  if (gate) FVATTN_JAX_TRY(make_operand("gate", *gate, 4, &og));
  FVATTN_JAX_TRY(make_operand("q_block_sizes", q_block_sizes, 1, &oqbs));
  FVATTN_JAX_TRY(make_operand("kv_block_sizes", kv_block_sizes, 1, &okvbs));
  FVATTN_JAX_TRY(make_output("out", *out, 4, &oo));
  FVATTN_JAX_TRY(make_output("q2k_idx", *q2k_idx, 4, &oi));
  FVATTN_JAX_TRY(make_output("q2k_num", *q2k_num, 3, &on));
  FVATTN_JAX_TRY(make_bytes("reserve", *reserve, kReserveRank, true, &ores));
  const std::vector<const Operand*> ops{&oq,  &ok, &ov, gate ? &og : nullptr, &oqbs, &okvbs,
                                        &oo, &oi, &on, &ores};
  Batch batch;
  FVATTN_JAX_TRY(Batch::of(oo, ops, &batch));
  const fva_tensor_t tq = batch.slice(oq, 0), tk = batch.slice(ok, 0), tv = batch.slice(ov, 0);
  size_t ws_bytes = 0, reserve_bytes = 0;
  const fva_status_t st =
      fva_vsa_layer_sizes(ex.handle, &cfg, &tq, &tk, &tv, &ws_bytes, &reserve_bytes);
  if (st != FVA_OK) return status_error(st);
  return run_batched(ex, batch, ops, ws_bytes, [&](const auto& t, void* ws, size_t n) {
    return fva_vsa_layer_forward(ex.handle, &cfg, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7],
                                 t[8], t[9]->data, slice_bytes(t[9]), ws, n, ex.stream);
  });
}

ffi::Error backward(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, const AnyBuffer* gate,
                    AnyBuffer q_block_sizes, AnyBuffer kv_block_sizes, AnyBuffer dout,
                    AnyBuffer reserve, float scale, int32_t block_size, int32_t topk, Ret dq,
                    Ret dk, Ret dv, Ret* dgate) {
  const fva_vsa_layer_config_t cfg = layer_config(scale, block_size, topk);
  Operand oq, ok, ov, og, oqbs, okvbs, odo, ores, odq, odk, odv, odg;
  FVATTN_JAX_TRY(make_operand("q", q, 4, &oq));
  FVATTN_JAX_TRY(make_operand("k", k, 4, &ok));
  FVATTN_JAX_TRY(make_operand("v", v, 4, &ov));
  if (gate) FVATTN_JAX_TRY(make_operand("gate", *gate, 4, &og));
  FVATTN_JAX_TRY(make_operand("q_block_sizes", q_block_sizes, 1, &oqbs));
  FVATTN_JAX_TRY(make_operand("kv_block_sizes", kv_block_sizes, 1, &okvbs));
  FVATTN_JAX_TRY(make_operand("dout", dout, 4, &odo));
  FVATTN_JAX_TRY(make_bytes("reserve", reserve, kReserveRank, false, &ores));
  FVATTN_JAX_TRY(make_output("dq", *dq, 4, &odq));
  FVATTN_JAX_TRY(make_output("dk", *dk, 4, &odk));
  FVATTN_JAX_TRY(make_output("dv", *dv, 4, &odv));
  if (dgate) FVATTN_JAX_TRY(make_output("dgate", **dgate, 4, &odg));
  const std::vector<const Operand*> ops{&oq,   &ok,  &ov,  gate ? &og : nullptr, &oqbs, &okvbs, &odo,
                                        &ores, &odq, &odk, &odv, dgate ? &odg : nullptr};
  Batch batch;
  FVATTN_JAX_TRY(Batch::of(odq, ops, &batch));
  const fva_tensor_t tq = batch.slice(oq, 0), tk = batch.slice(ok, 0), tv = batch.slice(ov, 0);
  size_t ws_bytes = 0, reserve_bytes = 0;
  const fva_status_t st =
      fva_vsa_layer_sizes(ex.handle, &cfg, &tq, &tk, &tv, &ws_bytes, &reserve_bytes);
  if (st != FVA_OK) return status_error(st);
  return run_batched(ex, batch, ops, ws_bytes, [&](const auto& t, void* ws, size_t n) {
    return fva_vsa_layer_backward(ex.handle, &cfg, t[0], t[1], t[2], t[3], t[4], t[5], t[6],
                                  t[7]->data, slice_bytes(t[7]), t[8], t[9], t[10], t[11], ws, n,
                                  ex.stream);
  });
}

ffi::Error layer_forward(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, AnyBuffer qbs,
                         AnyBuffer kvbs, float scale, int32_t block_size, int32_t topk, Ret out,
                         Ret idx, Ret num, Ret reserve) {
  return forward(ex, q, k, v, nullptr, qbs, kvbs, scale, block_size, topk, out, idx, num, reserve);
}

ffi::Error layer_forward_gated(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v,
                               AnyBuffer gate, AnyBuffer qbs, AnyBuffer kvbs, float scale,
                               int32_t block_size, int32_t topk, Ret out, Ret idx, Ret num,
                               Ret reserve) {
  return forward(ex, q, k, v, &gate, qbs, kvbs, scale, block_size, topk, out, idx, num, reserve);
}

ffi::Error layer_backward(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, AnyBuffer qbs,
                          AnyBuffer kvbs, AnyBuffer dout, AnyBuffer reserve, float scale,
                          int32_t block_size, int32_t topk, Ret dq, Ret dk, Ret dv) {
  return backward(ex, q, k, v, nullptr, qbs, kvbs, dout, reserve, scale, block_size, topk, dq, dk,
                  dv, nullptr);
}

ffi::Error layer_backward_gated(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v,
                                AnyBuffer gate, AnyBuffer qbs, AnyBuffer kvbs, AnyBuffer dout,
                                AnyBuffer reserve, float scale, int32_t block_size, int32_t topk,
                                Ret dq, Ret dk, Ret dv, Ret dgate) {
  return backward(ex, q, k, v, &gate, qbs, kvbs, dout, reserve, scale, block_size, topk, dq, dk,
                  dv, &dgate);
}

template <typename B>
auto bind_config(B&& b) {
  return std::move(b)
      .template Attr<float>("softmax_scale")
      .template Attr<int32_t>("block_size")
      .template Attr<int32_t>("topk");
}
template <typename B>
auto bind_forward_results(B&& b) {
  return std::move(b)
      .template Ret<AnyBuffer>()   // out
      .template Ret<AnyBuffer>()   // q2k_idx
      .template Ret<AnyBuffer>()   // q2k_num
      .template Ret<AnyBuffer>();  // reserve
}
template <typename B>
auto bind_layer_forward(B&& b) {
  return bind_forward_results(bind_config(std::move(b)
                                              .template Arg<AnyBuffer>()    // q
                                              .template Arg<AnyBuffer>()    // k
                                              .template Arg<AnyBuffer>()    // v
                                              .template Arg<AnyBuffer>()    // q_block_sizes
                                              .template Arg<AnyBuffer>()));  // kv_block_sizes
}
template <typename B>
auto bind_layer_forward_gated(B&& b) {
  return bind_forward_results(bind_config(std::move(b)
                                              .template Arg<AnyBuffer>()    // q
                                              .template Arg<AnyBuffer>()    // k
                                              .template Arg<AnyBuffer>()    // v
                                              .template Arg<AnyBuffer>()    // gate
                                              .template Arg<AnyBuffer>()    // q_block_sizes
                                              .template Arg<AnyBuffer>()));  // kv_block_sizes
}
template <typename B>
auto bind_layer_backward(B&& b) {
  return bind_config(std::move(b)
                         .template Arg<AnyBuffer>()    // q
                         .template Arg<AnyBuffer>()    // k
                         .template Arg<AnyBuffer>()    // v
                         .template Arg<AnyBuffer>()    // q_block_sizes
                         .template Arg<AnyBuffer>()    // kv_block_sizes
                         .template Arg<AnyBuffer>()    // dout
                         .template Arg<AnyBuffer>())   // reserve
      .template Ret<AnyBuffer>()                       // dq
      .template Ret<AnyBuffer>()                       // dk
      .template Ret<AnyBuffer>();                      // dv
}
template <typename B>
auto bind_layer_backward_gated(B&& b) {
  return bind_config(std::move(b)
                         .template Arg<AnyBuffer>()    // q
                         .template Arg<AnyBuffer>()    // k
                         .template Arg<AnyBuffer>()    // v
                         .template Arg<AnyBuffer>()    // gate
                         .template Arg<AnyBuffer>()    // q_block_sizes
                         .template Arg<AnyBuffer>()    // kv_block_sizes
                         .template Arg<AnyBuffer>()    // dout
                         .template Arg<AnyBuffer>())   // reserve
      .template Ret<AnyBuffer>()                       // dq
      .template Ret<AnyBuffer>()                       // dk
      .template Ret<AnyBuffer>()                       // dv
      .template Ret<AnyBuffer>();                      // dgate
}

}  // namespace
}  // namespace fvattn_jax

FVATTN_JAX_HANDLERS(FvattnVsaLayerForward, fvattn_jax::layer_forward, fvattn_jax::bind_layer_forward);
FVATTN_JAX_HANDLERS(FvattnVsaLayerForwardGated, fvattn_jax::layer_forward_gated,
                    fvattn_jax::bind_layer_forward_gated);
FVATTN_JAX_HANDLERS(FvattnVsaLayerBackward, fvattn_jax::layer_backward, fvattn_jax::bind_layer_backward);
FVATTN_JAX_HANDLERS(FvattnVsaLayerBackwardGated, fvattn_jax::layer_backward_gated,
                    fvattn_jax::bind_layer_backward_gated);
