#include "bundler/elf_file.h"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace agentix::bundler {
namespace {

// The whole file in memory: bundled binaries are at most tens of MB and are
// read once each.
absl::StatusOr<std::string> Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
bool ReadAt(const std::string& data, uint64_t offset, T* out) {
  if (offset > data.size() || data.size() - offset < sizeof(T)) return false;
  std::memcpy(out, data.data() + offset, sizeof(T));
  return true;
}

// NUL-terminated string at `offset`, or nullopt-like empty + false.
bool StringAt(const std::string& data, uint64_t offset, std::string* out) {
  if (offset >= data.size()) return false;
  size_t end = data.find('\0', offset);
  if (end == std::string::npos) return false;
  *out = data.substr(offset, end - offset);
  return true;
}

std::vector<std::string> SplitPath(const std::string& value) {
  return absl::StrSplit(value, ':', absl::SkipEmpty());
}

}  // namespace

bool IsElfFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[SELFMAG];
  if (!in.read(magic, SELFMAG)) return false;
  return std::memcmp(magic, ELFMAG, SELFMAG) == 0;
}

absl::StatusOr<ElfDynamicInfo> ReadElfDynamicInfo(const std::string& path) {
  absl::StatusOr<std::string> loaded = Slurp(path);
  if (!loaded.ok()) return loaded.status();
  const std::string& data = *loaded;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  };

  Elf64_Ehdr ehdr;
  if (!ReadAt(data, 0, &ehdr) ||
      std::memcmp(ehdr.e_ident, ELFMAG, SELFMAG) != 0) {
    return bad("not an ELF file");
  }
  if (ehdr.e_ident[EI_CLASS] != ELFCLASS64 ||
      ehdr.e_ident[EI_DATA] != ELFDATA2LSB) {
    return bad("not a little-endian ELF64 file");
  }
  if (ehdr.e_phentsize != sizeof(Elf64_Phdr)) {
    return bad("unexpected program header size");
  }

  ElfDynamicInfo info;
  std::vector<Elf64_Phdr> loads;
  Elf64_Phdr dynamic{};
  bool has_dynamic = false;
  for (uint16_t i = 0; i < ehdr.e_phnum; ++i) {
    Elf64_Phdr phdr;
    if (!ReadAt(data, ehdr.e_phoff + uint64_t{i} * sizeof(phdr), &phdr)) {
      return bad("program header outside the file");
    }
    if (phdr.p_type == PT_INTERP) {
      if (!StringAt(data, phdr.p_offset, &info.interpreter)) {
        return bad("PT_INTERP outside the file");
      }
    } else if (phdr.p_type == PT_LOAD) {
      loads.push_back(phdr);
    } else if (phdr.p_type == PT_DYNAMIC) {
      dynamic = phdr;
      has_dynamic = true;
    }
  }
  info.executable = ehdr.e_type == ET_EXEC || !info.interpreter.empty();
  if (!has_dynamic) return info;

  // DT_STRTAB is a virtual address; map it to a file offset through the
  // PT_LOAD segment that contains it.
  auto to_offset = [&](uint64_t vaddr, uint64_t* offset) {
    for (const auto& load : loads) {
      if (vaddr >= load.p_vaddr && vaddr < load.p_vaddr + load.p_filesz) {
        *offset = vaddr - load.p_vaddr + load.p_offset;
        return true;
      }
    }
    return false;
  };

  uint64_t strtab_vaddr = 0;
  bool has_strtab = false;
  std::vector<uint64_t> needed, rpath, runpath;
  uint64_t soname = 0;
  bool has_soname = false;
  for (uint64_t off = dynamic.p_offset;
       off + sizeof(Elf64_Dyn) <= dynamic.p_offset + dynamic.p_filesz;
       off += sizeof(Elf64_Dyn)) {
    Elf64_Dyn dyn;
    if (!ReadAt(data, off, &dyn)) return bad("PT_DYNAMIC outside the file");
    if (dyn.d_tag == DT_NULL) break;
    switch (dyn.d_tag) {
      case DT_STRTAB:
        strtab_vaddr = dyn.d_un.d_ptr;
        has_strtab = true;
        break;
      case DT_NEEDED:
        needed.push_back(dyn.d_un.d_val);
        break;
      case DT_RPATH:
        rpath.push_back(dyn.d_un.d_val);
        break;
      case DT_RUNPATH:
        runpath.push_back(dyn.d_un.d_val);
        break;
      case DT_SONAME:
        soname = dyn.d_un.d_val;
        has_soname = true;
        break;
      default:
        break;
    }
  }
  if (!has_strtab) {
    if (needed.empty() && rpath.empty() && runpath.empty() && !has_soname) {
      return info;
    }
    return bad("dynamic section without DT_STRTAB");
  }
  uint64_t strtab = 0;
  if (!to_offset(strtab_vaddr, &strtab)) return bad("DT_STRTAB not mapped");
  auto str = [&](uint64_t index, std::string* out) {
    return StringAt(data, strtab + index, out);
  };
  for (uint64_t index : needed) {
    std::string name;
    if (!str(index, &name)) return bad("DT_NEEDED outside the string table");
    info.needed.push_back(name);
  }
  for (uint64_t index : rpath) {
    std::string value;
    if (!str(index, &value)) return bad("DT_RPATH outside the string table");
    for (auto& p : SplitPath(value)) info.rpath.push_back(p);
  }
  for (uint64_t index : runpath) {
    std::string value;
    if (!str(index, &value)) return bad("DT_RUNPATH outside the string table");
    for (auto& p : SplitPath(value)) info.runpath.push_back(p);
  }
  if (has_soname && !str(soname, &info.soname)) {
    return bad("DT_SONAME outside the string table");
  }
  return info;
}

}  // namespace agentix::bundler
