// PLACEHOLDER until h-k8srender is merged (it owns this file): the smallest
// Pod the client tests need. Deleted at the merge.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "providers/backend.h"

namespace agentix::providers::kubernetes {

struct KubernetesOptions {
  std::string ns;  // empty: the kubeconfig's namespace
  std::string bundle_image;
  int runtime_port = 50051;
};

absl::StatusOr<nlohmann::json> RenderPod(const LaunchSpec& spec,
                                         const KubernetesOptions& options);
absl::StatusOr<nlohmann::json> RenderNetworkPolicy(const LaunchSpec& spec,
                                                   const KubernetesOptions& options);

}  // namespace agentix::providers::kubernetes
