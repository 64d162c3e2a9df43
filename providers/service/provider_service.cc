#include "providers/service/provider_service.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "auth/server_auth.h"
#include "base/grpc_status.h"
#include "base/log.h"
#include "providers/core/errors.h"

namespace agentix::providers {
namespace {

// LogChunk.data is at most this long (the proto's contract).
constexpr size_t kMaxLogChunkBytes = 64 << 10;
// How long the destructor waits for log threads blocked in the controller.
constexpr absl::Duration kLogThreadGrace = absl::Seconds(5);

// Finishes a DefaultReactor with `result` moved into `*response`.
template <typename T>
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                 absl::StatusOr<T> result, T* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) *response = std::move(*result);
  reactor->Finish(FinishStatus(context, result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(FinishStatus(context, status));
  return reactor;
}

// A server stream refused before it started: finishes at once.
template <typename T>
class RefusedWriter final : public grpc::ServerWriteReactor<T> {
 public:
  explicit RefusedWriter(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::Status FinishStatus(grpc::ServerContextBase* context,
                          const absl::Status& status) {
  if (!status.ok()) {
    const std::string reason = ReasonOf(status);
    if (!reason.empty()) context->AddTrailingMetadata(kReasonMetadataKey, reason);
    if (std::optional<absl::Duration> delay = RetryAfterOf(status)) {
      context->AddTrailingMetadata(
          kRetryAfterMetadataKey,
          absl::StrCat(std::max<int64_t>(0, absl::ToInt64Milliseconds(*delay))));
    }
  }
  return base::ToGrpcStatus(status);
}

// WatchSandboxes: the controller's events (from its thread, never blocking
// it) go into an owned queue; one write at a time drains it. A client whose
// backlog passes max_watch_queue is ended with RESOURCE_EXHAUSTED rather
// than growing memory. Deleted in OnDone, after the subscription is gone.
class ProviderServiceImpl::WatchReactor final
    : public grpc::ServerWriteReactor<pb::SandboxEvent>,
      public WatchObserver {
 public:
  WatchReactor(grpc::CallbackServerContext* context, size_t max_queue)
      : context_(context), max_queue_(max_queue) {}

  void Subscribe(SandboxController* controller,
                 const pb::WatchSandboxesRequest& request) {
    absl::StatusOr<std::unique_ptr<WatchHandle>> handle =
        controller->Watch(request, this);
    absl::MutexLock lock(&mu_);
    if (!handle.ok()) {
      EndLocked(handle.status());
      return;
    }
    handle_ = std::move(*handle);
  }

  bool OnEvent(const pb::SandboxEvent& event) override {
    absl::MutexLock lock(&mu_);
    if (ending_) return false;
    if (queue_.size() >= max_queue_) {
      EndLocked(ProviderError(
          absl::StatusCode::kResourceExhausted, kReasonWatchClientTooSlow,
          absl::StrCat("the watch client fell ", queue_.size(),
                       " events behind; watch again from the last "
                       "resource_version received")));
      return false;
    }
    queue_.push_back(event);
    if (!write_in_flight_) StartNextLocked();
    return true;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    queue_.pop_front();
    if (!ok && !ending_) {
      // The stream broke (the client is gone); nothing more can be sent.
      ending_ = true;
      pending_ = grpc::Status(grpc::StatusCode::CANCELLED, "stream broken");
    }
    if (ending_) {
      FinishPendingLocked();
    } else if (!queue_.empty()) {
      StartNextLocked();
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (ending_) return;
    ending_ = true;
    pending_ = grpc::Status::CANCELLED;
    FinishPendingLocked();
  }

  void OnDone() override {
    // Unsubscribes: no OnEvent after this returns, so `this` can go.
    std::unique_ptr<WatchHandle> handle;
    {
      absl::MutexLock lock(&mu_);
      handle = std::move(handle_);
    }
    handle.reset();
    delete this;
  }

 private:
  void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    write_in_flight_ = true;
    StartWrite(&queue_.front());  // stays put until OnWriteDone pops it
  }

  // Ends the stream with `status` once no write is in flight.
  void EndLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ending_) return;
    ending_ = true;
    pending_ = FinishStatus(context_, status);
    FinishPendingLocked();
  }

  void FinishPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (write_in_flight_ || finished_) return;
    finished_ = true;
    Finish(pending_);
  }

  grpc::CallbackServerContext* const context_;
  const size_t max_queue_;
  absl::Mutex mu_;
  std::deque<pb::SandboxEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;    // no more events taken
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish called
  grpc::Status pending_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<WatchHandle> handle_ ABSL_GUARDED_BY(mu_);
};

// StreamSandboxLogs: the controller's StreamLogs blocks, so it runs on a
// thread of this reactor's own, which feeds the queue and waits while it is
// full (flow control back to the log reader). Freed when both gRPC (OnDone)
// and the thread are done with it.
class ProviderServiceImpl::LogReactor final
    : public grpc::ServerWriteReactor<pb::LogChunk>,
      public LogSink {
 public:
  LogReactor(ProviderServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {}

  void Run(pb::StreamSandboxLogsRequest request) {
    std::thread([this, request = std::move(request)] {
      pthread_setname_np(pthread_self(), "agx-logs");
      const absl::Status status =
          service_->controller_->StreamLogs(request, this);
      ProviderServiceImpl* service = service_;
      {
        absl::MutexLock lock(&mu_);
        if (!ending_) {
          ending_ = true;
          pending_ = FinishStatus(context_, status);
        }
        FinishPendingLocked();
      }
      Unref();
      service->LogThreadDone();
    }).detach();
  }

  bool OnLogData(int64_t offset, absl::string_view data,
                 bool truncated) override {
    do {
      const absl::string_view piece = data.substr(0, kMaxLogChunkBytes);
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &LogReactor::MayQueueLocked));
      if (ending_) return false;
      pb::LogChunk& chunk = queue_.emplace_back();
      chunk.set_offset(offset);
      chunk.set_data(piece.data(), piece.size());
      chunk.set_truncated(truncated);
      truncated = false;
      offset += static_cast<int64_t>(piece.size());
      data.remove_prefix(piece.size());
      if (!write_in_flight_) StartNextLocked();
    } while (!data.empty());
    return true;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    queue_.pop_front();
    if (!ok) {
      // The stream broke (the client is gone): drop the rest.
      cancelled_ = true;
      if (!ending_) {
        ending_ = true;
        pending_ = grpc::Status(grpc::StatusCode::CANCELLED, "stream broken");
      }
    }
    if (!cancelled_ && !queue_.empty()) {
      StartNextLocked();
    } else {
      FinishPendingLocked();
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!ending_) {
      ending_ = true;
      pending_ = grpc::Status::CANCELLED;
    }
    FinishPendingLocked();
  }

  void OnDone() override { Unref(); }

  // For a call refused before its thread started: drops the thread's
  // reference.
  void ThreadlessRelease() { Unref(); }

 private:
  bool MayQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ending_ || queue_.size() < service_->options_.max_log_queue;
  }

  void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    write_in_flight_ = true;
    StartWrite(&queue_.front());
  }

  // Finishes once nothing is in flight and, unless cancelled, the queue is
  // drained (the last chunks before the end still reach the client).
  void FinishPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ending_ || finished_ || write_in_flight_) return;
    if (!cancelled_ && !queue_.empty()) return;
    finished_ = true;
    Finish(pending_);
  }

  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  ProviderServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  std::atomic<int> refs_{2};  // gRPC's OnDone and the thread
  absl::Mutex mu_;
  std::deque<pb::LogChunk> queue_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status pending_ ABSL_GUARDED_BY(mu_);
};

ProviderServiceImpl::ProviderServiceImpl(SandboxController* controller,
                                         ProviderServiceOptions options)
    : controller_(controller), options_(options) {}

ProviderServiceImpl::~ProviderServiceImpl() {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(
          absl::Condition(
              +[](size_t* n) { return *n == 0; }, &log_threads_),
          kLogThreadGrace)) {
    AGX_LOG(Warning, "{} log stream thread(s) still blocked at shutdown",
            log_threads_);
  }
}

absl::Status ProviderServiceImpl::Authenticate(
    grpc::CallbackServerContext* context) const {
  if (options_.token.empty()) return absl::OkStatus();
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it != metadata.end() &&
      auth::BearerTokenMatches(
          options_.token,
          absl::string_view(it->second.data(), it->second.size()))) {
    return absl::OkStatus();
  }
  return ProviderError(
      absl::StatusCode::kUnauthenticated, kReasonUnauthenticated,
      "missing or wrong bearer token: send 'authorization: Bearer <token>' "
      "(ServiceProvider(address, token=...))");
}

grpc::ServerUnaryReactor* ProviderServiceImpl::Refuse(
    grpc::CallbackServerContext* context) const {
  absl::Status status = Authenticate(context);
  return status.ok() ? nullptr : Answer(context, status);
}

size_t ProviderServiceImpl::live_log_streams() {
  absl::MutexLock lock(&mu_);
  return log_threads_;
}

void ProviderServiceImpl::LogThreadDone() {
  absl::MutexLock lock(&mu_);
  --log_threads_;
}

grpc::ServerUnaryReactor* ProviderServiceImpl::CreateSandbox(
    grpc::CallbackServerContext* context,
    const pb::CreateSandboxRequest* request,
    pb::CreateSandboxResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::string idempotency_key;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find(kIdempotencyKeyMetadataKey); it != metadata.end()) {
    idempotency_key.assign(it->second.data(), it->second.size());
  }
  // The call (context, response) lives until Finish, whether or not the
  // client is still there: a create that outlives its caller just finishes
  // into a cancelled call, and the sandbox stays (its TTL bounds it; a retry
  // with the same request_id collects it).
  controller_->CreateSandbox(
      *request, std::move(idempotency_key),
      [context, response, reactor](absl::StatusOr<CreateResult> result) {
        if (result.ok()) {
          *response->mutable_sandbox() = std::move(result->sandbox);
          response->mutable_credentials()->set_access_token(
              std::move(result->access_token));
          response->set_replayed(result->replayed);
        }
        reactor->Finish(FinishStatus(context, result.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* ProviderServiceImpl::GetSandbox(
    grpc::CallbackServerContext* context, const pb::GetSandboxRequest* request,
    pb::Sandbox* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  return Answer(context, controller_->GetSandbox(request->id()), response);
}

grpc::ServerUnaryReactor* ProviderServiceImpl::GetSandboxCredentials(
    grpc::CallbackServerContext* context, const pb::GetSandboxRequest* request,
    pb::Credentials* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  return Answer(context, controller_->GetCredentials(request->id()), response);
}

grpc::ServerUnaryReactor* ProviderServiceImpl::ListSandboxes(
    grpc::CallbackServerContext* context,
    const pb::ListSandboxesRequest* request,
    pb::ListSandboxesResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  return Answer(context, controller_->ListSandboxes(*request), response);
}

grpc::ServerWriteReactor<pb::SandboxEvent>* ProviderServiceImpl::WatchSandboxes(
    grpc::CallbackServerContext* context,
    const pb::WatchSandboxesRequest* request) {
  if (absl::Status status = Authenticate(context); !status.ok()) {
    return new RefusedWriter<pb::SandboxEvent>(FinishStatus(context, status));
  }
  auto* reactor = new WatchReactor(context, options_.max_watch_queue);
  reactor->Subscribe(controller_, *request);
  return reactor;
}

grpc::ServerUnaryReactor* ProviderServiceImpl::WaitSandbox(
    grpc::CallbackServerContext* context, const pb::WaitSandboxRequest* request,
    pb::WaitSandboxResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  controller_->WaitSandbox(
      *request, [context, response,
                 reactor](absl::StatusOr<pb::WaitSandboxResponse> result) {
        if (result.ok()) *response = std::move(*result);
        reactor->Finish(FinishStatus(context, result.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* ProviderServiceImpl::ExtendSandbox(
    grpc::CallbackServerContext* context,
    const pb::ExtendSandboxRequest* request, pb::Sandbox* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  return Answer(context, controller_->ExtendSandbox(*request), response);
}

grpc::ServerUnaryReactor* ProviderServiceImpl::DeleteSandbox(
    grpc::CallbackServerContext* context,
    const pb::DeleteSandboxRequest* request,
    pb::DeleteSandboxResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  controller_->DeleteSandbox(
      *request,
      [context, response, reactor](absl::StatusOr<pb::Sandbox> result) {
        if (result.ok()) *response->mutable_sandbox() = std::move(*result);
        reactor->Finish(FinishStatus(context, result.status()));
      });
  return reactor;
}

grpc::ServerWriteReactor<pb::LogChunk>* ProviderServiceImpl::StreamSandboxLogs(
    grpc::CallbackServerContext* context,
    const pb::StreamSandboxLogsRequest* request) {
  if (absl::Status status = Authenticate(context); !status.ok()) {
    return new RefusedWriter<pb::LogChunk>(FinishStatus(context, status));
  }
  auto* reactor = new LogReactor(this, context);
  {
    absl::MutexLock lock(&mu_);
    if (log_threads_ >= options_.max_log_streams) {
      // No thread: finish now; OnDone drops gRPC's reference, and the
      // thread's one goes here.
      reactor->Finish(FinishStatus(
          context,
          ProviderError(absl::StatusCode::kResourceExhausted,
                        kReasonTooManyLogStreams,
                        absl::StrCat("more than ", options_.max_log_streams,
                                     " log streams at once; retry later"))));
      reactor->ThreadlessRelease();
      return reactor;
    }
    ++log_threads_;
  }
  reactor->Run(*request);
  return reactor;
}

grpc::ServerUnaryReactor* ProviderServiceImpl::CreateWarmPool(
    grpc::CallbackServerContext* context,
    const pb::CreateWarmPoolRequest* request, pb::WarmPool* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  return Answer(context, controller_->CreateWarmPool(request->pool()),
                response);
}

grpc::ServerUnaryReactor* ProviderServiceImpl::UpdateWarmPool(
    grpc::CallbackServerContext* context,
    const pb::UpdateWarmPoolRequest* request, pb::WarmPool* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  return Answer(context, controller_->UpdateWarmPool(request->pool()),
                response);
}

grpc::ServerUnaryReactor* ProviderServiceImpl::GetWarmPool(
    grpc::CallbackServerContext* context, const pb::GetWarmPoolRequest* request,
    pb::WarmPool* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  return Answer(context, controller_->GetWarmPool(request->name()), response);
}

grpc::ServerUnaryReactor* ProviderServiceImpl::ListWarmPools(
    grpc::CallbackServerContext* context,
    const pb::ListWarmPoolsRequest* /*request*/,
    pb::ListWarmPoolsResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  for (pb::WarmPool& pool : controller_->ListWarmPools()) {
    *response->add_pools() = std::move(pool);
  }
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ProviderServiceImpl::DeleteWarmPool(
    grpc::CallbackServerContext* context,
    const pb::DeleteWarmPoolRequest* request,
    pb::DeleteWarmPoolResponse* /*response*/) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  return Answer(context, controller_->DeleteWarmPool(request->name(),
                                                     request->allow_missing()));
}

grpc::ServerUnaryReactor* ProviderServiceImpl::GetCapabilities(
    grpc::CallbackServerContext* context,
    const pb::GetCapabilitiesRequest* /*request*/,
    pb::Capabilities* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
  *response = controller_->GetCapabilities();
  return Answer(context, absl::OkStatus());
}

}  // namespace agentix::providers
