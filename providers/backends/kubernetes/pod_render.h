// The pure half of the Kubernetes backend: how a LaunchSpec becomes a Pod
// (and, for network NONE, a NetworkPolicy; for arming, a Secret holding the
// admin token), PROVIDER-SERVICE.md §6 and §8.8. No I/O: the API client
// (kubernetes backend) posts what these return. docs/PROVIDERS.md,
// "Kubernetes backend: Pods", says why each field is there.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "providers/backend.h"

namespace agentix::providers::kubernetes {

// Labels every Pod of ours carries (ListOwned selects on managed-by).
inline constexpr char kLabelSandboxId[] = "agentix.dev/sandbox-id";
inline constexpr char kLabelUid[] = "agentix.dev/uid";
inline constexpr char kLabelManagedBy[] = "agentix.dev/managed-by";
inline constexpr char kLabelPool[] = "agentix.dev/pool";
// "false" on a fresh pool member; a claim PATCHes it to "true" (with the
// resourceVersion precondition).
inline constexpr char kLabelClaimed[] = "agentix.dev/claimed";
// User labels that are not agentix.dev/ ones get this prefix (as on the
// engine backend) so they never collide with the cluster's own.
inline constexpr char kUserLabelPrefix[] = "agentix.dev/label.";

inline constexpr char kAnnotationRequestId[] = "agentix.dev/request-id";
inline constexpr char kAnnotationExpireTime[] = "agentix.dev/expire-time";
inline constexpr char kAnnotationSpecHash[] = "agentix.dev/spec-hash";

// Inside the Pod.
inline constexpr char kEntryPoint[] = "/nix/runtime/bootstrap.sh";
inline constexpr char kRunDir[] = "/run/agentix";
inline constexpr char kAdminTokenDir[] = "/run/agentix-admin";
inline constexpr char kAdminTokenKey[] = "admin-token";
inline constexpr char kTaskContainer[] = "task";
inline constexpr char kBundleInitContainer[] = "bundle";
// The gRPC service name the readiness probe asks grpc.health.v1 about.
inline constexpr char kProbeService[] = "agentix.runtime.v1.RuntimeService";

enum class BundleMode {
  // `volumes[].image` (API >= 1.31 with the ImageVolume gate; on by default
  // from 1.35): no copy. Needs a digest-pinned bundle reference.
  kImageVolume,
  // An init container running the bundle image copies its /nix into an
  // emptyDir mounted at /nix (any Kubernetes).
  kInitCopy,
};

struct KubernetesOptions {
  std::string namespace_name = "default";
  BundleMode bundle_mode = BundleMode::kInitCopy;
  // Image volume only: mount the bundle image's nix/ (subPath, server >=
  // 1.33). false: the bundle artifact's root is the /nix content itself.
  bool image_volume_subpath = true;
  // The runtime service (token-checked; the daemon listens on 0.0.0.0).
  int runtime_port = 50051;
  // Plaintext grpc.health.v1 only (agentix-sandboxd --health-listen): what
  // the kubelet's gRPC probes dial.
  int health_port = 50052;
  std::string runtime_class_name;  // "" = the cluster's default
  // Task images often need root. true is refused together with an admin
  // token for now: Secret files are root's, and the daemon refuses a
  // group-readable token file.
  bool run_as_non_root = false;
  bool read_only_root_filesystem = true;
  int64_t termination_grace_seconds = 3;
  // activeDeadlineSeconds: the backstop if providerd is gone.
  absl::Duration max_lifetime = absl::Hours(24);
  int64_t default_scratch_bytes = int64_t{64} << 20;  // /tmp emptyDir
  int64_t run_dir_bytes = int64_t{1} << 20;           // /run/agentix emptyDir
  // Added to the scratch and run dir sizes in the ephemeral-storage request
  // and limit: the container's logs and writable layer, and (init-copy) the
  // copied bundle.
  int64_t writable_layer_bytes = int64_t{256} << 20;
  // Init-copy: also the sizeLimit of the emptyDir the bundle is copied to.
  int64_t bundle_copy_bytes = int64_t{1} << 30;
  std::string image_pull_policy = "IfNotPresent";
  // Init-copy: the copier inside the bundle image and its arguments
  // (`<copier> --install-bundle /nix <dst>`).
  std::string bundle_copier = "/nix/runtime/bin/agentix-sandboxd";
  int startup_period_seconds = 1;
  int startup_failure_threshold = 300;  // slow image pulls
  int readiness_period_seconds = 5;
  // Network NONE: ingress to the runtime and health ports only from Pods with these
  // labels (providerd, a router). Empty: no ingress at all.
  std::map<std::string, std::string> ingress_from_labels = {
      {"app.kubernetes.io/name", "agentix-providerd"}};
  // network HOST -> hostNetwork; refused unless allowed.
  bool allow_host_network = false;
};

// What the controller knows that a LaunchSpec does not carry.
struct PodAnnotations {
  std::string request_id;
  absl::Time expire_time = absl::InfinitePast();  // InfinitePast: omitted
};

// "sbx-<id>": the Pod's name (a DNS-1123 label: ids are <= 53 characters,
// so "sbx-<id>-admin" fits 63 too).
std::string PodName(absl::string_view sandbox_id);
// "sbx-<id>-admin": the Secret holding the admin token.
std::string AdminSecretName(absl::string_view sandbox_id);
// "sbx-<id>-deny": the NetworkPolicy of a network NONE sandbox.
std::string NetworkPolicyName(absl::string_view sandbox_id);

// Kubernetes label syntax: key = [prefix/]name, prefix a DNS-1123
// subdomain <= 253, name <= 63 [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?;
// value "" or the name rule. INVALID_ARGUMENT naming the label otherwise.
absl::Status ValidateLabel(absl::string_view key, absl::string_view value);

// The first 128 bits (32 hex digits) of the sha256 of the spec's
// deterministic serialization, env left out: the spec-hash annotation
// (what a 409 adoption compares).
std::string SpecHash(const pb::SandboxSpec& spec);

// Every check that needs no API server: ids, image and bundle references
// (image volume: `...@sha256:<64 hex>`), labels, resources, network,
// options. INVALID_ARGUMENT for bad input, FAILED_PRECONDITION for what
// this configuration cannot enforce (host network not allowed, BRIDGE,
// egress lists).
absl::Status ValidatePodSpec(const LaunchSpec& spec, const KubernetesOptions& options);

// The Pod (apiVersion v1, kind Pod). Runs ValidatePodSpec first;
// INVALID_ARGUMENT without spec.admin_token (every Pod starts unarmed).
absl::StatusOr<nlohmann::json> RenderPod(const LaunchSpec& spec,
                                         const KubernetesOptions& options,
                                         const PodAnnotations& annotations = {});

// The Secret holding spec.admin_token (mounted read-only, mode 0400, at
// kAdminTokenDir; the daemon reads it with --admin-token-file). With a
// non-empty `pod_uid` it is owned by the Pod, so deleting the Pod deletes it.
// INVALID_ARGUMENT when the spec has no admin token.
absl::StatusOr<nlohmann::json> RenderAdminSecret(const LaunchSpec& spec,
                                                 const KubernetesOptions& options,
                                                 absl::string_view pod_uid = "");

// Network NONE: a NetworkPolicy selecting this Pod that denies all egress
// and admits ingress to the runtime and health ports only from
// options.ingress_from_labels Pods. Other modes: INVALID_ARGUMENT.
absl::StatusOr<nlohmann::json> RenderNetworkPolicy(const LaunchSpec& spec,
                                                   const KubernetesOptions& options);

}  // namespace agentix::providers::kubernetes
