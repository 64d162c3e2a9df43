// CallSink: where the session manager sends the events of the calls a host
// stream owns. The gRPC adapter implements it; tests use a recording fake.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "wire/sandbox_event.h"

namespace agentix::sandbox {

class CallSink {
 public:
  virtual ~CallSink() = default;
  // Queues `events` (in order) for the host. Thread-safe and non-blocking;
  // may be called from any thread, never with a SessionManager lock held.
  // Events handed over together leave in as few stream messages as
  // possible. Returns false if the stream behind this sink has ended (the
  // manager keeps the events retained for a later resume either way).
  virtual bool Deliver(std::vector<SandboxEventPtr> events) = 0;
  // Called (no lock held) after deliveries to this sink, once
  // SessionManager::HasOpenCalls no longer counts them as being handed
  // over: a half-closed stream may check again whether it can finish.
  virtual void OnDelivered() {}
  // Bytes handed over by Deliver and not yet written to the host.
  virtual size_t UnwrittenBytes() { return 0; }
  // Ends the stream (RESOURCE_EXHAUSTED, `message`), dropping what is
  // unwritten: its host stopped reading. The calls stay retained.
  virtual void Abort(const std::string& /*message*/) {}
  // The host client behind this stream (its `agentix-client-id` metadata),
  // or "": the log records and trace events of its calls go to the Logs and
  // Traces streams of the same client only.
  virtual const std::string& client_id() const {
    static const std::string kNone;
    return kNone;
  }
};

}  // namespace agentix::sandbox
