#include "support/elf_soname.h"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

namespace fvt {
namespace {

template <typename T>
T read_at(const std::vector<char>& f, uint64_t offset) {
  if (offset > f.size() || f.size() - offset < sizeof(T)) throw std::runtime_error("ELF file truncated");
  T v;
  std::memcpy(&v, f.data() + offset, sizeof v);
  return v;
}

}  // namespace

std::string elf_soname(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::vector<char> f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto eh = read_at<Elf64_Ehdr>(f, 0);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64)
    throw std::runtime_error(path + " is not a 64-bit ELF file");
  auto section = [&](uint64_t i) { return read_at<Elf64_Shdr>(f, eh.e_shoff + i * eh.e_shentsize); };
  for (uint64_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr dyn = section(i);
    if (dyn.sh_type != SHT_DYNAMIC) continue;
    const Elf64_Shdr strtab = section(dyn.sh_link);  // the dynamic section's strings
    for (uint64_t off = dyn.sh_offset; off + sizeof(Elf64_Dyn) <= dyn.sh_offset + dyn.sh_size;
         off += sizeof(Elf64_Dyn)) {
      const auto d = read_at<Elf64_Dyn>(f, off);
      if (d.d_tag == DT_NULL) break;
      if (d.d_tag != DT_SONAME) continue;
      const uint64_t at = strtab.sh_offset + d.d_un.d_val;
      if (at >= f.size()) throw std::runtime_error("ELF SONAME offset out of range");
      return std::string(f.data() + at, strnlen(f.data() + at, f.size() - at));
    }
  }
  throw std::runtime_error(path + " has no SONAME");
}

}  // namespace fvt
