#include "bundler/oci_layout.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "bundler/archive.h"
#include "bundler/test_util.h"
#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string MakeLayer(const std::string& dir) {
  TarEntry file;
  file.path = "nix/runtime/bootstrap.sh";
  file.content = "#!/bin/sh\n";
  file.content_is_inline = true;
  file.executable = true;
  const std::string layer = dir + "/layer.tar";
  REQUIRE_OK(WriteTar({file}, layer));
  return layer;
}

TEST_CASE("WriteOciLayout writes a consistent single-layer layout",
          "[bundler]") {
  const std::string dir = testing::FreshDir("oci_layout");
  const std::string layer = MakeLayer(dir);
  REQUIRE_OK_AND_ASSIGN(std::string layer_sha, Sha256File(layer));
  OciImageOptions options;
  options.ref_name = "0.1.0";
  options.entrypoint = {"/nix/runtime/bootstrap.sh"};
  options.env = {"PATH=/nix/runtime/bin"};
  REQUIRE_OK_AND_ASSIGN(OciImage image,
                        WriteOciLayout(layer, options, dir + "/oci"));
  CHECK(image.layer_digest == "sha256:" + layer_sha);
  CHECK_FALSE(fs::exists(layer));  // moved into blobs/

  CHECK(ReadJson(dir + "/oci/oci-layout")["imageLayoutVersion"] == "1.0.0");
  nlohmann::json index = ReadJson(dir + "/oci/index.json");
  REQUIRE(index["manifests"].size() == 1);
  const nlohmann::json& descriptor = index["manifests"][0];
  CHECK(descriptor["digest"] == image.manifest_digest);
  CHECK(descriptor["annotations"]["org.opencontainers.image.ref.name"] ==
        "0.1.0");

  // Every descriptor's digest and size match the blob it names.
  auto blob = [&](const nlohmann::json& d) {
    const std::string hex = d["digest"].get<std::string>().substr(7);
    const std::string path = dir + "/oci/blobs/sha256/" + hex;
    REQUIRE_OK_AND_ASSIGN(std::string sha, Sha256File(path));
    CHECK(sha == hex);
    CHECK(fs::file_size(path) == d["size"].get<uint64_t>());
    return path;
  };
  nlohmann::json manifest = ReadJson(blob(descriptor));
  CHECK(manifest["schemaVersion"] == 2);
  REQUIRE(manifest["layers"].size() == 1);
  blob(manifest["layers"][0]);
  nlohmann::json config = ReadJson(blob(manifest["config"]));
  CHECK(config["rootfs"]["diff_ids"][0] == image.layer_digest);
  CHECK(config["config"]["Entrypoint"][0] == "/nix/runtime/bootstrap.sh");
  CHECK(config["os"] == "linux");
  CHECK_FALSE(config.contains("created"));
}

TEST_CASE("WriteOciLayout is deterministic and replaces an old layout",
          "[bundler]") {
  const std::string dir = testing::FreshDir("oci_layout_twice");
  OciImageOptions options;
  options.ref_name = "t";
  REQUIRE_OK_AND_ASSIGN(OciImage first,
                        WriteOciLayout(MakeLayer(dir), options, dir + "/oci"));
  std::ofstream(dir + "/oci/stale") << "x";
  REQUIRE_OK_AND_ASSIGN(OciImage second,
                        WriteOciLayout(MakeLayer(dir), options, dir + "/oci"));
  CHECK(first.manifest_digest == second.manifest_digest);
  CHECK_FALSE(fs::exists(dir + "/oci/stale"));
  CHECK(WriteOciLayout(dir + "/missing.tar", options, dir + "/oci2")
            .status()
            .code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace agentix::bundler
