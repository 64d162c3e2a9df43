// See call_results_wire.h. Field numbers are runtime.proto's.
#include "host/python/native/call_results_wire.h"

#include "host/python/native/proto_wire.h"

namespace agentix::host {
namespace {

using wire::kLengthDelimited;
using wire::kVarint;
using wire::ReadFields;
using wire::ReadString;
using wire::WireReader;

constexpr uint64_t kEncodingPickle = 1;

// CallResult {1: call_id, 2: encoding, 3: value, 4: value_size, 5: log_seq,
// 6: trace_seq}.
bool DecodeCallResult(std::string_view bytes, CallResultView* out) {
  return ReadFields(bytes, [out](WireReader& in, uint32_t field,
                                 int wire_type) {
    switch (field) {
      case 1:
        return ReadString(in, wire_type, &out->call_id);
      case 3:
        return wire_type == kLengthDelimited && in.LengthDelimited(&out->value);
      case 2:
        return wire_type == kVarint && in.Varint(&out->encoding) &&
               out->encoding <= kEncodingPickle;
      case 4:
        return wire_type == kVarint && in.Varint(&out->value_size);
      case 5:
        return wire_type == kVarint && in.Varint(&out->log_seq);
      case 6:
        return wire_type == kVarint && in.Varint(&out->trace_seq);
      default:
        return false;  // unknown: left to protobuf
    }
  });
}

// SandboxEvent holding exactly one field, `result` (2). A second field (even
// `result` again, which protobuf would merge) is left to protobuf.
bool DecodeResultEvent(std::string_view bytes, CallResultView* out) {
  WireReader in(bytes);
  uint32_t field;
  int wire_type;
  std::string_view result;
  return in.Tag(&field, &wire_type) && field == 2 &&
         wire_type == kLengthDelimited && in.LengthDelimited(&result) &&
         in.done() && DecodeCallResult(result, out);
}

}  // namespace

std::optional<std::vector<CallResultView>> DecodeCallResults(
    std::string_view bytes) {
  // CallsResponse {1: events}.
  std::vector<CallResultView> results;
  const bool read = ReadFields(
      bytes, [&results](WireReader& in, uint32_t field, int wire_type) {
        std::string_view event;
        return field == 1 && wire_type == kLengthDelimited &&
               in.LengthDelimited(&event) &&
               DecodeResultEvent(event, &results.emplace_back());
      });
  if (!read) return std::nullopt;
  return results;
}

}  // namespace agentix::host
