// Wire limits: every message the daemon writes on a RuntimeService stream
// fits gRPC's default 4 MiB receive limit, framing included, so that a
// client in any language reads it without raising its limit. The batching
// writer caps messages; producers cap single items (kMaxWireItemBytes).
#pragma once

#include <cstddef>
#include <string>

namespace agentix::sandbox {

// gRPC's default receive limit in every stack (grpc-js, grpc++, Python,
// Go): a message larger than this breaks a default client's whole stream.
inline constexpr size_t kDefaultClientMessageLimit = 4u << 20;
// gRPC frames each message with a 5-byte prefix (flag + length).
inline constexpr size_t kGrpcFramePrefixBytes = 5;
// The largest serialized message the daemon writes on a stream.
inline constexpr size_t kMaxBatchBytes =
    kDefaultClientMessageLimit - kGrpcFramePrefixBytes;
// The largest item (event, record) a producer may hand a stream writer:
// room is left for the message's header fields (instance id, namespace)
// and the item's own tag and length.
inline constexpr size_t kMaxWireItemBytes = kMaxBatchBytes - 4096;

// The bytes an item of `size` adds to a message as an element of a repeated
// message field numbered below 16: a one-byte tag, its varint length, itself.
inline constexpr size_t FramedItemBytes(size_t size) {
  size_t varint = 1;
  for (size_t v = size; v >= 0x80; v >>= 7) ++varint;
  return 1 + varint + size;
}

// Cuts `text` to at most `max_bytes` on a UTF-8 character boundary and
// appends a note of how much was cut; unchanged when it fits.
inline void TruncateForWire(std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return;
  const size_t original = text.size();
  size_t cut = max_bytes > 64 ? max_bytes - 64 : 0;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  text.resize(cut);
  text += " ... [truncated: ";
  text += std::to_string(original - cut);
  text += " more bytes]";
}

}  // namespace agentix::sandbox
