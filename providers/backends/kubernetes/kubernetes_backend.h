// The Kubernetes backend of agentix-providerd: Pods through the API server
// over HTTPS + JSON (docs/PROVIDERS.md, "Kubernetes backend: client, watch
// and claims"). Launch creates the Pod (and a NetworkPolicy for network
// NONE), adopting a Pod an earlier attempt of the same launch made;
// Inspect/ResolveEndpoint read a cache fed by LIST + WATCH from its
// resourceVersion (relist on 410 Gone); warm-pool claims are one PATCH with
// a resourceVersion precondition.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "providers/backend.h"
#include "providers/backends/kubernetes/kube_config.h"
#include "providers/backends/kubernetes/pod_render.h"

namespace agentix::providers::kubernetes {

struct KubernetesBackendOptions {
  KubeConfig config;         // where the API server is, how to log in; config.ns
                             // is the namespace (render.namespace_name is set from it)
  KubernetesOptions render;  // the Pods' shape; render.runtime_port is the endpoint's port
  std::string instance;      // agentix.dev/managed-by of the Pods we watch
  absl::Duration request_timeout = absl::Seconds(30);
  // A watch is reopened from its last resourceVersion after this long (the
  // API server ends watches too; this bounds a silently dead connection).
  absl::Duration watch_timeout = absl::Minutes(5);
};

absl::StatusOr<std::unique_ptr<Backend>> NewKubernetesBackend(KubernetesBackendOptions options);

// Pod JSON -> what the controller sees (exported for the unit tests).
Observed ObservePod(const nlohmann::json& pod);

}  // namespace agentix::providers::kubernetes
