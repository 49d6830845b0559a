// The record the VSA layer's forward leaves at the start of its reserve, and the check every kernel of
// the layer's backward makes against it (the layer's own kernels, and the fine branch's kernels that
// write dq, dk and dv: shared/kernel_params.h's BlockTerms). Shared by the CUDA backend and the
// kernels, and by the CPU backend, which builds the same record (src/core/vsa_layer_record.h).
#pragma once

#include <stdint.h>

namespace fva::kern {

// What the forward recorded: the shapes, the dtype, topk, the softmax scale and whether a gate was
// given. The forward's first kernel clears the magic and its last kernel writes the whole record,
// so a forward that stops half way (a launch refused) leaves none; every kernel of the backward
// compares it, word for word, with what its own call expects and, when they differ, returns before
// writing anything (the host cannot read the reserve without synchronizing). No padding: 80 bytes,
// 20 words.
constexpr uint32_t kLayerReserveMagic = 0x4c415346u;  // "FSAL" in memory order: fvattn's VSA layer
constexpr uint32_t kLayerReserveVersion = 1u;
struct LayerReserveHeader {
  uint32_t magic, version;
  int32_t dtype, gate;
  int64_t B, Hq, Hkv, nq, nkv, D, topk;
  uint32_t scale_bits;  // the fp32 softmax scale's bits
  uint32_t reserved;    // 0
};
static_assert(sizeof(LayerReserveHeader) == 80, "the record is compared as 20 words");
constexpr int kLayerHeaderWords = static_cast<int>(sizeof(LayerReserveHeader) / 4);

// The record's check, as every backward kernel takes it: where the record lies and what it must say.
struct LayerReserveCheck {
  const LayerReserveHeader* stored;
  LayerReserveHeader expected;
};

}  // namespace fva::kern
