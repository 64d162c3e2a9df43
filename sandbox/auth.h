// The daemon's use of //auth: the same token check, which here also marks
// the calling connection authenticated for the connection guard
// (connection_guard.h), with a hint that names the Python client.
#pragma once

#include <memory>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "auth/server_auth.h"

namespace agentix::sandbox {

using auth::BearerTokenMatches;
using auth::kTokenEnvVar;
using auth::LoadToken;
using auth::ReadPemFile;
using auth::ServerSecurityOptions;

// auth::MakeServerCredentials with the connection guard's hook and the
// daemon's UNAUTHENTICATED message.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeDaemonCredentials(
    ServerSecurityOptions options);

}  // namespace agentix::sandbox
