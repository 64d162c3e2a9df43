// Conversion between absl::Status (used everywhere inside our code) and
// grpc::Status (used only at the gRPC edge).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace agentix::base {

// Longest message sent to a client; longer ones are cut with a marker.
inline constexpr size_t kMaxClientMessageBytes = 1024;

// Same code; the message is truncated to kMaxClientMessageBytes.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
// Cuts `message` to at most `limit` bytes, ending in "... (truncated)".
std::string TruncateMessage(std::string message,
                            size_t limit = kMaxClientMessageBytes);

}  // namespace agentix::base
