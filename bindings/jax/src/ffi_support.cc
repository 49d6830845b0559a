#include "ffi_support.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace fvattn_jax {

namespace {

std::mutex g_mutex;

fva_handle_t create(int32_t backend, int32_t device, ffi::Error* err) {
  fva_handle_options_t opts = FVA_HANDLE_OPTIONS_INIT;
  opts.backend = backend;
  opts.device = device;
  // FVATTN_DETERMINISTIC=1: deterministic handles (the Python package reads it the same way).
  const char* det = std::getenv("FVATTN_DETERMINISTIC");
  if (det != nullptr && std::strcmp(det, "0") != 0 && std::strcmp(det, "1") != 0) {
    *err = ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string("FVATTN_DETERMINISTIC='") + det + "': expected '0' or '1'");
    return nullptr;
  }
  opts.deterministic = det != nullptr && std::strcmp(det, "1") == 0 ? 1 : 0;
  fva_handle_t h = nullptr;
  const fva_status_t st = fva_create(&h, &opts);
  if (st != FVA_OK) *err = status_error(st);
  return h;
}

ffi::ErrorCode error_code(fva_status_t st) {
  switch (st) {
    case FVA_ERR_INVALID_ARGUMENT:
    case FVA_ERR_WORKSPACE_TOO_SMALL: return ffi::ErrorCode::kInvalidArgument;
    case FVA_ERR_UNSUPPORTED: return ffi::ErrorCode::kUnimplemented;
    case FVA_ERR_NO_DEVICE: return ffi::ErrorCode::kFailedPrecondition;
    case FVA_ERR_OUT_OF_MEMORY: return ffi::ErrorCode::kResourceExhausted;
    default: return ffi::ErrorCode::kInternal;
  }
}

bool dtype_of(ffi::DataType t, int32_t* code, size_t* esize) {
  switch (t) {
    case ffi::DataType::BF16: *code = FVA_DTYPE_BF16; *esize = 2; return true;
    case ffi::DataType::F16: *code = FVA_DTYPE_F16; *esize = 2; return true;
    case ffi::DataType::F32: *code = FVA_DTYPE_F32; *esize = 4; return true;
    case ffi::DataType::S32: *code = FVA_DTYPE_I32; *esize = 4; return true;
    case ffi::DataType::S64: *code = FVA_DTYPE_I64; *esize = 8; return true;
    default: return false;
  }
}

}  // namespace

bool cuda_copy_async(void* dst, const void* src, size_t bytes, void* stream) {
  using MemcpyAsync = int (*)(uintptr_t, uintptr_t, size_t, void*);  // CUresult(CUdeviceptr x2, size_t, CUstream)
  static const MemcpyAsync fn = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    return lib ? reinterpret_cast<MemcpyAsync>(dlsym(lib, "cuMemcpyAsync")) : nullptr;
  }();
  return fn != nullptr && fn(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), bytes, stream) == 0;
}

namespace {
void* cuda_symbol(const char* name) {
  static void* lib = [] {
    void* l = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return l ? l : dlopen("libcuda.so.1", RTLD_NOW);
  }();
  return lib ? dlsym(lib, name) : nullptr;
}
}  // namespace

void* cuda_alloc_async(size_t bytes, void* stream) {
  using AllocAsync = int (*)(uintptr_t*, size_t, void*);  // CUresult(CUdeviceptr*, size_t, CUstream)
  static const AllocAsync fn = reinterpret_cast<AllocAsync>(cuda_symbol("cuMemAllocAsync"));
  uintptr_t p = 0;
  return fn != nullptr && fn(&p, bytes, stream) == 0 ? reinterpret_cast<void*>(p) : nullptr;
}

void cuda_free_async(void* p, void* stream) {
  using FreeAsync = int (*)(uintptr_t, void*);  // CUresult(CUdeviceptr, CUstream)
  static const FreeAsync fn = reinterpret_cast<FreeAsync>(cuda_symbol("cuMemFreeAsync"));
  if (fn != nullptr && p != nullptr) fn(reinterpret_cast<uintptr_t>(p), stream);
}

ffi::Error status_error(fva_status_t status) {
  return ffi::Error(error_code(status),
                    std::string(fva_status_string(status)) + ": " + fva_last_error());
}

fva_handle_t cpu_handle(ffi::Error* err) {
  std::lock_guard<std::mutex> lock(g_mutex);
  static fva_handle_t h = nullptr;
  if (h == nullptr) h = create(FVA_BACKEND_CPU, -1, err);
  return h;
}

fva_handle_t cuda_handle(int32_t device, ffi::Error* err) {
  std::lock_guard<std::mutex> lock(g_mutex);
  static std::map<int32_t, fva_handle_t> handles;
  fva_handle_t& h = handles[device];
  if (h == nullptr) h = create(FVA_BACKEND_CUDA, device, err);
  return h;
}

ffi::Error make_operand(const char* name, const ffi::AnyBuffer& b, int base_rank, Operand* out) {
  out->name = name;
  out->data = static_cast<char*>(b.untyped_data());
  out->base_rank = base_rank;
  if (!dtype_of(b.element_type(), &out->dtype, &out->esize))
    return ffi::Error::InvalidArgument(std::string(name) +
                                       ": element type is not bf16, f16, f32, int32 or int64");
  const auto dims = b.dimensions();
  out->dims.assign(dims.begin(), dims.end());
  if (static_cast<int>(out->dims.size()) < base_rank)
    return ffi::Error::InvalidArgument(std::string(name) + ": rank is " +
                                       std::to_string(out->dims.size()) + " but must be " +
                                       std::to_string(base_rank));
  return ffi::Error::Success();
}

ffi::Error make_bytes(const char* name, const ffi::AnyBuffer& b, int base_rank, bool is_output,
                      Operand* out) {
  if (b.element_type() != ffi::DataType::U8)
    return ffi::Error::InvalidArgument(std::string(name) + ": element type must be uint8 (raw bytes)");
  out->name = name;
  out->data = static_cast<char*>(b.untyped_data());
  out->dtype = 0;  // not an fvattn tensor: passed on as (data, bytes)
  out->esize = 1;
  out->base_rank = base_rank;
  out->is_output = is_output;
  const auto dims = b.dimensions();
  out->dims.assign(dims.begin(), dims.end());
  if (out->dims.size() < static_cast<size_t>(base_rank))
    return ffi::Error::InvalidArgument(std::string(name) + ": rank is " +
                                       std::to_string(out->dims.size()) + " but must be at least " +
                                       std::to_string(base_rank));
  return ffi::Error::Success();
}

ffi::Error Batch::of(const Operand& shape_from, const std::vector<const Operand*>& all, Batch* out) {
  const size_t lead = shape_from.dims.size() - shape_from.base_rank;
  out->lead_.assign(shape_from.dims.begin(), shape_from.dims.begin() + lead);
  out->count_ = 1;
  for (int64_t n : out->lead_) out->count_ *= n;
  for (const Operand* op : all) {
    if (op == nullptr) continue;  // an optional operand left out (o_hp)
    const size_t op_lead = op->dims.size() - op->base_rank;
    bool ok = op_lead == lead;
    for (size_t i = 0; ok && i < lead; ++i) ok = op->dims[i] == out->lead_[i] || op->dims[i] == 1;
    if (!ok)
      return ffi::Error::InvalidArgument(std::string(op->name) +
                                         ": its leading (batch) dimensions do not match the call's");
  }
  return ffi::Error::Success();
}

fva_tensor_t Batch::slice(const Operand& op, int64_t n) const {
  fva_tensor_t t{};
  t.dtype = op.dtype;
  t.rank = op.base_rank;
  const size_t lead = lead_.size();
  int64_t stride = 1;
  for (int i = op.base_rank - 1; i >= 0; --i) {
    t.shape[i] = op.dims[lead + i];
    t.strides[i] = stride;
    stride *= t.shape[i];
  }
  // stride is now the element count of one slice; walk the leading dims from the innermost.
  int64_t offset = 0;
  for (size_t i = lead; i-- > 0;) {
    const int64_t idx = n % lead_[i];
    n /= lead_[i];
    if (op.dims[i] != 1) offset += idx * stride;
    stride *= op.dims[i];
  }
  t.data = op.data + offset * static_cast<int64_t>(op.esize);
  return t;
}

size_t Batch::slice_bytes(const Operand& op) {
  size_t n = op.esize;
  for (size_t i = op.dims.size() - op.base_rank; i < op.dims.size(); ++i) n *= static_cast<size_t>(op.dims[i]);
  return n;
}

ffi::Error run_batched(const Exec& ex, const Batch& batch, const std::vector<const Operand*>& ops,
                       size_t bytes, const BatchedCall& call) {
  constexpr size_t kAlign = 256;
  const auto round_up = [](size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  // Which operands need staging: any whose slices can start off a 16-byte boundary.
  std::vector<size_t> stage_offset(ops.size(), SIZE_MAX);
  size_t total = round_up(bytes);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Operand* op = ops[i];
    if (op == nullptr) continue;
    const size_t sb = Batch::slice_bytes(*op);
    const bool misaligned = reinterpret_cast<uintptr_t>(op->data) % 16 != 0 ||
                            (batch.count() > 1 && sb % 16 != 0);
    if (!misaligned) continue;
    stage_offset[i] = total;
    total += round_up(sb);
  }
  char* base = nullptr;
  if (total > 0) {
    base = static_cast<char*>(ex.workspace(total));
    if (base == nullptr)
      return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                        "fvattn: could not allocate " + std::to_string(total) + " bytes of workspace");
  }
  void* ws = bytes > 0 ? base : nullptr;
  std::vector<fva_tensor_t> slices(ops.size());
  std::vector<const fva_tensor_t*> ptrs(ops.size(), nullptr);
  for (int64_t n = 0; n < batch.count(); ++n) {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i] == nullptr) continue;
      slices[i] = batch.slice(*ops[i], n);
      if (stage_offset[i] != SIZE_MAX) {
        char* staged = base + stage_offset[i];
        if (!ops[i]->is_output && !ex.copy(staged, slices[i].data, Batch::slice_bytes(*ops[i])))
          return ffi::Error::Internal(std::string("fvattn: staging copy of ") + ops[i]->name + " failed");
        slices[i].data = staged;
      }
      ptrs[i] = &slices[i];
    }
    const fva_status_t st = call(ptrs, ws, bytes);
    if (st != FVA_OK) return status_error(st);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i] == nullptr || !ops[i]->is_output || stage_offset[i] == SIZE_MAX) continue;
      if (!ex.copy(batch.slice(*ops[i], n).data, slices[i].data, Batch::slice_bytes(*ops[i])))
        return ffi::Error::Internal(std::string("fvattn: staging copy of ") + ops[i]->name + " failed");
    }
  }
  return ffi::Error::Success();
}

}  // namespace fvattn_jax
