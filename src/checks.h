// Argument checks shared by every entry point (ARCHITECTURE.md, "Every argument is checked before
// any work"). Each check throws fva::Failure with a message that names the argument and the rule
// it broke; nothing is written to any output before all checks have passed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "error.h"
#include "fvattn/fvattn.h"

namespace fva {

// Sets of accepted dtypes, as bit masks over FVA_DTYPE_*.
using DtypeMask = uint32_t;
constexpr DtypeMask dtype_bit(int32_t dtype) { return 1u << dtype; }
constexpr DtypeMask kHalfTypes = dtype_bit(FVA_DTYPE_BF16) | dtype_bit(FVA_DTYPE_F16);
constexpr DtypeMask kF32Only = dtype_bit(FVA_DTYPE_F32);
constexpr DtypeMask kI32Only = dtype_bit(FVA_DTYPE_I32);

// Dimensions of an attention tensor [B, H, S, D].
constexpr int kB = 0, kH = 1, kS = 2, kD = 3;

// The most elements one tensor may have (2^56): far beyond any memory, small enough that no size
// derived from it overflows.
constexpr int64_t kMaxElements = int64_t{1} << 56;

// Alignment the kernels need for vector loads and TMA (bytes).
constexpr size_t kRequiredAlignment = 16;

const char* dtype_name(int32_t dtype);
size_t dtype_size(int32_t dtype);  // 0 for an unknown dtype

void check_not_null(const void* p, const char* name);

// The rules every tensor argument follows: non-null descriptor and data, 16-byte aligned data, the
// given rank and an accepted dtype, every extent >= 1, strides >= 0 with the last one 1, the largest
// offset representable in 64 bits. `layout` names the dimensions for messages ("[B, H, S, D]").
// Outputs must also not overlap themselves (two indices, one address).
void check_tensor(const char* name, const fva_tensor_t* t, int rank, DtypeMask allowed,
                  bool is_output, const char* layout);

// An attention tensor: rank 4 [B, H, S, D], bf16 or f16, and every stride of a dimension longer than
// one a multiple of 16 bytes (so each row starts aligned).
void check_attention_tensor(const char* name, const fva_tensor_t* t, bool is_output);

// An attention tensor with ref's dtype and shape.
void check_like(const char* name, const fva_tensor_t* t, const char* ref_name,
                const fva_tensor_t* ref, bool is_output);

// lse: float32 [B, Hq, Sq] matching q.
void check_lse(const fva_tensor_t* lse, const fva_tensor_t* q, bool is_output);

// q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D] of one dtype, with Hkv dividing Hq (grouped-query
// attention). Head-dim support is the operation's to check.
void check_qkv(const fva_tensor_t* q, const fva_tensor_t* k, const fva_tensor_t* v);

// t's dtype equals ref's ("dout: dtype is F16 but q.dtype is BF16").
void check_same_dtype(const char* name, const fva_tensor_t* t, const char* ref_name,
                      const fva_tensor_t* ref);

// t.shape[dim] equals ref.shape[ref_dim] ("v: shape[2] is 320 but k.shape[2] is 300").
void check_dim_matches(const char* name, const fva_tensor_t* t, int dim, const char* ref_name,
                       const fva_tensor_t* ref, int ref_dim);

// t.shape[dim] equals `expected`, which `what` describes ("lse: shape[2] is 10 but must be 12 (Sq)").
void check_dim_is(const char* name, const fva_tensor_t* t, int dim, int64_t expected,
                  const char* what);

// One tensor argument of a call, for the overlap check.
struct TensorArg {
  const char* name;
  const fva_tensor_t* t;  // may be null (an absent optional argument): ignored
  bool is_output;
};

// No output shares memory with an input or with another output. Tensors with the same shape and
// strides interleaved in one buffer (a packed dq/dk/dv, say) are told apart exactly; other pairs
// are compared by the byte ranges they span.
void check_no_overlap(std::initializer_list<TensorArg> args);

// The caller's workspace holds at least `need` bytes (FVA_ERR_WORKSPACE_TOO_SMALL otherwise) and is
// non-null and aligned when need > 0. `query` names the matching size query for the message.
void check_workspace(const void* ws, size_t ws_bytes, size_t need, const char* query);

// 0 or 1.
void check_flag(int32_t value, const char* name);

// A VSA block size: positive (FVA_ERR_INVALID_ARGUMENT), and 64, the only one the kernels and the
// CPU backend run (FVA_ERR_UNSUPPORTED).
void check_vsa_block_size(int32_t block_size, const char* name);

// softmax_scale: finite and > 0, or 0 (meaning 1/sqrt(D)).
void check_softmax_scale(float scale, const char* name);
float resolve_softmax_scale(float scale, int64_t head_dim);

// Reads an options struct that starts with struct_size: NULL gives `defaults`; a struct_size below
// `min_size` (the struct's size in ABI 1; by default all of it) is an error; fields a smaller
// (older) struct lacks keep their defaults; bytes beyond what this library knows are ignored.
template <typename Config>
Config read_config(const Config* user, const Config& defaults, const char* name,
                   const char* type_name, size_t min_size = sizeof(Config)) {
  if (user == nullptr) return defaults;
  if (user->struct_size < min_size) {
    fail(FVA_ERR_INVALID_ARGUMENT,
         "{}: struct_size is {} but must be at least {} (sizeof({}) in ABI {}); initialize it "
         "with the header's *_INIT macro",
         name, user->struct_size, min_size, type_name, FVA_ABI_VERSION);
  }
  Config c = defaults;
  std::memcpy(&c, user, user->struct_size < sizeof(Config) ? user->struct_size : sizeof(Config));
  return c;
}

}  // namespace fva
