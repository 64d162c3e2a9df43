// NamespaceHub: which host streams have which plugin namespace open, and the
// broadcast of the sandbox's namespace events to them (DESIGN.md, side
// channels: "/<plugin>", the daemon is namespace-opaque). The hub never
// looks inside an event: it routes by namespace name only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "wire/namespace_rules.h"  // the limits, kHostConnectedEvent

namespace agentix::sandbox {

using NamespaceEventPtr = std::shared_ptr<const runtime::v1::NamespaceEvent>;

// The write side of one host Namespace stream.
class NamespaceSubscriber {
 public:
  virtual ~NamespaceSubscriber() = default;
  // Queues `events` for the host; false once the stream has ended.
  virtual bool Deliver(std::vector<NamespaceEventPtr> events) = 0;
};

class NamespaceHub {
 public:
  // OK for a name a plugin may open; InvalidArgument (with the reason) for
  // "", "/", names not starting with "/", names longer than
  // kMaxNamespaceBytes, and the core's /rpc, /log, /trace.
  static absl::Status CheckName(absl::string_view name);
  // OK for an event a host may send on an open namespace; InvalidArgument
  // (with the reason) for an event name over kMaxEventNameBytes, a
  // request_id over kMaxRequestIdBytes, and kHostConnectedEvent.
  static absl::Status CheckHostEvent(const runtime::v1::NamespaceEvent& event);
  // The kHostConnectedEvent the daemon sends the worker (msgpack nil data).
  static runtime::v1::NamespaceEvent HostConnectedEvent();

  // At most `max_streams` streams may be open at once (over all names).
  explicit NamespaceHub(size_t max_streams = 256) : max_streams_(max_streams) {}

  // `subscriber` receives every event broadcast on `name` from now on.
  // ResourceExhausted when `max_streams` are already open.
  absl::Status Subscribe(const std::string& name,
                         std::shared_ptr<NamespaceSubscriber> subscriber);
  // Forgets `subscriber` on every namespace. Idempotent.
  void Unsubscribe(const NamespaceSubscriber* subscriber);
  // Hands `events` (all of namespace `name`) to every subscriber of `name`;
  // returns how many accepted them.
  size_t Broadcast(const std::string& name,
                   const std::vector<NamespaceEventPtr>& events);
  // Number of open streams on `name`.
  size_t Subscribers(const std::string& name);

  // Direct Namespace streams (docs/DIRECT-CALLS.md stage 8). True, and
  // `subscriber` is marked as `name`'s handed-over stream, when it is the
  // one stream open on `name`; it stays subscribed (counted against the
  // cap; a broadcast counts it as delivered, the worker writing to it)
  // until Unsubscribe.
  bool ClaimDirect(const std::string& name,
                   const NamespaceSubscriber* subscriber);
  // Whether the streams on `name` other than `subscriber` are all handed
  // over (a host's previous stream whose end the worker has not reported
  // yet, typically): a claim may succeed shortly.
  bool OthersAreDirect(const std::string& name,
                       const NamespaceSubscriber* subscriber);
  // Whether `name` has a handed-over stream.
  bool HasDirect(const std::string& name);
  // The hand-over did not happen: `subscriber` is a relayed stream again.
  void UnclaimDirect(const NamespaceSubscriber* subscriber);
  // Number of open streams, over all names.
  size_t OpenStreams();

 private:
  void UnclaimLocked(const NamespaceSubscriber* subscriber)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_streams_;
  absl::Mutex mu_;
  size_t open_streams_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string,
                      std::vector<std::shared_ptr<NamespaceSubscriber>>>
      subscribers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, const NamespaceSubscriber*> direct_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace agentix::sandbox
