// Decodes the daemon's NamespaceResponse (agentix/runtime/v1/runtime.proto)
// from its wire form, for the host's per-event path: the Python protobuf
// runtime parses these through reflection (DynamicMessage), which costs the
// host's event loop several microseconds per namespace event.
//
// Exact or nothing: a message is decoded only when the decoder is sure
// protobuf would accept it and read the same values; anything else
// (truncation, invalid UTF-8, groups, a known field with an unexpected wire
// type, ...) yields nullopt, and the caller parses the message with protobuf,
// which then reports the error as before. fuzz/namespace_wire_fuzzer.cc
// checks that promise against the generated C++ parser.
#ifndef AGENTIX_HOST_PYTHON_NATIVE_NAMESPACE_WIRE_H_
#define AGENTIX_HOST_PYTHON_NATIVE_NAMESPACE_WIRE_H_

#include <optional>
#include <string_view>
#include <vector>

namespace agentix::host {

// One NamespaceEvent: what the host's namespace objects receive. Views into
// the decoded bytes; `event` is valid UTF-8.
struct NamespaceEventView {
  std::string_view event;
  std::string_view data;
};

// The parts of a NamespaceResponse the host acts on. (`namespace`,
// `instance_id` and each event's `request_id` / `error` are validated but
// not returned.)
struct NamespaceResponseView {
  bool opened = false;
  std::vector<NamespaceEventView> events;
};

std::optional<NamespaceResponseView> DecodeNamespaceResponse(
    std::string_view bytes);

}  // namespace agentix::host

#endif  // AGENTIX_HOST_PYTHON_NATIVE_NAMESPACE_WIRE_H_
