// PLACEHOLDER until h-k8srender is merged (see pod_render.h).
#include "providers/backends/kubernetes/pod_render.h"

#include "absl/strings/str_cat.h"

namespace agentix::providers::kubernetes {

absl::StatusOr<nlohmann::json> RenderPod(const LaunchSpec& spec,
                                         const KubernetesOptions& options) {
  if (spec.spec.image().empty()) return absl::InvalidArgumentError("spec.image is required");
  nlohmann::json pod;
  pod["apiVersion"] = "v1";
  pod["kind"] = "Pod";
  pod["metadata"]["name"] = absl::StrCat("sbx-", spec.sandbox_id);
  pod["metadata"]["namespace"] = options.ns;
  for (const auto& [k, v] : spec.labels) pod["metadata"]["labels"][k] = v;
  pod["spec"]["restartPolicy"] = "Never";
  pod["spec"]["containers"] = nlohmann::json::array(
      {{{"name", "sandbox"},
        {"image", spec.spec.image()},
        {"ports", {{{"containerPort", options.runtime_port}}}}}});
  return pod;
}

absl::StatusOr<nlohmann::json> RenderNetworkPolicy(const LaunchSpec& spec,
                                                   const KubernetesOptions& options) {
  nlohmann::json np;
  np["apiVersion"] = "networking.k8s.io/v1";
  np["kind"] = "NetworkPolicy";
  np["metadata"]["name"] = absl::StrCat("sbx-", spec.sandbox_id);
  np["metadata"]["namespace"] = options.ns;
  np["spec"]["podSelector"]["matchLabels"]["agentix.dev/sandbox-id"] = spec.sandbox_id;
  np["spec"]["policyTypes"] = {"Ingress", "Egress"};
  return np;
}

}  // namespace agentix::providers::kubernetes
