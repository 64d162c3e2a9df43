// See namespace_wire.h. Field numbers are runtime.proto's.
#include "host/python/native/namespace_wire.h"

#include <cstdint>

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
         IsValidUtf8(*out);
}

// NamespaceError {1: type, 2: message, 3: status_code}: validated only.
bool CheckNamespaceError(std::string_view bytes) {
  WireReader in(bytes);
  while (!in.done()) {
    uint32_t field;
    int wire_type;
    if (!in.Tag(&field, &wire_type)) return false;
    std::string_view text;
    uint64_t number;
    bool ok;
    switch (field) {
      case 1:
      case 2:
        ok = ReadString(in, wire_type, &text);
        break;
      case 3:
        ok = wire_type == kVarint && in.Varint(&number);
        break;
      default:
        ok = in.SkipUnknown(wire_type);
    }
    if (!ok) return false;
  }
  return true;
}

// NamespaceEvent {1: event, 2: data, 3: request_id, 4: error}. A field
// given twice keeps its last value, as protobuf does.
bool DecodeNamespaceEvent(std::string_view bytes, NamespaceEventView* out) {
  WireReader in(bytes);
  while (!in.done()) {
    uint32_t field;
    int wire_type;
    if (!in.Tag(&field, &wire_type)) return false;
    std::string_view value;
    bool ok;
    switch (field) {
      case 1:
        ok = ReadString(in, wire_type, &out->event);
        break;
      case 2:
        ok = wire_type == kLengthDelimited && in.LengthDelimited(&out->data);
        break;
      case 3:
        ok = ReadString(in, wire_type, &value);
        break;
      case 4:
        ok = wire_type == kLengthDelimited && in.LengthDelimited(&value) &&
             CheckNamespaceError(value);
        break;
      default:
        ok = in.SkipUnknown(wire_type);
    }
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::optional<NamespaceResponseView> DecodeNamespaceResponse(
    std::string_view bytes) {
  // NamespaceResponse {1: namespace, 2: opened, 3: instance_id, 4: events}.
  NamespaceResponseView response;
  WireReader in(bytes);
  while (!in.done()) {
    uint32_t field;
    int wire_type;
    if (!in.Tag(&field, &wire_type)) return std::nullopt;
    std::string_view value;
    uint64_t number;
    bool ok;
    switch (field) {
      case 1:
      case 3:
        ok = ReadString(in, wire_type, &value);
        break;
      case 2:
        ok = wire_type == kVarint && in.Varint(&number);
        if (ok) response.opened = number != 0;
        break;
      case 4:
        ok = wire_type == kLengthDelimited && in.LengthDelimited(&value) &&
             DecodeNamespaceEvent(value, &response.events.emplace_back());
        break;
      default:
        ok = in.SkipUnknown(wire_type);
    }
    if (!ok) return std::nullopt;
  }
  return response;
}

bool IsValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t* const end = p + text.size();
  while (p < end) {
    const uint8_t lead = *p;
    if (lead < 0x80) {
      ++p;
      continue;
    }
    // The allowed range of the second byte depends on the lead byte
    // (RFC 3629, table 3-7 of the Unicode standard); later ones are
    // 0x80..0xBF.
    size_t length;
    uint8_t low = 0x80, high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;   // no overlong forms
      if (lead == 0xED) high = 0x9F;  // no surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;   // no overlong forms
      if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
    } else {
      return false;
    }
    if (static_cast<size_t>(end - p) < length) return false;
    if (p[1] < low || p[1] > high) return false;
    for (size_t i = 2; i < length; ++i) {
      if (p[i] < 0x80 || p[i] > 0xBF) return false;
    }
    p += length;
  }
  return true;
}

}  // namespace agentix::host
