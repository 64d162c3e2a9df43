// Writes an OCI image layout (image-spec v1: oci-layout, index.json,
// blobs/sha256/...) holding one single-layer image, so that container engines
// can run a bundle directly (`podman run oci:DIR:TAG`) or copy it elsewhere
// (`skopeo copy oci:DIR:TAG ...`). JSON by nlohmann-json; the output is
// deterministic (no creation time, keys sorted).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace agentix::bundler {

struct OciImageOptions {
  std::string ref_name;                 // index annotation, e.g. "0.1.0"
  std::vector<std::string> entrypoint;  // config.Entrypoint
  std::vector<std::string> env;         // config.Env, "K=V"
  std::string working_dir = "/";
  std::vector<std::pair<std::string, std::string>> labels;
};

struct OciImage {
  std::string manifest_digest;  // "sha256:<hex>"
  std::string layer_digest;     // "sha256:<hex>"
};

// Builds the layout in `out_dir` (created; an existing layout there is
// replaced) with `layer_tar` (an uncompressed tar) as the only layer. The
// tar is moved into blobs/. Errors: kNotFound for a missing layer,
// kInternal for filesystem failures.
absl::StatusOr<OciImage> WriteOciLayout(const std::string& layer_tar,
                                        const OciImageOptions& options,
                                        const std::string& out_dir);

}  // namespace agentix::bundler
