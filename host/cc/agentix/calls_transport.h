// CallsTransport: what carries the client's one Calls stream
// (RuntimeService/Calls: CallsRequest up, CallsResponse down). Two carriers:
// gRPC (grpc_calls_transport.h) and the daemon's frame wire over a Unix
// socket (frame_transport.h, docs/FRAME-WIRE.md). The client's calls,
// resume and acks are the same on both; only the bytes' path differs.
#ifndef AGENTIX_HOST_CC_AGENTIX_CALLS_TRANSPORT_H_
#define AGENTIX_HOST_CC_AGENTIX_CALLS_TRANSPORT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "agentix/runtime/v1/runtime.pb.h"

namespace agentix::client_internal {

// The metadata a Calls stream opens with (gRPC metadata or HELLO pairs):
// lowercase keys, e.g. {"authorization", "Bearer T"}, {"agentix-client-id", id}.
using StreamMetadata = std::vector<std::pair<std::string, std::string>>;

// One Calls stream. Threads: at most one Write/WritesDone at a time, at most
// one Read at a time (a writer and a reader may overlap); Cancel from any
// thread at any time; Finish once, after the last Read and Write returned.
class CallsTransport {
 public:
  virtual ~CallsTransport() = default;

  // Sends one request; false when the stream is broken (Finish says why).
  virtual bool Write(const runtime::v1::CallsRequest& request) = 0;
  // The client will send nothing more; the daemon ends the stream with OK
  // once its calls are finished and delivered.
  virtual bool WritesDone() = 0;
  // Blocks for the next response; false at the end of the stream (its
  // status, a break, or Cancel).
  virtual bool Read(runtime::v1::CallsResponse* response) = 0;
  // Unblocks a Read or Write in progress and ends the stream.
  virtual void Cancel() = 0;
  // How the stream ended, with gRPC's codes: the daemon's status; a lost
  // connection is UNAVAILABLE (the client reconnects and resumes).
  virtual absl::Status Finish() = 0;
  // "grpc" or "frames", for diagnostics.
  virtual const char* wire() const = 0;
};

}  // namespace agentix::client_internal

#endif  // AGENTIX_HOST_CC_AGENTIX_CALLS_TRANSPORT_H_
