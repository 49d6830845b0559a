// The versions agree: the header's FVA_VERSION_* and FVA_ABI_VERSION, what the loaded
// library reports (fva_version, fva_abi_version), the SONAME the linker recorded
// (libfvattn.so.<FVA_ABI_VERSION>), the file name (libfvattn.so.MAJOR.MINOR.PATCH) and the symbol
// version node the exports live under (FVATTN_<FVA_ABI_VERSION>). CMake reads the version and the
// SONAME from the header; this test is what notices if one of them is changed by hand.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "support/elf_soname.h"

namespace {

// The file the dynamic linker loaded fva_version from, and that file with links resolved.
std::string loaded_library() {
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(&fva_version), &info) != 0);
  REQUIRE(info.dli_fname != nullptr);
  return info.dli_fname;
}

std::string basename_of(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

}  // namespace

TEST_CASE("header version macros, fva_version, fva_abi_version, SONAME and file name agree") {
  const int major = FVA_VERSION_MAJOR, minor = FVA_VERSION_MINOR, patch = FVA_VERSION_PATCH;
  const std::string version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  CHECK(fva_version() == major * 10000 + minor * 100 + patch);
  CHECK(fva_abi_version() == FVA_ABI_VERSION);

  const std::string path = loaded_library();
  char real[PATH_MAX];
  REQUIRE(realpath(path.c_str(), real) != nullptr);
  MESSAGE("fvattn " << version << ", ABI " << FVA_ABI_VERSION << ", loaded from " << path << " -> " << real);
  CHECK(fvt::elf_soname(real) == "libfvattn.so." + std::to_string(FVA_ABI_VERSION));
  CHECK(basename_of(real) == "libfvattn.so." + version);

  // Every export lives under the version node of this ABI.
  void* self = dlopen(real, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(self != nullptr);
  const std::string node = "FVATTN_" + std::to_string(FVA_ABI_VERSION);
  CHECK_MESSAGE(dlvsym(self, "fva_version", node.c_str()) == reinterpret_cast<void*>(&fva_version),
                "fva_version is not exported under " << node);
  dlclose(self);
}
