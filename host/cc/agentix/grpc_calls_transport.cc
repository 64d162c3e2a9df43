#include "agentix/grpc_calls_transport.h"

#include <grpcpp/grpcpp.h>

namespace agentix::client_internal {
namespace {

namespace pb = ::agentix::runtime::v1;

class GrpcCallsTransport final : public CallsTransport {
 public:
  GrpcCallsTransport(pb::RuntimeService::Stub* stub, const StreamMetadata& metadata) {
    for (const auto& [key, value] : metadata) context_.AddMetadata(key, value);
    rw_ = stub->Calls(&context_);
  }

  bool Write(const pb::CallsRequest& request) override { return rw_->Write(request); }
  bool WritesDone() override { return rw_->WritesDone(); }
  bool Read(pb::CallsResponse* response) override { return rw_->Read(response); }
  void Cancel() override { context_.TryCancel(); }
  absl::Status Finish() override {
    const grpc::Status status = rw_->Finish();
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  const char* wire() const override { return "grpc"; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::CallsRequest, pb::CallsResponse>> rw_;
};

}  // namespace

std::unique_ptr<CallsTransport> OpenGrpcCallsTransport(
    pb::RuntimeService::Stub* stub, const StreamMetadata& metadata) {
  return std::make_unique<GrpcCallsTransport>(stub, metadata);
}

}  // namespace agentix::client_internal
