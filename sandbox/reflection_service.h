// ReflectionV1Service: grpc.reflection.v1.ServerReflection on the daemon's
// completion queue. Debian's grpc++ 1.51 serves only v1alpha (its builder
// plugin stays on for older tools); current tools (grpcurl, Postman,
// grpc-js reflection clients) ask v1 first. Answers come from the linked-in
// generated descriptor pool, which holds every service the daemon serves.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "sandbox/server_stream.h"

namespace agentix::sandbox {

class ReflectionV1Service {
 public:
  // `services`: the fully-qualified names list_services reports (both
  // reflection services are added).
  explicit ReflectionV1Service(std::vector<std::string> services);

  // Before BuildAndStart.
  void AddTo(grpc::ServerBuilder& builder) {
    builder.RegisterService(&service_);
  }
  // After BuildAndStart: answers calls; reactions run on the queue's thread.
  void Start(CompletionQueueThread* thread);

  // The answer to one request; `sent` holds the files this stream has
  // already sent (they are not sent again). Public for tests.
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request,
      std::vector<std::string>& sent) const;

  class ReflectionStream;

 private:
  void AwaitNext();

  using Service = grpc::reflection::v1::ServerReflection::WithRawMethod_ServerReflectionInfo<
      grpc::reflection::v1::ServerReflection::Service>;
  Service service_;
  CompletionQueueThread* thread_ = nullptr;
  const std::vector<std::string> services_;
};

}  // namespace agentix::sandbox
