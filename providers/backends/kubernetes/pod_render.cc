#include "providers/backends/kubernetes/pod_render.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <openssl/evp.h>

#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "providers/core/errors.h"

namespace agentix::providers::kubernetes {
namespace {

using nlohmann::json;

absl::Status Invalid(absl::string_view message) {
  return ProviderError(absl::StatusCode::kInvalidArgument, kReasonInvalidSpec,
                       absl::StrCat("kubernetes backend: ", message));
}

absl::Status NotEnforceable(absl::string_view message) {
  return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonLimitNotEnforceable,
                       absl::StrCat("kubernetes backend: ", message));
}

bool IsAlnum(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)); }
bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// [a-z0-9]([-a-z0-9]*[a-z0-9])?, <= max.
bool IsDnsLabel(absl::string_view s, size_t max = 63) {
  if (s.empty() || s.size() > max) return false;
  if (!IsLowerAlnum(s.front()) || !IsLowerAlnum(s.back())) return false;
  for (char c : s) {
    if (!IsLowerAlnum(c) && c != '-') return false;
  }
  return true;
}

bool IsDnsSubdomain(absl::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (absl::string_view part : absl::StrSplit(s, '.')) {
    if (!IsDnsLabel(part)) return false;
  }
  return true;
}

// A label name or value: [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, <= 63.
bool IsLabelName(absl::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  if (!IsAlnum(s.front()) || !IsAlnum(s.back())) return false;
  for (char c : s) {
    if (!IsAlnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

bool IsHex64(absl::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Loose OCI reference syntax: what could ever pull; the registry decides
// the rest.
bool IsImageReference(absl::string_view ref) {
  if (ref.empty() || ref.size() > 4096) return false;
  if (!IsAlnum(ref.front())) return false;
  for (char c : ref) {
    if (!IsAlnum(c) && !absl::StrContains("._-/:@", c)) return false;
  }
  return true;
}

// The label key the Pod carries for a LaunchSpec label.
std::string PodLabelKey(const std::string& key) {
  return absl::StartsWith(key, "agentix.dev/") ? key : absl::StrCat(kUserLabelPrefix, key);
}

// The bundle image reference, pinned when the BundleRef has a digest.
absl::StatusOr<std::string> BundleImage(const pb::BundleRef& bundle, BundleMode mode) {
  if (bundle.ref_case() != pb::BundleRef::kOciReference || bundle.oci_reference().empty()) {
    return ProviderError(absl::StatusCode::kInvalidArgument, kReasonNotABundle,
                         "kubernetes backend: the bundle must be an OCI image reference "
                         "(bundle.oci_reference), not a path on providerd's machine");
  }
  std::string ref = bundle.oci_reference();
  if (!IsImageReference(ref)) {
    return Invalid(absl::StrCat("bad bundle image reference \"", ref, "\""));
  }
  std::string digest = bundle.digest();
  if (absl::StartsWith(digest, "sha256:")) digest = digest.substr(7);
  if (!digest.empty() && !IsHex64(digest)) {
    return Invalid(absl::StrCat("bundle.digest \"", bundle.digest(),
                                "\" is not sha256:<64 lowercase hex digits>"));
  }
  size_t at = ref.find('@');
  if (at != std::string::npos) {
    absl::string_view pinned = absl::string_view(ref).substr(at + 1);
    if (!absl::ConsumePrefix(&pinned, "sha256:") || !IsHex64(pinned)) {
      return Invalid(absl::StrCat("bundle reference \"", ref,
                                  "\": the digest must be sha256:<64 lowercase hex digits>"));
    }
    if (!digest.empty() && pinned != digest) {
      return Invalid(absl::StrCat("bundle reference \"", ref, "\" and bundle.digest disagree"));
    }
  } else if (!digest.empty()) {
    ref = absl::StrCat(ref, "@sha256:", digest);
  } else if (mode == BundleMode::kImageVolume) {
    // A tag with IfNotPresent pins whatever each node cached.
    return Invalid(absl::StrCat("bundle \"", ref,
                                "\": an image volume needs a digest-pinned reference "
                                "(IMAGE@sha256:... or bundle.digest)"));
  }
  return ref;
}

json Quantities(const pb::Resources& r, const KubernetesOptions& options, bool with_gpu) {
  json q = json::object();
  if (r.cpu_millis() > 0) q["cpu"] = absl::StrCat(r.cpu_millis(), "m");
  if (r.memory_bytes() > 0) q["memory"] = absl::StrCat(r.memory_bytes());
  int64_t scratch = r.scratch_bytes() > 0 ? r.scratch_bytes() : options.default_scratch_bytes;
  int64_t storage = scratch + options.run_dir_bytes + options.writable_layer_bytes;
  if (options.bundle_mode == BundleMode::kInitCopy) storage += options.bundle_copy_bytes;
  q["ephemeral-storage"] = absl::StrCat(storage);
  if (with_gpu && r.gpus() > 0) q["nvidia.com/gpu"] = absl::StrCat(r.gpus());
  return q;
}

json ContainerSecurity(const KubernetesOptions& options) {
  json sc = {
      {"allowPrivilegeEscalation", false},
      {"capabilities", {{"drop", json::array({"ALL"})}}},
      {"seccompProfile", {{"type", "RuntimeDefault"}}},
      {"readOnlyRootFilesystem", options.read_only_root_filesystem},
  };
  if (options.run_as_non_root) sc["runAsNonRoot"] = true;
  return sc;
}

json GrpcProbe(const KubernetesOptions& options, int period, int failure_threshold) {
  return {
      {"grpc", {{"port", options.health_port}, {"service", kProbeService}}},
      {"periodSeconds", period},
      {"failureThreshold", failure_threshold},
      {"timeoutSeconds", 1},
  };
}

json SelectorFor(const LaunchSpec& spec) {
  return {{"matchLabels",
           {{kLabelSandboxId, spec.sandbox_id}, {kLabelManagedBy, spec.instance}}}};
}

}  // namespace

// The controller's ids already read "sbx-…"; others (pool members "wp-…",
// client-chosen ids) get the prefix, so every object we make says sbx-.
std::string PodName(absl::string_view sandbox_id) {
  return absl::StartsWith(sandbox_id, "sbx-") ? std::string(sandbox_id)
                                              : absl::StrCat("sbx-", sandbox_id);
}
std::string AdminSecretName(absl::string_view sandbox_id) {
  return absl::StrCat(PodName(sandbox_id), "-admin");
}
std::string NetworkPolicyName(absl::string_view sandbox_id) {
  return absl::StrCat(PodName(sandbox_id), "-deny");
}

absl::Status ValidateLabel(absl::string_view key, absl::string_view value) {
  absl::string_view name = key;
  size_t slash = key.find('/');
  if (slash != absl::string_view::npos) {
    absl::string_view prefix = key.substr(0, slash);
    name = key.substr(slash + 1);
    if (!IsDnsSubdomain(prefix)) {
      return Invalid(absl::StrCat("label \"", key, "\": the prefix must be a DNS-1123 subdomain"));
    }
  }
  if (!IsLabelName(name)) {
    return Invalid(absl::StrCat("label \"", key,
                                "\": the name must be 1-63 of [A-Za-z0-9-_.], alphanumeric "
                                "at both ends"));
  }
  if (!value.empty() && !IsLabelName(value)) {
    return Invalid(absl::StrCat("label \"", key, "\": the value \"", value,
                                "\" must be empty or 1-63 of [A-Za-z0-9-_.], alphanumeric "
                                "at both ends"));
  }
  return absl::OkStatus();
}

std::string SpecHash(const pb::SandboxSpec& full) {
  // Without env: it is not part of the Pod (it arrives with Activate), and
  // a hash of user secrets in an annotation would help guess them.
  pb::SandboxSpec spec = full;
  spec.clear_env();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    spec.SerializeToCodedStream(&coded);
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  // 128 bits are plenty to tell specs apart, and podman kube play refuses
  // annotation values over 63 characters.
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), std::min(size, 16u)));
}

absl::Status ValidatePodSpec(const LaunchSpec& spec, const KubernetesOptions& options) {
  if (!IsDnsLabel(spec.sandbox_id, 63 - 10)) {  // room for "sbx-" and "-admin"
    return Invalid(absl::StrCat("sandbox id \"", spec.sandbox_id,
                                "\" must be 1-53 of [a-z0-9-], alphanumeric at both ends"));
  }
  if (!IsDnsSubdomain(options.namespace_name) || options.namespace_name.size() > 63) {
    return Invalid(absl::StrCat("namespace \"", options.namespace_name, "\" is not a DNS-1123 label"));
  }
  if (spec.instance.empty()) return Invalid("the providerd instance name is empty");
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{kLabelManagedBy, spec.instance},
        {kLabelUid, spec.uid}}) {
    if (auto s = ValidateLabel(key, value); !s.ok()) return s;
  }
  for (const auto& [key, value] : spec.labels) {
    if (auto s = ValidateLabel(PodLabelKey(key), value); !s.ok()) return s;
  }
  const pb::SandboxSpec& s = spec.spec;
  if (!IsImageReference(s.image())) {
    return Invalid(absl::StrCat("bad task image reference \"", s.image(), "\""));
  }
  if (auto bundle = BundleImage(s.bundle(), options.bundle_mode); !bundle.ok()) {
    return bundle.status();
  }
  const pb::Resources& r = s.resources();
  if (r.cpu_millis() < 0 || r.memory_bytes() < 0 || r.gpus() < 0 || r.scratch_bytes() < 0 ||
      r.pids() < 0 || r.nofile() < 0) {
    return Invalid("resources must not be negative");
  }
  // Kubernetes has no per-Pod pids or nofile limit (pids: the node's
  // podPidsLimit; nofile: the runtime's default).
  if (r.pids() > 0) return NotEnforceable("no per-Pod pids limit (the node's podPidsLimit applies)");
  if (r.nofile() > 0) return NotEnforceable("no per-Pod open-file limit");
  const pb::Network& n = s.network();
  if (n.mode() == pb::Network::BRIDGE) {
    return NotEnforceable("network BRIDGE is not supported (NONE or HOST)");
  }
  if (n.mode() == pb::Network::HOST && !options.allow_host_network) {
    return NotEnforceable("network HOST (hostNetwork) is not allowed by this providerd");
  }
  if (n.allow_egress_cidrs_size() > 0 || n.deny_egress_cidrs_size() > 0) {
    return NotEnforceable("egress lists are not supported yet");
  }
  for (int port : {options.runtime_port, options.health_port}) {
    if (port < 1 || port > 65535) return Invalid(absl::StrCat("port ", port, " out of range"));
  }
  if (options.runtime_port == options.health_port) {
    return Invalid("the runtime and health ports must differ");
  }
  if (options.image_pull_policy != "Always" && options.image_pull_policy != "IfNotPresent" &&
      options.image_pull_policy != "Never") {
    return Invalid(absl::StrCat("image pull policy \"", options.image_pull_policy,
                                "\" is not Always, IfNotPresent or Never"));
  }
  if (options.max_lifetime < absl::Seconds(1)) return Invalid("max lifetime below 1 s");
  // A Secret volume's files are root's; a 0400 one is unreadable to a
  // non-root daemon, and a group-readable one (fsGroup) is refused by
  // --admin-token-file.
  if (options.run_as_non_root && !spec.admin_token.empty()) {
    return NotEnforceable(
        "runAsNonRoot: a non-root daemon cannot read the root-owned admin token Secret "
        "(not supported yet)");
  }
  return absl::OkStatus();
}

absl::StatusOr<json> RenderPod(const LaunchSpec& spec, const KubernetesOptions& options,
                               const PodAnnotations& annotations) {
  if (auto s = ValidatePodSpec(spec, options); !s.ok()) return s;
  // Without one the daemon would serve whoever reaches the Pod's IP.
  if (spec.admin_token.empty()) return Invalid("no admin token: every Pod starts unarmed");
  const pb::SandboxSpec& s = spec.spec;
  const pb::Resources& r = s.resources();
  absl::StatusOr<std::string> bundle = BundleImage(s.bundle(), options.bundle_mode);
  if (!bundle.ok()) return bundle.status();

  json labels = json::object();
  for (const auto& [key, value] : spec.labels) labels[PodLabelKey(key)] = value;
  labels[kLabelSandboxId] = spec.sandbox_id;
  labels[kLabelUid] = spec.uid;
  labels[kLabelManagedBy] = spec.instance;
  if (labels.contains(kLabelPool) && !labels.contains(kLabelClaimed)) {
    labels[kLabelClaimed] = "false";
  }
  json annot = {{kAnnotationSpecHash, SpecHash(s)}};
  if (!annotations.request_id.empty()) annot[kAnnotationRequestId] = annotations.request_id;
  if (annotations.expire_time != absl::InfinitePast()) {
    annot[kAnnotationExpireTime] =
        absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", annotations.expire_time, absl::UTCTimeZone());
  }

  int64_t scratch = r.scratch_bytes() > 0 ? r.scratch_bytes() : options.default_scratch_bytes;
  json mounts = json::array({
      {{"name", "bundle"}, {"mountPath", "/nix"}, {"readOnly", true}},
      {{"name", "tmp"}, {"mountPath", "/tmp"}},
      {{"name", "run"}, {"mountPath", kRunDir}},
  });
  if (options.bundle_mode == BundleMode::kImageVolume && options.image_volume_subpath) {
    mounts[0]["subPath"] = "nix";
  }
  json args = json::array({"--health-listen", absl::StrCat("0.0.0.0:", options.health_port)});
  if (!spec.admin_token.empty()) {
    mounts.push_back({{"name", "admin"}, {"mountPath", kAdminTokenDir}, {"readOnly", true}});
    args.push_back("--admin-token-file");
    args.push_back(absl::StrCat(kAdminTokenDir, "/", kAdminTokenKey));
  }
  json quantities = Quantities(r, options, /*with_gpu=*/true);
  json task = {
      {"name", kTaskContainer},
      {"image", s.image()},
      {"imagePullPolicy", options.image_pull_policy},
      {"command", json::array({kEntryPoint})},
      {"args", args},
      // Control variables only; the user's env arrives with Activate (so a
      // warm Pod stays warm and no secret sits in the Pod object).
      // No `ports`: Kubernetes needs none (probes and the NetworkPolicy use
      // numbers), and podman kube play turns each into a host port mapping.
      {"env", json::array({{{"name", "AGENTIX_LISTEN"},
                            {"value", absl::StrCat("0.0.0.0:", options.runtime_port)}}})},
      {"resources", {{"requests", quantities}, {"limits", quantities}}},
      {"volumeMounts", mounts},
      {"securityContext", ContainerSecurity(options)},
      {"startupProbe", GrpcProbe(options, options.startup_period_seconds,
                                 options.startup_failure_threshold)},
      {"readinessProbe", GrpcProbe(options, options.readiness_period_seconds, 3)},
  };

  json volumes = json::array();
  json pod_spec = {
      {"restartPolicy", "Never"},
      {"automountServiceAccountToken", false},
      {"enableServiceLinks", false},
      {"terminationGracePeriodSeconds", options.termination_grace_seconds},
      {"activeDeadlineSeconds", absl::ToInt64Seconds(options.max_lifetime)},
      // The pause process becomes PID 1 and reaps what user code leaves
      // orphaned (the engine backend's HostConfig.Init); there is only one
      // long-running container to share with.
      {"shareProcessNamespace", true},
  };
  if (options.bundle_mode == BundleMode::kImageVolume) {
    volumes.push_back({{"name", "bundle"},
                       {"image", {{"reference", *bundle}, {"pullPolicy", options.image_pull_policy}}}});
  } else {
    volumes.push_back({{"name", "bundle"},
                       {"emptyDir", {{"sizeLimit", absl::StrCat(options.bundle_copy_bytes)}}}});
    json copy_quantities = Quantities(r, options, /*with_gpu=*/false);
    pod_spec["initContainers"] = json::array({{
        {"name", kBundleInitContainer},
        {"image", *bundle},
        {"imagePullPolicy", options.image_pull_policy},
        {"command", json::array({options.bundle_copier, "--install-bundle", "/nix", "/bundle"})},
        {"resources", {{"requests", copy_quantities}, {"limits", copy_quantities}}},
        {"volumeMounts", json::array({{{"name", "bundle"}, {"mountPath", "/bundle"}}})},
        {"securityContext", ContainerSecurity(options)},
    }});
  }
  volumes.push_back({{"name", "tmp"}, {"emptyDir", {{"sizeLimit", absl::StrCat(scratch)}}}});
  volumes.push_back(
      {{"name", "run"}, {"emptyDir", {{"sizeLimit", absl::StrCat(options.run_dir_bytes)}}}});
  if (!spec.admin_token.empty()) {
    volumes.push_back({{"name", "admin"},
                       // optional: podman 4.3's kube play dereferences it.
                       {"secret", {{"secretName", AdminSecretName(spec.sandbox_id)},
                                   {"defaultMode", 0400},
                                   {"optional", false}}}});
  }
  pod_spec["containers"] = json::array({task});
  pod_spec["volumes"] = volumes;
  if (!options.runtime_class_name.empty()) {
    pod_spec["runtimeClassName"] = options.runtime_class_name;
  }
  if (s.network().mode() == pb::Network::HOST) {
    pod_spec["hostNetwork"] = true;
  } else {
    // The Pod's own UTS namespace: a recognisable hostname.
    pod_spec["hostname"] = PodName(spec.sandbox_id);
  }
  return json{
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", PodName(spec.sandbox_id)},
        {"namespace", options.namespace_name},
        {"labels", labels},
        {"annotations", annot}}},
      {"spec", pod_spec},
  };
}

absl::StatusOr<json> RenderAdminSecret(const LaunchSpec& spec, const KubernetesOptions& options,
                                       absl::string_view pod_uid) {
  if (auto s = ValidatePodSpec(spec, options); !s.ok()) return s;
  if (spec.admin_token.empty()) return Invalid("no admin token to put in a Secret");
  json metadata = {
      {"name", AdminSecretName(spec.sandbox_id)},
      {"namespace", options.namespace_name},
      {"labels",
       {{kLabelSandboxId, spec.sandbox_id}, {kLabelUid, spec.uid}, {kLabelManagedBy, spec.instance}}},
  };
  if (!pod_uid.empty()) {
    metadata["ownerReferences"] = json::array({{
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"name", PodName(spec.sandbox_id)},
        {"uid", std::string(pod_uid)},
    }});
  }
  return json{
      {"apiVersion", "v1"},
      {"kind", "Secret"},
      {"metadata", metadata},
      {"type", "Opaque"},
      {"immutable", true},
      {"data", {{kAdminTokenKey, absl::Base64Escape(spec.admin_token)}}},
  };
}

absl::StatusOr<json> RenderNetworkPolicy(const LaunchSpec& spec, const KubernetesOptions& options) {
  if (auto s = ValidatePodSpec(spec, options); !s.ok()) return s;
  pb::Network::Mode mode = spec.spec.network().mode();
  if (mode != pb::Network::NONE && mode != pb::Network::MODE_UNSPECIFIED) {
    return Invalid("a deny-all NetworkPolicy is for network NONE only");
  }
  json ingress = json::array();
  if (!options.ingress_from_labels.empty()) {
    json match = json::object();
    for (const auto& [key, value] : options.ingress_from_labels) {
      if (auto s = ValidateLabel(key, value); !s.ok()) return s;
      match[key] = value;
    }
    ingress.push_back({
        {"from", json::array({{{"podSelector", {{"matchLabels", match}}}}})},
        {"ports", json::array({{{"protocol", "TCP"}, {"port", options.runtime_port}},
                               {{"protocol", "TCP"}, {"port", options.health_port}}})},
    });
  }
  return json{
      {"apiVersion", "networking.k8s.io/v1"},
      {"kind", "NetworkPolicy"},
      {"metadata",
       {{"name", NetworkPolicyName(spec.sandbox_id)},
        {"namespace", options.namespace_name},
        {"labels",
         {{kLabelSandboxId, spec.sandbox_id}, {kLabelUid, spec.uid}, {kLabelManagedBy, spec.instance}}}}},
      {"spec",
       {{"podSelector", SelectorFor(spec)},
        {"policyTypes", json::array({"Ingress", "Egress"})},
        {"ingress", ingress},
        {"egress", json::array()}}},
  };
}

}  // namespace agentix::providers::kubernetes
