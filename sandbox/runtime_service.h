// RuntimeService: the gRPC callback adapter over SessionManager. It converts
// stream messages to manager calls and manager events to stream writes; all
// decisions live in the manager.
#pragma once

#include <string>

#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "sandbox/flush_scheduler.h"
#include "sandbox/session_manager.h"

namespace agentix::sandbox {

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
