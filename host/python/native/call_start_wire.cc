#include "host/python/native/call_start_wire.h"

#include <cstring>

namespace agentix::host {
namespace {

// Tags (field number << 3 | wire type), as wire.py's.
constexpr uint8_t kEvents = 1 << 3 | 2;        // CallsRequest.events
constexpr uint8_t kHostStart = 1 << 3 | 2;     // HostEvent.start
constexpr uint8_t kHostAck = 5 << 3 | 2;       // HostEvent.ack
constexpr uint8_t kAckCallId = 1 << 3 | 2;     // AckResult.call_id
constexpr uint8_t kStartCallId = 1 << 3 | 2;   // StartCall.call_id
constexpr uint8_t kStartArguments = 4 << 3 | 2;
constexpr uint8_t kStartArgumentsSize = 5 << 3 | 0;
constexpr uint8_t kStartContext = 6 << 3 | 2;
constexpr uint8_t kStartStreamWindow = 7 << 3 | 0;

size_t VarintSize(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

// A length-delimited field's tag, length and bytes; nothing when empty.
size_t FieldSize(std::string_view value) {
  return value.empty() ? 0 : 1 + VarintSize(value.size()) + value.size();
}

// A length-delimited field of `body` bytes: its tag, length and body.
size_t DelimitedSize(size_t body) { return 1 + VarintSize(body) + body; }

// One CallsRequest.events entry whose HostEvent holds a `body`-byte message.
size_t EventSize(size_t body) { return DelimitedSize(DelimitedSize(body)); }

size_t StartSize(const StartCallParts& start) {
  size_t size = FieldSize(start.call_id) + start.callable_fields.size() + FieldSize(start.arguments);
  if (!start.arguments.empty()) size += 1 + VarintSize(start.arguments.size());
  size += start.context_is_fields ? start.context.size() : FieldSize(start.context);
  if (start.stream_window != 0) size += 1 + VarintSize(start.stream_window);
  return size;
}

class Writer {
 public:
  explicit Writer(char* out) : out_(out) {}
  size_t written() const { return static_cast<size_t>(at_ - out_); }
  void Byte(uint8_t byte) { *at_++ = static_cast<char>(byte); }
  void Varint(uint64_t value) {
    while (value >= 0x80) {
      Byte(static_cast<uint8_t>(value | 0x80));
      value >>= 7;
    }
    Byte(static_cast<uint8_t>(value));
  }
  void Raw(std::string_view bytes) {
    if (!bytes.empty()) std::memcpy(at_, bytes.data(), bytes.size());
    at_ += bytes.size();
  }
  // The head of an events entry (EventSize's) whose HostEvent field `kind`
  // holds `body` bytes, which follow.
  void Event(uint8_t kind, size_t body) {
    Byte(kEvents);
    Varint(DelimitedSize(body));
    Byte(kind);
    Varint(body);
  }
  void Field(uint8_t tag, std::string_view value) {
    if (value.empty()) return;
    Byte(tag);
    Varint(value.size());
    Raw(value);
  }

 private:
  char* out_;
  char* at_ = out_;
};

size_t PayloadSize(const std::vector<std::string_view>& ack_ids, const StartCallParts& start) {
  size_t size = 0;
  for (std::string_view id : ack_ids) size += EventSize(FieldSize(id));
  return size + EventSize(StartSize(start));
}

}  // namespace

size_t CallsRequestSize(const std::vector<std::string_view>& ack_ids, const StartCallParts& start,
                        uint8_t frame_kind) {
  return (frame_kind != 0 ? kFrameHeaderBytes : 0) + PayloadSize(ack_ids, start);
}

size_t EncodeCallsRequest(const std::vector<std::string_view>& ack_ids, const StartCallParts& start,
                          uint8_t frame_kind, char* out) {
  Writer w(out);
  if (frame_kind != 0) {
    const size_t payload = PayloadSize(ack_ids, start);
    for (int i = 0; i < 4; ++i) w.Byte(static_cast<uint8_t>(payload >> (8 * i)));
    w.Byte(frame_kind);
  }
  for (std::string_view id : ack_ids) {
    w.Event(kHostAck, FieldSize(id));
    w.Field(kAckCallId, id);
  }
  w.Event(kHostStart, StartSize(start));
  w.Field(kStartCallId, start.call_id);
  w.Raw(start.callable_fields);
  w.Field(kStartArguments, start.arguments);
  if (!start.arguments.empty()) {
    w.Byte(kStartArgumentsSize);
    w.Varint(start.arguments.size());
  }
  if (start.context_is_fields) {
    w.Raw(start.context);
  } else {
    w.Field(kStartContext, start.context);
  }
  if (start.stream_window != 0) {
    w.Byte(kStartStreamWindow);
    w.Varint(start.stream_window);
  }
  return w.written();
}

}  // namespace agentix::host
