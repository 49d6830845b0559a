#include "support/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fvt {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("npy: " + path + ": " + why);
}

// Value of key `key` in the header dict, as raw text up to the next top-level ',' or '}'.
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  const std::string k = "'" + key + "'";
  const size_t at = header.find(k);
  if (at == std::string::npos) fail(path, "header has no " + k);
  size_t p = header.find(':', at + k.size());
  if (p == std::string::npos) fail(path, "header is malformed at " + k);
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  size_t e = p;
  if (e < header.size() && header[e] == '(') {
    e = header.find(')', e);
    if (e == std::string::npos) fail(path, "unterminated shape tuple");
    return header.substr(p, e - p + 1);
  }
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  return header.substr(p, e - p);
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

size_t NpyArray::item_size() const { return descr == "<u2" ? 2 : 4; }

std::vector<uint16_t> NpyArray::as_u16() const {
  if (descr != "<u2") throw std::runtime_error("npy: expected <u2, have " + descr);
  std::vector<uint16_t> out(static_cast<size_t>(numel()));
  std::memcpy(out.data(), bytes.data(), out.size() * 2);  // the test hosts are little-endian
  return out;
}

std::vector<float> NpyArray::as_f32() const {
  if (descr != "<f4") throw std::runtime_error("npy: expected <f4, have " + descr);
  std::vector<float> out(static_cast<size_t>(numel()));
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::vector<int32_t> NpyArray::as_i32() const {
  if (descr != "<i4") throw std::runtime_error("npy: expected <i4, have " + descr);
  std::vector<int32_t> out(static_cast<size_t>(numel()));
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open");
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(path, "not a .npy file");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t hlen = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) fail(path, "truncated header");
    hlen = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) fail(path, "truncated header");
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    fail(path, "unsupported format version " + std::to_string(major));
  }
  std::string header(hlen, '\0');
  if (!f.read(&header[0], hlen)) fail(path, "truncated header");

  NpyArray a;
  std::string descr = dict_value(header, "descr", path);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"')) fail(path, "bad descr");
  a.descr = descr.substr(1, descr.size() - 2);
  if (a.descr == "|u2") a.descr = "<u2";
  if (a.descr != "<u2" && a.descr != "<f4" && a.descr != "<i4")
    fail(path, "unsupported dtype " + a.descr + " (want <u2, <f4 or <i4)");
  if (dict_value(header, "fortran_order", path) != "False") fail(path, "Fortran order unsupported");
  const std::string shape = dict_value(header, "shape", path);
  std::stringstream ss(shape.substr(1, shape.size() - 2));
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t p = item.find_first_not_of(' ');
    if (p == std::string::npos) continue;  // the trailing comma of a 1-tuple
    a.shape.push_back(std::stoll(item.substr(p)));
  }
  const size_t nbytes = static_cast<size_t>(a.numel()) * a.item_size();
  a.bytes.resize(nbytes);
  if (nbytes && !f.read(reinterpret_cast<char*>(a.bytes.data()), static_cast<std::streamsize>(nbytes)))
    fail(path, "truncated data (want " + std::to_string(nbytes) + " bytes)");
  return a;
}

}  // namespace fvt
