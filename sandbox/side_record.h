// SideRecord: one buffered log record or trace event (a SeqBuffer Record) as
// the Logs and Traces streams write it: the fields the daemon owns (seq,
// worker_id) and the rest of the message as bytes (the worker's checked
// fields, then a trace event's OpenTelemetry ids), serialized as
// runtime.proto's LogRecord / TraceEvent. No protobuf message per record:
// one was three heap blocks more per record (its unknown-field container,
// its worker_id string, a span's ids appended by a reallocation) than this
// struct, which lives inside its shared_ptr's block with the body's string.
// SideResponse: the LogsResponse / TracesResponse a stream writes, borrowing
// its records.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace agentix::sandbox {

namespace wire_encoding {

// Protobuf's wire encoding, as much as these messages need.
inline size_t VarintSize(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}
inline char* PutVarint(uint64_t value, char* out) {
  while (value >= 0x80) {
    *out++ = static_cast<char>(value | 0x80);
    value >>= 7;
  }
  *out++ = static_cast<char>(value);
  return out;
}
// A length-delimited field's tag (wire type 2).
constexpr uint64_t BytesTag(uint32_t number) { return (uint64_t{number} << 3) | 2; }
// The bytes of a length-delimited field holding `size` bytes.
inline size_t FieldBytes(uint32_t number, size_t size) {
  return VarintSize(BytesTag(number)) + VarintSize(size) + size;
}
inline char* PutBytesField(uint32_t number, std::string_view value, char* out) {
  out = PutVarint(BytesTag(number), out);
  out = PutVarint(value.size(), out);
  std::memcpy(out, value.data(), value.size());
  return out + value.size();
}

}  // namespace wire_encoding

// `kWorkerIdField`: worker_id's field number (LogRecord 13, TraceEvent 19);
// `kMaxSuffix`: bytes the daemon may add behind the body (a trace event's
// three encoded ids).
template <uint32_t kWorkerIdField, size_t kMaxSuffix>
class SideRecord {
 public:
  SideRecord() = default;
  // `body`: message fields other than seq and worker_id (which it must not
  // carry: the daemon checks), moved in; `suffix` (at most kMaxSuffix
  // bytes) is written after it.
  explicit SideRecord(std::string body, std::string_view suffix = {})
      : body_(std::move(body)), suffix_size_(static_cast<uint8_t>(suffix.size())) {
    static_assert(kMaxSuffix < 256);
    if constexpr (kMaxSuffix > 0) {
      if (!suffix.empty()) std::memcpy(suffix_.data(), suffix.data(), suffix.size());
    }
  }

  uint64_t seq() const { return seq_; }
  void set_seq(uint64_t seq) { seq_ = seq; }
  const std::string& worker_id() const { return worker_id_; }
  // Empty: no field (as proto3 leaves an empty string out).
  void set_worker_id(const std::string& id) { worker_id_ = id; }
  const std::string& body() const { return body_; }
  std::string_view suffix() const {
    if constexpr (kMaxSuffix > 0) return {suffix_.data(), suffix_size_};
    return {};
  }

  // Serialized bytes of the message (without its own tag and length).
  size_t ByteSize() const {
    size_t n = body_.size() + suffix_size_;
    if (seq_ != 0) n += 1 + wire_encoding::VarintSize(seq_);
    if (!worker_id_.empty()) n += wire_encoding::FieldBytes(kWorkerIdField, worker_id_.size());
    return n;
  }
  // Writes the message (ByteSize() bytes) at `out`; returns its end. seq,
  // worker_id, the body, the suffix: the order protobuf gave the same
  // fields when these were messages with the body as unknown fields.
  char* SerializeTo(char* out) const {
    if (seq_ != 0) {
      *out++ = '\x08';  // seq = 1, varint
      out = wire_encoding::PutVarint(seq_, out);
    }
    if (!worker_id_.empty()) {
      out = wire_encoding::PutBytesField(kWorkerIdField, worker_id_, out);
    }
    std::memcpy(out, body_.data(), body_.size());
    out += body_.size();
    if constexpr (kMaxSuffix > 0) {
      std::memcpy(out, suffix_.data(), suffix_size_);
      out += suffix_size_;
    }
    return out;
  }
  std::string SerializeAsString() const {
    std::string out(ByteSize(), '\0');
    SerializeTo(out.data());
    return out;
  }

 private:
  uint64_t seq_ = 0;
  std::string worker_id_;
  std::string body_;
  std::array<char, kMaxSuffix> suffix_;
  uint8_t suffix_size_ = 0;
};

// The three OpenTelemetry ids a trace event may carry, encoded: a one-byte
// tag and length each, and 16 + 8 + 8 bytes.
inline constexpr size_t kOtelIdsBytes = 3 * 2 + 16 + 8 + 8;

// runtime.v1.LogRecord and runtime.v1.TraceEvent as buffered.
using LogRecordWire = SideRecord<13, 0>;
using TraceEventWire = SideRecord<19, kOtelIdsBytes>;

// LogsResponse / TracesResponse (records = 1, instance_id = 2), holding
// pointers to records that must outlive its serialization.
template <typename Record>
struct SideResponse {
  std::vector<const Record*> records;
  std::string instance_id;

  size_t ByteSizeLong() const {
    size_t n = 0;
    for (const Record* r : records) n += wire_encoding::FieldBytes(1, r->ByteSize());
    if (!instance_id.empty()) n += wire_encoding::FieldBytes(2, instance_id.size());
    return n;
  }
  // Writes ByteSizeLong() bytes at `out` (records, then instance_id, as
  // protobuf orders them); returns the end.
  char* SerializeTo(char* out) const {
    for (const Record* r : records) {
      *out++ = '\x0a';  // records = 1, length-delimited
      out = wire_encoding::PutVarint(r->ByteSize(), out);
      out = r->SerializeTo(out);
    }
    if (!instance_id.empty()) out = wire_encoding::PutBytesField(2, instance_id, out);
    return out;
  }
  std::string SerializeAsString() const {
    std::string out(ByteSizeLong(), '\0');
    SerializeTo(out.data());
    return out;
  }
};

using LogsResponseWire = SideResponse<LogRecordWire>;
using TracesResponseWire = SideResponse<TraceEventWire>;

}  // namespace agentix::sandbox
