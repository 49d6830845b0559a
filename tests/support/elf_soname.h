// The DT_SONAME of an ELF shared object on disk, read from its dynamic section (64-bit ELF), so a
// test can compare what the linker recorded with the header's FVA_ABI_VERSION without readelf.
#pragma once

#include <string>

namespace fvt {

// The SONAME of the 64-bit ELF file at `path`; throws std::runtime_error if the file cannot be read,
// is not such a file, or has no SONAME.
std::string elf_soname(const std::string& path);

}  // namespace fvt
