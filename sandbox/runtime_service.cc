#include "sandbox/runtime_service.h"

#include <memory>
#include <utility>
#include <vector>

#include "sandbox/batching_writer.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;
using runtime::v1::LogsRequest;
using runtime::v1::LogsResponse;

class CallsReactor;

struct CallsEvents {
  static auto* Get(CallsResponse& r) { return r.mutable_events(); }
};
using CallsWriter = BatchingWriter<CallsRequest, CallsResponse,
                                   runtime::v1::SandboxEvent, CallsEvents>;

// The CallSink of one Calls stream. Outlives its reactor while the session
// manager still holds it. A half-closed stream finishes once every call it
// owns has reached its terminal event.
class StreamSink final : public CallSink, public CallsWriter {
 public:
  StreamSink(CallsReactor* reactor, SessionManager* manager);
  bool Deliver(std::vector<SandboxEventPtr> events) override;

 private:
  // Lock order is writer -> manager; the manager never calls a sink while
  // holding its own lock.
  bool ReadyToFinish() override { return !manager_->HasOpenCalls(this); }

  SessionManager* const manager_;
};

class CallsReactor final
    : public grpc::ServerBidiReactor<CallsRequest, CallsResponse> {
 public:
  explicit CallsReactor(SessionManager* manager)
      : manager_(manager),
        sink_(std::make_shared<StreamSink>(this, manager)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      sink_->OnReadsDone();
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

StreamSink::StreamSink(CallsReactor* reactor, SessionManager* manager)
    : CallsWriter(reactor), manager_(manager) {}

bool StreamSink::Deliver(std::vector<SandboxEventPtr> events) {
  // A half-closed stream re-checks ReadyToFinish when this write completes.
  return Enqueue(std::move(events));
}

struct LogsRecords {
  static auto* Get(LogsResponse& r) { return r.mutable_records(); }
};
using LogsWriter = BatchingWriter<LogsRequest, LogsResponse,
                                  runtime::v1::LogRecord, LogsRecords>;

// One Logs stream: subscribes to the log buffer on SubscribeLogs, forwards
// AckLogs, finishes when the host half-closes.
class LogsSink final : public LogSubscriber, public LogsWriter {
 public:
  LogsSink(grpc::ServerBidiReactor<LogsRequest, LogsResponse>* reactor,
           const std::string& instance_id)
      : LogsWriter(reactor, Header(instance_id)) {}
  void Deliver(std::vector<LogRecordPtr> records) override {
    Enqueue(std::move(records));
  }

 private:
  static LogsResponse Header(const std::string& instance_id) {
    LogsResponse header;
    header.set_instance_id(instance_id);
    return header;
  }
};

class LogsReactor final
    : public grpc::ServerBidiReactor<LogsRequest, LogsResponse> {
 public:
  explicit LogsReactor(LogBuffer* logs)
      : logs_(logs),
        sink_(std::make_shared<LogsSink>(this, logs->instance_id())) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      sink_->OnReadsDone();
      return;
    }
    if (request_.has_subscribe()) {
      if (!subscribed_) {
        subscribed_ = true;
        logs_->Subscribe(sink_, request_.subscribe().after_seq(),
                         request_.subscribe().instance_id());
      }
    } else if (request_.has_ack()) {
      logs_->Ack(request_.ack().seq());
    }
    request_.Clear();
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override { sink_->OnCancel(); }

  void OnDone() override {
    logs_->Unsubscribe(sink_.get());
    sink_->Detach();
    delete this;
  }

 private:
  LogBuffer* const logs_;
  std::shared_ptr<LogsSink> sink_;
  LogsRequest request_;
  bool subscribed_ = false;  // only touched by read reactions
};

}  // namespace

RuntimeServiceImpl::RuntimeServiceImpl(SessionManager* manager,
                                       std::string version)
    : manager_(manager), version_(std::move(version)) {}

grpc::ServerBidiReactor<CallsRequest, CallsResponse>* RuntimeServiceImpl::Calls(
    grpc::CallbackServerContext* /*context*/) {
  return new CallsReactor(manager_);
}

grpc::ServerBidiReactor<LogsRequest, LogsResponse>* RuntimeServiceImpl::Logs(
    grpc::CallbackServerContext* /*context*/) {
  return new LogsReactor(&manager_->logs());
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
