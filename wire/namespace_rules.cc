#include "wire/namespace_rules.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace agentix::sandbox {

absl::Status CheckNamespaceName(absl::string_view name) {
  if (name.size() > kMaxNamespaceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace name of ", name.size(),
                     " bytes exceeds the limit of ", kMaxNamespaceBytes));
  }
  if (name.empty() || name[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace '", name, "' must start with '/' (e.g. '/myplugin')"));
  }
  if (name == "/") {
    return absl::InvalidArgumentError(
        "namespace '/' cannot be opened: name the plugin's namespace");
  }
  if (name == "/rpc" || name == "/log" || name == "/trace") {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace '", name,
        "' is reserved by agentix-core; choose another name for the plugin"));
  }
  return absl::OkStatus();
}

absl::Status CheckHostNamespaceEvent(const runtime::v1::NamespaceEvent& event) {
  // Host-chosen names forwarded to the sandbox (which keeps handlers and
  // pending requests by them) are bounded.
  if (event.event().size() > kMaxEventNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("event name of ", event.event().size(),
                     " bytes exceeds the limit of ", kMaxEventNameBytes));
  }
  if (event.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id of ", event.request_id().size(),
                     " bytes exceeds the limit of ", kMaxRequestIdBytes));
  }
  if (event.event() == kHostConnectedEvent) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event name ", kHostConnectedEvent, " is reserved for the daemon"));
  }
  return absl::OkStatus();
}

runtime::v1::NamespaceEvent HostConnectedEvent() {
  runtime::v1::NamespaceEvent connected;
  connected.set_event(kHostConnectedEvent);
  connected.set_data(std::string(1, '\xc0'));  // msgpack nil
  return connected;
}

ipc::Frame NamespaceEventFrame(const std::string& name,
                               const runtime::v1::NamespaceEvent& event) {
  ipc::Frame frame;
  frame.type = ipc::FrameType::kNamespaceEvent;
  frame.ns.name = name;
  frame.ns.event = event.event();
  frame.ns.request_id = event.request_id();
  if (event.has_error()) {
    frame.ns.has_error = true;
    frame.ns.error_type = event.error().type();
    frame.ns.error_message = event.error().message();
    frame.ns.status_code = event.error().status_code();
  }
  frame.data = event.data();
  return frame;
}

void FillNamespaceEvent(const ipc::Frame& frame,
                        runtime::v1::NamespaceEvent& event) {
  event.set_event(frame.ns.event);
  event.set_data(frame.data);
  event.set_request_id(frame.ns.request_id);
  if (frame.ns.has_error) {
    runtime::v1::NamespaceError* error = event.mutable_error();
    error->set_type(frame.ns.error_type);
    error->set_message(frame.ns.error_message);
    error->set_status_code(frame.ns.status_code);
  }
}

}  // namespace agentix::sandbox
