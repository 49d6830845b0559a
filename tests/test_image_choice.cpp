// Which kernel image each compute capability from 8.0 to 12.1 runs (src/core/image_choice.h: the
// driver's own choice among the SASS images of a release build and its compute_80 PTX, which
// fva_get_info and `fvattn info` report), and what the ptx_jit option changes.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/image_choice.h"

namespace {

const std::vector<std::string> kRelease = fva::split_archs("80;86;89;90a;100f;120f");

std::string image(int major, int minor, bool ptx_jit = false) {
  return fva::choose_image(major, minor, kRelease, 80, ptx_jit).image;
}

}  // namespace

TEST_CASE("image choice: every compute capability since Ampere gets SASS or the PTX") {
  struct Row {
    int major, minor;
    const char* image;
  };
  const Row rows[] = {
      {8, 0, "sm_80"},       // A100
      {8, 6, "sm_86"},       // A10, RTX 3090
      {8, 7, "sm_86"},       // Jetson Orin: sm_86's SASS runs on 8.7
      {8, 8, "sm_86"},
      {8, 9, "sm_89"},       // L40S, RTX 4090
      {9, 0, "sm_90a"},      // H100, H200
      {10, 0, "sm_100f"},    // B200
      {10, 3, "sm_100f"},    // B300: the family image
      {11, 0, "compute_80"}, // Thor: no SASS of this build fits, the PTX is JIT-compiled
      {12, 0, "sm_120f"},    // RTX 50
      {12, 1, "sm_120f"},    // DGX Spark
      {13, 0, "compute_80"}, // a device newer than the build
      {7, 5, "none"},        // Turing: older than the oldest image
  };
  for (const Row& r : rows) {
    INFO(r.major << "." << r.minor);
    const fva::ImageChoice c = fva::choose_image(r.major, r.minor, kRelease, 80, false);
    CHECK(c.image == r.image);
    CHECK(!c.reason.empty());
  }
}

TEST_CASE("image choice: ptx_jit runs the PTX wherever it can, and a custom build's own archs") {
  CHECK(image(9, 0, true) == "compute_80");
  CHECK(image(8, 0, true) == "compute_80");
  CHECK(image(7, 5, true) == "none");
  CHECK(fva::choose_image(9, 0, kRelease, 80, true).reason.find("ptx_jit") != std::string::npos);
  // A device-only build (-DFVATTN_SASS_ARCHS=90a): SASS on 9.0, the PTX elsewhere.
  const std::vector<std::string> only90 = fva::split_archs("90a");
  CHECK(fva::choose_image(9, 0, only90, 80, false).image == "sm_90a");
  CHECK(fva::choose_image(8, 6, only90, 80, false).image == "compute_80");
  CHECK(fva::choose_image(10, 0, only90, 80, false).image == "compute_80");
  // "90a" is arch-specific: not for a hypothetical 9.1.
  CHECK(fva::choose_image(9, 1, only90, 80, false).image == "compute_80");
  // No PTX in the build: nothing for a device without SASS.
  CHECK(fva::choose_image(8, 6, only90, 0, false).image == "none");
  CHECK(fva::split_archs("80, 86;;89") == std::vector<std::string>{"80", "86", "89"});
}
