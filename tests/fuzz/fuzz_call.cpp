#include "fuzz_call.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>

#include "tensor_desc.h"

namespace fvafuzz {
namespace {

// ---- values -----------------------------------------------------------------------------------

int64_t interesting64(ByteReader& in) {
  return in.pick<int64_t>({0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 63, 64, 65, 127, 128, 256, 4096,
                           (int64_t{1} << 31) - 1, int64_t{1} << 31, int64_t{1} << 32,
                           int64_t{1} << 55, int64_t{1} << 56, (int64_t{1} << 56) + 1,
                           int64_t{1} << 62, std::numeric_limits<int64_t>::max() - 1,
                           std::numeric_limits<int64_t>::max(), -1, -2, -16,
                           std::numeric_limits<int64_t>::min()});
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint32_t interesting32(ByteReader& in) {
  const float inf = std::numeric_limits<float>::infinity();
  return in.pick<uint32_t>({0u, 1u, 2u, 3u, 0xffffffffu, 0x80000000u, 0x7fffffffu, 4u, 8u, 11u, 12u,
                            16u, 17u, 31u, 32u, 39u, 40u, 41u, 63u, 64u, 65u, 1000u,
                            float_bits(1.0f), float_bits(-1.0f), float_bits(0.125f),
                            float_bits(-0.0f), float_bits(inf), float_bits(-inf),
                            float_bits(std::nanf("")), float_bits(3.0e38f), float_bits(1e-40f)});
}

// ---- problems -----------------------------------------------------------------------------------

Dims read_layout(ByteReader& in) {
  Dims d;
  const uint8_t c = in.u8();
  d.dtype = (c & 1) ? FVA_DTYPE_F16 : FVA_DTYPE_BF16;
  d.bshd = (c & 2) != 0;
  d.pad = (c & 4) ? 8 : 0;
  d.B = 1 + in.u8() % 2;
  d.Hkv = 1 + in.u8() % 2;
  d.Hq = d.Hkv * (1 + in.u8() % 3);
  return d;
}

// [B, H, S, D] in the chosen layout, every row followed by `pad` unused elements.
fva_tensor_t attn(const Dims& d, int64_t H, int64_t S) {
  return fvadesc::attention_layout(nullptr, d.dtype, d.B, H, S, d.D, d.bshd, d.pad);
}

// A contiguous tensor; its data pointer is set by Arenas::place.
fva_tensor_t contiguous(int32_t dtype, const std::vector<int64_t>& shape) {
  return fvadesc::contiguous(nullptr, dtype, shape);
}

// a + b modulo 2^64 (a may already be an extreme value).
int64_t wrapping_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

void mutate_tensor(Call& c, Arg& a, ByteReader& in) {
  const int d = in.u8() % FVA_MAX_RANK;
  switch (in.u8() % 13) {
    case 0: a.desc.rank = static_cast<int32_t>(interesting32(in)); break;
    case 1: a.desc.dtype = in.pick<int32_t>({0, 1, 2, 3, 4, 5, 6, 31, 32, -1, INT32_MIN}); break;
    case 2: a.desc.shape[d] = interesting64(in); break;
    case 3: a.desc.strides[d] = interesting64(in); break;
    case 4: a.desc.shape[d] = wrapping_add(a.desc.shape[d], in.pick<int64_t>({-1, 1, -2, 2, 64, -64})); break;
    case 5: a.desc.strides[d] = wrapping_add(a.desc.strides[d], in.pick<int64_t>({8, -8, 1, -1, 16, 64})); break;
    case 6: a.ptr = PtrKind::kNull; break;
    case 7: a.ptr = PtrKind::kOdd, a.odd = 1 + in.u8() % 15; break;
    case 8: a.ptr = PtrKind::kTop, a.top_gap = 16 * (1 + uint64_t{in.u8()}); break;
    case 9: {  // share another argument's memory, at its offset or a little after
      const Arg& b = c.args[in.u8() % c.args.size()];
      a.arena = b.arena;
      a.offset = b.offset + 16 * static_cast<uint64_t>(in.u8() % 4);
      break;
    }
    case 10: a.pass_null = true; break;
    case 11: {  // take another argument's geometry (agreeing, or not, with the rest)
      const Arg& b = c.args[in.u8() % c.args.size()];
      a.desc.rank = b.desc.rank;
      std::memcpy(a.desc.shape, b.desc.shape, sizeof a.desc.shape);
      std::memcpy(a.desc.strides, b.desc.strides, sizeof a.desc.strides);
      break;
    }
    case 12: {  // swap two dimensions' strides (a permuted layout, or an overlapping one)
      const int e = in.u8() % FVA_MAX_RANK;
      std::swap(a.desc.strides[d], a.desc.strides[e]);
      break;
    }
  }
}

void mutate(Call& c, ByteReader& in) {
  const int n = in.u8() % 9;
  for (int m = 0; m < n; ++m) {
    const size_t target = in.u8() % (c.args.size() + 3);
    if (target < c.args.size()) {
      mutate_tensor(c, c.args[target], in);
    } else if (target == c.args.size()) {  // the config
      if (c.cfg.empty()) continue;
      const uint8_t kind = in.u8() % 3;
      if (kind == 0) {
        c.cfg_null = true;
      } else {  // field 0 is struct_size
        const size_t field = kind == 1 ? 0 : in.u8() % (c.cfg.size() / 4);
        const uint32_t v = interesting32(in);
        std::memcpy(c.cfg.data() + 4 * field, &v, 4);
      }
    } else if (target == c.args.size() + 1) {
      const uint8_t kind = in.u8() % 7;
      if (kind < 2) c.ws_ptr = 1 + kind;
      else c.ws_size = kind - 1;
    } else {
      c.handle_null = true;
    }
  }
}

// ---- filling the arenas -------------------------------------------------------------------------

struct Rng {  // xorshift64*: deterministic per input
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
};

// bf16/f16 bits: mostly moderate values of either sign, at `special_rate`/256 an inf, NaN, zero,
// subnormal or the largest finite value (of either format: the bits mean different things in each).
uint16_t half_bits(int32_t dtype, Rng& r, int special_rate) {
  static const uint16_t kSpecials[] = {0x7f80, 0xff80, 0x7fc0, 0xffff, 0x0000,
                                       0x8000, 0x7bff, 0x0001, 0x7f7f, 0x7c00};
  const uint64_t x = r.next();
  if (static_cast<int>(x % 256) < special_rate) return kSpecials[(x >> 8) % 10];
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  if (dtype == FVA_DTYPE_F16)  // |x| in [2^-3, 2^2)
    return static_cast<uint16_t>(sign | ((12 + (x >> 20) % 5) << 10) | ((x >> 24) & 0x3ff));
  return static_cast<uint16_t>(sign | ((124 + (x >> 20) % 5) << 7) | ((x >> 24) & 0x7f));
}

float lse_value(Rng& r, int special_rate) {
  const uint64_t x = r.next();
  if (static_cast<int>(x % 256) < special_rate) {
    const float inf = std::numeric_limits<float>::infinity();
    const float specials[] = {-inf, inf, std::nanf(""), 0.0f, -0.0f, 3.0e38f};
    return specials[(x >> 8) % 6];
  }
  return static_cast<float>((x >> 11) % 16000) / 1000.0f - 4.0f;
}

// Index metadata from the input's last bytes: mostly in range, sometimes not (SPEC section 3 and
// the header: out-of-range entries are skipped, counts clamped to [0, max_k], sizes to [0, 64]).
int32_t index_value(Fill f, const Dims& d, int64_t i, uint8_t v) {
  const int64_t nkv = std::max<int64_t>(d.num_kv_blocks, 1), max_k = std::max<int64_t>(d.max_k, 1);
  if (v < 200) {
    switch (f) {
      case Fill::kIndex: return static_cast<int32_t>((v + i % max_k) % nkv);  // zeros: 0, 1, 2, ...
      case Fill::kCount: return static_cast<int32_t>(max_k - v % (max_k + 1));  // zeros: full lists
      default: return static_cast<int32_t>(64 - v % 65);                        // zeros: full blocks
    }
  }
  const int32_t wild[] = {-1, static_cast<int32_t>(nkv), static_cast<int32_t>(max_k + 1), 65, INT32_MAX,
                          INT32_MIN, -64, 1 << 20};
  return wild[v % 8];
}

void fill_arenas(const Call& c, const Arenas& arenas, ByteReader& in) {
  Rng rng{0x9E3779B97F4A7C15ull ^ in.u32()};
  const int special_rate = in.u8() % 32;  // out of 256 values: NaN, inf, extremes
  std::vector<int> owner(arenas.count(), -1);
  for (size_t i = 0; i < c.args.size(); ++i) {
    const size_t j = static_cast<size_t>(c.args[i].arena);
    if (owner[j] < 0 && c.args[i].ptr == PtrKind::kArena) owner[j] = static_cast<int>(i);
  }
  for (size_t j = 0; j < arenas.count(); ++j) {
    uint8_t* p = arenas.data(j);
    const size_t n = arenas.size(j);
    if (!p || n == 0) continue;
    std::memset(p, 0xA5, n);
    if (owner[j] < 0) continue;
    const Fill f = c.fills[static_cast<size_t>(owner[j])];
    const int32_t dtype = c.args[static_cast<size_t>(owner[j])].desc.dtype;
    if (f == Fill::kAttnIn) {
      for (size_t b = 0; b + 2 <= n; b += 2) {
        const uint16_t h = half_bits(dtype, rng, special_rate);
        std::memcpy(p + b, &h, 2);
      }
    } else if (f == Fill::kLseIn) {
      for (size_t b = 0; b + 4 <= n; b += 4) {
        const float x = lse_value(rng, special_rate);
        std::memcpy(p + b, &x, 4);
      }
    } else if (f != Fill::kOutput) {
      for (size_t b = 0; b + 4 <= n; b += 4) {
        const int32_t x = index_value(f, c.dims, static_cast<int64_t>(b / 4), in.u8());
        std::memcpy(p + b, &x, 4);
      }
    }
  }
}

// ---- the operations' problems ------------------------------------------------------------------------

// B·Hq·Sq·D·Skv: the multiply-adds of one attention product, from q and k.
double qat_work(const Call& c) {
  return extent_product(c.args[0].desc, 4) *
         static_cast<double>(std::max<int64_t>(c.args[1].desc.shape[2], 1));
}

void build_qat(Call& c, ByteReader& in, bool backward) {
  Dims& d = c.dims;
  d = read_layout(in);
  d.D = in.pick<int64_t>({16, 32, 64, 128, 256});
  d.Sq = 1 + in.u8() % 72;
  d.Skv = 1 + in.u8() % 72;
  fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
  const uint8_t f = in.u8();
  cfg.causal = f & 1;
  cfg.quantize = (f >> 1) & 1;
  cfg.smooth_k = (f >> 2) & 1;
  cfg.qkv_scale = (f >> 3) & 1;
  cfg.p_scale = ((f >> 4) & 3) % 3;
  cfg.quantize_p_backward = (f >> 6) & 1;
  cfg.high_precision_o = (f >> 7) & 1;
  cfg.quantized_qkv_backward = in.u8() & 1;
  cfg.softmax_scale = in.pick<float>({0.0f, 0.125f, 1.0f, 0.01f});
  c.set_config(cfg);
  c.add("q", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("k", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  c.add("v", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  const fva_tensor_t lse = contiguous(FVA_DTYPE_F32, {d.B, d.Hq, d.Sq});
  if (!backward) {
    c.add("o", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("o_hp", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.args.back().pass_null = !cfg.high_precision_o;
    c.add("lse", lse, Fill::kOutput);
    c.budget_null = 5;
  } else {
    c.add("o_for_bwd", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
    c.add("lse", lse, Fill::kLseIn);
    c.add("dout", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
    c.add("dq", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("dk", attn(d, d.Hkv, d.Skv), Fill::kOutput);
    c.add("dv", attn(d, d.Hkv, d.Skv), Fill::kOutput);
    c.budget_null = 8;
  }
}

void build_vsa(Call& c, ByteReader& in, bool backward) {
  Dims& d = c.dims;
  d = read_layout(in);
  d.D = in.pick<int64_t>({64, 128});
  const int64_t nqb = 1 + in.u8() % 2;
  d.num_kv_blocks = 1 + in.u8() % 3;
  d.max_k = 1 + in.u8() % 4;
  d.Sq = 64 * nqb;
  d.Skv = 64 * d.num_kv_blocks;
  fva_vsa_config_t cfg = FVA_VSA_CONFIG_INIT;
  cfg.softmax_scale = in.pick<float>({0.0f, 0.125f, 1.0f});
  c.set_config(cfg);
  c.add("q", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("k", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  c.add("v", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  const fva_tensor_t idx = contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb, d.max_k});
  const fva_tensor_t num = contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb});
  const fva_tensor_t sizes = contiguous(FVA_DTYPE_I32, {d.num_kv_blocks});
  const fva_tensor_t lse = contiguous(FVA_DTYPE_F32, {d.B, d.Hq, d.Sq});
  if (!backward) {
    c.add("q2k_idx", idx, Fill::kIndex);
    c.add("q2k_num", num, Fill::kCount);
    c.add("block_sizes", sizes, Fill::kBlockSizes);
    c.add("o", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("lse", lse, Fill::kOutput);
    c.budget_null = 7;
  } else {
    c.add("o", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
    c.add("lse", lse, Fill::kLseIn);
    c.add("dout", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
    c.add("q2k_idx", idx, Fill::kIndex);
    c.add("q2k_num", num, Fill::kCount);
    c.add("block_sizes", sizes, Fill::kBlockSizes);
    c.add("dq", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("dk", attn(d, d.Hkv, d.Skv), Fill::kOutput);
    c.add("dv", attn(d, d.Hkv, d.Skv), Fill::kOutput);
    c.budget_null = 11;
  }
}

void build_invert(Call& c, ByteReader& in) {
  Dims& d = c.dims;
  d.B = 1 + in.u8() % 2;
  d.Hq = 1 + in.u8() % 3;
  const int64_t nqb = 1 + in.u8() % 4;
  d.num_kv_blocks = 1 + in.u8() % 4;
  d.max_k = 1 + in.u8() % 6;
  c.add("q2k_idx", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb, d.max_k}), Fill::kIndex);
  c.add("q2k_num", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb}), Fill::kCount);
  c.add("k2q_idx", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, d.num_kv_blocks, nqb}), Fill::kOutput);
  c.add("k2q_num", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, d.num_kv_blocks}), Fill::kOutput);
  c.budget_null = 3;
}

void build_nvfp4(Call& c, ByteReader& in) {
  Dims& d = c.dims;
  d = read_layout(in);
  d.D = in.pick<int64_t>({16, 32, 48, 64, 128});
  d.Sq = 1 + in.u8() % 72;
  fva_nvfp4_config_t cfg = FVA_NVFP4_CONFIG_INIT;
  cfg.scale_mode = in.u8() % 2;
  cfg.tile_tokens = 1 + in.u8() % 40;
  c.set_config(cfg);
  c.add("x", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("y", attn(d, d.Hq, d.Sq), Fill::kOutput);
  if (in.u8() & 1) c.args[1].arena = 0;  // in place: y is x
  c.budget_null = 1;
}

// The sizes of a valid layer problem (a query reads no tensor memory: the data pointers only have
// to pass the checks).
bool layer_sizes(fva_handle_t h, const fva_vsa_layer_config_t& cfg, const Dims& d, size_t* ws,
                 size_t* reserve) {
  fva_tensor_t q = attn(d, d.Hq, d.Sq), k = attn(d, d.Hkv, d.Skv);
  q.data = k.data = reinterpret_cast<void*>(uintptr_t{1} << 20);
  return fva_vsa_layer_sizes(h, &cfg, &q, &k, &k, ws, reserve) == FVA_OK;
}

// The whole VSA layer. Arguments: q, k, v, gate, q_block_sizes, kv_block_sizes, then forward: out,
// q2k_idx, q2k_num, reserve; backward: dout, reserve, dq, dk, dv, dgate. The backward's reserve is
// filled by a forward over the same arenas first (or by one with the gate or topk changed, or not
// at all: prepare_call), so the backward meets real records, mismatched ones and garbage.
void build_layer(Call& c, ByteReader& in, bool backward, fva_handle_t sizes) {
  Dims& d = c.dims;
  d = read_layout(in);
  d.D = in.pick<int64_t>({64, 128});
  const int64_t nqb = 1 + in.u8() % 2;
  d.num_kv_blocks = 1 + in.u8() % 3;
  d.Sq = 64 * nqb;
  d.Skv = 64 * d.num_kv_blocks;
  fva_vsa_layer_config_t cfg = FVA_VSA_LAYER_CONFIG_INIT;
  cfg.topk = in.pick<int32_t>({1, 2, 3, 5});
  cfg.softmax_scale = in.pick<float>({0.0f, 0.125f, 1.0f});
  d.max_k = std::min<int64_t>(cfg.topk, d.num_kv_blocks);
  const uint8_t flags = in.u8();
  const bool gate = (flags & 1) == 0;
  c.reserve_size = (flags >> 1) % 4;
  const int prepare_mode = (flags >> 3) % 4;
  size_t ws_need = 0, reserve_need = 0;
  if (!layer_sizes(sizes, cfg, d, &ws_need, &reserve_need))
    finding("fva_vsa_layer_sizes refused a valid problem");
  c.set_config(cfg);
  c.add("q", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("k", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  c.add("v", attn(d, d.Hkv, d.Skv), Fill::kAttnIn);
  c.add("gate", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.args.back().pass_null = !gate;
  c.add("q_block_sizes", contiguous(FVA_DTYPE_I32, {nqb}), Fill::kBlockSizes);
  c.add("kv_block_sizes", contiguous(FVA_DTYPE_I32, {d.num_kv_blocks}), Fill::kBlockSizes);
  const fva_tensor_t reserve = contiguous(FVA_DTYPE_I32, {static_cast<int64_t>(reserve_need / 4)});
  if (!backward) {
    c.add("out", attn(d, d.Hq, d.Sq), Fill::kOutput);
    c.add("q2k_idx", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb, d.max_k}), Fill::kOutput);
    c.add("q2k_num", contiguous(FVA_DTYPE_I32, {d.B, d.Hq, nqb}), Fill::kOutput);
    c.add("reserve", reserve, Fill::kOutput);
    c.reserve_arg = 9;
    c.budget_null = 6;
    return;
  }
  c.add("dout", attn(d, d.Hq, d.Sq), Fill::kAttnIn);
  c.add("reserve", reserve, Fill::kLseIn);  // overwritten by prepare_call's forward
  c.reserve_arg = 7;
  c.add("dq", attn(d, d.Hq, d.Sq), Fill::kOutput);
  c.add("dk", attn(d, d.Hkv, d.Skv), Fill::kOutput);
  c.add("dv", attn(d, d.Hkv, d.Skv), Fill::kOutput);
  c.add("dgate", attn(d, d.Hq, d.Sq), Fill::kOutput);
  c.args.back().pass_null = !gate;
  c.budget_null = 10;
  c.prepare_mode = prepare_mode;
}

// The VSA layer's fine branch (as VSA's) plus the coarse attention's few products.
double layer_work(const Call& c, double per_entry) {
  return per_entry * extent_product(c.args[0].desc, 4) * 64 *
             static_cast<double>(std::max<int64_t>(c.dims.max_k, 1)) +
         4 * extent_product(c.args[0].desc, 4) *
             static_cast<double>(std::max<int64_t>(c.args[1].desc.shape[2], 1)) / 64;
}

// VSA: each listed entry costs three (forward) or about ten (backward) 64x64xD block products: per
// q block row, 64·D multiply-adds per product and entry, at most max_k entries.
double vsa_work(const Call& c, size_t idx_arg, double per_entry) {
  return per_entry * extent_product(c.args[0].desc, 4) * 64 *
         static_cast<double>(std::max<int64_t>(c.args[idx_arg].desc.shape[3], 1));
}

template <typename Config>
const Config* as(const void* p) {
  return static_cast<const Config*>(p);
}

}  // namespace

void Call::add(const char* name, const fva_tensor_t& t, Fill fill) {
  Arg a;
  a.name = name;
  a.is_output = fill == Fill::kOutput;
  a.desc = t;
  a.arena = static_cast<int>(args.size());
  args.push_back(a);
  fills.push_back(fill);
}

Kind read_kind(ByteReader& in) { return static_cast<Kind>(in.u8() % kKinds); }

bool is_tensor_op(Kind k) { return k != Kind::kHandles && k != Kind::kMisc && k != Kind::kTilePlan; }

const char* op_name(Kind k) {
  switch (k) {
    case Kind::kQatForward: return "fva_qat_forward";
    case Kind::kQatBackward: return "fva_qat_backward";
    case Kind::kVsaForward: return "fva_vsa_forward";
    case Kind::kVsaBackward: return "fva_vsa_backward";
    case Kind::kInvert: return "fva_vsa_invert_indices";
    case Kind::kNvfp4: return "fva_nvfp4_fake_quantize";
    case Kind::kHandles: return "fva_create";
    case Kind::kMisc: return "misc";
    case Kind::kLayerForward: return "fva_vsa_layer_forward";
    case Kind::kLayerBackward: return "fva_vsa_layer_backward";
    case Kind::kTilePlan: return "fva_vsa_tile_plan";
  }
  return "?";
}

double call_work(const Call& c) {
  switch (c.kind) {
    case Kind::kQatForward: return 2 * qat_work(c);
    case Kind::kQatBackward: return 5 * qat_work(c);
    case Kind::kVsaForward: return vsa_work(c, 3, 3);
    case Kind::kVsaBackward: return vsa_work(c, 6, 10);
    case Kind::kInvert: return extent_product(c.args[0].desc, 4) + extent_product(c.args[2].desc, 4);
    case Kind::kNvfp4: return 8 * extent_product(c.args[0].desc, 4);
    case Kind::kLayerForward: return layer_work(c, 3);
    case Kind::kLayerBackward: return layer_work(c, 13);
    default: return 0;
  }
}

void decode_call(Kind k, ByteReader& in, fva_handle_t sizes, Call* call, Arenas* arenas,
                 double work_budget) {
  Call& c = *call;
  c = Call{};
  c.kind = k;
  switch (k) {
    case Kind::kQatForward: build_qat(c, in, false); break;
    case Kind::kQatBackward: build_qat(c, in, true); break;
    case Kind::kVsaForward: build_vsa(c, in, false); break;
    case Kind::kVsaBackward: build_vsa(c, in, true); break;
    case Kind::kInvert: build_invert(c, in); break;
    case Kind::kNvfp4: build_nvfp4(c, in); break;
    case Kind::kLayerForward: build_layer(c, in, false, sizes); break;
    case Kind::kLayerBackward: build_layer(c, in, true, sizes); break;
    default: finding("decode_call: not a tensor operation");
  }
  mutate(c, in);
  if (call_work(c) > work_budget) {
    c.args[c.budget_null].pass_null = true;
    c.budget_nulled = true;
  }
  arenas->place(c.args);
  fill_arenas(c, *arenas, in);
  if (c.ws_size == 4) c.ws_extra = in.u8();
}

bool has_query(Kind k) { return k != Kind::kNvfp4; }

fva_status_t query_call(const Call& c, fva_handle_t h, const void* p, size_t* b) {
  switch (c.kind) {
    case Kind::kQatForward:
      return fva_qat_forward_workspace_size(h, as<fva_qat_config_t>(p), c.t(0), c.t(1), c.t(2), b);
    case Kind::kQatBackward:
      return fva_qat_backward_workspace_size(h, as<fva_qat_config_t>(p), c.t(0), c.t(1), c.t(2), b);
    case Kind::kVsaForward:
      return fva_vsa_forward_workspace_size(h, as<fva_vsa_config_t>(p), c.t(0), c.t(1), c.t(2), c.t(3), b);
    case Kind::kVsaBackward:
      return fva_vsa_backward_workspace_size(h, as<fva_vsa_config_t>(p), c.t(0), c.t(1), c.t(2), c.t(6), b);
    case Kind::kInvert: return fva_vsa_invert_indices_workspace_size(h, c.t(0), c.t(2), b);
    case Kind::kLayerForward:
    case Kind::kLayerBackward: {
      size_t reserve = 0;
      return fva_vsa_layer_sizes(h, as<fva_vsa_layer_config_t>(p), c.t(0), c.t(1), c.t(2), b, &reserve);
    }
    default: finding("query_call: the operation has no workspace query");
  }
}

fva_status_t invoke_call(const Call& c, fva_handle_t h, const void* p, void* ws, size_t wsb, void* stream) {
  switch (c.kind) {
    case Kind::kQatForward:
      return fva_qat_forward(h, as<fva_qat_config_t>(p), c.t(0), c.t(1), c.t(2), c.t(3), c.t(4), c.t(5), ws,
                             wsb, stream);
    case Kind::kQatBackward:
      return fva_qat_backward(h, as<fva_qat_config_t>(p), c.t(0), c.t(1), c.t(2), c.t(3), c.t(4), c.t(5),
                              c.t(6), c.t(7), c.t(8), ws, wsb, stream);
    case Kind::kVsaForward:
      return fva_vsa_forward(h, as<fva_vsa_config_t>(p), c.t(0), c.t(1), c.t(2), c.t(3), c.t(4), c.t(5),
                             c.t(6), c.t(7), ws, wsb, stream);
    case Kind::kVsaBackward:
      return fva_vsa_backward(h, as<fva_vsa_config_t>(p), c.t(0), c.t(1), c.t(2), c.t(3), c.t(4), c.t(5),
                              c.t(6), c.t(7), c.t(8), c.t(9), c.t(10), c.t(11), ws, wsb, stream);
    case Kind::kInvert:
      return fva_vsa_invert_indices(h, c.t(0), c.t(1), c.t(2), c.t(3), ws, wsb, stream);
    case Kind::kNvfp4:
      return fva_nvfp4_fake_quantize(h, as<fva_nvfp4_config_t>(p), c.t(0), c.t(1), stream);
    case Kind::kLayerForward:
      return fva_vsa_layer_forward(h, as<fva_vsa_layer_config_t>(p), c.t(0), c.t(1), c.t(2), c.t(3), c.t(4),
                                   c.t(5), c.t(6), c.t(7), c.t(8), reserve_ptr(c), reserve_bytes(c), ws,
                                   wsb, stream);
    case Kind::kLayerBackward:
      return fva_vsa_layer_backward(h, as<fva_vsa_layer_config_t>(p), c.t(0), c.t(1), c.t(2), c.t(3),
                                    c.t(4), c.t(5), c.t(6), reserve_ptr(c), reserve_bytes(c), c.t(8),
                                    c.t(9), c.t(10), c.t(11), ws, wsb, stream);
    default: finding("invoke_call: not a tensor operation");
  }
}

size_t claimed_workspace(const Call& c, size_t need) {
  switch (c.ws_size) {
    case 1: return need ? need - 1 : 0;
    case 2: return 0;
    case 3: return SIZE_MAX;
    case 4: return need + c.ws_extra;
    case 5: return need / 2;
    default: return need;
  }
}

void* reserve_ptr(const Call& c) {
  const Arg& a = c.args[static_cast<size_t>(c.reserve_arg)];
  return a.pass_null ? nullptr : a.desc.data;
}

size_t reserve_bytes(const Call& c) {
  const Arg& a = c.args[static_cast<size_t>(c.reserve_arg)];
  const std::optional<uint64_t> e = addressed_bytes(a.desc);
  const size_t have = a.ptr == PtrKind::kArena && e ? static_cast<size_t>(*e) : 0;
  switch (c.reserve_size) {
    case 1: return have ? have - 1 : 0;
    case 2: return have / 2;
    case 3: return 0;
    default: return have;
  }
}

// The forward that fills the layer backward's reserve: the call's own arguments (as mutated), an
// output of its own.
void prepare_call(const Call& c, fva_handle_t h, Memory& mem, void* stream) {
  if (c.kind != Kind::kLayerBackward) return;
  if (c.prepare_mode == 1 || c.cfg_null || c.handle_null) return;
  fva_vsa_layer_config_t fcfg;
  std::memcpy(&fcfg, c.cfg.data(), sizeof fcfg);
  if (c.prepare_mode == 3) fcfg.topk = fcfg.topk == 1 ? 2 : 1;
  const fva_tensor_t* gate_arg = c.t(3);
  if (c.prepare_mode == 2) gate_arg = gate_arg ? nullptr : c.t(0);
  size_t ws = 0, rs = 0;
  if (fva_vsa_layer_sizes(h, &fcfg, c.t(0), c.t(1), c.t(2), &ws, &rs) != FVA_OK || !c.t(0)) return;
  if (ws > mem.cap() || rs > reserve_bytes(c)) return;
  fva_tensor_t out = *c.t(0);
  const std::optional<uint64_t> out_bytes = addressed_bytes(out);
  if (!out_bytes || *out_bytes > kArenaCap) return;
  void* out_mem = mem.alloc(*out_bytes);
  if (out_mem == nullptr) return;
  void* ws_mem = ws ? mem.alloc(ws) : nullptr;
  if (ws && ws_mem == nullptr) std::abort();
  out.data = out_mem;
  (void)fva_vsa_layer_forward(h, &fcfg, c.t(0), c.t(1), c.t(2), gate_arg, c.t(4), c.t(5), &out, nullptr,
                              nullptr, reserve_ptr(c), reserve_bytes(c), ws_mem, ws, stream);
  mem.release(out_mem);
  mem.release(ws_mem);
}

ConfigMemory::ConfigMemory(const Call& c) {
  if (c.cfg.empty() || c.cfg_null) return;
  uint32_t struct_size;
  std::memcpy(&struct_size, c.cfg.data(), 4);
  const size_t bytes = std::min<size_t>(std::max<size_t>(struct_size, 4), c.cfg.size() + 64);
  p = std::calloc(1, bytes);
  std::memcpy(p, c.cfg.data(), std::min(bytes, c.cfg.size()));
}

ConfigMemory::~ConfigMemory() { std::free(p); }

// ---- the host-only kinds ---------------------------------------------------------------------------

void decode_handles_head(ByteReader& in, HandlesStep* s) {
  fva_handle_options_t& o = s->o;
  o = FVA_HANDLE_OPTIONS_INIT;
  o.backend = in.pick<int32_t>({FVA_BACKEND_CPU, FVA_BACKEND_AUTO, FVA_BACKEND_CUDA, 3, -1, INT32_MAX});
  o.device = in.pick<int32_t>({-1, 0, 1, -2, INT32_MAX, INT32_MIN});
  o.deterministic = in.pick<int32_t>({0, 1, 2, -1});
  if (in.u8() & 1) {  // the tuning options, in and out of range
    o.qat_forward_split = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 2, 8, 9, -2, INT32_MIN});
    o.qat_forward_clusters = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 2});
    o.ds_budget_mib = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 2048, INT32_MAX, -5});
    o.chained_launches = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 3});
    o.cpu_threads = in.pick<int32_t>({FVA_OPTION_AUTO, 1, 2, 4096, 4097, 0});
    o.ptx_jit = in.pick<int32_t>({FVA_OPTION_AUTO, 0, 1, 2});
  }
  const uint8_t shape = in.u8();
  if (shape & 1) o.struct_size = interesting32(in);
  s->opts_null = (shape & 2) != 0;
  s->out_null = (shape & 4) != 0;
}

void decode_handles_tail(ByteReader& in, HandlesStep* s) {
  s->info_size = sizeof(fva_handle_info_t);
  if (in.u8() & 1) s->info_size = interesting32(in);
  s->info_handle_null = (in.u8() & 1) != 0;
}

void decode_misc(ByteReader& in, MiscStep* s) { s->status = static_cast<int32_t>(in.u32()); }

void decode_tile_plan(ByteReader& in, TilePlanStep* s) {
  for (int64_t& x : s->dims) x = (in.u8() & 1) ? interesting64(in) : 1 + in.u8() % 13;
  for (int32_t& x : s->tile) x = (in.u8() & 1) ? static_cast<int32_t>(interesting32(in)) : 1 + in.u8() % 5;
  s->nulls = in.u8();
}

void* HostMemory::alloc(size_t bytes) {
  void* p = nullptr;
  return posix_memalign(&p, 64, bytes) == 0 ? p : nullptr;
}

void HostMemory::release(void* p) { std::free(p); }

}  // namespace fvafuzz
