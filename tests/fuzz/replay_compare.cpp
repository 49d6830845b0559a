#include "replay_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "support/host_tensor.h"
#include "tensor_desc.h"

namespace fvafuzz {
namespace {

bool is_ws_message(const std::string& m) {
  return m.rfind("ws:", 0) == 0 || m.rfind("ws_bytes", 0) == 0;
}

bool is_reserve_record_message(const std::string& m) {
  return m.rfind("reserve: holds no record", 0) == 0 || m.rfind("reserve: was written by", 0) == 0;
}

// Calls f(byte offset of the element from t.data) for every logical element of t, row-major. The
// call succeeded, so t's geometry passed the library's checks.
void for_each_element(const fva_tensor_t& t, const std::function<void(uint64_t)>& f) {
  const uint64_t es = fvadesc::dtype_size(t.dtype);
  int64_t idx[FVA_MAX_RANK] = {};
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < t.rank; ++d) off += idx[d] * t.strides[d];
    f(static_cast<uint64_t>(off) * es);
    int d = t.rank - 1;
    while (d >= 0 && ++idx[d] == t.shape[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

double element_value(int32_t dtype, const uint8_t* p) {
  switch (dtype) {
    case FVA_DTYPE_BF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return fvt::bf16_value(b);
    }
    case FVA_DTYPE_F16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return fvt::f16_value(b);
    }
    case FVA_DTYPE_F32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    default: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
  }
}

// The element's bytes in an arena image, or null when they lie outside it (a bug of the replay).
const uint8_t* element_at(const ArenaImage& img, const fva_tensor_t& t, uint64_t off, uint64_t es) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(t.data) - img.base + off;
  return at + es <= img.size ? img.bytes + at : nullptr;
}

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kSame: return "same";
    case Verdict::kUnsupported: return "unsupported on target";
    case Verdict::kWorkspaceChoice: return "workspace choice";
    case Verdict::kReserveInKernel: return "reserve refused in kernel";
    case Verdict::kMismatch: return "MISMATCH";
  }
  return "?";
}

Verdict judge_status(const Call& c, const StatusPair& s, std::string* why) {
  if (s.cpu == s.target) return Verdict::kSame;
  // FVA_ERR_UNSUPPORTED comes after every argument check but the workspace's (whose size the
  // backend's support decides), so a CUDA handle may say it where the CPU backend ran the call or
  // refused its workspace.
  if (s.target_is_cuda && s.target == FVA_ERR_UNSUPPORTED &&
      (s.cpu == FVA_OK || s.cpu == FVA_ERR_WORKSPACE_TOO_SMALL ||
       (s.cpu == FVA_ERR_INVALID_ARGUMENT && is_ws_message(s.cpu_message))))
    return Verdict::kUnsupported;
  // A NULL, misaligned, short or empty workspace fails only where the query asked for bytes.
  const bool bad_choice = c.ws_ptr != 0 || c.ws_size == 1 || c.ws_size == 2 || c.ws_size == 5;
  const bool ws_refusal_cpu = s.cpu == FVA_ERR_WORKSPACE_TOO_SMALL ||
                              (s.cpu == FVA_ERR_INVALID_ARGUMENT && is_ws_message(s.cpu_message));
  const bool ws_refusal_target = s.target == FVA_ERR_WORKSPACE_TOO_SMALL ||
                                 (s.target == FVA_ERR_INVALID_ARGUMENT && is_ws_message(s.target_message));
  if (bad_choice && (s.cpu_need == 0) != (s.target_need == 0) &&
      ((s.cpu == FVA_OK && ws_refusal_target && s.cpu_need == 0) ||
       (s.target == FVA_OK && ws_refusal_cpu && s.target_need == 0)))
    return Verdict::kWorkspaceChoice;
  if (c.kind == Kind::kLayerBackward && s.target_is_cuda && s.cpu == FVA_ERR_INVALID_ARGUMENT &&
      s.target == FVA_OK && is_reserve_record_message(s.cpu_message))
    return Verdict::kReserveInKernel;  // the caller checks that no output changed
  *why = fmt::format("CPU {} ({}) but target {} ({})", fva_status_string(s.cpu), s.cpu_message,
                     fva_status_string(s.target), s.target_message);
  return Verdict::kMismatch;
}

double output_tolerance(const Call& c, size_t arg) {
  const std::string name = c.args[arg].name;
  if (name == "reserve") return -1.0;  // opaque; the backward that reads it is compared instead
  if (c.kind == Kind::kNvfp4) return 0.0;  // the same quantizer code on both backends
  if (c.args[arg].desc.dtype == FVA_DTYPE_I32) return 0.0;
  if (name == "lse") return 1e-3;
  return 1e-2;
}

std::string compare_output(const Call& cpu, const Call& target, size_t arg, const ArenaImage& a,
                           const ArenaImage& b, double tol, double* err) {
  const fva_tensor_t& ta = cpu.args[arg].desc;
  const fva_tensor_t& tb = target.args[arg].desc;
  const uint64_t es = fvadesc::dtype_size(ta.dtype);
  std::vector<double> ref, got;
  int64_t class_mismatch = 0, bit_mismatch = 0, i = 0, first = -1;
  double first_ref = 0, first_got = 0;
  bool outside = false;
  // The two descriptors differ in their data pointers only.
  std::vector<uint64_t> offsets;
  for_each_element(ta, [&](uint64_t off) { offsets.push_back(off); });
  for (uint64_t off : offsets) {
    const uint8_t* pa = element_at(a, ta, off, es);
    const uint8_t* pb = element_at(b, tb, off, es);
    if (!pa || !pb) {
      outside = true;
      break;
    }
    const double x = element_value(ta.dtype, pa), y = element_value(ta.dtype, pb);
    bool differs = false;
    if (tol == 0.0) {
      differs = std::memcmp(pa, pb, es) != 0 && !(std::isnan(x) && std::isnan(y));
      bit_mismatch += differs ? 1 : 0;
    } else if (std::isfinite(x) && std::isfinite(y)) {
      ref.push_back(x);
      got.push_back(y);
    } else {
      differs = !(std::isnan(x) && std::isnan(y)) && !(x == y);  // the same infinity, or both NaN
      class_mismatch += differs ? 1 : 0;
    }
    if (differs && first < 0) first = i, first_ref = x, first_got = y;
    ++i;
  }
  const char* name = cpu.args[arg].name;
  if (outside) return fmt::format("{}: an element lies outside its arena (a bug of the replay)", name);
  if (bit_mismatch)
    return fmt::format("{}: {} of {} elements differ bit for bit (first #{}: CPU {} target {})", name,
                       bit_mismatch, i, first, first_ref, first_got);
  if (class_mismatch)
    return fmt::format("{}: {} of {} elements differ in NaN/Inf (first #{}: CPU {} target {})", name,
                       class_mismatch, i, first, first_ref, first_got);
  if (tol > 0.0 && !ref.empty()) {
    const double e = fvt::rel_l2_floored(got, ref);
    *err = std::max(*err, e);
    if (!(e <= tol)) return fmt::format("{}: rel L2 {:.3e} > {:.0e}", name, e, tol);
  }
  return "";
}

std::vector<bool> tensor_bytes(const Call& c, size_t arena, uintptr_t base, size_t size, bool outputs) {
  std::vector<bool> mark(size, false);
  for (const Arg& a : c.args) {
    if (a.is_output != outputs || a.pass_null || a.ptr != PtrKind::kArena ||
        static_cast<size_t>(a.arena) != arena)
      continue;
    const std::optional<uint64_t> extent = addressed_bytes(a.desc);
    const uintptr_t start = reinterpret_cast<uintptr_t>(a.desc.data) - base;
    if (!extent || start > size || *extent > size - start) continue;
    uint64_t numel = 1;
    for (int d = 0; d < a.desc.rank; ++d) numel *= static_cast<uint64_t>(a.desc.shape[d]);
    if (!outputs || numel > size) {  // inputs, and broadcast views: their whole byte range
      std::fill(mark.begin() + static_cast<ptrdiff_t>(start),
                mark.begin() + static_cast<ptrdiff_t>(start + *extent), true);
      continue;
    }
    const uint64_t es = fvadesc::dtype_size(a.desc.dtype);
    for_each_element(a.desc, [&](uint64_t off) {
      for (uint64_t k = 0; k < es; ++k) mark[start + off + k] = true;
    });
  }
  return mark;
}

}  // namespace fvafuzz
