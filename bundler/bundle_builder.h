// Builds one bundle: a project's pyproject.toml in, the /nix/runtime tree, a
// deterministic tarball and an OCI image layout out. Each stage reports
// progress and timing on stderr ("[bundler] stdlib: 1234 files, 0.8 s").
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace agentix::bundler {

struct BundleOptions {
  std::string project_dir;  // absolute; holds pyproject.toml
  std::string output_dir;   // absolute; default <project>/dist/agentix-bundle
  std::string name;         // default: [project].name without "agentix-"
  std::string tag;          // default: [project].version, else "latest"
  std::vector<std::string> wheelhouses;
  // AGENTIX_WIRE's default in bootstrap.sh: "grpc", or "socketio" for a
  // bundle that unchanged original providers start (docs/GATEWAY.md).
  std::string wire = "grpc";
  // Inputs from the build (runfiles of //bundler).
  std::string sandboxd;
  std::string worker;
  // agentix-launch (bin/agentix-launch); empty: not bundled, the daemon
  // starts its worker itself whatever AGENTIX_EARLY_WORKER says.
  std::string launcher;
  // AGENTIX_EARLY_WORKER's default in bootstrap.sh.
  bool early_worker = false;
  std::string agentix_wheel;
  std::string closure_helper;
  // Inputs from the build machine.
  std::string python = "/usr/bin/python3";
  std::string python_executable = "/usr/bin/python3.11";
  std::string stdlib = "/usr/lib/python3.11";
  std::string busybox = "/bin/busybox";
  std::string patchelf = "patchelf";
  std::string ld_so_conf = "/etc/ld.so.conf";
  // Where the tree lives at run time. Fixed by the image layout.
  std::string runtime_root = "/nix/runtime";
};

struct BundleResult {
  std::string tree;            // <output>/nix
  std::string tarball;         // <output>/<name>-<tag>.bundle.tar
  std::string tarball_sha256;  // hex
  std::string digest;          // "sha256:<hex>", the tree digest
  std::string oci_layout;      // <output>/oci
  std::string oci_manifest_digest;
  uint64_t tree_bytes = 0;
};

// Runs every stage. Errors carry the failing stage's message, which says
// what to do (missing pyproject, dependency not available offline, unknown
// system package, missing tool).
absl::StatusOr<BundleResult> BuildBundle(const BundleOptions& options);

}  // namespace agentix::bundler
