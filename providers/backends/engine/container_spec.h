// The pure half of the docker/podman backend: how a LaunchSpec becomes the
// Docker Engine API's container-create body (PROVIDER-SERVICE.md §8.7), the
// labels that make a container ours, and the checks that need no engine.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "providers/backend.h"

namespace agentix::providers::engine {

inline constexpr char kLabelSandboxId[] = "agentix.dev/sandbox-id";
inline constexpr char kLabelUid[] = "agentix.dev/uid";
inline constexpr char kLabelManagedBy[] = "agentix.dev/managed-by";
// User labels that are not already agentix.dev/ ones get this prefix, so they
// never collide with the image's own labels.
inline constexpr char kUserLabelPrefix[] = "agentix.dev/label.";

// Reasons this backend adds to core/errors.h's list.
inline constexpr char kReasonImageNotPresent[] = "IMAGE_NOT_PRESENT";
inline constexpr char kReasonEngineUnavailable[] = "ENGINE_UNAVAILABLE";
inline constexpr char kReasonEngineError[] = "ENGINE_ERROR";

// Inside the container.
inline constexpr char kRunDirInContainer[] = "/run/agentix";
inline constexpr char kSocketName[] = "agentix.sock";
inline constexpr char kAdminTokenName[] = "admin-token";
inline constexpr char kEntryPoint[] = "/nix/runtime/bootstrap.sh";

struct EngineOptions {
  std::string name = "docker";  // "docker" or "podman": the backend's name
  std::string socket_path;      // the engine's API socket
  // Host directory holding one run dir per sandbox, bind-mounted at
  // /run/agentix. Short: the socket path must fit sun_path (108 bytes).
  std::string run_root;
  // The managed-by label the events watch follows ("" = every container
  // with an agentix.dev/managed-by label).
  std::string instance;
  // Sent on every container: podman under runc here cannot start one without
  // both (ENVIRONMENT.md §2), and they must not exceed the engine's own hard
  // limits (20000 / 96364 here).
  int64_t default_nofile = 1024;
  int64_t nproc = 4096;
  int64_t default_scratch_bytes = int64_t{64} << 20;  // the /tmp tmpfs
  // Each run dir is a tmpfs of this size on the host (0: a plain directory),
  // so a sandbox cannot fill the host's disk through its one writable bind.
  // Needs root and the engine in providerd's mount namespace.
  int64_t run_dir_tmpfs_bytes = int64_t{1} << 20;
  absl::Duration request_timeout = absl::Seconds(30);
};

// "agentix-<sandbox id>".
std::string ContainerName(absl::string_view sandbox_id);

// The bundle's nix/ directory on this machine: `path` is a bundle directory
// (holding nix/runtime/bootstrap.sh) or that nix/ directory.
// INVALID_ARGUMENT (NOT_A_BUNDLE) otherwise; FAILED_PRECONDITION for a bundle
// by OCI reference (not supported by this backend yet).
absl::StatusOr<std::string> BundleNixDir(const pb::BundleRef& bundle);

// The engine-independent checks of Validate: ids, image reference syntax,
// resources, network, paths that Binds cannot carry, the socket path length.
absl::Status ValidateStatic(const LaunchSpec& spec, const EngineOptions& options,
                            int64_t nofile_hard_limit);

std::string RunDir(const EngineOptions& options, absl::string_view sandbox_id);

// POST /containers/create's body.
nlohmann::json RenderCreateBody(const LaunchSpec& spec, const EngineOptions& options,
                                const std::string& nix_dir, const std::string& run_dir);

// "linux/amd64" from an engine's or image's Os and Architecture
// (x86_64 -> amd64, aarch64 -> arm64).
std::string NormalizePlatform(absl::string_view os, absl::string_view arch);

}  // namespace agentix::providers::engine
