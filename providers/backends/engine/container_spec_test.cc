#include "providers/backends/engine/container_spec.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "providers/core/errors.h"

namespace agentix::providers::engine {
namespace {

using nlohmann::json;

// A bundle directory with nix/runtime/bootstrap.sh, removed at the end.
struct TempBundle {
  TempBundle() {
    char tmpl[] = "/tmp/agx-spec-XXXXXX";
    dir = ::mkdtemp(tmpl);
    ::mkdir((dir + "/nix").c_str(), 0755);
    ::mkdir((dir + "/nix/runtime").c_str(), 0755);
    std::ofstream(dir + "/nix/runtime/bootstrap.sh") << "#!/bin/sh\n";
  }
  ~TempBundle() { (void)!std::system(("rm -rf " + dir).c_str()); }
  std::string dir;
};

LaunchSpec Spec(const std::string& bundle) {
  LaunchSpec spec;
  spec.sandbox_id = "sb-1";
  spec.uid = "uid-1";
  spec.instance = "providerd-a";
  spec.spec.set_image("localhost/agx-bb:1");
  spec.spec.mutable_bundle()->set_path(bundle);
  return spec;
}

EngineOptions Options() {
  EngineOptions options;
  options.name = "podman";
  options.run_root = "/run/agx/podman";
  return options;
}

TEST_CASE("the create body carries every limit and hardening flag") {
  LaunchSpec spec = Spec("/b");
  spec.admin_token = "secret-token";
  spec.labels = {{"team", "x"}, {"agentix.dev/pool", "p1"}};
  (*spec.spec.mutable_env())["USER_VAR"] = "never-at-launch";
  pb::Resources* r = spec.spec.mutable_resources();
  r->set_cpu_millis(1500);
  r->set_memory_bytes(64 << 20);
  r->set_pids(32);
  r->set_scratch_bytes(8 << 20);
  r->set_nofile(512);
  json body = RenderCreateBody(spec, Options(), "/b/nix", "/run/agx/podman/sb-1");
  const json& host = body["HostConfig"];
  CHECK(body["Image"] == "localhost/agx-bb:1");
  CHECK(body["Entrypoint"] == json::array({"/nix/runtime/bootstrap.sh"}));
  CHECK(body["Cmd"] == json::array({"--admin-token-file", "/run/agentix/admin-token"}));
  CHECK(body["Env"] == json::array({"AGENTIX_LISTEN=unix:///run/agentix/agentix.sock"}));
  CHECK(body.dump().find("secret-token") == std::string::npos);
  CHECK(body.dump().find("never-at-launch") == std::string::npos);
  CHECK(body["Labels"]["agentix.dev/sandbox-id"] == "sb-1");
  CHECK(body["Labels"]["agentix.dev/uid"] == "uid-1");
  CHECK(body["Labels"]["agentix.dev/managed-by"] == "providerd-a");
  CHECK(body["Labels"]["agentix.dev/label.team"] == "x");
  CHECK(body["Labels"]["agentix.dev/pool"] == "p1");
  CHECK(body["Hostname"] == "sbx-sb-1");
  CHECK(body["Tty"] == false);
  CHECK(host["Binds"] == json::array({"/b/nix:/nix:ro", "/run/agx/podman/sb-1:/run/agentix"}));
  CHECK(host["Init"] == true);
  CHECK(host["NanoCpus"] == 1500000000);
  CHECK(host["Memory"] == 64 << 20);
  CHECK(host["MemorySwap"] == 64 << 20);
  CHECK(host["PidsLimit"] == 32);
  CHECK(host["Ulimits"] == json::parse(R"([{"Name":"nofile","Soft":512,"Hard":512},
                                           {"Name":"nproc","Soft":4096,"Hard":4096}])"));
  CHECK(host["ReadonlyRootfs"] == true);
  CHECK(host["Tmpfs"]["/tmp"] == "rw,nosuid,nodev,size=8388608");
  CHECK(host["CapDrop"] == json::array({"ALL"}));
  CHECK(host["SecurityOpt"] == json::array({"no-new-privileges"}));
  CHECK(host["NetworkMode"] == "none");
  CHECK(host["AutoRemove"] == false);
  CHECK_FALSE(host.contains("DeviceRequests"));
}

TEST_CASE("defaults: ulimits always, no limits unless asked, host network has no hostname") {
  LaunchSpec spec = Spec("/b");
  spec.spec.mutable_network()->set_mode(pb::Network::HOST);
  json body = RenderCreateBody(spec, Options(), "/b/nix", "/r/sb-1");
  const json& host = body["HostConfig"];
  CHECK(body["Cmd"] == json::array());
  CHECK(host["NetworkMode"] == "host");
  CHECK_FALSE(body.contains("Hostname"));
  CHECK(host["Ulimits"][0]["Soft"] == 1024);
  CHECK(host["Ulimits"][1]["Name"] == "nproc");
  CHECK(host["Tmpfs"]["/tmp"] == "rw,nosuid,nodev,size=67108864");
  CHECK_FALSE(host.contains("Memory"));
  CHECK_FALSE(host.contains("PidsLimit"));
  CHECK_FALSE(host.contains("NanoCpus"));
}

TEST_CASE("the bundle is a directory holding nix/runtime/bootstrap.sh, or its nix/") {
  TempBundle bundle;
  pb::BundleRef ref;
  ref.set_path(bundle.dir);
  CHECK(*BundleNixDir(ref) == bundle.dir + "/nix");
  ref.set_path(bundle.dir + "/nix/");
  CHECK(*BundleNixDir(ref) == bundle.dir + "/nix");
  ref.set_path(bundle.dir + "/nix/runtime");
  CHECK(ReasonOf(BundleNixDir(ref).status()) == kReasonNotABundle);
  ref.set_path("relative/bundle");
  CHECK(BundleNixDir(ref).status().code() == absl::StatusCode::kInvalidArgument);
  ref.set_path("/x:y");
  CHECK(BundleNixDir(ref).status().code() == absl::StatusCode::kInvalidArgument);
  ref.set_oci_reference("localhost/bundle:1");
  CHECK(BundleNixDir(ref).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("what the engines cannot do here is refused before anything starts") {
  TempBundle bundle;
  EngineOptions options = Options();
  auto check = [&](LaunchSpec spec, absl::StatusCode code, const char* reason) {
    absl::Status status = ValidateStatic(spec, options, 20000);
    CHECK(status.code() == code);
    CHECK(ReasonOf(status) == reason);
  };
  CHECK(ValidateStatic(Spec(bundle.dir), options, 20000).ok());

  LaunchSpec bridge = Spec(bundle.dir);
  bridge.spec.mutable_network()->set_mode(pb::Network::BRIDGE);
  check(bridge, absl::StatusCode::kFailedPrecondition, kReasonLimitNotEnforceable);
  LaunchSpec egress = Spec(bundle.dir);
  egress.spec.mutable_network()->add_allow_egress_cidrs("10.0.0.0/8");
  check(egress, absl::StatusCode::kFailedPrecondition, kReasonLimitNotEnforceable);
  LaunchSpec nofile = Spec(bundle.dir);
  nofile.spec.mutable_resources()->set_nofile(20001);
  check(nofile, absl::StatusCode::kFailedPrecondition, kReasonLimitNotEnforceable);
  LaunchSpec tiny = Spec(bundle.dir);
  tiny.spec.mutable_resources()->set_memory_bytes(1 << 20);
  check(tiny, absl::StatusCode::kFailedPrecondition, kReasonLimitNotEnforceable);
  LaunchSpec negative = Spec(bundle.dir);
  negative.spec.mutable_resources()->set_pids(-1);
  check(negative, absl::StatusCode::kInvalidArgument, kReasonInvalidSpec);
  LaunchSpec image = Spec(bundle.dir);
  image.spec.set_image("bad image name");
  check(image, absl::StatusCode::kInvalidArgument, kReasonInvalidSpec);
  LaunchSpec id = Spec(bundle.dir);
  id.sandbox_id = "Upper_Case";
  check(id, absl::StatusCode::kInvalidArgument, kReasonInvalidSpec);
  LaunchSpec not_bundle = Spec("/nonexistent/bundle");
  check(not_bundle, absl::StatusCode::kInvalidArgument, kReasonNotABundle);

  options.run_root = "/" + std::string(80, 'r');
  LaunchSpec long_path = Spec(bundle.dir);
  long_path.sandbox_id = std::string(40, 'a');
  check(long_path, absl::StatusCode::kFailedPrecondition, kReasonLimitNotEnforceable);
}

TEST_CASE("platforms are normalized the way image references spell them") {
  CHECK(NormalizePlatform("linux", "x86_64") == "linux/amd64");
  CHECK(NormalizePlatform("linux", "amd64") == "linux/amd64");
  CHECK(NormalizePlatform("linux", "aarch64") == "linux/arm64");
}

}  // namespace
}  // namespace agentix::providers::engine
