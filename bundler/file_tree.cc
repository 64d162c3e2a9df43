#include "bundler/file_tree.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

absl::Status FsError(absl::string_view what, const std::string& path,
                     const std::error_code& ec) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", ec.message()));
}

}  // namespace

absl::StatusOr<CopyStats> CopyTree(
    const std::string& src, const std::string& dst,
    const std::function<bool(const std::string&, bool)>& exclude) {
  std::error_code ec;
  if (!fs::is_directory(src, ec)) {
    return absl::NotFoundError(absl::StrCat(src, " is not a directory"));
  }
  fs::create_directories(dst, ec);
  if (ec) return FsError("cannot create", dst, ec);
  CopyStats stats;
  fs::recursive_directory_iterator it(src, ec), end;
  if (ec) return FsError("cannot list", src, ec);
  for (; it != end; it.increment(ec)) {
    if (ec) return FsError("cannot list", src, ec);
    const fs::path& path = it->path();
    const std::string rel = path.lexically_relative(src).generic_string();
    const fs::path target = fs::path(dst) / rel;
    fs::file_status status = it->symlink_status(ec);
    const bool is_dir = fs::is_directory(status);
    if (exclude && exclude(rel, is_dir)) {
      ++stats.skipped;
      if (is_dir) it.disable_recursion_pending();
      continue;
    }
    if (fs::is_symlink(status)) {
      fs::path link = fs::read_symlink(path, ec);
      if (link.is_relative()) {
        fs::create_symlink(link, target, ec);
        if (ec) return FsError("cannot create symlink", target.string(), ec);
        ++stats.symlinks;
        continue;
      }
      if (!fs::is_regular_file(path, ec)) {  // dangling or not a file
        ++stats.skipped;
        continue;
      }
      fs::copy_file(path, target, fs::copy_options::overwrite_existing, ec);
      if (ec) return FsError("cannot copy", path.string(), ec);
      ++stats.files;
      stats.bytes += fs::file_size(target, ec);
    } else if (is_dir) {
      fs::create_directories(target, ec);
      if (ec) return FsError("cannot create", target.string(), ec);
    } else if (fs::is_regular_file(status)) {
      fs::copy_file(path, target, fs::copy_options::overwrite_existing, ec);
      if (ec) return FsError("cannot copy", path.string(), ec);
      ++stats.files;
      stats.bytes += fs::file_size(target, ec);
    } else {
      ++stats.skipped;
    }
  }
  return stats;
}

absl::Status CopyFileTo(const std::string& src, const std::string& dst) {
  std::error_code ec;
  fs::create_directories(fs::path(dst).parent_path(), ec);
  if (ec) return FsError("cannot create", fs::path(dst).parent_path(), ec);
  fs::copy_file(src, dst, fs::copy_options::overwrite_existing, ec);
  if (ec) return FsError("cannot copy", src, ec);
  fs::permissions(dst, fs::perms::owner_write, fs::perm_options::add, ec);
  if (ec) return FsError("cannot chmod", dst, ec);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

absl::Status WriteFile(const std::string& path, const std::string& content,
                       bool executable) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  std::error_code ec;
  fs::permissions(path,
                  executable ? fs::perms(0755) : fs::perms(0644), ec);
  if (ec) return FsError("cannot chmod", path, ec);
  return absl::OkStatus();
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return FsError("cannot remove", path, ec);
  return absl::OkStatus();
}

}  // namespace agentix::bundler
