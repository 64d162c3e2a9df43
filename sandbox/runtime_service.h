// RuntimeService: the gRPC callback adapter over SessionManager. It converts
// stream messages to manager calls and manager events to stream writes; all
// decisions live in the manager.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "sandbox/flush_scheduler.h"
#include "sandbox/session_manager.h"

namespace agentix::sandbox {

// How long a Logs or Traces message may be held back to gather a burst's
// records, and how much it may gather before it goes anyway. A host pays a
// fixed 300-500 µs of Python per message however few records it carries, so
// in a burst of 20,000-40,000 records/s messages of ~100 records cost it
// half the CPU per record of ~25-record ones (1 ms) and a fraction of what
// back-to-back writes (3-13 records) cost (docs/PERFORMANCE.md). 4 ms is far
// below what a person reading logs or a trace processor notices, and a
// record after a quiet moment still goes at once.
inline constexpr std::chrono::milliseconds kSideChannelCoalesceDelay{4};
inline constexpr size_t kSideChannelCoalesceBytes = 256 << 10;

class RuntimeServiceImpl final
    : public runtime::v1::RuntimeService::CallbackService {
 public:
  // `manager` must outlive the service (and the grpc::Server serving it).
  RuntimeServiceImpl(SessionManager* manager, std::string version);

  grpc::ServerBidiReactor<runtime::v1::CallsRequest,
                          runtime::v1::CallsResponse>*
  Calls(grpc::CallbackServerContext* context) override;

  grpc::ServerBidiReactor<runtime::v1::LogsRequest,
                          runtime::v1::LogsResponse>*
  Logs(grpc::CallbackServerContext* context) override;

  grpc::ServerBidiReactor<runtime::v1::TracesRequest,
                          runtime::v1::TracesResponse>*
  Traces(grpc::CallbackServerContext* context) override;

  grpc::ServerBidiReactor<runtime::v1::NamespaceRequest,
                          runtime::v1::NamespaceResponse>*
  Namespace(grpc::CallbackServerContext* context) override;

  grpc::ServerUnaryReactor* GetInfo(
      grpc::CallbackServerContext* context,
      const runtime::v1::GetInfoRequest* request,
      runtime::v1::GetInfoResponse* response) override;

 private:
  SessionManager* const manager_;
  const std::string version_;
  // Runs the Logs and Traces streams' delayed (coalesced) writes.
  FlushScheduler flush_scheduler_;
};

}  // namespace agentix::sandbox
