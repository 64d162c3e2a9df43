// See namespace_wire.h. Field numbers are runtime.proto's.
#include "host/python/native/namespace_wire.h"

#include <cstdint>

#include "base/utf8.h"

namespace agentix::host {
namespace {

enum WireType : int {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kFixed32 = 5,  // (3 and 4, groups, are never decoded here)
};

// Reads protobuf's wire primitives from a byte range. Every method returns
// false instead of reading past the end or accepting something doubtful.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : rest_(bytes) {}

  bool done() const { return rest_.empty(); }

  // A varint of at most `max_bytes` bytes (protobuf reads values of up to
  // ten, tags and lengths of up to five, and refuses longer encodings). A
  // tenth byte may only carry the 64th bit (protobuf drops the rest;
  // doubtful, so left to it).
  bool Varint(uint64_t* out, int max_bytes = 10) {
    uint64_t value = 0;
    for (int i = 0; i < max_bytes && !rest_.empty(); ++i) {
      const auto byte = static_cast<uint8_t>(rest_.front());
      rest_.remove_prefix(1);
      if (i == 9 && byte > 1) return false;
      value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if (byte < 0x80) {
        *out = value;
        return true;
      }
    }
    return false;
  }

  // A tag: field number (not 0) and wire type, in at most five bytes and 32
  // bits, as protobuf reads tags.
  bool Tag(uint32_t* field, int* wire_type) {
    uint64_t tag;
    if (!Varint(&tag, 5) || tag > UINT32_MAX || (tag >> 3) == 0) return false;
    *field = static_cast<uint32_t>(tag >> 3);
    *wire_type = static_cast<int>(tag & 7);
    return true;
  }

  // A length-delimited value: its size in at most five bytes and below
  // 2^31 (protobuf's limits), then that many bytes.
  bool LengthDelimited(std::string_view* out) {
    uint64_t size;
    if (!Varint(&size, 5) || size > INT32_MAX || size > rest_.size()) {
      return false;
    }
    *out = rest_.substr(0, static_cast<size_t>(size));
    rest_.remove_prefix(static_cast<size_t>(size));
    return true;
  }

  // Skips the value of a field this decoder does not know (protobuf keeps
  // such fields as unknown ones and reads the rest of the message).
  bool SkipUnknown(int wire_type) {
    uint64_t ignored;
    std::string_view ignored_bytes;
    switch (wire_type) {
      case kVarint:
        return Varint(&ignored);
      case kFixed64:
        return Skip(8);
      case kLengthDelimited:
        return LengthDelimited(&ignored_bytes);
      case kFixed32:
        return Skip(4);
      default:
        return false;  // groups (and invalid wire types 6, 7)
    }
  }

 private:
  bool Skip(size_t n) {
    if (n > rest_.size()) return false;
    rest_.remove_prefix(n);
    return true;
  }

  std::string_view rest_;
};

// A proto3 string field's value: length-delimited, valid UTF-8.
bool ReadString(WireReader& in, int wire_type, std::string_view* out) {
  return wire_type == kLengthDelimited && in.LengthDelimited(out) &&
         base::IsValidUtf8(*out);
}

// Reads the message in `bytes` field by field: `read_field(in, field,
// wire_type)` reads each field's value from `in` (false: refuse the
// message). False when a tag cannot be read or a field was refused.
template <typename ReadField>
bool ReadFields(std::string_view bytes, ReadField read_field) {
  WireReader in(bytes);
  while (!in.done()) {
    uint32_t field;
    int wire_type;
    if (!in.Tag(&field, &wire_type) || !read_field(in, field, wire_type)) {
      return false;
    }
  }
  return true;
}

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
