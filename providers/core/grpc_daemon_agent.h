// GrpcDaemonAgent: the DaemonAgent (daemon_agent.h) over real gRPC, to a
// sandbox daemon started with --admin-token-file (docs/PROVIDERS.md,
// "Arming (SandboxAdmin)").
//
// Channels. The controller polls CheckReady every few ms while a sandbox
// starts, and a gRPC channel whose connect failed waits out a reconnect
// backoff (1 s at first) before it tries again. So each probe that has no
// connected channel yet makes a fresh one, on its own subchannel pool (a
// shared pool would hand back the subchannel in backoff); the first probe
// that succeeds keeps its channel for the endpoint, and Activate and
// GetStatus reuse it (no second connect). A channel whose RPC fails
// UNAVAILABLE is dropped, so the next use connects afresh.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "providers/core/daemon_agent.h"

namespace agentix::providers {

class GrpcDaemonAgent final : public DaemonAgent {
 public:
  struct Options {
    // PEM roots that verify daemons' certificates for Endpoint.tls; empty:
    // gRPC's default roots.
    std::string tls_root_certs_pem;
    // Connected channels kept (one per endpoint); the least recently used
    // goes first beyond it.
    size_t max_channels = 1024;
  };

  GrpcDaemonAgent() : GrpcDaemonAgent(Options()) {}
  explicit GrpcDaemonAgent(Options options);

  // OK when health answers SERVING to the admin token and a runtime RPC
  // without a token is refused (UNAUTHENTICATED or FAILED_PRECONDITION).
  // UNAVAILABLE while the daemon cannot be reached (connection refused, no
  // socket yet, NOT_SERVING, or `deadline` passing first); FAILED_PRECONDITION
  // when it answers but refuses the admin token or answers without a token;
  // INVALID_ARGUMENT for an empty target.
  absl::Status CheckReady(const provider::v1::Endpoint& endpoint,
                          const std::string& admin_token,
                          absl::Time deadline) override;
  // SandboxAdmin.Activate with the admin token; the daemon's status as is
  // (FAILED_PRECONDITION: activated with another token; INVALID_ARGUMENT: a
  // bad token, env or sandbox_id; UNAUTHENTICATED: a wrong admin token).
  absl::Status Activate(const provider::v1::Endpoint& endpoint,
                        const std::string& admin_token,
                        const ActivateParams& params,
                        absl::Time deadline) override;
  absl::StatusOr<DaemonStatus> GetStatus(const provider::v1::Endpoint& endpoint,
                                         const std::string& admin_token,
                                         absl::Time deadline) override;

  // Drops the channel kept for `endpoint` (its sandbox is gone).
  void Forget(const provider::v1::Endpoint& endpoint);
  // Channels kept (for tests).
  size_t ChannelCount();

 private:
  using Key = std::tuple<std::string, bool, std::string>;
  struct Kept {
    std::shared_ptr<grpc::Channel> channel;
    std::list<Key>::iterator lru;
  };

  static Key KeyOf(const provider::v1::Endpoint& endpoint);
  std::shared_ptr<grpc::Channel> NewChannel(
      const provider::v1::Endpoint& endpoint) const;
  // The kept channel of `endpoint`, or a new one (not kept yet).
  std::shared_ptr<grpc::Channel> ChannelFor(
      const provider::v1::Endpoint& endpoint);
  void Keep(const provider::v1::Endpoint& endpoint,
            std::shared_ptr<grpc::Channel> channel);
  // Drops `channel` if it is the one kept for `endpoint`.
  void Drop(const provider::v1::Endpoint& endpoint,
            const std::shared_ptr<grpc::Channel>& channel);

  const Options options_;
  absl::Mutex mu_;
  std::map<Key, Kept> channels_ ABSL_GUARDED_BY(mu_);
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
};

}  // namespace agentix::providers
