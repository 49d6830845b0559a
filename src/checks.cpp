#include "checks.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/problems.h"

namespace fva {

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case FVA_DTYPE_BF16: return "BF16";
    case FVA_DTYPE_F16: return "F16";
    case FVA_DTYPE_F32: return "F32";
    case FVA_DTYPE_I32: return "I32";
    case FVA_DTYPE_I64: return "I64";
    default: return "unknown";
  }
}

size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case FVA_DTYPE_BF16:
    case FVA_DTYPE_F16: return 2;
    case FVA_DTYPE_F32:
    case FVA_DTYPE_I32: return 4;
    case FVA_DTYPE_I64: return 8;
    default: return 0;
  }
}

namespace {

std::string allowed_names(DtypeMask allowed) {
  std::string s;
  for (int32_t d = FVA_DTYPE_BF16; d <= FVA_DTYPE_I64; ++d) {
    if (!(allowed & dtype_bit(d))) continue;
    if (!s.empty()) s += " or ";
    s += dtype_name(d);
  }
  return s;
}

std::string shape_string(const fva_tensor_t* t) {
  std::string s = "[";
  for (int i = 0; i < t->rank; ++i) s += fmt::format("{}{}", i ? ", " : "", t->shape[i]);
  return s + "]";
}

std::string strides_string(const fva_tensor_t* t) {
  std::string s = "[";
  for (int i = 0; i < t->rank; ++i) s += fmt::format("{}{}", i ? ", " : "", t->strides[i]);
  return s + "]";
}

// Largest element offset of a checked tensor (fits in int64 by check_tensor).
int64_t max_offset(const fva_tensor_t* t) {
  int64_t off = 0;
  for (int i = 0; i < t->rank; ++i) off += (t->shape[i] - 1) * t->strides[i];
  return off;
}

// Byte range [begin, end) a checked tensor spans.
struct ByteRange {
  uintptr_t begin, end;
};
ByteRange byte_range(const fva_tensor_t* t) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t->data);
  const size_t es = dtype_size(t->dtype);
  return {begin, begin + static_cast<uintptr_t>(max_offset(t)) * es + es};
}

// Dimensions longer than one, by increasing stride: the order in which a non-overlapping layout
// nests them.
std::vector<int> nesting_order(const fva_tensor_t* t) {
  std::vector<int> dims;
  for (int i = 0; i < t->rank; ++i)
    if (t->shape[i] > 1) dims.push_back(i);
  std::stable_sort(dims.begin(), dims.end(),
                   [t](int a, int b) { return t->strides[a] < t->strides[b]; });
  return dims;
}

// True when no two indices of t map to one element: each stride exceeds the span of the dims
// nested inside it.
bool is_non_overlapping(const fva_tensor_t* t) {
  int64_t span = 0;  // largest offset reachable by the dims visited so far
  for (int d : nesting_order(t)) {
    if (t->strides[d] <= span) return false;
    span += (t->shape[d] - 1) * t->strides[d];
  }
  return true;
}

bool same_layout(const fva_tensor_t* a, const fva_tensor_t* b) {
  if (a->rank != b->rank || dtype_size(a->dtype) != dtype_size(b->dtype)) return false;
  for (int i = 0; i < a->rank; ++i)
    if (a->shape[i] != b->shape[i] || a->strides[i] != b->strides[i]) return false;
  return true;
}

// For two tensors of one non-overlapping layout whose ranges intersect: do they share an element?
// Their elements sit at base + sum(i_k * stride_k); with nested strides that mixed-radix
// representation is unique, so peeling the largest stride first decides whether the distance
// between the bases is (within one element) such an offset.
bool interleaved_tensors_share_memory(const fva_tensor_t* a, const fva_tensor_t* b) {
  const uintptr_t pa = reinterpret_cast<uintptr_t>(a->data);
  const uintptr_t pb = reinterpret_cast<uintptr_t>(b->data);
  uint64_t delta = pa > pb ? pa - pb : pb - pa;
  const uint64_t es = dtype_size(a->dtype);
  std::vector<int> dims = nesting_order(a);
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    const uint64_t step = static_cast<uint64_t>(a->strides[*it]) * es;
    const uint64_t count = std::min<uint64_t>(delta / step, static_cast<uint64_t>(a->shape[*it] - 1));
    delta -= count * step;
  }
  return delta < es;
}

}  // namespace

void check_not_null(const void* p, const char* name) {
  if (p == nullptr) fail(FVA_ERR_INVALID_ARGUMENT, "{}: is NULL", name);
}

void check_tensor(const char* name, const fva_tensor_t* t, int rank, DtypeMask allowed,
                  bool is_output, const char* layout) {
  if (t == nullptr) fail(FVA_ERR_INVALID_ARGUMENT, "{}: is NULL", name);
  if (t->rank != rank)
    fail(FVA_ERR_INVALID_ARGUMENT, "{}: rank is {} but must be {} ({})", name, t->rank, rank,
         layout);
  if (t->dtype < 0 || t->dtype > 31 || !(allowed & dtype_bit(t->dtype)))
    fail(FVA_ERR_INVALID_ARGUMENT, "{}: dtype is {} ({}) but must be {}", name,
         dtype_name(t->dtype), t->dtype, allowed_names(allowed));
  if (t->data == nullptr) fail(FVA_ERR_INVALID_ARGUMENT, "{}: data is NULL", name);
  if (reinterpret_cast<uintptr_t>(t->data) % kRequiredAlignment != 0)
    fail(FVA_ERR_INVALID_ARGUMENT, "{}: data {} is not {}-byte aligned", name, t->data,
         kRequiredAlignment);
  for (int i = 0; i < rank; ++i) {
    if (t->shape[i] < 1)
      fail(FVA_ERR_INVALID_ARGUMENT, "{}: shape[{}] is {} but must be >= 1 (shape {} {})", name, i,
           t->shape[i], shape_string(t), layout);
    if (t->strides[i] < 0)
      fail(FVA_ERR_INVALID_ARGUMENT, "{}: strides[{}] is {} but strides must be >= 0", name, i,
           t->strides[i]);
  }
  // Element counts bound every size derived from them (workspaces hold a few fp32 copies), so no
  // size computation can wrap, even for inputs broadcast with zero strides.
  int64_t numel = 1;
  for (int i = 0; i < rank; ++i) {
    if (__builtin_mul_overflow(numel, t->shape[i], &numel) || numel > kMaxElements)
      fail(FVA_ERR_UNSUPPORTED, "{}: shape {} has more than 2^56 elements, more than fvattn supports",
           name, shape_string(t));
  }
  if (t->strides[rank - 1] != 1)
    fail(FVA_ERR_INVALID_ARGUMENT, "{}: strides[{}] is {} but the last stride must be 1", name,
         rank - 1, t->strides[rank - 1]);
  // The byte offset of the last element, and the address past it, must not overflow.
  int64_t off = 0;
  for (int i = 0; i < rank; ++i) {
    int64_t term;
    if (__builtin_mul_overflow(t->shape[i] - 1, t->strides[i], &term) ||
        __builtin_add_overflow(off, term, &off))
      fail(FVA_ERR_INVALID_ARGUMENT, "{}: shape {} with strides {} overflows 64-bit offsets", name,
           shape_string(t), strides_string(t));
  }
  // off + 1 elements: off may be INT64_MAX itself (found by fvattn_fuzz), so the + 1 is checked too.
  int64_t count, bytes;
  uintptr_t end;
  if (__builtin_add_overflow(off, 1, &count) ||
      __builtin_mul_overflow(count, static_cast<int64_t>(dtype_size(t->dtype)), &bytes) ||
      __builtin_add_overflow(reinterpret_cast<uintptr_t>(t->data), static_cast<uintptr_t>(bytes),
                             &end))
    fail(FVA_ERR_INVALID_ARGUMENT, "{}: shape {} with strides {} overflows 64-bit offsets", name,
         shape_string(t), strides_string(t));
  if (is_output && !is_non_overlapping(t))
    fail(FVA_ERR_INVALID_ARGUMENT,
         "{}: strides {} with shape {} make different elements share memory; an output needs "
         "non-overlapping strides",
         name, strides_string(t), shape_string(t));
}

void check_attention_tensor(const char* name, const fva_tensor_t* t, bool is_output) {
  check_tensor(name, t, 4, kHalfTypes, is_output, "[B, H, S, D]");
  const int64_t es = static_cast<int64_t>(dtype_size(t->dtype));
  for (int i = 0; i < 3; ++i) {
    if (t->shape[i] > 1 && (t->strides[i] * es) % static_cast<int64_t>(kRequiredAlignment) != 0)
      fail(FVA_ERR_INVALID_ARGUMENT,
           "{}: strides[{}] is {} elements ({} bytes), not a multiple of {} bytes", name, i,
           t->strides[i], t->strides[i] * es, kRequiredAlignment);
  }
}

void check_same_dtype(const char* name, const fva_tensor_t* t, const char* ref_name,
                      const fva_tensor_t* ref) {
  if (t->dtype != ref->dtype)
    fail(FVA_ERR_INVALID_ARGUMENT, "{}: dtype is {} but {}.dtype is {}", name,
         dtype_name(t->dtype), ref_name, dtype_name(ref->dtype));
}

void check_dim_matches(const char* name, const fva_tensor_t* t, int dim, const char* ref_name,
                       const fva_tensor_t* ref, int ref_dim) {
  if (t->shape[dim] != ref->shape[ref_dim])
    fail(FVA_ERR_INVALID_ARGUMENT, "{}: shape[{}] is {} but {}.shape[{}] is {}", name, dim,
         t->shape[dim], ref_name, ref_dim, ref->shape[ref_dim]);
}

void check_dim_is(const char* name, const fva_tensor_t* t, int dim, int64_t expected,
                  const char* what) {
  if (t->shape[dim] != expected)
    fail(FVA_ERR_INVALID_ARGUMENT, "{}: shape[{}] is {} but must be {} ({})", name, dim,
         t->shape[dim], expected, what);
}

void check_like(const char* name, const fva_tensor_t* t, const char* ref_name,
                const fva_tensor_t* ref, bool is_output) {
  check_attention_tensor(name, t, is_output);
  check_same_dtype(name, t, ref_name, ref);
  for (int d = 0; d < 4; ++d) check_dim_matches(name, t, d, ref_name, ref, d);
}

void check_lse(const fva_tensor_t* lse, const fva_tensor_t* q, bool is_output) {
  check_tensor("lse", lse, 3, kF32Only, is_output, "[B, H, S]");
  for (int d = 0; d < 3; ++d) check_dim_matches("lse", lse, d, "q", q, d);
}

void check_qkv(const fva_tensor_t* q, const fva_tensor_t* k, const fva_tensor_t* v) {
  check_attention_tensor("q", q, false);
  check_attention_tensor("k", k, false);
  check_attention_tensor("v", v, false);
  check_same_dtype("k", k, "q", q);
  check_same_dtype("v", v, "q", q);
  check_dim_matches("k", k, 0, "q", q, 0);
  check_dim_matches("k", k, 3, "q", q, 3);
  for (int d = 0; d < 4; ++d) check_dim_matches("v", v, d, "k", k, d);
  if (q->shape[1] % k->shape[1] != 0)
    fail(FVA_ERR_INVALID_ARGUMENT,
         "k: shape[1] is {} but must divide q.shape[1] = {} (grouped-query attention shares each "
         "k/v head among Hq/Hkv query heads)",
         k->shape[1], q->shape[1]);
}

void check_no_overlap(std::initializer_list<TensorArg> args) {
  for (auto a = args.begin(); a != args.end(); ++a) {
    if (a->t == nullptr || !a->is_output) continue;
    const ByteRange ra = byte_range(a->t);
    for (auto b = args.begin(); b != args.end(); ++b) {
      if (b == a || b->t == nullptr) continue;
      if (b->is_output && b < a) continue;  // that pair was checked from the other side
      const ByteRange rb = byte_range(b->t);
      if (ra.end <= rb.begin || rb.end <= ra.begin) continue;
      if (same_layout(a->t, b->t) && a->t->data != b->t->data &&
          !interleaved_tensors_share_memory(a->t, b->t))
        continue;
      fail(FVA_ERR_INVALID_ARGUMENT,
           "{}: overlaps {} in memory; an output may not share memory with an input or another "
           "output",
           a->name, b->name);
    }
  }
}

void check_workspace(const void* ws, size_t ws_bytes, size_t need, const char* query) {
  if (need == 0) return;
  if (ws_bytes < need)
    fail(FVA_ERR_WORKSPACE_TOO_SMALL, "ws_bytes is {} but this call needs {} bytes (see {})",
         ws_bytes, need, query);
  if (ws == nullptr)
    fail(FVA_ERR_INVALID_ARGUMENT, "ws: is NULL but this call needs {} bytes of workspace", need);
  if (reinterpret_cast<uintptr_t>(ws) % kRequiredAlignment != 0)
    fail(FVA_ERR_INVALID_ARGUMENT, "ws: {} is not {}-byte aligned", ws, kRequiredAlignment);
}

void check_vsa_block_size(int32_t block_size, const char* name) {
  if (block_size < 1) fail(FVA_ERR_INVALID_ARGUMENT, "{} is {} but must be positive", name, block_size);
  if (block_size != kVsaBlock)
    fail(FVA_ERR_UNSUPPORTED, "{} is {} but only {} is supported", name, block_size, kVsaBlock);
}

void check_flag(int32_t value, const char* name) {
  if (value != 0 && value != 1)
    fail(FVA_ERR_INVALID_ARGUMENT, "{} is {} but must be 0 or 1", name, value);
}

void check_softmax_scale(float scale, const char* name) {
  if (!std::isfinite(scale) || scale < 0.0f)
    fail(FVA_ERR_INVALID_ARGUMENT, "{} is {} but must be finite and > 0, or 0 for 1/sqrt(D)", name,
         scale);
}

float resolve_softmax_scale(float scale, int64_t head_dim) {
  return scale > 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

}  // namespace fva
