// Test-side description of one rendering: a LaunchSpec, KubernetesOptions
// and PodAnnotations as JSON, so golden inputs, the schema test and the
// `podman kube play` test all render through the same code as the backend.
//
//   {"sandbox_id", "uid", "instance", "admin_token", "labels": {...},
//    "request_id", "expire_time_unix",
//    "spec": {"image", "bundle" (OCI ref), "bundle_digest",
//             "resources": {"cpu_millis", "memory_bytes", "gpus",
//                           "scratch_bytes", "pids", "nofile"},
//             "network": "NONE" | "HOST" | "BRIDGE", "egress": [cidr...]},
//    "options": {"namespace", "bundle_mode": "image-volume" | "init-copy",
//                "image_volume_subpath", "runtime_port", "health_port",
//                "runtime_class_name", "run_as_non_root",
//                "read_only_root_filesystem", "max_lifetime_s",
//                "image_pull_policy", "allow_host_network",
//                "ingress_from_labels": {...}}}
#pragma once

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "providers/backends/kubernetes/pod_render.h"

namespace agentix::providers::kubernetes {

struct RenderInput {
  LaunchSpec spec;
  KubernetesOptions options;
  PodAnnotations annotations;
};

absl::StatusOr<RenderInput> ParseRenderInput(const nlohmann::json& in);

// {"pod": ..., "network_policy": ... (network NONE), "admin_secret": ...
// (with an admin token)} or {"error": {"code", "reason", "message"}}.
nlohmann::json RenderAll(const RenderInput& input);

}  // namespace agentix::providers::kubernetes
