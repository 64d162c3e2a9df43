#include "providers/core/grpc_daemon_agent.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agentix/runtime/v1/admin.grpc.pb.h"
#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace agentix::providers {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

void Prepare(grpc::ClientContext& context, const std::string& token,
             absl::Time deadline) {
  if (!token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }
  context.set_deadline(absl::ToChronoTime(deadline));
}

bool Unreachable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

GrpcDaemonAgent::GrpcDaemonAgent(Options options)
    : options_(std::move(options)) {}

GrpcDaemonAgent::Key GrpcDaemonAgent::KeyOf(
    const provider::v1::Endpoint& endpoint) {
  return Key(endpoint.target(), endpoint.tls(), endpoint.authority());
}

std::shared_ptr<grpc::Channel> GrpcDaemonAgent::NewChannel(
    const provider::v1::Endpoint& endpoint) const {
  grpc::ChannelArguments args;
  // Its own subchannel: a subchannel shared through the global pool may be
  // in reconnect backoff from an earlier probe of a daemon not yet up.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A kept channel that loses its daemon reconnects soon, not after 1 s+
  // (gRPC raises the initial backoff to its floor, 100 ms).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // gRPC takes the "minimum reconnect backoff" as the time one connection
  // attempt may take. It was 20 ms here (100 ms after gRPC's floor): a daemon
  // slow to finish the HTTP/2 handshake (a loaded machine, a sanitizer
  // build) failed CheckReady with "connection attempt timed out" although it
  // was up. The call's own deadline bounds the attempt anyway.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  if (!endpoint.authority().empty()) {
    args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, endpoint.authority());
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (endpoint.tls()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.tls_root_certs_pem;
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  return grpc::CreateCustomChannel(endpoint.target(), credentials, args);
}

std::shared_ptr<grpc::Channel> GrpcDaemonAgent::ChannelFor(
    const provider::v1::Endpoint& endpoint) {
  {
    absl::MutexLock lock(&mu_);
    auto it = channels_.find(KeyOf(endpoint));
    if (it != channels_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.channel;
    }
  }
  return NewChannel(endpoint);
}

void GrpcDaemonAgent::Keep(const provider::v1::Endpoint& endpoint,
                           std::shared_ptr<grpc::Channel> channel) {
  absl::MutexLock lock(&mu_);
  const Key key = KeyOf(endpoint);
  auto it = channels_.find(key);
  if (it != channels_.end()) {
    it->second.channel = std::move(channel);
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return;
  }
  lru_.push_front(key);
  channels_[key] = Kept{std::move(channel), lru_.begin()};
  while (channels_.size() > options_.max_channels && !lru_.empty()) {
    channels_.erase(lru_.back());
    lru_.pop_back();
  }
}

void GrpcDaemonAgent::Drop(const provider::v1::Endpoint& endpoint,
                           const std::shared_ptr<grpc::Channel>& channel) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(KeyOf(endpoint));
  if (it == channels_.end() || it->second.channel != channel) return;
  lru_.erase(it->second.lru);
  channels_.erase(it);
}

void GrpcDaemonAgent::Forget(const provider::v1::Endpoint& endpoint) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(KeyOf(endpoint));
  if (it == channels_.end()) return;
  lru_.erase(it->second.lru);
  channels_.erase(it);
}

size_t GrpcDaemonAgent::ChannelCount() {
  absl::MutexLock lock(&mu_);
  return channels_.size();
}

absl::Status GrpcDaemonAgent::CheckReady(const provider::v1::Endpoint& endpoint,
                                         const std::string& admin_token,
                                         absl::Time deadline) {
  if (endpoint.target().empty()) {
    return absl::InvalidArgumentError("endpoint has no target");
  }
  std::shared_ptr<grpc::Channel> channel = ChannelFor(endpoint);
  {
    grpc::ClientContext context;
    Prepare(context, admin_token, deadline);
    HealthCheckResponse response;
    const grpc::Status status =
        grpc::health::v1::Health::NewStub(channel)->Check(
            &context, HealthCheckRequest(), &response);
    if (!status.ok()) {
      Drop(endpoint, channel);
      if (Unreachable(status.error_code())) {
        return absl::UnavailableError(absl::StrCat(
            "daemon at ", endpoint.target(),
            " not reachable yet: ", status.error_message()));
      }
      if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        return absl::FailedPreconditionError(absl::StrCat(
            "daemon at ", endpoint.target(),
            " refuses the admin token (not started with this "
            "--admin-token-file?): ", status.error_message()));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "daemon at ", endpoint.target(), " failed its health check: ",
          status.error_message(), " (", status.error_code(), ")"));
    }
    if (response.status() != HealthCheckResponse::SERVING) {
      return absl::UnavailableError(absl::StrCat(
          "daemon at ", endpoint.target(), " is not serving (",
          HealthCheckResponse::ServingStatus_Name(response.status()), ")"));
    }
  }
  // A runtime RPC without a token must be refused: a daemon that ignores
  // tokens (started without --admin-token-file or --token-file) must never
  // be handed out.
  grpc::ClientContext context;
  Prepare(context, "", deadline);
  runtime::v1::GetInfoResponse info;
  const grpc::Status status =
      runtime::v1::RuntimeService::NewStub(channel)->GetInfo(
          &context, runtime::v1::GetInfoRequest(), &info);
  switch (status.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::FAILED_PRECONDITION:
      Keep(endpoint, std::move(channel));
      return absl::OkStatus();
    case grpc::StatusCode::OK:
      return absl::FailedPreconditionError(absl::StrCat(
          "daemon at ", endpoint.target(), " answers without a token"));
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      Drop(endpoint, channel);
      return absl::UnavailableError(absl::StrCat(
          "daemon at ", endpoint.target(),
          " not reachable: ", status.error_message()));
    default:
      return absl::FailedPreconditionError(absl::StrCat(
          "daemon at ", endpoint.target(),
          " answered a runtime RPC without a token with ",
          status.error_code(), " (", status.error_message(),
          "), not UNAUTHENTICATED or FAILED_PRECONDITION"));
  }
}

absl::Status GrpcDaemonAgent::Activate(const provider::v1::Endpoint& endpoint,
                                       const std::string& admin_token,
                                       const ActivateParams& params,
                                       absl::Time deadline) {
  if (endpoint.target().empty()) {
    return absl::InvalidArgumentError("endpoint has no target");
  }
  runtime::v1::ActivateRequest request;
  request.set_token(params.token);
  request.set_sandbox_id(params.sandbox_id);
  request.mutable_env()->insert(params.env.begin(), params.env.end());
  request.mutable_labels()->insert(params.labels.begin(), params.labels.end());
  std::shared_ptr<grpc::Channel> channel = ChannelFor(endpoint);
  grpc::ClientContext context;
  Prepare(context, admin_token, deadline);
  runtime::v1::ActivateResponse response;
  const grpc::Status status =
      runtime::v1::SandboxAdmin::NewStub(channel)->Activate(&context, request,
                                                            &response);
  if (status.ok()) {
    Keep(endpoint, std::move(channel));
  } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    Drop(endpoint, channel);
  }
  return FromGrpc(status);
}

absl::StatusOr<DaemonStatus> GrpcDaemonAgent::GetStatus(
    const provider::v1::Endpoint& endpoint, const std::string& admin_token,
    absl::Time deadline) {
  if (endpoint.target().empty()) {
    return absl::InvalidArgumentError("endpoint has no target");
  }
  std::shared_ptr<grpc::Channel> channel = ChannelFor(endpoint);
  grpc::ClientContext context;
  Prepare(context, admin_token, deadline);
  runtime::v1::SandboxAdminStatus response;
  const grpc::Status status =
      runtime::v1::SandboxAdmin::NewStub(channel)->GetStatus(
          &context, runtime::v1::GetStatusRequest(), &response);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      Drop(endpoint, channel);
    }
    return FromGrpc(status);
  }
  Keep(endpoint, std::move(channel));
  DaemonStatus out;
  out.activated = response.activated();
  out.idle = absl::Milliseconds(response.idle_ms());
  out.calls_in_flight = response.calls_in_flight();
  out.open_streams = response.open_streams();
  out.worker_booting = response.worker_booting();
  return out;
}

}  // namespace agentix::providers
