// Decodes a CallsResponse (agentix/runtime/v1/runtime.proto) that holds only
// CallResults, for the host's per-call path: a sequential noop's response is
// one CallResult, which the host's Python reader (wire.parse_calls_response)
// walks byte by byte for about as long as the rest of reading the response.
//
// Exact or nothing, as namespace_wire.h: a message is decoded only when every
// event is a SandboxEvent holding just `result`, every CallResult field is
// one this reader knows with the wire type protobuf writes, its call_id is
// valid UTF-8 and its encoding unspecified or pickle. Anything else (another
// event kind, unknown fields, truncation, ...) yields nullopt and the caller
// reads the message as before, which then decides (or reports) it.
#ifndef AGENTIX_HOST_PYTHON_NATIVE_CALL_RESULTS_WIRE_H_
#define AGENTIX_HOST_PYTHON_NATIVE_CALL_RESULTS_WIRE_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace agentix::host {

// One CallResult; views into the decoded bytes. A field given twice keeps
// its last value, as protobuf does.
struct CallResultView {
  std::string_view call_id;
  uint64_t encoding = 0;  // 0 (unspecified) or 1 (pickle)
  std::string_view value;
  uint64_t value_size = 0;
  uint64_t log_seq = 0;
  uint64_t trace_seq = 0;
};

std::optional<std::vector<CallResultView>> DecodeCallResults(
    std::string_view bytes);

}  // namespace agentix::host

#endif  // AGENTIX_HOST_PYTHON_NATIVE_CALL_RESULTS_WIRE_H_
