#include "sandbox/runtime_service.h"

#include <deque>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;

// One outbound message carries queued events up to about this many bytes,
// which keeps every message far below gRPC's 4 MiB default limit's
// multiples and lets small results ride along with big chunks.
constexpr size_t kMaxBatchBytes = 4u << 20;

class CallsReactor;

// The CallSink of one Calls stream. Outlives its reactor when the session
// manager still holds it; after Detach() every Deliver() is refused.
//
// Threading: Deliver() runs on worker reader threads and gRPC threads;
// StartWrite and Finish are called outside mu_ because gRPC may run a
// reaction (which takes mu_) before they return. Finish is only ever called
// while no write is in flight, so OnDone (which deletes the reactor) cannot
// race a StartWrite that was decided under the lock.
class StreamSink final : public CallSink {
 public:
  explicit StreamSink(CallsReactor* reactor) : reactor_(reactor) {}
  ~StreamSink() override { ReleaseBatch(); }
  bool Deliver(std::vector<SandboxEventPtr> events) override;

  // Called by the reactor.
  void Detach();
  // A write finished; starts the next one if events are queued.
  void OnWriteDone(bool ok);
  // The host half-closed: finish once every owned call has ended.
  void OnReadsDone(SessionManager* manager);
  // The RPC was cancelled: finish as soon as no write is in flight.
  void OnCancel();

 private:
  // Moves queued events into batch_; returns false if nothing is queued.
  bool FillBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives the events borrowed by batch_ back (without freeing them).
  void ReleaseBatch();
  // Decides whether the RPC can finish now; returns the status to finish
  // with (the caller calls Finish after unlocking).
  std::optional<grpc::Status> TakeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishOutsideLock(std::optional<grpc::Status> status,
                         CallsReactor* reactor);

  absl::Mutex mu_;
  CallsReactor* reactor_ ABSL_GUARDED_BY(mu_);
  std::deque<SandboxEventPtr> queue_ ABSL_GUARDED_BY(mu_);
  // The message of the write in flight. Its events are *borrowed* from
  // `batch_refs_` (the session manager retains the same objects for resume),
  // so a megabyte chunk is not copied once more per write; serialising only
  // reads them. ReleaseBatch() must run before batch_ is reused or destroyed.
  CallsResponse batch_;
  std::vector<SandboxEventPtr> batch_refs_;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  SessionManager* manager_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class CallsReactor final
    : public grpc::ServerBidiReactor<CallsRequest, CallsResponse> {
 public:
  explicit CallsReactor(SessionManager* manager)
      : manager_(manager), sink_(std::make_shared<StreamSink>(this)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      sink_->OnReadsDone(manager_);
      return;
    }
    manager_->HandleHostEvents(sink_, request_.events());
    request_.Clear();
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override { sink_->OnCancel(); }

  void OnDone() override {
    sink_->Detach();
    manager_->DetachSink(sink_.get());
    delete this;
  }

 private:
  SessionManager* const manager_;
  std::shared_ptr<StreamSink> sink_;
  CallsRequest request_;
};

bool StreamSink::Deliver(std::vector<SandboxEventPtr> events) {
  CallsReactor* reactor;
  {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finished_ || cancelled_) return false;
    for (auto& event : events) queue_.push_back(std::move(event));
    if (write_in_flight_) return true;  // OnWriteDone picks it up
    FillBatch();
    write_in_flight_ = true;
    reactor = reactor_;
  }
  reactor->StartWrite(&batch_);
  return true;
}

bool StreamSink::FillBatch() {
  ReleaseBatch();
  size_t bytes = 0;
  auto* events = batch_.mutable_events();
  while (!queue_.empty() && bytes < kMaxBatchBytes) {
    SandboxEventPtr event = std::move(queue_.front());
    queue_.pop_front();
    bytes += event->ByteSizeLong();
    events->UnsafeArenaAddAllocated(
        const_cast<runtime::v1::SandboxEvent*>(event.get()));
    batch_refs_.push_back(std::move(event));
  }
  return !batch_refs_.empty();
}

void StreamSink::ReleaseBatch() {
  auto* events = batch_.mutable_events();
  while (!events->empty()) events->UnsafeArenaReleaseLast();
  batch_refs_.clear();
}

std::optional<grpc::Status> StreamSink::TakeFinish() {
  if (finished_ || write_in_flight_ || reactor_ == nullptr) return std::nullopt;
  if (cancelled_) {
    finished_ = true;
    return grpc::Status::CANCELLED;
  }
  if (!reads_done_ || !queue_.empty()) return std::nullopt;
  // Lock order is sink -> manager; the manager never calls a sink while
  // holding its own lock.
  if (manager_->HasOpenCalls(this)) return std::nullopt;
  finished_ = true;
  return grpc::Status::OK;
}

void StreamSink::FinishOutsideLock(std::optional<grpc::Status> status,
                                   CallsReactor* reactor) {
  if (status.has_value()) reactor->Finish(*status);
}

void StreamSink::OnWriteDone(bool ok) {
  CallsReactor* reactor = nullptr;
  std::optional<grpc::Status> finish;
  bool write_next = false;
  {
    absl::MutexLock lock(&mu_);
    reactor = reactor_;
    if (!ok) cancelled_ = true;  // the stream is broken
    write_next = !cancelled_ && FillBatch();
    if (!write_next) {
      write_in_flight_ = false;
      finish = TakeFinish();
    }
  }
  if (write_next) {
    reactor->StartWrite(&batch_);
  } else {
    FinishOutsideLock(finish, reactor);
  }
}

void StreamSink::OnReadsDone(SessionManager* manager) {
  std::optional<grpc::Status> finish;
  CallsReactor* reactor;
  {
    absl::MutexLock lock(&mu_);
    reads_done_ = true;
    manager_ = manager;
    reactor = reactor_;
    finish = TakeFinish();
  }
  FinishOutsideLock(finish, reactor);
}

void StreamSink::OnCancel() {
  std::optional<grpc::Status> finish;
  CallsReactor* reactor;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    reactor = reactor_;
    finish = TakeFinish();
  }
  FinishOutsideLock(finish, reactor);
}

void StreamSink::Detach() {
  absl::MutexLock lock(&mu_);
  reactor_ = nullptr;
  queue_.clear();
}

}  // namespace

RuntimeServiceImpl::RuntimeServiceImpl(SessionManager* manager,
                                       std::string version)
    : manager_(manager), version_(std::move(version)) {}

grpc::ServerBidiReactor<CallsRequest, CallsResponse>* RuntimeServiceImpl::Calls(
    grpc::CallbackServerContext* /*context*/) {
  return new CallsReactor(manager_);
}

grpc::ServerUnaryReactor* RuntimeServiceImpl::GetInfo(
    grpc::CallbackServerContext* context,
    const runtime::v1::GetInfoRequest* /*request*/,
    runtime::v1::GetInfoResponse* response) {
  SessionInfo info = manager_->Info();
  response->set_status("ok");
  response->set_version(version_);
  response->set_worker_pid(info.worker_pid);
  response->set_workers_started(info.workers_started);
  response->set_calls_in_flight(info.calls_in_flight);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace agentix::sandbox
