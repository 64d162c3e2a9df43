#include "providers/backends/kubernetes/pod_render.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "providers/backends/kubernetes/render_input.h"
#include "providers/core/errors.h"

namespace agentix::providers::kubernetes {
namespace {

using nlohmann::json;

// Bazel runs tests from the workspace's runfiles root.
constexpr char kTestdata[] = "providers/backends/kubernetes/testdata/";

json ReadJson(const std::string& name) {
  std::ifstream in(absl::StrCat(kTestdata, name));
  REQUIRE(in.good());
  return json::parse(in);
}

RenderInput Input(const std::string& name) {
  auto input = ParseRenderInput(ReadJson(name));
  REQUIRE(input.ok());
  return *input;
}

// Objects whose keys are data (labels, quantities), not field names.
const std::set<std::string>& MapPaths() {
  static const auto* maps = new std::set<std::string>{
      "metadata.labels",
      "metadata.annotations",
      "data",
      "spec.containers[].resources.requests",
      "spec.containers[].resources.limits",
      "spec.initContainers[].resources.requests",
      "spec.initContainers[].resources.limits",
      "spec.podSelector.matchLabels",
      "spec.ingress[].from[].podSelector.matchLabels",
  };
  return *maps;
}

void CollectPaths(const std::string& kind, const std::string& path, const json& v,
                  std::set<std::string>* out) {
  if (v.is_object()) {
    if (v.empty()) out->insert(absl::StrCat(kind, " ", path));
    for (const auto& [key, value] : v.items()) {
      std::string child = MapPaths().count(path) ? "*" : key;
      CollectPaths(kind, path.empty() ? child : absl::StrCat(path, ".", child), value, out);
    }
  } else if (v.is_array()) {
    if (v.empty()) out->insert(absl::StrCat(kind, " ", path, "[]"));
    for (const auto& element : v) CollectPaths(kind, absl::StrCat(path, "[]"), element, out);
  } else {
    out->insert(absl::StrCat(kind, " ", path));
  }
}

std::set<std::string> AllowedPaths() {
  std::ifstream in(absl::StrCat(kTestdata, "allowed_paths.txt"));
  REQUIRE(in.good());
  std::set<std::string> allowed;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') allowed.insert(line);
  }
  return allowed;
}

// Every leaf path of every object in `rendered` (RenderAll's output) is on
// the allow-list; returns the ones that are not.
std::set<std::string> UnlistedPaths(const json& rendered) {
  std::set<std::string> paths;
  for (const auto& [name, object] : rendered.items()) {
    CollectPaths(object.at("kind").get<std::string>(), "", object, &paths);
  }
  std::set<std::string> allowed = AllowedPaths();
  std::set<std::string> unlisted;
  for (const auto& p : paths) {
    if (!allowed.count(p)) unlisted.insert(p);
  }
  return unlisted;
}

TEST_CASE("rendered objects match the golden files", "[kubernetes]") {
  // Regenerate after a deliberate change:
  //   bazel-bin/providers/backends/kubernetes/pod_render_tool testdata/X.input.json
  //     > testdata/X.golden.json   (and review the diff)
  for (const char* name : {"init_copy", "image_volume", "host_network"}) {
    INFO(name);
    json rendered = RenderAll(Input(absl::StrCat(name, ".input.json")));
    json golden = ReadJson(absl::StrCat(name, ".golden.json"));
    INFO(json::diff(golden, rendered).dump(1));
    CHECK(rendered == golden);
  }
}

TEST_CASE("every emitted field path is on the allow-list", "[kubernetes]") {
  for (const char* name : {"init_copy", "image_volume", "host_network"}) {
    INFO(name);
    json rendered = RenderAll(Input(absl::StrCat(name, ".input.json")));
    REQUIRE_FALSE(rendered.contains("error"));
    CHECK(UnlistedPaths(rendered).empty());
  }
  // A Secret owned by its Pod.
  RenderInput in = Input("init_copy.input.json");
  auto secret = RenderAdminSecret(in.spec, in.options, "5f0c-uid");
  REQUIRE(secret.ok());
  CHECK((*secret)["metadata"]["ownerReferences"][0]["uid"] == "5f0c-uid");
  CHECK(UnlistedPaths(json{{"secret", *secret}}).empty());
}

TEST_CASE("the allow-list check catches a misspelled or unknown field", "[kubernetes]") {
  json rendered = RenderAll(Input("init_copy.input.json"));
  rendered["pod"]["spec"]["volumes"][0]["emptyDir"]["sizeLimt"] = "1";
  rendered["pod"]["spec"]["containers"][0]["securityContext"]["privileged"] = true;
  CHECK(UnlistedPaths(rendered) ==
        std::set<std::string>{"Pod spec.volumes[].emptyDir.sizeLimt",
                              "Pod spec.containers[].securityContext.privileged"});
}

TEST_CASE("the Pod carries the contract's fields", "[kubernetes]") {
  RenderInput in = Input("init_copy.input.json");
  auto pod = RenderPod(in.spec, in.options, in.annotations);
  REQUIRE(pod.ok());
  const json& spec = (*pod)["spec"];
  const json& task = spec["containers"][0];
  CHECK((*pod)["metadata"]["name"] == "sbx-a1b2c3");
  // The controller's own ids already carry the prefix: never "sbx-sbx-".
  RenderInput own = Input("init_copy.input.json");
  own.spec.sandbox_id = "sbx-k2v9q";
  auto own_pod = RenderPod(own.spec, own.options, own.annotations);
  REQUIRE(own_pod.ok());
  CHECK((*own_pod)["metadata"]["name"] == "sbx-k2v9q");
  CHECK(spec["restartPolicy"] == "Never");
  CHECK(spec["automountServiceAccountToken"] == false);
  CHECK(spec["enableServiceLinks"] == false);
  CHECK(spec["activeDeadlineSeconds"] == 3600);
  CHECK(task["command"] == json::array({"/nix/runtime/bootstrap.sh"}));
  // The probes dial the plaintext health port by number.
  CHECK(task["readinessProbe"]["grpc"]["port"].is_number_integer());
  CHECK(task["readinessProbe"]["grpc"]["port"] == in.options.health_port);
  CHECK(task["startupProbe"]["grpc"]["service"] == kProbeService);
  CHECK(task["args"][1] == absl::StrCat("0.0.0.0:", in.options.health_port));
  CHECK(task["securityContext"]["capabilities"]["drop"] == json::array({"ALL"}));
  CHECK(task["resources"]["limits"]["cpu"] == "500m");
  CHECK(task["resources"]["limits"]["memory"] == "536870912");
  // The user's env never reaches the Pod object (it arrives with Activate).
  in.spec.spec.mutable_env()->insert({"SECRET_KEY", "hunter2"});
  auto with_env = RenderPod(in.spec, in.options, in.annotations);
  REQUIRE(with_env.ok());
  CHECK_FALSE(absl::StrContains(with_env->dump(), "hunter2"));
  // Nor does the admin token: only the Secret has it (base64).
  CHECK_FALSE(absl::StrContains(with_env->dump(), in.spec.admin_token));
  // The spec hash leaves env out (no hash of user secrets in the Pod)...
  CHECK((*with_env)["metadata"]["annotations"][kAnnotationSpecHash] ==
        (*pod)["metadata"]["annotations"][kAnnotationSpecHash]);
  // ...and changes with what the Pod is made of.
  in.spec.spec.set_image("docker.io/library/python:3.13-slim");
  auto other = RenderPod(in.spec, in.options, in.annotations);
  REQUIRE(other.ok());
  CHECK((*other)["metadata"]["annotations"][kAnnotationSpecHash] !=
        (*pod)["metadata"]["annotations"][kAnnotationSpecHash]);
  CHECK(SpecHash(in.spec.spec).size() == 32);
}

TEST_CASE("a pool member is labelled unclaimed", "[kubernetes]") {
  RenderInput in = Input("image_volume.input.json");
  auto pod = RenderPod(in.spec, in.options, in.annotations);
  REQUIRE(pod.ok());
  CHECK((*pod)["metadata"]["labels"][kLabelPool] == "swe-small");
  CHECK((*pod)["metadata"]["labels"][kLabelClaimed] == "false");
  CHECK((*pod)["spec"]["volumes"][0]["image"]["reference"] ==
        in.spec.spec.bundle().oci_reference());
  CHECK((*pod)["spec"]["containers"][0]["volumeMounts"][0]["subPath"] == "nix");
  CHECK((*pod)["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1");
  CHECK((*pod)["spec"]["runtimeClassName"] == "gvisor");
}

void CheckRefused(const RenderInput& in, absl::StatusCode code, const std::string& reason,
                  const std::string& needle) {
  auto pod = RenderPod(in.spec, in.options, in.annotations);
  REQUIRE_FALSE(pod.ok());
  INFO(pod.status().ToString());
  CHECK(pod.status().code() == code);
  CHECK(ReasonOf(pod.status()) == reason);
  CHECK(absl::StrContains(pod.status().message(), needle));
  CHECK(ValidatePodSpec(in.spec, in.options).code() ==
        (absl::StrContains(needle, "admin token:") ? absl::StatusCode::kOk : code));
}

TEST_CASE("bad input is refused with a typed error", "[kubernetes]") {
  const RenderInput good = Input("init_copy.input.json");
  const RenderInput volume = Input("image_volume.input.json");
  using C = absl::StatusCode;
  {
    RenderInput in = good;
    in.spec.labels["team"] = std::string(64, 'a');  // value > 63
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "label \"agentix.dev/label.team\"");
  }
  {
    RenderInput in = good;
    in.spec.labels["bad key!"] = "x";
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "bad key!");
  }
  {
    RenderInput in = good;
    in.spec.labels["team"] = "-leading-dash";
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "-leading-dash");
  }
  {
    RenderInput in = good;
    in.spec.labels["Bad_Prefix/x"] = "v";
    // User keys become agentix.dev/label.<key>: one with its own prefix cannot.
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "label.Bad_Prefix/x");
  }
  {
    RenderInput in = good;
    in.spec.sandbox_id = "Upper";
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "sandbox id");
  }
  {
    // An image volume needs a digest-pinned reference (a tag with
    // IfNotPresent pins whatever each node cached).
    RenderInput in = volume;
    in.spec.spec.mutable_bundle()->set_oci_reference("registry.example.com/agentix/bundle:0.3.0");
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "digest-pinned");
    in.spec.spec.mutable_bundle()->set_oci_reference("registry.example.com/b@sha256:abc");
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "64 lowercase hex");
    in.spec.spec.mutable_bundle()->set_oci_reference(
        absl::StrCat("registry.example.com/b@sha256:", std::string(64, 'a')));
    in.spec.spec.mutable_bundle()->set_digest(absl::StrCat("sha256:", std::string(64, 'b')));
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "disagree");
  }
  {
    RenderInput in = good;
    in.spec.spec.mutable_bundle()->set_path("/opt/bundle");
    CheckRefused(in, C::kInvalidArgument, kReasonNotABundle, "OCI image reference");
  }
  {
    RenderInput in = good;
    in.spec.spec.set_image("bad image");
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "task image");
  }
  {
    RenderInput in = good;
    in.spec.spec.mutable_resources()->set_pids(100);
    CheckRefused(in, C::kFailedPrecondition, kReasonLimitNotEnforceable, "pids");
    in = good;
    in.spec.spec.mutable_resources()->set_nofile(100);
    CheckRefused(in, C::kFailedPrecondition, kReasonLimitNotEnforceable, "open-file");
  }
  {
    RenderInput in = good;
    in.spec.spec.mutable_network()->set_mode(pb::Network::HOST);
    CheckRefused(in, C::kFailedPrecondition, kReasonLimitNotEnforceable, "hostNetwork");
    in = good;
    in.spec.spec.mutable_network()->add_allow_egress_cidrs("10.0.0.0/8");
    CheckRefused(in, C::kFailedPrecondition, kReasonLimitNotEnforceable, "egress");
  }
  {
    RenderInput in = good;
    in.options.health_port = in.options.runtime_port;
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "must differ");
    in = good;
    in.options.health_port = 0;  // a named or missing port cannot be probed
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "out of range");
  }
  {
    RenderInput in = good;
    in.options.run_as_non_root = true;
    CheckRefused(in, C::kFailedPrecondition, kReasonLimitNotEnforceable, "runAsNonRoot");
  }
  {
    RenderInput in = good;
    in.spec.admin_token.clear();
    CheckRefused(in, C::kInvalidArgument, kReasonInvalidSpec, "no admin token:");
  }
}

TEST_CASE("the NetworkPolicy is for network NONE only", "[kubernetes]") {
  RenderInput in = Input("host_network.input.json");
  auto policy = RenderNetworkPolicy(in.spec, in.options);
  REQUIRE_FALSE(policy.ok());
  CHECK(policy.status().code() == absl::StatusCode::kInvalidArgument);
  // No ingress labels: deny everything both ways.
  RenderInput none = Input("init_copy.input.json");
  none.options.ingress_from_labels.clear();
  auto closed = RenderNetworkPolicy(none.spec, none.options);
  REQUIRE(closed.ok());
  CHECK((*closed)["spec"]["ingress"] == json::array());
  CHECK((*closed)["spec"]["egress"] == json::array());
  CHECK((*closed)["spec"]["policyTypes"] == json::array({"Ingress", "Egress"}));
}

TEST_CASE("ValidateLabel follows the Kubernetes label syntax", "[kubernetes]") {
  CHECK(ValidateLabel("app.kubernetes.io/name", "agentix").ok());
  CHECK(ValidateLabel("a", "").ok());
  CHECK(ValidateLabel("x", std::string(63, 'v')).ok());
  CHECK_FALSE(ValidateLabel("x", std::string(64, 'v')).ok());
  CHECK_FALSE(ValidateLabel(std::string(64, 'k'), "v").ok());
  CHECK_FALSE(ValidateLabel("/x", "v").ok());
  CHECK_FALSE(ValidateLabel("x/", "v").ok());
  CHECK_FALSE(ValidateLabel("x", "a b").ok());
  CHECK_FALSE(ValidateLabel("x", "end-").ok());
}

}  // namespace
}  // namespace agentix::providers::kubernetes
