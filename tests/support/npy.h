// A minimal .npy reader for the golden data: little-endian '<u2' (bf16 bit patterns), '<f4', '<i4',
// C order, format versions 1-3. Anything else is rejected with a message naming the file, so a
// changed golden file fails loudly instead of being misread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fvt {

struct NpyArray {
  std::string descr;           // "<u2", "<f4" or "<i4"
  std::vector<int64_t> shape;  // C order
  std::vector<uint8_t> bytes;  // raw little-endian element data, numel * item size

  int64_t numel() const;
  size_t item_size() const;
  // Typed copies; each throws std::runtime_error if descr does not match.
  std::vector<uint16_t> as_u16() const;
  std::vector<float> as_f32() const;
  std::vector<int32_t> as_i32() const;
};

// Throws std::runtime_error (with the path) on any I/O or format problem.
NpyArray read_npy(const std::string& path);

}  // namespace fvt
