#include "sandbox/auth.h"

#include <utility>

#include "sandbox/connection_guard.h"

namespace agentix::sandbox {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeDaemonCredentials(
    ServerSecurityOptions options) {
  options.on_authenticated = &MarkCurrentConnectionAuthenticated;
  options.denied_message =
      "missing or wrong bearer token: send 'authorization: Bearer "
      "<token>' (RuntimeClient(url, token=...))";
  return auth::MakeServerCredentials(options);
}

}  // namespace agentix::sandbox
