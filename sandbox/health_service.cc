#include "sandbox/health_service.h"

#include <atomic>
#include <optional>
#include <utility>

#include "sandbox/server_stream.h"

namespace agentix::sandbox {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch call: writes the watched service's status when it arrives and
// whenever it changes (the latest status wins while a write is in flight),
// until the host goes away or the service shuts down.
class HealthService::Watcher final {
 public:
  explicit Watcher(HealthService* health) : health_(health) {
    context_.AsyncNotifyWhenDone(&done_);
    grpc::ServerCompletionQueue* cq = health->thread_->cq();
    health->service_.RequestWatch(&context_, &request_, &writer_, cq, cq,
                                  &accepted_);
  }

  const std::string& service() const { return request_.service(); }

  // Writes `status` unless it is the one last written. Any thread.
  void Update(Status status) {
    absl::MutexLock lock(&mu_);
    pending_ = status;
    WriteOrFinishLocked();
  }

  // Ends the call (OK) once what is pending has been written.
  void FinishSoon() {
    absl::MutexLock lock(&mu_);
    finish_ = true;
    WriteOrFinishLocked();
  }

 private:
  void WriteOrFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (pending_.has_value() && !broken_) {
      const Status status = *std::exchange(pending_, std::nullopt);
      if (status == last_written_) return WriteOrFinishLocked();
      last_written_ = status;
      response_.set_status(status);
      writing_ = true;
      ops_.fetch_add(1, std::memory_order_relaxed);
      writer_.Write(response_, &written_);
      return;
    }
    if (finish_ || broken_) {
      finished_ = true;
      ops_.fetch_add(1, std::memory_order_relaxed);
      writer_.Finish(grpc::Status::OK, &finish_done_);
    }
  }

  void Accepted(bool ok) {
    if (!ok) {  // the server is shutting down: no call, no done tag
      delete this;
      return;
    }
    health_->thread_->AddLive();
    ops_.store(2, std::memory_order_relaxed);  // the done tag; until Finish
    health_->AwaitWatch();
    absl::MutexLock lock(&health_->mu_);
    health_->watchers_.insert(this);
    Update(health_->StatusOfLocked(service()));
    if (health_->shut_down_) FinishSoon();
  }
  void Written(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) broken_ = true;
      WriteOrFinishLocked();
    }
    Release(1);
  }
  void CallDone(bool /*ok*/) {
    health_->Unwatch(this);
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;  // the host is gone or the call ended
      WriteOrFinishLocked();
    }
    Release(1);
  }
  void FinishDone(bool /*ok*/) { Release(2); }
  void Release(int n) {
    if (ops_.fetch_sub(n, std::memory_order_acq_rel) == n) {
      RetireCall(this, health_->thread_);
    }
  }

  HealthService* const health_;
  grpc::ServerContext context_;
  HealthCheckRequest request_;
  HealthCheckResponse response_;
  grpc::ServerAsyncWriter<HealthCheckResponse> writer_{&context_};
  std::atomic<int> ops_{0};

  absl::Mutex mu_;
  std::optional<Status> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<Status> last_written_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;

  MemberCompletion<Watcher, &Watcher::Accepted> accepted_{this};
  MemberCompletion<Watcher, &Watcher::Written> written_{this};
  MemberCompletion<Watcher, &Watcher::CallDone> done_{this};
  MemberCompletion<Watcher, &Watcher::FinishDone> finish_done_{this};
};

HealthService::HealthService(const std::vector<std::string>& services) {
  absl::MutexLock lock(&mu_);
  statuses_[""] = HealthCheckResponse::SERVING;
  for (const auto& service : services) {
    statuses_[service] = HealthCheckResponse::SERVING;
  }
}

HealthService::~HealthService() = default;

void HealthService::Start(CompletionQueueThread* thread) {
  thread_ = thread;
  AwaitCheck();
  AwaitWatch();
}

void HealthService::AwaitCheck() {
  UnaryCall<HealthCheckRequest, HealthCheckResponse>::AwaitNext(
      [this](auto* context, auto* request, auto* writer, auto* queue,
             void* tag) {
        service_.RequestCheck(context, request, writer, queue, queue, tag);
      },
      [this](const HealthCheckRequest& request, HealthCheckResponse* response) {
        const Status status = StatusOf(request.service());
        if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
          return grpc::Status(grpc::StatusCode::NOT_FOUND,
                              "unknown service " + request.service());
        }
        response->set_status(status);
        return grpc::Status::OK;
      },
      thread_);
}
void HealthService::AwaitWatch() { new Watcher(this); }

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  for (auto& [service, status] : statuses_) {
    status = HealthCheckResponse::NOT_SERVING;
  }
  for (Watcher* watcher : watchers_) {
    watcher->Update(StatusOfLocked(watcher->service()));
    watcher->FinishSoon();
  }
}

HealthService::Status HealthService::StatusOf(const std::string& service) {
  absl::MutexLock lock(&mu_);
  return StatusOfLocked(service);
}

HealthService::Status HealthService::StatusOfLocked(
    const std::string& service) {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN
                               : it->second;
}

void HealthService::Unwatch(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

}  // namespace agentix::sandbox
