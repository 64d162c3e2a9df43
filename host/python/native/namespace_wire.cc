// See namespace_wire.h. Field numbers are runtime.proto's.
#include "host/python/native/namespace_wire.h"

#include <cstdint>

#include "host/python/native/proto_wire.h"

namespace agentix::host {
namespace {

using wire::kLengthDelimited;
using wire::kVarint;
using wire::ReadFields;
using wire::ReadString;
using wire::WireReader;

// NamespaceError {1: type, 2: message, 3: status_code}: validated only.
bool CheckNamespaceError(std::string_view bytes) {
  return ReadFields(bytes, [](WireReader& in, uint32_t field, int wire_type) {
    std::string_view text;
    uint64_t number;
    switch (field) {
      case 1:
      case 2:
        return ReadString(in, wire_type, &text);
      case 3:
        return wire_type == kVarint && in.Varint(&number);
      default:
        return in.SkipUnknown(wire_type);
    }
  });
}

// NamespaceEvent {1: event, 2: data, 3: request_id, 4: error}. A field
// given twice keeps its last value, as protobuf does.
bool DecodeNamespaceEvent(std::string_view bytes, NamespaceEventView* out) {
  return ReadFields(bytes, [out](WireReader& in, uint32_t field,
                                 int wire_type) {
    std::string_view value;
    switch (field) {
      case 1:
        return ReadString(in, wire_type, &out->event);
      case 2:
        return wire_type == kLengthDelimited && in.LengthDelimited(&out->data);
      case 3:
        return ReadString(in, wire_type, &value);
      case 4:
        return wire_type == kLengthDelimited && in.LengthDelimited(&value) &&
               CheckNamespaceError(value);
      default:
        return in.SkipUnknown(wire_type);
    }
  });
}

}  // namespace

std::optional<NamespaceResponseView> DecodeNamespaceResponse(
    std::string_view bytes) {
  // NamespaceResponse {1: namespace, 2: opened, 3: instance_id, 4: events}.
  NamespaceResponseView response;
  const bool read = ReadFields(
      bytes, [&response](WireReader& in, uint32_t field, int wire_type) {
        std::string_view value;
        uint64_t number;
        switch (field) {
          case 1:
          case 3:
            return ReadString(in, wire_type, &value);
          case 2:
            if (wire_type != kVarint || !in.Varint(&number)) return false;
            response.opened = number != 0;
            return true;
          case 4:
            return wire_type == kLengthDelimited &&
                   in.LengthDelimited(&value) &&
                   DecodeNamespaceEvent(value, &response.events.emplace_back());
          default:
            return in.SkipUnknown(wire_type);
        }
      });
  if (!read) return std::nullopt;
  return response;
}

}  // namespace agentix::host
