// The key order of the sm_90a QAT forward's K and V tiles with quantized P ("owned groups").
//
// In a wgmma accumulator, the thread of quad lane t holds columns 8j + 2t + e (j = 0..7,
// e = 0, 1) of its rows: with keys in their natural order, a 16-key NVFP4 group of P (keys
// 16k .. 16k + 15, SPEC.md section 1) is spread over the quad's four lanes, and its max and its
// scale need shuffles that lie on the softmax's critical path. Stored in this order, the tile's
// rows put group t entirely in lane t's 16 columns: slot 8j + 2t + e holds key 16t + 2j + e. Q Kᵀ
// then has its columns in slot order and P·V contracts over slots with V in the same order, so
// the product is unchanged; only the masks read the key through key_of_owned_slot.
// The QAT forward's NVFP4 preparation writes K and V in this order (preprocess/nvfp4_quantize.cu), each
// (b, head) padded with zero rows to whole 64-key tiles, and only the Hopper forward reads them.
#pragma once

#include "shared/host_device.h"

namespace fva {

constexpr int kOwnedTileKeys = 64;  // the order permutes keys within 64-key tiles

// The slot (row within the tile) of key `key` (0..63), and its inverse.
FVA_HD constexpr int owned_slot_of_key(int key) {
  return (((key >> 1) & 7) << 3) | ((key >> 4) << 1) | (key & 1);
}
FVA_HD constexpr int key_of_owned_slot(int slot) {
  return (((slot >> 1) & 3) << 4) | ((slot >> 3) << 1) | (slot & 1);
}
// The row that stores token s of a sequence in this order (its tile's rows permuted), and the rows
// a sequence of `tokens` takes once padded to whole tiles.
FVA_HD constexpr int owned_row_of_token(int s) {
  return (s & ~(kOwnedTileKeys - 1)) | owned_slot_of_key(s & (kOwnedTileKeys - 1));
}
template <typename Int>
FVA_HD constexpr Int owned_padded_rows(Int tokens) {  // tokens >= 0
  return (tokens + kOwnedTileKeys - 1) & ~static_cast<Int>(kOwnedTileKeys - 1);
}

}  // namespace fva
