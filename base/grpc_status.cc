#include "base/grpc_status.h"

#include <string>

namespace agentix::base {

std::string TruncateMessage(std::string message, size_t limit) {
  static constexpr char kMarker[] = "... (truncated)";
  constexpr size_t kMarkerLen = sizeof(kMarker) - 1;
  if (message.size() <= limit) return message;
  if (limit < kMarkerLen) return message.substr(0, limit);
  message.resize(limit - kMarkerLen);
  message += kMarker;
  return message;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      TruncateMessage(std::string(status.message())));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace agentix::base
