// XLA FFI handlers of VSA block-sparse attention (forward, backward) and of its index inversion,
// for the cpu and CUDA platforms. The config arrives as attributes softmax_scale (f32) and
// block_size (int32).
#include <utility>

#include "platforms.h"

namespace fvattn_jax {
namespace {

using ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

fva_vsa_config_t vsa_config(float softmax_scale, int32_t block_size) {
  fva_vsa_config_t c = FVA_VSA_CONFIG_INIT;
  c.softmax_scale = softmax_scale;
  c.block_size = block_size;
  return c;
}

ffi::Error vsa_forward(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, AnyBuffer q2k_idx,
                       AnyBuffer q2k_num, AnyBuffer block_sizes, float scale, int32_t block_size,
                       Ret o, Ret lse) {
  const fva_vsa_config_t cfg = vsa_config(scale, block_size);
  Operand oq, ok, ov, oi, on, obs, oo, ol;
  FVATTN_JAX_TRY(make_operand("q", q, 4, &oq));
  FVATTN_JAX_TRY(make_operand("k", k, 4, &ok));
  FVATTN_JAX_TRY(make_operand("v", v, 4, &ov));
  FVATTN_JAX_TRY(make_operand("q2k_idx", q2k_idx, 4, &oi));
  FVATTN_JAX_TRY(make_operand("q2k_num", q2k_num, 3, &on));
  FVATTN_JAX_TRY(make_operand("block_sizes", block_sizes, 1, &obs));
  FVATTN_JAX_TRY(make_output("o", *o, 4, &oo));
  FVATTN_JAX_TRY(make_output("lse", *lse, 3, &ol));
  const std::vector<const Operand*> ops{&oq, &ok, &ov, &oi, &on, &obs, &oo, &ol};
  Batch batch;
  FVATTN_JAX_TRY(Batch::of(oo, ops, &batch));
  const fva_tensor_t tq = batch.slice(oq, 0), tk = batch.slice(ok, 0), tv = batch.slice(ov, 0),
                     ti = batch.slice(oi, 0);
  size_t bytes = 0;
  const fva_status_t st = fva_vsa_forward_workspace_size(ex.handle, &cfg, &tq, &tk, &tv, &ti, &bytes);
  if (st != FVA_OK) return status_error(st);
  return run_batched(ex, batch, ops, bytes, [&](const auto& t, void* ws, size_t ws_bytes) {
    return fva_vsa_forward(ex.handle, &cfg, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], ws,
                           ws_bytes, ex.stream);
  });
}

ffi::Error vsa_backward(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, AnyBuffer o,
                        AnyBuffer lse, AnyBuffer dout, AnyBuffer q2k_idx, AnyBuffer q2k_num,
                        AnyBuffer block_sizes, float scale, int32_t block_size, Ret dq, Ret dk,
                        Ret dv) {
  const fva_vsa_config_t cfg = vsa_config(scale, block_size);
  Operand oq, ok, ov, oo, ol, odo, oi, on, obs, odq, odk, odv;
  FVATTN_JAX_TRY(make_operand("q", q, 4, &oq));
  FVATTN_JAX_TRY(make_operand("k", k, 4, &ok));
  FVATTN_JAX_TRY(make_operand("v", v, 4, &ov));
  FVATTN_JAX_TRY(make_operand("o", o, 4, &oo));
  FVATTN_JAX_TRY(make_operand("lse", lse, 3, &ol));
  FVATTN_JAX_TRY(make_operand("dout", dout, 4, &odo));
  FVATTN_JAX_TRY(make_operand("q2k_idx", q2k_idx, 4, &oi));
  FVATTN_JAX_TRY(make_operand("q2k_num", q2k_num, 3, &on));
  FVATTN_JAX_TRY(make_operand("block_sizes", block_sizes, 1, &obs));
  FVATTN_JAX_TRY(make_output("dq", *dq, 4, &odq));
  FVATTN_JAX_TRY(make_output("dk", *dk, 4, &odk));
  FVATTN_JAX_TRY(make_output("dv", *dv, 4, &odv));
  const std::vector<const Operand*> ops{&oq, &ok, &ov, &oo, &ol, &odo, &oi, &on, &obs, &odq, &odk, &odv};
  Batch batch;
  FVATTN_JAX_TRY(Batch::of(odq, ops, &batch));
  const fva_tensor_t tq = batch.slice(oq, 0), tk = batch.slice(ok, 0), tv = batch.slice(ov, 0),
                     ti = batch.slice(oi, 0);
  size_t bytes = 0;
  const fva_status_t st = fva_vsa_backward_workspace_size(ex.handle, &cfg, &tq, &tk, &tv, &ti, &bytes);
  if (st != FVA_OK) return status_error(st);
  return run_batched(ex, batch, ops, bytes, [&](const auto& t, void* ws, size_t ws_bytes) {
    return fva_vsa_backward(ex.handle, &cfg, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8],
                            t[9], t[10], t[11], ws, ws_bytes, ex.stream);
  });
}

ffi::Error vsa_invert_indices(const Exec& ex, AnyBuffer q2k_idx, AnyBuffer q2k_num, Ret k2q_idx,
                              Ret k2q_num) {
  Operand oi, on, oki, okn;
  FVATTN_JAX_TRY(make_operand("q2k_idx", q2k_idx, 4, &oi));
  FVATTN_JAX_TRY(make_operand("q2k_num", q2k_num, 3, &on));
  FVATTN_JAX_TRY(make_output("k2q_idx", *k2q_idx, 4, &oki));
  FVATTN_JAX_TRY(make_output("k2q_num", *k2q_num, 3, &okn));
  const std::vector<const Operand*> ops{&oi, &on, &oki, &okn};
  Batch batch;
  FVATTN_JAX_TRY(Batch::of(oki, ops, &batch));
  const fva_tensor_t ti = batch.slice(oi, 0), tki = batch.slice(oki, 0);
  size_t bytes = 0;
  const fva_status_t st = fva_vsa_invert_indices_workspace_size(ex.handle, &ti, &tki, &bytes);
  if (st != FVA_OK) return status_error(st);
  return run_batched(ex, batch, ops, bytes, [&](const auto& t, void* ws, size_t ws_bytes) {
    return fva_vsa_invert_indices(ex.handle, t[0], t[1], t[2], t[3], ws, ws_bytes, ex.stream);
  });
}

template <typename B>
auto bind_vsa_forward(B&& b) {
  return std::move(b)
      .template Arg<AnyBuffer>()  // q
      .template Arg<AnyBuffer>()  // k
      .template Arg<AnyBuffer>()  // v
      .template Arg<AnyBuffer>()  // q2k_idx
      .template Arg<AnyBuffer>()  // q2k_num
      .template Arg<AnyBuffer>()  // block_sizes
      .template Attr<float>("softmax_scale")
      .template Attr<int32_t>("block_size")
      .template Ret<AnyBuffer>()  // o
      .template Ret<AnyBuffer>();  // lse
}
template <typename B>
auto bind_vsa_backward(B&& b) {
  return std::move(b)
      .template Arg<AnyBuffer>()  // q
      .template Arg<AnyBuffer>()  // k
      .template Arg<AnyBuffer>()  // v
      .template Arg<AnyBuffer>()  // o
      .template Arg<AnyBuffer>()  // lse
      .template Arg<AnyBuffer>()  // dout
      .template Arg<AnyBuffer>()  // q2k_idx
      .template Arg<AnyBuffer>()  // q2k_num
      .template Arg<AnyBuffer>()  // block_sizes
      .template Attr<float>("softmax_scale")
      .template Attr<int32_t>("block_size")
      .template Ret<AnyBuffer>()  // dq
      .template Ret<AnyBuffer>()  // dk
      .template Ret<AnyBuffer>();  // dv
}
template <typename B>
auto bind_vsa_invert(B&& b) {
  return std::move(b)
      .template Arg<AnyBuffer>()  // q2k_idx
      .template Arg<AnyBuffer>()  // q2k_num
      .template Ret<AnyBuffer>()  // k2q_idx
      .template Ret<AnyBuffer>();  // k2q_num
}

}  // namespace
}  // namespace fvattn_jax

FVATTN_JAX_HANDLERS(FvattnVsaForward, fvattn_jax::vsa_forward, fvattn_jax::bind_vsa_forward);
FVATTN_JAX_HANDLERS(FvattnVsaBackward, fvattn_jax::vsa_backward, fvattn_jax::bind_vsa_backward);
FVATTN_JAX_HANDLERS(FvattnVsaInvertIndices, fvattn_jax::vsa_invert_indices, fvattn_jax::bind_vsa_invert);
