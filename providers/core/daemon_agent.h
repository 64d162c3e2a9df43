// How the controller talks to a sandbox's daemon: health (readiness) and
// arming through the daemon's SandboxAdmin service. An interface so the
// controller's tests can run without sandboxes.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agentix/provider/v1/provider.pb.h"

namespace agentix::providers {

struct ActivateParams {
  std::string sandbox_id;
  std::string token;  // the per-sandbox runtime token
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;
};

struct DaemonStatus {
  bool activated = false;
  absl::Duration idle = absl::ZeroDuration();
  int calls_in_flight = 0;
  int open_streams = 0;
  // A worker started before activation (--prestart-worker) is still
  // booting. False when none runs or the daemon does not say.
  bool worker_booting = false;
};

class DaemonAgent {
 public:
  virtual ~DaemonAgent() = default;
  // OK when grpc.health.v1 answers SERVING with the admin token AND a
  // runtime RPC without a token is refused (a daemon that ignores its
  // token must never be handed out). UNAVAILABLE while not up yet (retry);
  // FAILED_PRECONDITION when it answers but fails the token rule.
  virtual absl::Status CheckReady(const provider::v1::Endpoint& endpoint,
                                  const std::string& admin_token,
                                  absl::Time deadline) = 0;
  virtual absl::Status Activate(const provider::v1::Endpoint& endpoint,
                                const std::string& admin_token,
                                const ActivateParams& params,
                                absl::Time deadline) = 0;
  virtual absl::StatusOr<DaemonStatus> GetStatus(
      const provider::v1::Endpoint& endpoint, const std::string& admin_token,
      absl::Time deadline) = 0;
};

}  // namespace agentix::providers
