// The Calls stream over gRPC (a grpc::ClientReaderWriter): the wire for
// every target (TCP, TLS, Unix sockets without a frame wire).
#ifndef AGENTIX_HOST_CC_AGENTIX_GRPC_CALLS_TRANSPORT_H_
#define AGENTIX_HOST_CC_AGENTIX_GRPC_CALLS_TRANSPORT_H_

#include <memory>

#include "agentix/calls_transport.h"
#include "agentix/runtime/v1/runtime.grpc.pb.h"

namespace agentix::client_internal {

// Opens the Calls stream on `stub` with `metadata` (it does not wait for the
// daemon: a refusal shows as the stream's status).
std::unique_ptr<CallsTransport> OpenGrpcCallsTransport(
    runtime::v1::RuntimeService::Stub* stub, const StreamMetadata& metadata);

}  // namespace agentix::client_internal

#endif  // AGENTIX_HOST_CC_AGENTIX_GRPC_CALLS_TRANSPORT_H_
