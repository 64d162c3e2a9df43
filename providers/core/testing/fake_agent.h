// A DaemonAgent for the controller's tests: every endpoint is healthy unless
// told otherwise; Activate calls are recorded; idleness is what the test
// sets (default: time since Activate).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "providers/core/daemon_agent.h"

namespace agentix::providers::testing {

namespace pb = ::agentix::provider::v1;

class FakeAgentState {
 public:
  absl::Mutex mu;
  // CheckReady answers FAILED_PRECONDITION (the token rule) when set.
  bool refuse_token_rule ABSL_GUARDED_BY(mu) = false;
  bool fail_activate ABSL_GUARDED_BY(mu) = false;
  std::map<std::string, ActivateParams> activated ABSL_GUARDED_BY(mu);  // by target
  std::map<std::string, absl::Time> activated_at ABSL_GUARDED_BY(mu);
  std::map<std::string, int> busy ABSL_GUARDED_BY(mu);  // calls in flight by target
  int activations ABSL_GUARDED_BY(mu) = 0;
  // GetStatus says worker_booting for every target while set (a prestarted
  // worker still booting); Activate counts the targets it arms meanwhile.
  bool workers_booting ABSL_GUARDED_BY(mu) = false;
  int activated_while_booting ABSL_GUARDED_BY(mu) = 0;
  int status_calls ABSL_GUARDED_BY(mu) = 0;

  bool IsActivated(const std::string& sandbox_id) {
    absl::MutexLock lock(&mu);
    return activated.count("fake://" + sandbox_id) > 0;
  }
  std::vector<ActivateParams> all() {
    absl::MutexLock lock(&mu);
    std::vector<ActivateParams> out;
    for (auto& [t, p] : activated) out.push_back(p);
    return out;
  }
};

class FakeAgent : public DaemonAgent {
 public:
  explicit FakeAgent(std::shared_ptr<FakeAgentState> state) : state_(std::move(state)) {}
  absl::Status CheckReady(const pb::Endpoint& endpoint, const std::string& admin_token,
                          absl::Time deadline) override;
  absl::Status Activate(const pb::Endpoint& endpoint, const std::string& admin_token,
                        const ActivateParams& params, absl::Time deadline) override;
  absl::StatusOr<DaemonStatus> GetStatus(const pb::Endpoint& endpoint,
                                         const std::string& admin_token,
                                         absl::Time deadline) override;

 private:
  std::shared_ptr<FakeAgentState> state_;
};

}  // namespace agentix::providers::testing
