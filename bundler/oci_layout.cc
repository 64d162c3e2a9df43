#include "bundler/oci_layout.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "bundler/archive.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestType[] = "application/vnd.oci.image.manifest.v1+json";
constexpr char kConfigType[] = "application/vnd.oci.image.config.v1+json";
constexpr char kLayerType[] = "application/vnd.oci.image.layer.v1.tar";

absl::Status WriteFile(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

// Stores `content` as a blob; returns its descriptor.
absl::StatusOr<nlohmann::json> PutBlob(const fs::path& blobs,
                                       const std::string& media_type,
                                       const std::string& content) {
  std::string hex = Sha256Hex(content);
  AGX_RETURN_IF_ERROR(WriteFile(blobs / hex, content));
  return nlohmann::json{{"mediaType", media_type},
                        {"digest", "sha256:" + hex},
                        {"size", content.size()}};
}

}  // namespace

absl::StatusOr<OciImage> WriteOciLayout(const std::string& layer_tar,
                                        const OciImageOptions& options,
                                        const std::string& out_dir) {
  std::error_code ec;
  if (!fs::is_regular_file(layer_tar, ec)) {
    return absl::NotFoundError(absl::StrCat("layer ", layer_tar, " not found"));
  }
  fs::remove_all(out_dir, ec);
  const fs::path blobs = fs::path(out_dir) / "blobs" / "sha256";
  fs::create_directories(blobs, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create ", blobs.string(), ": ", ec.message()));
  }

  AGX_ASSIGN_OR_RETURN(std::string layer_hex, Sha256File(layer_tar));
  const uintmax_t layer_size = fs::file_size(layer_tar, ec);
  fs::rename(layer_tar, blobs / layer_hex, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot move ", layer_tar,
                                            " into the layout: ", ec.message()));
  }
  const std::string layer_digest = "sha256:" + layer_hex;

  nlohmann::json labels = nlohmann::json::object();
  for (const auto& [key, value] : options.labels) labels[key] = value;
  nlohmann::json config = {
      {"architecture", "amd64"},
      {"os", "linux"},
      {"config",
       {{"Entrypoint", options.entrypoint},
        {"Env", options.env},
        {"WorkingDir", options.working_dir},
        {"Labels", labels}}},
      // Uncompressed layer: its diff_id is its own digest.
      {"rootfs", {{"type", "layers"}, {"diff_ids", {layer_digest}}}},
  };
  AGX_ASSIGN_OR_RETURN(nlohmann::json config_descriptor,
                       PutBlob(blobs, kConfigType, config.dump()));

  nlohmann::json manifest = {
      {"schemaVersion", 2},
      {"mediaType", kManifestType},
      {"config", config_descriptor},
      {"layers",
       {{{"mediaType", kLayerType},
         {"digest", layer_digest},
         {"size", layer_size}}}},
  };
  AGX_ASSIGN_OR_RETURN(nlohmann::json manifest_descriptor,
                       PutBlob(blobs, kManifestType, manifest.dump()));
  manifest_descriptor["annotations"] = {
      {"org.opencontainers.image.ref.name", options.ref_name}};
  manifest_descriptor["platform"] = {{"architecture", "amd64"},
                                     {"os", "linux"}};

  nlohmann::json index = {{"schemaVersion", 2},
                          {"manifests", {manifest_descriptor}}};
  AGX_RETURN_IF_ERROR(WriteFile(fs::path(out_dir) / "index.json", index.dump()));
  AGX_RETURN_IF_ERROR(WriteFile(fs::path(out_dir) / "oci-layout",
                                R"({"imageLayoutVersion":"1.0.0"})"));
  return OciImage{manifest_descriptor["digest"].get<std::string>(),
                  layer_digest};
}

}  // namespace agentix::bundler
