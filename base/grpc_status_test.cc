#include "base/grpc_status.h"

#include <catch2/catch.hpp>

namespace agentix::base {
namespace {

TEST_CASE("ToGrpcStatus keeps the code and the message", "[base]") {
  grpc::Status s = ToGrpcStatus(absl::InvalidArgumentError("bad frame"));
  REQUIRE(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(s.error_message() == "bad frame");
  REQUIRE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST_CASE("Status round-trips through gRPC for every canonical code",
          "[base]") {
  for (int code = 1; code <= 16; ++code) {
    absl::Status in(static_cast<absl::StatusCode>(code), "m");
    absl::Status out = FromGrpcStatus(ToGrpcStatus(in));
    REQUIRE(out.code() == in.code());
    REQUIRE(out.message() == "m");
  }
}

TEST_CASE("Long messages are truncated for clients", "[base]") {
  std::string huge(5000, 'x');
  grpc::Status s = ToGrpcStatus(absl::InternalError(huge));
  REQUIRE(s.error_message().size() == kMaxClientMessageBytes);
  REQUIRE(s.error_message().find("(truncated)") != std::string::npos);
  REQUIRE(TruncateMessage("short") == "short");
}

}  // namespace
}  // namespace agentix::base
