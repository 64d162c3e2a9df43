// Protobuf wire primitives for the host's hand-written decoders
// (namespace_wire.h, side_wire.h): they read exactly what protobuf reads, or
// refuse (false) whatever protobuf might read differently, so a decoder
// built on them can leave doubtful bytes to protobuf.
#ifndef AGENTIX_HOST_PYTHON_NATIVE_PROTO_WIRE_H_
#define AGENTIX_HOST_PYTHON_NATIVE_PROTO_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/utf8.h"

namespace agentix::host::wire {

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

  // Eight little-endian bytes (a fixed64 / double field's value).
  bool Fixed64(uint64_t* out) {
    if (rest_.size() < 8) return false;
    uint64_t value = 0;
    for (int i = 7; i >= 0; --i) {
      value = (value << 8) | static_cast<uint8_t>(rest_[static_cast<size_t>(i)]);
    }
    *out = value;
    rest_.remove_prefix(8);
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
inline bool ReadString(WireReader& in, int wire_type, std::string_view* out) {
  return wire_type == kLengthDelimited && in.LengthDelimited(out) &&
         base::IsValidUtf8(*out);
}

// Reads the message in `bytes` field by field: `read_field(in, field,
// wire_type)` reads each field's value from `in` (false: refuse the
// message). False when a tag cannot be read or a field was refused.
template <typename ReadField>
inline bool ReadFields(std::string_view bytes, ReadField read_field) {
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

}  // namespace agentix::host::wire

#endif  // AGENTIX_HOST_PYTHON_NATIVE_PROTO_WIRE_H_
