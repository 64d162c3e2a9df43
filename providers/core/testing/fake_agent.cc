#include "providers/core/testing/fake_agent.h"

namespace agentix::providers::testing {

absl::Status FakeAgent::CheckReady(const pb::Endpoint& endpoint, const std::string& admin_token,
                                   absl::Time deadline) {
  absl::MutexLock lock(&state_->mu);
  if (admin_token.empty()) return absl::UnauthenticatedError("no admin token");
  if (state_->refuse_token_rule) {
    return absl::FailedPreconditionError("the daemon serves runtime RPCs without a token");
  }
  return absl::OkStatus();
}

absl::Status FakeAgent::Activate(const pb::Endpoint& endpoint, const std::string& admin_token,
                                 const ActivateParams& params, absl::Time deadline) {
  absl::MutexLock lock(&state_->mu);
  if (state_->fail_activate) return absl::UnavailableError("activate refused");
  if (state_->activated.count(endpoint.target())) {
    return absl::FailedPreconditionError("already activated: a member was reused");
  }
  state_->activated[endpoint.target()] = params;
  state_->activated_at[endpoint.target()] = absl::Now();
  state_->activations++;
  if (state_->workers_booting) state_->activated_while_booting++;
  return absl::OkStatus();
}

absl::StatusOr<DaemonStatus> FakeAgent::GetStatus(const pb::Endpoint& endpoint,
                                                  const std::string& admin_token,
                                                  absl::Time deadline) {
  absl::MutexLock lock(&state_->mu);
  DaemonStatus status;
  auto it = state_->activated_at.find(endpoint.target());
  status.activated = it != state_->activated_at.end();
  if (status.activated) status.idle = absl::Now() - it->second;
  status.calls_in_flight = state_->busy[endpoint.target()];
  status.worker_booting = state_->workers_booting;
  state_->status_calls++;
  return status;
}

}  // namespace agentix::providers::testing
