// The rules of a host's Namespace stream that whoever serves it applies —
// the daemon, or the worker for a stream handed over to it
// (docs/DIRECT-CALLS.md stage 8): which names may be opened, which host
// events are accepted and the frame they become, and the event that tells
// the sandbox a host listens.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "worker/ipc/frame.h"

namespace agentix::sandbox {

// Longest accepted namespace name and event name (host-chosen strings kept
// as map keys in the daemon and in the worker).
inline constexpr size_t kMaxNamespaceBytes = 256;
inline constexpr size_t kMaxEventNameBytes = 1024;
// Longest request_id of a host event (the worker keeps pending requests by
// it); the same bound as a call id.
inline constexpr size_t kMaxRequestIdBytes = 256;

// The event the sandbox's agentix.sio is sent when a host opens a
// namespace, so requests whose event or reply a broken connection lost are
// sent again. Reserved: a host may not send it.
inline constexpr char kHostConnectedEvent[] = "agentix:host_connected";

// OK for a name a plugin may open; InvalidArgument (with the reason) for
// "", "/", names not starting with "/", names longer than
// kMaxNamespaceBytes, and the core's /rpc, /log, /trace.
absl::Status CheckNamespaceName(absl::string_view name);
// OK for an event a host may send on an open namespace; InvalidArgument
// (with the reason) for an event name over kMaxEventNameBytes, a
// request_id over kMaxRequestIdBytes, and kHostConnectedEvent.
absl::Status CheckHostNamespaceEvent(const runtime::v1::NamespaceEvent& event);
// The kHostConnectedEvent sent to the sandbox (msgpack nil data).
runtime::v1::NamespaceEvent HostConnectedEvent();
// A host's `event` on namespace `name` as the worker link's kNamespaceEvent
// frame: the same whether the daemon relays it or the worker serves the
// stream.
ipc::Frame NamespaceEventFrame(const std::string& name,
                               const runtime::v1::NamespaceEvent& event);
// The other way: the sandbox's kNamespaceEvent `frame` as the event its
// hosts get, written into `event` (whoever serves the stream).
void FillNamespaceEvent(const ipc::Frame& frame,
                        runtime::v1::NamespaceEvent& event);

}  // namespace agentix::sandbox
