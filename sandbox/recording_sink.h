// A CallSink that keeps every event delivered to it, for the daemon's tests
// that run calls through a SessionManager (session_manager_test,
// admin_service_test, worker_adoption_test).
#pragma once

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "sandbox/call_sink.h"

namespace agentix::sandbox {

class RecordingSink : public CallSink {
 public:
  bool Deliver(std::vector<SandboxEventPtr> events) override {
    absl::MutexLock lock(&mu_);
    for (auto& e : events) events_.push_back(std::move(e));
    return true;
  }

  // Waits up to 10 s for the terminal event (result or error) of `call_id`;
  // the test fails if none comes.
  runtime::v1::SandboxEvent AwaitTerminal(const std::string& call_id) {
    absl::MutexLock lock(&mu_);
    const runtime::v1::SandboxEvent* found = nullptr;
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& e : events_) {
        if ((e->has_result() && e->result().call_id() == call_id) ||
            (e->has_error() && e->error().call_id() == call_id)) {
          found = e.get();
          return true;
        }
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
    REQUIRE(found != nullptr);
    return *found;
  }

 protected:
  absl::Mutex mu_;
  std::vector<SandboxEventPtr> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace agentix::sandbox
