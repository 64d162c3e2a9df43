// The Docker Engine API's multiplexed stream (container logs and attach
// without a TTY): frames of an 8-byte header {stream, 0, 0, 0, size as
// big-endian u32} and `size` bytes of payload. Podman's compat API sends the
// same framing.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/strings/string_view.h"

namespace agentix::providers::engine {

class LogDemuxer {
 public:
  // stream: 1 stdout, 2 stderr (0 stdin). A frame's payload may arrive in
  // several calls. Returning false stops Feed.
  using PayloadFn = std::function<bool(int stream, absl::string_view payload)>;

  // Feeds the next bytes of the stream, in any split. Returns false when
  // `out` asked to stop. A header that is not a frame header (a TTY
  // container's raw stream) switches to passing bytes through as stdout.
  bool Feed(absl::string_view data, const PayloadFn& out);

  // Bytes of payload still expected for the current frame (0 between frames).
  uint32_t pending() const { return remaining_; }
  bool raw() const { return raw_; }

 private:
  unsigned char header_[8] = {0};
  int header_len_ = 0;
  uint32_t remaining_ = 0;
  int stream_ = 1;
  bool raw_ = false;
};

}  // namespace agentix::providers::engine
