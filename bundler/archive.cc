#include "bundler/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <openssl/evp.h>
#include <stdio.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

constexpr size_t kChunk = 1 << 20;

struct ArchiveDeleter {
  void operator()(struct archive* a) const { archive_write_free(a); }
};
struct EntryDeleter {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};
struct DigestDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
  }
  void Update(const void* data, size_t size) {
    EVP_DigestUpdate(ctx_.get(), data, size);
  }
  void Update(absl::string_view data) { Update(data.data(), data.size()); }
  std::string HexDigest() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_DigestFinal_ex(ctx_.get(), out, &size);
    return absl::BytesToHexString(
        absl::string_view(reinterpret_cast<const char*>(out), size));
  }

 private:
  std::unique_ptr<EVP_MD_CTX, DigestDeleter> ctx_;
};

bool IsExecutable(fs::perms perms) {
  return (perms & (fs::perms::owner_exec | fs::perms::group_exec |
                   fs::perms::others_exec)) != fs::perms::none;
}

absl::Status ArchiveError(struct archive* a, absl::string_view what) {
  const char* message = archive_error_string(a);
  return absl::InternalError(absl::StrCat(what, ": ",
                                          message ? message : "libarchive"));
}

}  // namespace

absl::StatusOr<std::vector<TarEntry>> CollectTree(const std::string& root,
                                                  const std::string& prefix) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::NotFoundError(absl::StrCat(root, " is not a directory"));
  }
  std::vector<TarEntry> entries;
  TarEntry top;
  top.path = prefix;
  top.type = TarEntry::Type::kDirectory;
  entries.push_back(top);
  fs::recursive_directory_iterator it(root, ec), end;
  if (ec) return absl::NotFoundError(absl::StrCat(root, ": ", ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) return absl::InternalError(absl::StrCat(root, ": ", ec.message()));
    const fs::path& path = it->path();
    // lexically_relative: fs::relative would resolve symlinks.
    TarEntry entry;
    entry.path =
        (fs::path(prefix) / path.lexically_relative(root)).generic_string();
    fs::file_status status = it->symlink_status(ec);
    if (ec) return absl::InternalError(absl::StrCat(path.string(), ": ", ec.message()));
    if (fs::is_symlink(status)) {
      entry.type = TarEntry::Type::kSymlink;
      entry.link_target = fs::read_symlink(path, ec).string();
    } else if (fs::is_directory(status)) {
      entry.type = TarEntry::Type::kDirectory;
    } else if (fs::is_regular_file(status)) {
      entry.type = TarEntry::Type::kFile;
      entry.source = path.string();
      entry.executable = IsExecutable(status.permissions());
    } else {
      return absl::FailedPreconditionError(absl::StrCat(
          path.string(), " is not a file, directory or symlink"));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::Status WriteTar(std::vector<TarEntry> entries,
                      const std::string& out_path) {
  std::sort(entries.begin(), entries.end(),
            [](const TarEntry& a, const TarEntry& b) { return a.path < b.path; });
  const std::string temp = out_path + ".partial";
  std::unique_ptr<struct archive, ArchiveDeleter> a(archive_write_new());
  // pax only where ustar cannot express an entry (long names, big files);
  // this libarchive names pax headers without a pid, so they are stable.
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
      archive_write_open_filename(a.get(), temp.c_str()) != ARCHIVE_OK) {
    return ArchiveError(a.get(), absl::StrCat("cannot create ", temp));
  }
  std::vector<char> buffer(kChunk);
  for (const TarEntry& e : entries) {
    std::unique_ptr<archive_entry, EntryDeleter> entry(archive_entry_new());
    archive_entry_set_pathname(entry.get(), e.path.c_str());
    archive_entry_set_mtime(entry.get(), kArchiveMtime, 0);
    archive_entry_set_uid(entry.get(), 0);
    archive_entry_set_gid(entry.get(), 0);
    archive_entry_set_uname(entry.get(), "");
    archive_entry_set_gname(entry.get(), "");
    std::ifstream in;
    int64_t size = 0;
    switch (e.type) {
      case TarEntry::Type::kDirectory:
        archive_entry_set_filetype(entry.get(), AE_IFDIR);
        archive_entry_set_perm(entry.get(), e.directory_mode);
        break;
      case TarEntry::Type::kSymlink:
        archive_entry_set_filetype(entry.get(), AE_IFLNK);
        archive_entry_set_perm(entry.get(), 0777);
        archive_entry_set_symlink(entry.get(), e.link_target.c_str());
        break;
      case TarEntry::Type::kFile:
        archive_entry_set_filetype(entry.get(), AE_IFREG);
        archive_entry_set_perm(entry.get(), e.executable ? 0755 : 0644);
        if (e.content_is_inline) {
          size = static_cast<int64_t>(e.content.size());
        } else {
          in.open(e.source, std::ios::binary);
          std::error_code ec;
          uintmax_t file_size = fs::file_size(e.source, ec);
          if (!in || ec) {
            return absl::NotFoundError(absl::StrCat("cannot read ", e.source));
          }
          size = static_cast<int64_t>(file_size);
        }
        archive_entry_set_size(entry.get(), size);
        break;
    }
    if (archive_write_header(a.get(), entry.get()) != ARCHIVE_OK) {
      return ArchiveError(a.get(), absl::StrCat("writing ", e.path));
    }
    if (e.type != TarEntry::Type::kFile) continue;
    if (e.content_is_inline) {
      if (archive_write_data(a.get(), e.content.data(), e.content.size()) < 0) {
        return ArchiveError(a.get(), absl::StrCat("writing ", e.path));
      }
      continue;
    }
    int64_t written = 0;
    while (in.read(buffer.data(), buffer.size()) || in.gcount() > 0) {
      la_ssize_t n = archive_write_data(a.get(), buffer.data(),
                                        static_cast<size_t>(in.gcount()));
      if (n < 0) return ArchiveError(a.get(), absl::StrCat("writing ", e.path));
      written += in.gcount();
    }
    if (written != size) {
      return absl::InternalError(
          absl::StrCat(e.source, " changed size while being archived"));
    }
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK) {
    return ArchiveError(a.get(), absl::StrCat("closing ", temp));
  }
  std::error_code ec;
  fs::rename(temp, out_path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("rename ", temp, " -> ", out_path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

std::string Sha256Hex(absl::string_view data) {
  Sha256 sha;
  sha.Update(data);
  return sha.HexDigest();
}

absl::StatusOr<std::string> Sha256File(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  Sha256 sha;
  std::vector<char> buffer(kChunk);
  while (in.read(buffer.data(), buffer.size()) || in.gcount() > 0) {
    sha.Update(buffer.data(), static_cast<size_t>(in.gcount()));
  }
  return sha.HexDigest();
}

absl::StatusOr<std::string> TreeDigest(const std::string& root) {
  absl::StatusOr<std::vector<TarEntry>> entries = CollectTree(root, ".");
  if (!entries.ok()) return entries.status();
  std::sort(entries->begin(), entries->end(),
            [](const TarEntry& a, const TarEntry& b) { return a.path < b.path; });
  Sha256 sha;
  std::vector<char> buffer(kChunk);
  for (const TarEntry& e : *entries) {
    if (e.path == ".") continue;
    std::string rel = e.path.substr(2);  // drop "./"
    int mode = e.type == TarEntry::Type::kDirectory ? 0755
               : e.type == TarEntry::Type::kSymlink ? 0777
               : e.executable                       ? 0755
                                                    : 0644;
    sha.Update(absl::StrCat(rel, std::string(1, '\0'), absl::StrFormat("%o", mode),
                            std::string(1, '\0')));
    if (e.type == TarEntry::Type::kSymlink) {
      sha.Update(absl::StrCat("L", std::string(1, '\0'), e.link_target,
                              std::string(1, '\0')));
    } else if (e.type == TarEntry::Type::kDirectory) {
      sha.Update(absl::StrCat("D", std::string(1, '\0')));
    } else {
      std::error_code ec;
      uintmax_t size = fs::file_size(e.source, ec);
      if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", e.source));
      sha.Update(absl::StrCat("F", std::string(1, '\0'), size,
                              std::string(1, '\0')));
      std::ifstream in(e.source, std::ios::binary);
      while (in.read(buffer.data(), buffer.size()) || in.gcount() > 0) {
        sha.Update(buffer.data(), static_cast<size_t>(in.gcount()));
      }
    }
  }
  return sha.HexDigest();
}

}  // namespace agentix::bundler
