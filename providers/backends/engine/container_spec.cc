#include "providers/backends/engine/container_spec.h"

#include <sys/stat.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "providers/core/errors.h"

namespace agentix::providers::engine {
namespace {

// Docker and podman refuse smaller memory limits.
constexpr int64_t kMinMemoryBytes = int64_t{6} << 20;
constexpr size_t kSunPathMax = 107;  // sizeof(sun_path) - 1

absl::Status Invalid(absl::string_view reason, absl::string_view message) {
  return ProviderError(absl::StatusCode::kInvalidArgument, reason, message);
}

absl::Status NotEnforceable(absl::string_view message) {
  return ProviderError(absl::StatusCode::kFailedPrecondition,
                       kReasonLimitNotEnforceable, message);
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool ValidImageReference(absl::string_view image) {
  if (image.empty() || image.size() > 512 || image[0] == '-' || image[0] == '/') return false;
  for (char c : image) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        !absl::StrContains("._-/:@", c)) {
      return false;
    }
  }
  return true;
}

bool ValidSandboxId(absl::string_view id) {
  if (id.empty() || id.size() > 63) return false;
  for (char c : id) {
    if (!(absl::ascii_islower(static_cast<unsigned char>(c)) ||
          absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-')) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string ContainerName(absl::string_view sandbox_id) {
  return absl::StrCat("agentix-", sandbox_id);
}

std::string RunDir(const EngineOptions& options, absl::string_view sandbox_id) {
  return absl::StrCat(options.run_root, "/", sandbox_id);
}

absl::StatusOr<std::string> BundleNixDir(const pb::BundleRef& bundle) {
  if (bundle.ref_case() == pb::BundleRef::kOciReference) {
    return NotEnforceable(
        "a bundle by OCI reference is not supported by the docker/podman backends yet; "
        "give the bundle directory");
  }
  const std::string& path = bundle.path();
  if (path.empty()) return Invalid(kReasonInvalidSpec, "spec.bundle is empty");
  if (path[0] != '/') {
    return Invalid(kReasonNotABundle, absl::StrCat("bundle path ", path, " is not absolute"));
  }
  // ':' and ',' would split a Binds entry.
  if (absl::StrContains(path, ':') || absl::StrContains(path, ',')) {
    return Invalid(kReasonNotABundle,
                   absl::StrCat("bundle path ", path, " contains ':' or ','"));
  }
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  if (IsFile(absl::StrCat(trimmed, "/nix/runtime/bootstrap.sh"))) {
    return absl::StrCat(trimmed, "/nix");
  }
  if (absl::EndsWith(trimmed, "/nix") && IsFile(absl::StrCat(trimmed, "/runtime/bootstrap.sh"))) {
    return trimmed;
  }
  return Invalid(kReasonNotABundle,
                 absl::StrCat(path, " is not a bundle (no nix/runtime/bootstrap.sh)"));
}

absl::Status ValidateStatic(const LaunchSpec& spec, const EngineOptions& options,
                            int64_t nofile_hard_limit) {
  if (!ValidSandboxId(spec.sandbox_id)) {
    return Invalid(kReasonInvalidSpec,
                   absl::StrCat("sandbox id '", spec.sandbox_id, "' is not [a-z0-9-]{1,63}"));
  }
  const pb::SandboxSpec& s = spec.spec;
  if (!ValidImageReference(s.image())) {
    return Invalid(kReasonInvalidSpec,
                   absl::StrCat("image '", s.image(), "' is not an image reference"));
  }
  auto nix = BundleNixDir(s.bundle());
  if (!nix.ok()) return nix.status();
  const pb::Resources& r = s.resources();
  if (r.cpu_millis() < 0 || r.memory_bytes() < 0 || r.pids() < 0 || r.gpus() < 0 ||
      r.scratch_bytes() < 0 || r.nofile() < 0) {
    return Invalid(kReasonInvalidSpec, "resources must not be negative");
  }
  if (r.memory_bytes() > 0 && r.memory_bytes() < kMinMemoryBytes) {
    return NotEnforceable(absl::StrCat("memory limit ", r.memory_bytes(),
                                       " bytes is below the engines' minimum of 6 MiB"));
  }
  int64_t nofile = r.nofile() > 0 ? r.nofile() : options.default_nofile;
  if (nofile_hard_limit > 0 && nofile > nofile_hard_limit) {
    return NotEnforceable(absl::StrCat("nofile ", nofile, " is above this machine's hard limit ",
                                       nofile_hard_limit, " (it cannot be raised here)"));
  }
  const pb::Network& n = s.network();
  if (n.mode() == pb::Network::BRIDGE) {
    return NotEnforceable(absl::StrCat(options.name,
                                       " backend: network BRIDGE is not supported yet (NONE or HOST)"));
  }
  if (n.allow_egress_cidrs_size() > 0 || n.deny_egress_cidrs_size() > 0) {
    return NotEnforceable(absl::StrCat(options.name,
                                       " backend: egress lists are not supported yet"));
  }
  std::string socket = absl::StrCat(RunDir(options, spec.sandbox_id), "/", kSocketName);
  if (socket.size() > kSunPathMax) {
    return NotEnforceable(absl::StrCat("socket path ", socket, " exceeds ", kSunPathMax,
                                       " bytes; use a shorter run root"));
  }
  return absl::OkStatus();
}

nlohmann::json RenderCreateBody(const LaunchSpec& spec, const EngineOptions& options,
                                const std::string& nix_dir, const std::string& run_dir) {
  using nlohmann::json;
  const pb::SandboxSpec& s = spec.spec;
  const pb::Resources& r = s.resources();
  json labels = json::object();
  for (const auto& [key, value] : spec.labels) {
    labels[absl::StartsWith(key, "agentix.dev/") ? key : absl::StrCat(kUserLabelPrefix, key)] =
        value;
  }
  labels[kLabelSandboxId] = spec.sandbox_id;
  labels[kLabelUid] = spec.uid;
  labels[kLabelManagedBy] = spec.instance;

  json cmd = json::array();
  if (!spec.admin_token.empty()) {
    cmd.push_back("--admin-token-file");
    cmd.push_back(absl::StrCat(kRunDirInContainer, "/", kAdminTokenName));
  }
  bool host_network = s.network().mode() == pb::Network::HOST;
  int64_t nofile = r.nofile() > 0 ? r.nofile() : options.default_nofile;
  int64_t scratch = r.scratch_bytes() > 0 ? r.scratch_bytes() : options.default_scratch_bytes;

  json host = {
      {"Binds", json::array({absl::StrCat(nix_dir, ":/nix:ro"),
                             absl::StrCat(run_dir, ":", kRunDirInContainer)})},
      {"Init", true},
      {"Ulimits", json::array({{{"Name", "nofile"}, {"Soft", nofile}, {"Hard", nofile}},
                               {{"Name", "nproc"}, {"Soft", options.nproc}, {"Hard", options.nproc}}})},
      {"ReadonlyRootfs", true},
      {"Tmpfs", {{"/tmp", absl::StrCat("rw,nosuid,nodev,size=", scratch)}}},
      {"CapDrop", json::array({"ALL"})},
      {"SecurityOpt", json::array({"no-new-privileges"})},
      {"NetworkMode", host_network ? "host" : "none"},
      {"AutoRemove", false},
      {"RestartPolicy", {{"Name", "no"}}},
  };
  if (r.cpu_millis() > 0) host["NanoCpus"] = r.cpu_millis() * 1000000;
  if (r.memory_bytes() > 0) {
    host["Memory"] = r.memory_bytes();
    host["MemorySwap"] = r.memory_bytes();  // no swap on top of the limit
  }
  if (r.pids() > 0) host["PidsLimit"] = r.pids();
  if (r.gpus() > 0) {
    host["DeviceRequests"] = json::array(
        {{{"Driver", "nvidia"}, {"Count", r.gpus()}, {"Capabilities", json::array({json::array({"gpu"})})}}});
  }

  json body = {
      {"Image", s.image()},
      {"Entrypoint", json::array({kEntryPoint})},
      {"Cmd", cmd},
      // Control variables only; the user's env arrives with Activate. The
      // explicit listen address keeps bootstrap.sh from adding its TCP default.
      {"Env", json::array({absl::StrCat("AGENTIX_LISTEN=unix://", kRunDirInContainer, "/",
                                        kSocketName)})},
      {"Labels", labels},
      {"Tty", false},
      {"OpenStdin", false},
      {"AttachStdin", false},
      {"AttachStdout", false},
      {"AttachStderr", false},
      {"HostConfig", host},
  };
  // A hostname conflicts with the host's network namespace.
  if (!host_network) body["Hostname"] = absl::StrCat("sbx-", spec.sandbox_id).substr(0, 63);
  return body;
}

std::string NormalizePlatform(absl::string_view os, absl::string_view arch) {
  std::string a(arch);
  if (a == "x86_64") a = "amd64";
  if (a == "aarch64") a = "arm64";
  return absl::StrCat(os, "/", a);
}

}  // namespace agentix::providers::engine
