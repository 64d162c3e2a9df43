// The Calls guarantees (docs/RELIABILITY.md "Calls") as scenarios that any
// owner of a client's calls must pass — run for both owners: the daemon's
// SessionManager (sandbox/session_manager_owner_test) and the worker's
// DirectSession (worker/direct/direct_session_test), each with
// testing/fake_worker as the worker (its callables fake::echo, fake::hang,
// fake::double, fake::stream), so the two cannot drift.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "calls/call_table.h"
#include "wire/sandbox_event.h"

namespace agentix::calls::testing {

// What one test connection received, with bounded waits (10 s).
class EventLog {
 public:
  void Add(std::vector<SandboxEventPtr> events);
  // The `n`th terminal event of `id` (an empty event if it did not come).
  runtime::v1::SandboxEvent AwaitTerminal(const std::string& id, int n = 1);
  int CountTerminal(const std::string& id);
  std::vector<std::string> AwaitItems(const std::string& id, size_t n);
  std::vector<std::string> Items(const std::string& id);
  // Concatenated ResultChunk bytes of `id`.
  std::string Chunks(const std::string& id);
  // The first error with an empty call_id (over-long ids, kindless events).
  runtime::v1::SandboxEvent AwaitAnonymousError(int n = 1);

 private:
  std::vector<const runtime::v1::SandboxEvent*> Terminals(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> ItemsLocked(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Mutex mu_;
  std::vector<SandboxEventPtr> events_ ABSL_GUARDED_BY(mu_);
};

// One owner of one client's calls, seen from that client's connections.
class OwnerUnderTest {
 public:
  virtual ~OwnerUnderTest() = default;
  // A new Calls connection of the client.
  virtual std::shared_ptr<EventLog> Connect() = 0;
  virtual void Send(const std::shared_ptr<EventLog>& conn,
                    const runtime::v1::CallsRequest& request) = 0;
  // The connection ended (its calls stay for a resume).
  virtual void Close(const std::shared_ptr<EventLog>& conn) = 0;
};

// Builds a fresh owner with `limits` for one scenario.
using OwnerFactory =
    std::function<std::unique_ptr<OwnerUnderTest>(const CallTableLimits&)>;

// Runs every scenario, each a Catch2 section of the calling test case.
void RunOwnerScenarios(const OwnerFactory& make);

}  // namespace agentix::calls::testing
