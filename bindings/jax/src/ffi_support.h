// What every fvattn XLA FFI handler shares: library handles, XLA buffers as fvattn tensor
// descriptors (with the leading dimensions that jax.vmap adds), workspace, and status -> ffi::Error.
#pragma once

#include <fvattn/fvattn.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

// Returns the ffi::Error of `expr` from the enclosing function when it is not a success.
#define FVATTN_JAX_TRY(expr)      \
  do {                            \
    ::xla::ffi::Error e_ = (expr); \
    if (!e_.success()) return e_; \
  } while (0)

namespace fvattn_jax {

namespace ffi = xla::ffi;

// Where a call runs: the library handle, the stream (NULL on the CPU) and a workspace source.
struct Exec {
  fva_handle_t handle = nullptr;
  void* stream = nullptr;
  // Returns `bytes` of workspace of the handle's kind, or nullptr if it cannot.
  std::function<void*(size_t bytes)> workspace;
  // Copies bytes between two buffers of the handle's kind, in stream order; false on failure.
  std::function<bool(void* dst, const void* src, size_t bytes)> copy;
};

// The process-wide CPU handle, and one CUDA handle per device ordinal (created on first use; a
// handle may be shared by threads). On failure *err holds the library's status and message.
fva_handle_t cpu_handle(ffi::Error* err);
fva_handle_t cuda_handle(int32_t device, ffi::Error* err);

// A library status as an ffi::Error: "FVA_ERR_INVALID_ARGUMENT: <fva_last_error()>".
ffi::Error status_error(fva_status_t status);

// One XLA buffer: an fvattn operand of `base_rank` dimensions, preceded by the leading (batch)
// dimensions that vmap's "expand_dims" method adds: of the call's batch size, or 1 (broadcast).
struct Operand {
  const char* name = "";
  char* data = nullptr;
  int32_t dtype = 0;
  size_t esize = 0;
  int base_rank = 0;
  bool is_output = false;
  std::vector<int64_t> dims;
};

ffi::Error make_operand(const char* name, const ffi::AnyBuffer& b, int base_rank, Operand* out);
inline ffi::Error make_output(const char* name, const ffi::AnyBuffer& b, int base_rank, Operand* out) {
  out->is_output = true;
  return make_operand(name, b, base_rank, out);
}

// A buffer of raw bytes (uint8, base_rank dimensions plus vmap's leading ones), such as the VSA
// layer's reserve: the library gets a slice as (data, the product of its dimensions in bytes), not
// as a tensor.
ffi::Error make_bytes(const char* name, const ffi::AnyBuffer& b, int base_rank, bool is_output,
                      Operand* out);

// The batch the leading dimensions describe: the loop runs the library once per element, each
// operand's slice found from its own leading dims (size 1: the same slice for every element).
class Batch {
 public:
  // `shape_from` is an output operand: outputs always carry the full batch shape.
  static ffi::Error of(const Operand& shape_from, const std::vector<const Operand*>& all, Batch* out);
  int64_t count() const { return count_; }
  // The rank-base_rank descriptor of op's slice for batch element n (contiguous row-major).
  fva_tensor_t slice(const Operand& op, int64_t n) const;
  // Bytes of one slice of op.
  static size_t slice_bytes(const Operand& op);

 private:
  std::vector<int64_t> lead_;
  int64_t count_ = 1;
};

// Runs `call(tensors, ws, ws_bytes)` once per batch element, `tensors` holding the slices of `ops`
// in order (an op that is nullptr gives a NULL pointer), with one workspace of `bytes` (reused: on a
// stream the calls are ordered, on the CPU they run one after another).
// A slice that is not 16-byte aligned (vmap's slices of small tensors, e.g. block_sizes [N, 3]
// int32) is staged through an aligned copy: inputs copied in before the call, outputs copied out
// after it, since the library requires 16-byte aligned data.
using BatchedCall =
    std::function<fva_status_t(const std::vector<const fva_tensor_t*>& t, void* ws, size_t ws_bytes)>;
ffi::Error run_batched(const Exec& ex, const Batch& batch, const std::vector<const Operand*>& ops,
                       size_t bytes, const BatchedCall& call);

}  // namespace fvattn_jax
