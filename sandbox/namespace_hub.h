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

namespace agentix::sandbox {

// Longest accepted namespace name and event name (host-chosen strings kept
// as map keys here and in the worker).
inline constexpr size_t kMaxNamespaceBytes = 256;
inline constexpr size_t kMaxEventNameBytes = 1024;
// Longest request_id of a host event (the worker keeps pending requests by
// it); the same bound as a call id.
inline constexpr size_t kMaxRequestIdBytes = 256;

// The event the daemon sends the sandbox's agentix.sio when a host opens a
// namespace, so requests whose event or reply a broken connection lost are
// sent again. Reserved: a host may not send it.
inline constexpr char kHostConnectedEvent[] = "agentix:host_connected";

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
  // Number of open streams, over all names.
  size_t OpenStreams();

 private:
  const size_t max_streams_;
  absl::Mutex mu_;
  size_t open_streams_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string,
                      std::vector<std::shared_ptr<NamespaceSubscriber>>>
      subscribers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace agentix::sandbox
