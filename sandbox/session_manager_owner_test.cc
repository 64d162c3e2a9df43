// The shared owner scenarios (calls/owner_scenarios.h) against the daemon's
// SessionManager with testing/fake_worker: the relayed owner of a client's
// calls keeps the same promises as the worker's DirectSession.
#include <catch2/catch.hpp>

#include <map>

#include "calls/owner_scenarios.h"
#include "sandbox/fake_worker_calls.h"
#include "sandbox/session_manager.h"

namespace agentix::sandbox {
namespace {

using calls::testing::EventLog;

// A host stream of one named client whose events go to an EventLog.
class LogSink final : public CallSink {
 public:
  explicit LogSink(std::shared_ptr<EventLog> log) : log_(std::move(log)) {}
  bool Deliver(std::vector<SandboxEventPtr> events) override {
    log_->Add(std::move(events));
    return true;
  }
  const std::string& client_id() const override { return client_; }

 private:
  const std::shared_ptr<EventLog> log_;
  const std::string client_ = "scenario-client";
};

class ManagerOwner final : public calls::testing::OwnerUnderTest {
 public:
  explicit ManagerOwner(const calls::CallTableLimits& limits)
      : manager_(Options(limits)) {}

  std::shared_ptr<EventLog> Connect() override {
    auto log = std::make_shared<EventLog>();
    auto sink = std::make_shared<LogSink>(log);
    manager_.RegisterSink(sink);
    sinks_[log.get()] = sink;
    return log;
  }
  void Send(const std::shared_ptr<EventLog>& conn,
            const runtime::v1::CallsRequest& request) override {
    manager_.HandleHostEvents(sinks_.at(conn.get()), request.events());
  }
  void Close(const std::shared_ptr<EventLog>& conn) override {
    manager_.DetachSink(sinks_.at(conn.get()).get());
  }

 private:
  static SessionOptions Options(const calls::CallTableLimits& limits) {
    SessionOptions options = FakeWorkerOptions();
    options.max_retained_results = limits.max_retained_results;
    options.max_retained_bytes = limits.max_retained_bytes;
    options.max_payload_bytes = limits.max_payload_bytes;
    options.upload_idle_timeout = limits.upload_idle_timeout;
    options.max_stream_window = limits.max_stream_window;
    return options;
  }

  SessionManager manager_;
  std::map<const EventLog*, std::shared_ptr<LogSink>> sinks_;
};

TEST_CASE("SessionManager keeps every Calls guarantee (the owner scenarios)",
          "[sandbox][calls]") {
  calls::testing::RunOwnerScenarios([](const calls::CallTableLimits& limits) {
    return std::make_unique<ManagerOwner>(limits);
  });
}

}  // namespace
}  // namespace agentix::sandbox
