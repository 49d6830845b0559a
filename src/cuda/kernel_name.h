// A kernel's name put together on the stack from its pieces ("fva_vsa_fwd_", "bf16", "_d", 128):
// what each launch does to name its kernel, without formatting or allocating.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace fva::cuda {

class KernelName {
 public:
  template <typename... Pieces>
  explicit KernelName(const Pieces&... pieces) {
    (append(pieces), ...);
  }
  const char* c_str() const { return text_; }
  std::string str() const { return text_; }

 private:
  void append(const char* s) {
    const size_t n = std::strlen(s);
    if (length_ + n >= sizeof text_) return overflow();
    std::memcpy(text_ + length_, s, n + 1);
    length_ += n;
  }
  void append(const std::string& s) { append(s.c_str()); }
  template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
  void append(Int value) {
    char digits[24];
    int n = 0;
    uint64_t v = value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    if (value < 0) digits[n++] = '-';
    char reversed[24];
    for (int i = 0; i < n; ++i) reversed[i] = digits[n - 1 - i];
    reversed[n] = '\0';
    append(reversed);
  }
  // A name longer than any kernel's: the lookup then fails with this text in its message.
  void overflow() {
    static const char kTooLong[] = "(kernel name too long)";
    std::memcpy(text_, kTooLong, sizeof kTooLong);
    length_ = sizeof text_;  // no further piece fits
  }

  char text_[96] = {0};
  size_t length_ = 0;
};

}  // namespace fva::cuda
