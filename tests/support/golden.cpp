#include "support/golden.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <sys/stat.h>

#include "support/npy.h"

#ifndef FVA_GOLDEN_DIR
#error "FVA_GOLDEN_DIR must be defined by the build (tests/CMakeLists.txt)"
#endif

namespace fvt {
namespace {

// A small JSON reader, enough for case.json: objects, arrays, strings without exotic escapes,
// numbers, true/false/null.
struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool b = false;
  double num = 0.0;
  std::string str;
  std::vector<Json> arr;
  std::map<std::string, Json> obj;
};

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& where) : s_(text), where_(where) {}
  Json parse() {
    Json v = value();
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw std::runtime_error("json: " + where_ + ": " + why + " at offset " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  std::string string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') {
        ++i_;
        if (i_ >= s_.size()) fail("bad escape");
      }
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  Json value() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::Object;
      if (eat('}')) return v;
      do {
        ws();
        std::string key = string();
        expect(':');
        v.obj[key] = value();
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = Json::Array;
      if (eat(']')) return v;
      do v.arr.push_back(value());
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::String;
      v.str = string();
    } else if (s_.compare(i_, 4, "true") == 0) {
      v.kind = Json::Bool;
      v.b = true;
      i_ += 4;
    } else if (s_.compare(i_, 5, "false") == 0) {
      v.kind = Json::Bool;
      i_ += 5;
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else {
      const char* begin = s_.c_str() + i_;
      char* end = nullptr;
      v.kind = Json::Number;
      v.num = std::strtod(begin, &end);
      if (end == begin) fail("bad value");
      i_ += static_cast<size_t>(end - begin);
    }
    return v;
  }
  const std::string& s_;
  std::string where_;
  size_t i_ = 0;
};

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string golden_dir() { return FVA_GOLDEN_DIR; }

bool GoldenCase::flag(const std::string& key) const {
  auto it = preset.find(key);
  if (it == preset.end()) throw std::runtime_error("golden " + name + ": preset lacks " + key);
  return it->second;
}

std::vector<GoldenCase> list_golden(const std::string& kind) {
  const std::string root = golden_dir() + "/" + kind;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(root.c_str()), ::closedir);
  if (!d) throw std::runtime_error("golden: cannot open " + root);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d.get())) {
    const std::string n = e->d_name;
    if (n == "." || n == ".." || !is_dir(root + "/" + n)) continue;
    names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) throw std::runtime_error("golden: no cases under " + root);

  std::vector<GoldenCase> out;
  for (const std::string& n : names) {
    GoldenCase c;
    c.kind = kind;
    c.name = n;
    c.dir = root + "/" + n;
    std::ifstream f(c.dir + "/case.json");
    if (!f) throw std::runtime_error("golden: missing " + c.dir + "/case.json");
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    const Json j = JsonParser(text, c.dir + "/case.json").parse();
    if (j.kind != Json::Object) throw std::runtime_error("golden: case.json is not an object");
    if (kind == "qat") {
      auto p = j.obj.find("preset");
      auto causal = j.obj.find("causal");
      auto scale = j.obj.find("sm_scale");
      if (p == j.obj.end() || p->second.kind != Json::Object || causal == j.obj.end() ||
          causal->second.kind != Json::Bool || scale == j.obj.end() ||
          scale->second.kind != Json::Number)
        throw std::runtime_error("golden: " + c.dir + "/case.json lacks preset/causal/sm_scale");
      for (const auto& kv : p->second.obj)
        if (kv.second.kind == Json::Bool) c.preset[kv.first] = kv.second.b;
      c.causal = causal->second.b;
      c.sm_scale = scale->second.num;
    }
    if (kind == "vsa_layer") {
      auto topk = j.obj.find("topk");
      auto gate = j.obj.find("gate");
      if (topk == j.obj.end() || topk->second.kind != Json::Number || gate == j.obj.end() ||
          gate->second.kind != Json::Bool)
        throw std::runtime_error("golden: " + c.dir + "/case.json lacks topk/gate");
      c.topk = static_cast<int64_t>(topk->second.num);
      c.gate = gate->second.b;
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<int64_t> golden_shape(const GoldenCase& c, const std::string& name) {
  return read_npy(c.path(name)).shape;
}

std::vector<uint16_t> golden_bits(const GoldenCase& c, const std::string& name) {
  return read_npy(c.path(name)).as_u16();
}

ref64::Tensor golden_tensor(const GoldenCase& c, const std::string& name) {
  const NpyArray a = read_npy(c.path(name));
  if (a.shape.size() != 4) throw std::runtime_error("golden " + c.name + "/" + name + ": not rank 4");
  ref64::Shape s;
  s.B = a.shape[0];
  s.H = a.shape[1];
  s.S = a.shape[2];
  s.D = a.shape[3];
  ref64::Tensor t(s);
  const std::vector<uint16_t> bits = a.as_u16();
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    float f;
    static_assert(sizeof(f) == sizeof(u), "float is 32 bits");
    std::memcpy(&f, &u, 4);
    t.data[i] = f;
  }
  return t;
}

std::vector<double> golden_f32(const GoldenCase& c, const std::string& name) {
  const std::vector<float> f = read_npy(c.path(name)).as_f32();
  return std::vector<double>(f.begin(), f.end());
}

std::vector<int32_t> golden_i32(const GoldenCase& c, const std::string& name) {
  return read_npy(c.path(name)).as_i32();
}

ref64::QatConfig golden_qat_config(const GoldenCase& c) {
  ref64::QatConfig cfg;
  cfg.softmax_scale = c.sm_scale;
  cfg.causal = c.causal;
  cfg.quantize = c.flag("IS_QAT");
  cfg.smooth_k = c.flag("smooth_k");
  cfg.qkv_scale = c.flag("use_global_sf_QKV") ? ref64::Scale::Tile : ref64::Scale::Block;
  cfg.p_scale = c.flag("two_level_quant_P")  ? ref64::Scale::Row
                : c.flag("use_global_sf_P") ? ref64::Scale::Tile
                                            : ref64::Scale::Block;
  cfg.quantize_p_backward = c.flag("fake_quant_P");
  cfg.high_precision_o = c.flag("use_high_prec_o");
  cfg.quantized_qkv_backward = c.flag("use_qat_qkv_backward");
  return cfg;
}

}  // namespace fvt
