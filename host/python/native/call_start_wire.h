// Encodes the host's per-call write: a CallsRequest (agentix/runtime/v1/
// runtime.proto) holding the AckResults of earlier results, then one
// StartCall whose arguments travel whole in it. A sequential noop's write is
// exactly that; stream.py builds it in Python piece by piece for about as long
// as the rest of starting a call (stop 31).
//
// The bytes are protobuf's for the same message, with two exceptions that
// follow wire.start_call_event (whose output this replaces byte for byte):
// `callable_fields` and a `context_is_fields` context are written as given
// (already encoded fields), and such a context comes before stream_window.
// Protobuf reads both as the same message.
#ifndef AGENTIX_HOST_PYTHON_NATIVE_CALL_START_WIRE_H_
#define AGENTIX_HOST_PYTHON_NATIVE_CALL_START_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace agentix::host {

struct StartCallParts {
  std::string_view call_id;
  // StartCall.callable and .encoding, encoded (wire._start_fields).
  std::string_view callable_fields;
  // The pickled arguments; StartCall.arguments_size is their length.
  std::string_view arguments;
  // The pickled context carrier (StartCall.context), or with
  // `context_is_fields` the encoded traceparent / tracestate / baggage fields.
  std::string_view context;
  bool context_is_fields = false;
  uint64_t stream_window = 0;
};

// The frame wire's header in front of the message when `frame_kind` is not 0
// (u32le payload length, u8 kind; frames.py).
constexpr size_t kFrameHeaderBytes = 5;

// Bytes EncodeCallsRequest writes.
size_t CallsRequestSize(const std::vector<std::string_view>& ack_ids,
                        const StartCallParts& start, uint8_t frame_kind);

// Writes [frame header,] the AckResult events for `ack_ids` (an empty id as
// protobuf leaves an empty field out), then the StartCall event, to `out`
// (CallsRequestSize bytes). Returns the bytes written.
size_t EncodeCallsRequest(const std::vector<std::string_view>& ack_ids,
                          const StartCallParts& start, uint8_t frame_kind,
                          char* out);

}  // namespace agentix::host

#endif  // AGENTIX_HOST_PYTHON_NATIVE_CALL_START_WIRE_H_
