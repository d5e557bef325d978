// SPDX-License-Identifier: Apache-2.0
// Reads the dynamic symbol table of an ELF shared object, as `nm -D --defined-only` would list it.
#include "elf_symbols.h"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace phos::testing {
namespace {

template <typename T>
bool readAt(const std::vector<char>& file, std::size_t offset, T& out) {
  if (offset > file.size() || file.size() - offset < sizeof(T)) return false;
  std::memcpy(&out, file.data() + offset, sizeof(T));
  return true;
}

}  // namespace

Result<std::set<std::string>> definedDynamicSymbols(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return makeError(Code::kNotFound, "cannot open '{}'", path);
  std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  Elf64_Ehdr eh;
  if (!readAt(file, 0, eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) {
    return makeError(Code::kInvalidArgument, "'{}' is not a 64-bit ELF file", path);
  }
  std::vector<Elf64_Shdr> sections(eh.e_shnum);
  for (std::size_t i = 0; i < sections.size(); ++i) {
    if (!readAt(file, eh.e_shoff + i * eh.e_shentsize, sections[i])) {
      return makeError(Code::kDataLoss, "'{}': section header {} is truncated", path, i);
    }
  }
  std::set<std::string> names;
  for (const Elf64_Shdr& sh : sections) {
    if (sh.sh_type != SHT_DYNSYM) continue;
    if (sh.sh_link >= sections.size()) return makeError(Code::kDataLoss, "'{}': .dynsym links no string table", path);
    const Elf64_Shdr& strtab = sections[sh.sh_link];
    for (std::size_t off = sh.sh_offset; off + sizeof(Elf64_Sym) <= sh.sh_offset + sh.sh_size; off += sizeof(Elf64_Sym)) {
      Elf64_Sym sym;
      if (!readAt(file, off, sym)) return makeError(Code::kDataLoss, "'{}': .dynsym is truncated", path);
      const unsigned bind = ELF64_ST_BIND(sym.st_info);
      const unsigned vis = ELF64_ST_VISIBILITY(sym.st_other);
      if (sym.st_shndx == SHN_UNDEF || sym.st_name == 0) continue;
      if (bind != STB_GLOBAL && bind != STB_WEAK) continue;
      if (vis != STV_DEFAULT && vis != STV_PROTECTED) continue;
      std::size_t at = strtab.sh_offset + sym.st_name;
      if (at >= file.size()) return makeError(Code::kDataLoss, "'{}': symbol name outside the file", path);
      const char* begin = file.data() + at;
      names.emplace(begin, strnlen(begin, file.size() - at));
    }
  }
  return names;
}

}  // namespace phos::testing
