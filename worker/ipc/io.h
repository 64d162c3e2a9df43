// Blocking and non-blocking byte transfer for the frame channel.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/ipc/frame.h"

namespace agentix::ipc {

// Writes all of `bytes` to `fd`, retrying on EINTR and waiting in poll() when
// the fd is non-blocking and full. kUnavailable if the peer is gone.
absl::Status WriteAll(int fd, std::string_view bytes);
// The same for the concatenation of `pieces`, written with writev: frame
// headers and payloads that live apart go out without being copied together.
absl::Status WriteAll(int fd, absl::Span<const std::string_view> pieces);

// Reads what is available (at most `max_bytes`) from `fd` into `reader`.
// Returns the byte count; 0 means end of stream. For a non-blocking fd with
// nothing to read, returns kUnavailable with message "EAGAIN" — callers that
// poll should check IsWouldBlock().
absl::StatusOr<size_t> ReadInto(int fd, FrameReader& reader,
                                size_t max_bytes = 1 << 20);
bool IsWouldBlock(const absl::Status& status);

}  // namespace agentix::ipc
