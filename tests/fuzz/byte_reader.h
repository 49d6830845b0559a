// The fuzzer's view of its input: a stream of bytes read front to back, every read well defined
// once the input runs out (it yields zeros). Zeros are chosen to mean "the plain, valid choice"
// throughout the fuzzer, so a short input is a valid call and the seed corpus can be written by
// hand (tests/fuzz/make_corpus.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace fvafuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  bool empty() const { return p_ == end_; }

  uint8_t u8() { return p_ == end_ ? 0 : *p_++; }

  uint32_t u32() {  // little endian
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(u8()) << (8 * i);
    return v;
  }

  // One of `choices`, by the next byte (the first choice when the input is exhausted).
  template <typename T>
  T pick(std::initializer_list<T> choices) {
    const size_t i = u8() % choices.size();
    return *(choices.begin() + i);
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace fvafuzz
