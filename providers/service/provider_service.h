// ProviderServiceImpl: agentix.provider.v1.ProviderService on gRPC's
// callback API, a thin adapter over the SandboxController (CONVENTIONS 3.1-3.3).
// Unary RPCs use the context's DefaultReactor; the controller's callbacks
// (CreateSandbox, WaitSandbox, DeleteSandbox) finish them from its thread,
// even after the client cancelled (a create goes on; its result is then
// dropped). WatchSandboxes and StreamSandboxLogs are ServerWriteReactors
// with an owned queue and at most one write in flight.
//
// Errors: every absl::Status becomes the same gRPC code, with the
// provider's reason (errors.h) in the trailing metadata
// "agentix-error-reason" and its retry delay in "agentix-retry-after-ms".
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agentix/provider/v1/provider.grpc.pb.h"
#include "providers/core/controller.h"

namespace agentix::providers {

inline constexpr char kReasonMetadataKey[] = "agentix-error-reason";
inline constexpr char kRetryAfterMetadataKey[] = "agentix-retry-after-ms";
// The method-path prefix of this service (for the auth filter's exemption).
inline constexpr char kProviderServicePathPrefix[] =
    "/agentix.provider.v1.ProviderService/";
// Client metadata accepted as CreateSandboxRequest.request_id when that is
// empty.
inline constexpr char kIdempotencyKeyMetadataKey[] = "x-idempotency-key";
// A watch whose client reads slower than events arrive, once more than
// max_watch_queue events wait for it: RESOURCE_EXHAUSTED with this reason.
// The client watches again from the last resource_version it received.
inline constexpr char kReasonWatchClientTooSlow[] = "WATCH_CLIENT_TOO_SLOW";
// More than max_log_streams StreamSandboxLogs calls at once.
inline constexpr char kReasonTooManyLogStreams[] = "TOO_MANY_LOG_STREAMS";

struct ProviderServiceOptions {
  // Bearer token every RPC of this service must carry ("authorization:
  // Bearer <token>"); empty: no check. Checked here rather than in gRPC's
  // auth filter (auth::ServerSecurityOptions::handler_checked_prefix) so
  // that UNAUTHENTICATED carries its reason like every other error.
  std::string token;
  // Events buffered for one watch client before it is ended.
  size_t max_watch_queue = 4096;
  // StreamSandboxLogs calls at once (each holds a thread of its own).
  size_t max_log_streams = 64;
  // Log chunks buffered for one client; the log thread waits beyond.
  size_t max_log_queue = 16;
};

// `status` as a grpc::Status (message truncated), its reason and retry
// delay added to `context`'s trailing metadata. Call before Finish.
grpc::Status FinishStatus(grpc::ServerContextBase* context,
                          const absl::Status& status);

class ProviderServiceImpl final
    : public ::agentix::provider::v1::ProviderService::CallbackService {
 public:
  // `controller` outlives this object and the server it is registered with.
  explicit ProviderServiceImpl(SandboxController* controller,
                               ProviderServiceOptions options = {});
  // Waits (at most `log_thread_grace`) for log threads still blocked in the
  // controller; call after the server has shut down.
  ~ProviderServiceImpl() override;

  ProviderServiceImpl(const ProviderServiceImpl&) = delete;
  ProviderServiceImpl& operator=(const ProviderServiceImpl&) = delete;

  grpc::ServerUnaryReactor* CreateSandbox(
      grpc::CallbackServerContext* context,
      const pb::CreateSandboxRequest* request,
      pb::CreateSandboxResponse* response) override;
  grpc::ServerUnaryReactor* GetSandbox(grpc::CallbackServerContext* context,
                                       const pb::GetSandboxRequest* request,
                                       pb::Sandbox* response) override;
  grpc::ServerUnaryReactor* GetSandboxCredentials(
      grpc::CallbackServerContext* context,
      const pb::GetSandboxRequest* request,
      pb::Credentials* response) override;
  grpc::ServerUnaryReactor* ListSandboxes(
      grpc::CallbackServerContext* context,
      const pb::ListSandboxesRequest* request,
      pb::ListSandboxesResponse* response) override;
  grpc::ServerWriteReactor<pb::SandboxEvent>* WatchSandboxes(
      grpc::CallbackServerContext* context,
      const pb::WatchSandboxesRequest* request) override;
  grpc::ServerUnaryReactor* WaitSandbox(grpc::CallbackServerContext* context,
                                        const pb::WaitSandboxRequest* request,
                                        pb::WaitSandboxResponse* response) override;
  grpc::ServerUnaryReactor* ExtendSandbox(
      grpc::CallbackServerContext* context,
      const pb::ExtendSandboxRequest* request, pb::Sandbox* response) override;
  grpc::ServerUnaryReactor* DeleteSandbox(
      grpc::CallbackServerContext* context,
      const pb::DeleteSandboxRequest* request,
      pb::DeleteSandboxResponse* response) override;
  grpc::ServerWriteReactor<pb::LogChunk>* StreamSandboxLogs(
      grpc::CallbackServerContext* context,
      const pb::StreamSandboxLogsRequest* request) override;
  grpc::ServerUnaryReactor* CreateWarmPool(
      grpc::CallbackServerContext* context,
      const pb::CreateWarmPoolRequest* request, pb::WarmPool* response) override;
  grpc::ServerUnaryReactor* UpdateWarmPool(
      grpc::CallbackServerContext* context,
      const pb::UpdateWarmPoolRequest* request, pb::WarmPool* response) override;
  grpc::ServerUnaryReactor* GetWarmPool(grpc::CallbackServerContext* context,
                                        const pb::GetWarmPoolRequest* request,
                                        pb::WarmPool* response) override;
  grpc::ServerUnaryReactor* ListWarmPools(
      grpc::CallbackServerContext* context,
      const pb::ListWarmPoolsRequest* request,
      pb::ListWarmPoolsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteWarmPool(
      grpc::CallbackServerContext* context,
      const pb::DeleteWarmPoolRequest* request,
      pb::DeleteWarmPoolResponse* response) override;
  grpc::ServerUnaryReactor* GetCapabilities(
      grpc::CallbackServerContext* context,
      const pb::GetCapabilitiesRequest* request,
      pb::Capabilities* response) override;

  // Log streams whose thread is still running.
  size_t live_log_streams();

  class WatchReactor;
  class LogReactor;

 private:
  friend class LogReactor;
  void LogThreadDone();
  // OK, or UNAUTHENTICATED with its reason when the caller lacks the token.
  absl::Status Authenticate(grpc::CallbackServerContext* context) const;
  // A finished DefaultReactor when the caller lacks the token, else null.
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context) const;

  SandboxController* const controller_;
  const ProviderServiceOptions options_;
  absl::Mutex mu_;
  size_t log_threads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace agentix::providers
