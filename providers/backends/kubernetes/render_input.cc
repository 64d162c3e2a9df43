#include "providers/backends/kubernetes/render_input.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "providers/core/errors.h"

namespace agentix::providers::kubernetes {

using nlohmann::json;

absl::StatusOr<RenderInput> ParseRenderInput(const json& in) {
  if (!in.is_object()) return absl::InvalidArgumentError("input must be an object");
  try {
    RenderInput r;
    r.spec.sandbox_id = in.value("sandbox_id", "");
    r.spec.uid = in.value("uid", "");
    r.spec.instance = in.value("instance", "");
    r.spec.admin_token = in.value("admin_token", "");
    const json labels = in.value("labels", json::object());
    for (const auto& [k, v] : labels.items()) {
      r.spec.labels[k] = v.get<std::string>();
    }
    r.annotations.request_id = in.value("request_id", "");
    if (in.contains("expire_time_unix")) {
      r.annotations.expire_time = absl::FromUnixSeconds(in["expire_time_unix"].get<int64_t>());
    }
    const json s = in.value("spec", json::object());
    pb::SandboxSpec& spec = r.spec.spec;
    spec.set_image(s.value("image", ""));
    if (s.contains("bundle")) spec.mutable_bundle()->set_oci_reference(s["bundle"].get<std::string>());
    if (s.contains("bundle_path")) spec.mutable_bundle()->set_path(s["bundle_path"].get<std::string>());
    spec.mutable_bundle()->set_digest(s.value("bundle_digest", ""));
    const json res = s.value("resources", json::object());
    pb::Resources* pr = spec.mutable_resources();
    pr->set_cpu_millis(res.value("cpu_millis", int64_t{0}));
    pr->set_memory_bytes(res.value("memory_bytes", int64_t{0}));
    pr->set_gpus(res.value("gpus", 0));
    pr->set_scratch_bytes(res.value("scratch_bytes", int64_t{0}));
    pr->set_pids(res.value("pids", int64_t{0}));
    pr->set_nofile(res.value("nofile", int64_t{0}));
    std::string net = s.value("network", "NONE");
    pb::Network::Mode mode;
    if (!pb::Network::Mode_Parse(net, &mode)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown network ", net));
    }
    spec.mutable_network()->set_mode(mode);
    const json egress = s.value("egress", json::array());
    for (const auto& cidr : egress) {
      spec.mutable_network()->add_allow_egress_cidrs(cidr.get<std::string>());
    }
    const json o = in.value("options", json::object());
    KubernetesOptions& opt = r.options;
    opt.namespace_name = o.value("namespace", opt.namespace_name);
    std::string bundle_mode = o.value("bundle_mode", "init-copy");
    if (bundle_mode == "image-volume") {
      opt.bundle_mode = BundleMode::kImageVolume;
    } else if (bundle_mode == "init-copy") {
      opt.bundle_mode = BundleMode::kInitCopy;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown bundle_mode ", bundle_mode));
    }
    opt.image_volume_subpath = o.value("image_volume_subpath", opt.image_volume_subpath);
    opt.runtime_port = o.value("runtime_port", opt.runtime_port);
    opt.health_port = o.value("health_port", opt.health_port);
    opt.runtime_class_name = o.value("runtime_class_name", opt.runtime_class_name);
    opt.run_as_non_root = o.value("run_as_non_root", opt.run_as_non_root);
    opt.read_only_root_filesystem =
        o.value("read_only_root_filesystem", opt.read_only_root_filesystem);
    if (o.contains("max_lifetime_s")) {
      opt.max_lifetime = absl::Seconds(o["max_lifetime_s"].get<int64_t>());
    }
    opt.image_pull_policy = o.value("image_pull_policy", opt.image_pull_policy);
    opt.allow_host_network = o.value("allow_host_network", opt.allow_host_network);
    if (o.contains("ingress_from_labels")) {
      opt.ingress_from_labels.clear();
      for (const auto& [k, v] : o["ingress_from_labels"].items()) {
        opt.ingress_from_labels[k] = v.get<std::string>();
      }
    }
    return r;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad input: ", e.what()));
  }
}

json RenderAll(const RenderInput& input) {
  auto error = [](const absl::Status& s) {
    return json{{"error",
                 {{"code", absl::StatusCodeToString(s.code())},
                  {"reason", ReasonOf(s)},
                  {"message", std::string(s.message())}}}};
  };
  absl::StatusOr<json> pod = RenderPod(input.spec, input.options, input.annotations);
  if (!pod.ok()) return error(pod.status());
  json out = {{"pod", *pod}};
  pb::Network::Mode mode = input.spec.spec.network().mode();
  if (mode == pb::Network::NONE || mode == pb::Network::MODE_UNSPECIFIED) {
    absl::StatusOr<json> policy = RenderNetworkPolicy(input.spec, input.options);
    if (!policy.ok()) return error(policy.status());
    out["network_policy"] = *policy;
  }
  if (!input.spec.admin_token.empty()) {
    absl::StatusOr<json> secret = RenderAdminSecret(input.spec, input.options, "");
    if (!secret.ok()) return error(secret.status());
    out["admin_secret"] = *secret;
  }
  return out;
}

}  // namespace agentix::providers::kubernetes
