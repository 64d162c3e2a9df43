// HealthService: grpc.health.v1.Health (Check and Watch) on the daemon's
// completion queue. grpc++'s default health service runs on the callback
// API, and merely having it made grpc 1.51 start two "nexting" threads that
// took turns polling the daemon's sockets with ours: ~9 extra thread
// wake-ups per remote call (docs/PERFORMANCE.md, "Daemon server on a
// completion queue").
//
// Known services: "" (the whole server) and those given to the constructor,
// all SERVING from Start() until Shutdown(), NOT_SERVING after it; Check of
// any other name is NOT_FOUND, Watch of it reports SERVICE_UNKNOWN, as the
// protocol says.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "sandbox/server_stream.h"

namespace agentix::sandbox {

class HealthService {
 public:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;

  explicit HealthService(const std::vector<std::string>& services);
  ~HealthService();

  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  // Before BuildAndStart.
  void AddTo(grpc::ServerBuilder& builder) {
    builder.RegisterService(&service_);
  }
  // After BuildAndStart: answers calls; reactions run on the queue's thread.
  void Start(CompletionQueueThread* thread);
  // Every service NOT_SERVING from now on (watchers are told); for a server
  // about to stop.
  void Shutdown();

  // The status Check/Watch report for `service`.
  Status StatusOf(const std::string& service);

  class Watcher;

 private:
  void AwaitCheck();
  void AwaitWatch();
  friend class Watcher;
  void Unwatch(Watcher* watcher);
  Status StatusOfLocked(const std::string& service)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  grpc::health::v1::Health::AsyncService service_;
  CompletionQueueThread* thread_ = nullptr;

  absl::Mutex mu_;
  std::map<std::string, Status> statuses_ ABSL_GUARDED_BY(mu_);
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace agentix::sandbox
