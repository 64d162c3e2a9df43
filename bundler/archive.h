// Deterministic tar archives (libarchive) and sha256 digests (OpenSSL
// libcrypto). The same tree always gives byte-identical archives: entries in
// sorted order, one fixed mtime, uid/gid 0 with empty owner names, modes
// normalised to 0755/0644, no atime/ctime, no compression.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::bundler {

// The mtime every entry gets (1980-01-01, the zip epoch, as reproducible
// builds commonly use).
inline constexpr long kArchiveMtime = 315532800;

struct TarEntry {
  enum class Type { kFile, kDirectory, kSymlink };
  std::string path;  // inside the archive, relative, no trailing slash
  Type type = Type::kFile;
  // kFile: read from `source` unless `content_is_inline`, then `content`.
  std::string source;
  std::string content;
  bool content_is_inline = false;
  bool executable = false;  // kFile: mode 0755 instead of 0644
  std::string link_target;  // kSymlink
  int directory_mode = 0755;  // kDirectory (e.g. 01777 for tmp/)
};

// Lists `root` recursively as entries under `prefix` (e.g. "nix"), the
// directory itself included, without following symlinks. Errors: kNotFound
// for a missing root, kFailedPrecondition for sockets/devices/fifos.
absl::StatusOr<std::vector<TarEntry>> CollectTree(const std::string& root,
                                                  const std::string& prefix);

// Writes `entries` (sorted here by path) to `out_path` via a temporary file
// renamed into place. Errors: kInternal with libarchive's message,
// kNotFound for an unreadable source.
absl::Status WriteTar(std::vector<TarEntry> entries,
                      const std::string& out_path);

// Lower-case hex sha256 of a string / of a file's bytes.
std::string Sha256Hex(absl::string_view data);
absl::StatusOr<std::string> Sha256File(const std::string& path);

// The bundle's content digest (the original's rule): sha256 over the entries
// of `root` in sorted relative-path order, each contributing
// `rel\0mode\0` then `L\0target\0` (symlink), `D\0` (directory) or
// `F\0size\0bytes` (file). Ownership and times do not count.
absl::StatusOr<std::string> TreeDigest(const std::string& root);

}  // namespace agentix::bundler
