// Which of libfvattn's kernel images a device runs, and why: the choice the driver makes when it
// loads a family's fatbin (every SASS image of the build and the compute_80 PTX; kernels/CMakeLists.txt),
// written out so that fva_get_info and `fvattn info` can say it before anything is loaded. Pure
// (no driver calls), header-only, so the tests check it for every compute capability.
//
// The driver runs a SASS image on a device of the same major version and an equal or newer minor
// one ("86" on 8.6, 8.7 and 8.8), an arch-specific image ("90a") on its own compute capability only,
// and a family image ("100f", "120f") on every device of its family (same major, equal or newer
// minor); it prefers the fitting SASS of the highest minor and JITs the PTX where none fits.
#pragma once

#include <string>
#include <vector>

namespace fva {

struct ImageChoice {
  std::string image;   // "sm_86", "sm_90a", "sm_100f", "compute_80" (the PTX, JIT), or "none"
  std::string reason;  // one sentence, for fva_handle_info_t.image_reason and `fvattn info`
};

// The SASS architectures a build holds ("80;86;89;90a;100f;120f", FVATTN_SASS_ARCHS), split.
inline std::vector<std::string> split_archs(const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : list) {
    if (c == ';' || c == ',' || c == ' ') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// ptx_arch: the PTX's compute capability as major * 10 + minor (80); 0: the build has no PTX.
inline ImageChoice choose_image(int sm_major, int sm_minor, const std::vector<std::string>& sass,
                                int ptx_arch, bool ptx_jit) {
  const int cc = sm_major * 10 + sm_minor;
  const std::string ptx = "compute_" + std::to_string(ptx_arch);
  const std::string device = std::to_string(sm_major) + "." + std::to_string(sm_minor);
  if (ptx_jit) {
    if (ptx_arch == 0 || cc < ptx_arch)
      return {"none", "the handle asks for the PTX (ptx_jit), which this build lacks or which needs "
                      "compute capability " + std::to_string(ptx_arch / 10) + "." +
                      std::to_string(ptx_arch % 10) + " or newer"};
    return {ptx, "the handle asks for the PTX (ptx_jit): the driver JIT-compiles " + ptx +
                     " for this " + device + " device, the SASS images unused"};
  }
  std::string best;
  int best_minor = -1;
  for (const std::string& a : sass) {
    if (a.size() < 2) continue;
    const char suffix = a.back();
    const bool specific = suffix == 'a', family = suffix == 'f';
    const std::string digits = specific || family ? a.substr(0, a.size() - 1) : a;
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const int v = std::stoi(digits), major = v / 10, minor = v % 10;
    const bool fits = specific ? (major == sm_major && minor == sm_minor)
                               : (major == sm_major && minor <= sm_minor);
    if (fits && minor > best_minor) {
      best = a;
      best_minor = minor;
    }
  }
  if (!best.empty()) {
    const std::string image = "sm_" + best;
    const char suffix = best.back();
    if (suffix == 'a') return {image, "SASS built for compute capability " + device + " (arch-specific)"};
    if (suffix == 'f')
      return {image, "SASS of the family image " + image + ", which runs on every " +
                         std::to_string(sm_major) + ".x device of its family"};
    if (best_minor == sm_minor) return {image, "SASS built for compute capability " + device};
    return {image, "SASS " + image + ", which runs on this " + device +
                       " device (same major version, older minor)"};
  }
  if (ptx_arch != 0 && cc >= ptx_arch)
    return {ptx, "no SASS of this build fits compute capability " + device + ": the driver JIT-compiles " +
                     ptx + " (once per process; the driver caches it)"};
  return {"none", "compute capability " + device + " is older than the oldest image (" +
                      (ptx_arch != 0 ? ptx : std::string("none")) + "): every call returns FVA_ERR_UNSUPPORTED"};
}

}  // namespace fva
