// SandboxAdminService: agentix.runtime.v1.SandboxAdmin (admin.proto) on the
// daemon's completion queue, served only in activation mode
// (--admin-token-file). The auth processor (auth.h, TokenGate) has already
// checked the admin token before a call gets here.
//
// Activate arms the gate with the runtime token once, after giving the
// session manager the worker's environment (env + AGENTIX_SANDBOX_ID), so
// the first call that the token admits runs in a worker that sees it: one
// started later with it, or one prestarted before activation that has set it
// in its os.environ (or been replaced; SessionManager::ApplyWorkerEnv).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agentix/runtime/v1/admin.grpc.pb.h"
#include "sandbox/auth.h"
#include "sandbox/server_stream.h"
#include "sandbox/session_manager.h"
#include "sandbox/stream_activity.h"

namespace agentix::sandbox {

// The worker-environment variable Activate's sandbox_id becomes.
inline constexpr char kSandboxIdEnvVar[] = "AGENTIX_SANDBOX_ID";
// Bounds on what one Activate may add to the worker's environment.
inline constexpr size_t kMaxActivateEnvEntries = 4096;
inline constexpr size_t kMaxActivateEnvBytes = 1 << 20;

class SandboxAdminService {
 public:
  // All must outlive the service. `start_worker` (--prestart-worker): the
  // daemon started the worker before activation; Activate starts one if it
  // is not running (it failed or died). `apply_env_timeout`: how long
  // Activate waits for a running worker to apply the env (its boot
  // included) before replacing it with a fresh one.
  SandboxAdminService(std::shared_ptr<TokenGate> gate, SessionManager* manager,
                      const StreamActivity* activity, bool start_worker,
                      absl::Duration apply_env_timeout = absl::Seconds(20));

  SandboxAdminService(const SandboxAdminService&) = delete;
  SandboxAdminService& operator=(const SandboxAdminService&) = delete;

  // Before BuildAndStart.
  void AddTo(grpc::ServerBuilder& builder) {
    builder.RegisterService(&service_);
  }
  // After BuildAndStart: answers calls on the queue `thread` polls.
  void Start(CompletionQueueThread* thread);

  // The RPCs' logic (public for tests). Activate: InvalidArgument for a
  // blank or unsendable token, the admin token, a bad env name or value, a
  // sandbox_id with control characters, or too much env (nothing changes);
  // OK again for the same token (nothing changes); FailedPrecondition for
  // another token.
  absl::Status Activate(const runtime::v1::ActivateRequest& request);
  runtime::v1::SandboxAdminStatus GetStatus();

 private:
  const std::shared_ptr<TokenGate> gate_;
  SessionManager* const manager_;
  const StreamActivity* const activity_;
  const bool start_worker_;
  const absl::Duration apply_env_timeout_;
  absl::Mutex activate_mu_;  // one Activate at a time
  runtime::v1::SandboxAdmin::AsyncService service_;
};

}  // namespace agentix::sandbox
