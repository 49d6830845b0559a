// XLA FFI handlers of QAT attention (forward with and without o_hp, backward) and of NVFP4 fake
// quantization, for the cpu and CUDA platforms. The config arrives as attributes: softmax_scale
// (f32) and flags (int32[8], fva_qat_config_t's int fields in struct order).
#include <utility>

#include "platforms.h"

namespace fvattn_jax {
namespace {

using ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;
using Flags = ffi::Span<const int32_t>;

ffi::Error qat_config(float softmax_scale, Flags flags, fva_qat_config_t* c) {
  if (flags.size() != 8)
    return ffi::Error::InvalidArgument("flags: fvattn's QAT handlers take 8 int32 flags");
  *c = fva_qat_config_t FVA_QAT_CONFIG_INIT;
  c->softmax_scale = softmax_scale;
  c->causal = flags[0];
  c->quantize = flags[1];
  c->smooth_k = flags[2];
  c->qkv_scale = flags[3];
  c->p_scale = flags[4];
  c->quantize_p_backward = flags[5];
  c->high_precision_o = flags[6];
  c->quantized_qkv_backward = flags[7];
  return ffi::Error::Success();
}

ffi::Error forward(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, float scale, Flags flags,
                   Ret o, Ret* o_hp, Ret lse) {
  fva_qat_config_t cfg;
  FVATTN_JAX_TRY(qat_config(scale, flags, &cfg));
  Operand oq, ok, ov, oo, ohp, ol;
  FVATTN_JAX_TRY(make_operand("q", q, 4, &oq));
  FVATTN_JAX_TRY(make_operand("k", k, 4, &ok));
  FVATTN_JAX_TRY(make_operand("v", v, 4, &ov));
  FVATTN_JAX_TRY(make_output("o", *o, 4, &oo));
  FVATTN_JAX_TRY(make_output("lse", *lse, 3, &ol));
  if (o_hp) FVATTN_JAX_TRY(make_output("o_hp", **o_hp, 4, &ohp));
  const std::vector<const Operand*> ops{&oq, &ok, &ov, &oo, o_hp ? &ohp : nullptr, &ol};
  Batch batch;
  FVATTN_JAX_TRY(Batch::of(oo, ops, &batch));
  const fva_tensor_t tq = batch.slice(oq, 0), tk = batch.slice(ok, 0), tv = batch.slice(ov, 0);
  size_t bytes = 0;
  const fva_status_t st = fva_qat_forward_workspace_size(ex.handle, &cfg, &tq, &tk, &tv, &bytes);
  if (st != FVA_OK) return status_error(st);
  return run_batched(ex, batch, ops, bytes, [&](const auto& t, void* ws, size_t ws_bytes) {
    return fva_qat_forward(ex.handle, &cfg, t[0], t[1], t[2], t[3], t[4], t[5], ws, ws_bytes, ex.stream);
  });
}

ffi::Error qat_forward(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, float scale,
                       Flags flags, Ret o, Ret lse) {
  return forward(ex, q, k, v, scale, flags, o, nullptr, lse);
}

ffi::Error qat_forward_hp(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, float scale,
                          Flags flags, Ret o, Ret o_hp, Ret lse) {
  return forward(ex, q, k, v, scale, flags, o, &o_hp, lse);
}

ffi::Error qat_backward(const Exec& ex, AnyBuffer q, AnyBuffer k, AnyBuffer v, AnyBuffer o_for_bwd,
                        AnyBuffer lse, AnyBuffer dout, float scale, Flags flags, Ret dq, Ret dk,
                        Ret dv) {
  fva_qat_config_t cfg;
  FVATTN_JAX_TRY(qat_config(scale, flags, &cfg));
  Operand oq, ok, ov, oob, ol, odo, odq, odk, odv;
  FVATTN_JAX_TRY(make_operand("q", q, 4, &oq));
  FVATTN_JAX_TRY(make_operand("k", k, 4, &ok));
  FVATTN_JAX_TRY(make_operand("v", v, 4, &ov));
  FVATTN_JAX_TRY(make_operand("o_for_bwd", o_for_bwd, 4, &oob));
  FVATTN_JAX_TRY(make_operand("lse", lse, 3, &ol));
  FVATTN_JAX_TRY(make_operand("dout", dout, 4, &odo));
  FVATTN_JAX_TRY(make_output("dq", *dq, 4, &odq));
  FVATTN_JAX_TRY(make_output("dk", *dk, 4, &odk));
  FVATTN_JAX_TRY(make_output("dv", *dv, 4, &odv));
  const std::vector<const Operand*> ops{&oq, &ok, &ov, &oob, &ol, &odo, &odq, &odk, &odv};
  Batch batch;
  FVATTN_JAX_TRY(Batch::of(odq, ops, &batch));
  const fva_tensor_t tq = batch.slice(oq, 0), tk = batch.slice(ok, 0), tv = batch.slice(ov, 0);
  size_t bytes = 0;
  const fva_status_t st = fva_qat_backward_workspace_size(ex.handle, &cfg, &tq, &tk, &tv, &bytes);
  if (st != FVA_OK) return status_error(st);
  return run_batched(ex, batch, ops, bytes, [&](const auto& t, void* ws, size_t ws_bytes) {
    return fva_qat_backward(ex.handle, &cfg, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8],
                            ws, ws_bytes, ex.stream);
  });
}

ffi::Error nvfp4_fake_quantize(const Exec& ex, AnyBuffer x, int32_t scale_mode, int32_t tile_tokens,
                               Ret y) {
  fva_nvfp4_config_t cfg = FVA_NVFP4_CONFIG_INIT;
  cfg.scale_mode = scale_mode;
  cfg.tile_tokens = tile_tokens;
  Operand ox, oy;
  FVATTN_JAX_TRY(make_operand("x", x, 4, &ox));
  FVATTN_JAX_TRY(make_output("y", *y, 4, &oy));
  const std::vector<const Operand*> ops{&ox, &oy};
  Batch batch;
  FVATTN_JAX_TRY(Batch::of(oy, ops, &batch));
  return run_batched(ex, batch, ops, 0, [&](const auto& t, void*, size_t) {
    return fva_nvfp4_fake_quantize(ex.handle, &cfg, t[0], t[1], ex.stream);
  });
}

template <typename B>
auto bind_forward(B&& b) {
  return std::move(b)
      .template Arg<AnyBuffer>()
      .template Arg<AnyBuffer>()
      .template Arg<AnyBuffer>()
      .template Attr<float>("softmax_scale")
      .template Attr<Flags>("flags");
}
template <typename B>
auto bind_qat_forward(B&& b) {
  return bind_forward(std::move(b)).template Ret<AnyBuffer>().template Ret<AnyBuffer>();
}
template <typename B>
auto bind_qat_forward_hp(B&& b) {
  return bind_forward(std::move(b))
      .template Ret<AnyBuffer>()
      .template Ret<AnyBuffer>()
      .template Ret<AnyBuffer>();
}
template <typename B>
auto bind_qat_backward(B&& b) {
  return std::move(b)
      .template Arg<AnyBuffer>()  // q
      .template Arg<AnyBuffer>()  // k
      .template Arg<AnyBuffer>()  // v
      .template Arg<AnyBuffer>()  // o_for_bwd
      .template Arg<AnyBuffer>()  // lse
      .template Arg<AnyBuffer>()  // dout
      .template Attr<float>("softmax_scale")
      .template Attr<Flags>("flags")
      .template Ret<AnyBuffer>()
      .template Ret<AnyBuffer>()
      .template Ret<AnyBuffer>();
}
template <typename B>
auto bind_nvfp4(B&& b) {
  return std::move(b)
      .template Arg<AnyBuffer>()
      .template Attr<int32_t>("scale_mode")
      .template Attr<int32_t>("tile_tokens")
      .template Ret<AnyBuffer>();
}

}  // namespace
}  // namespace fvattn_jax

FVATTN_JAX_HANDLERS(FvattnQatForward, fvattn_jax::qat_forward, fvattn_jax::bind_qat_forward);
FVATTN_JAX_HANDLERS(FvattnQatForwardHp, fvattn_jax::qat_forward_hp, fvattn_jax::bind_qat_forward_hp);
FVATTN_JAX_HANDLERS(FvattnQatBackward, fvattn_jax::qat_backward, fvattn_jax::bind_qat_backward);
FVATTN_JAX_HANDLERS(FvattnNvfp4FakeQuantize, fvattn_jax::nvfp4_fake_quantize, fvattn_jax::bind_nvfp4);
