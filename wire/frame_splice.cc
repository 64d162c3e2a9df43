#include "wire/frame_splice.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "google/protobuf/io/coded_stream.h"
#include "wire/frame_codec.h"
#include "absl/strings/str_cat.h"
#include "wire/wire_limits.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {
namespace {

using google::protobuf::Message;
using google::protobuf::io::CodedInputStream;
using runtime::v1::HostEvent;
using runtime::v1::SandboxEvent;

// Field numbers of agentix/runtime/v1/runtime.proto.
constexpr uint32_t kEventsField = 1;          // CallsRequest / CallsResponse
constexpr uint32_t kHostStartField = 1;       // HostEvent.start
constexpr uint32_t kHostChunkField = 2;       // HostEvent.argument_chunk
constexpr uint32_t kStartArgumentsField = 4;  // StartCall.arguments
constexpr uint32_t kChunkDataField = 2;       // ArgumentChunk / ResultChunk .data
constexpr uint32_t kLengthDelimited = 2;

// A varint of at most `max_bytes` bytes (protobuf reads tags and lengths
// in at most 5, other varints in at most 10).
bool ReadVarint(const char*& p, const char* end, uint64_t& value,
                int max_bytes = 10) {
  value = 0;
  for (int i = 0; i < max_bytes && p < end; ++i) {
    const uint8_t byte = static_cast<uint8_t>(*p++);
    value |= uint64_t{byte & 0x7Fu} << (7 * i);
    if (byte < 0x80) return true;
  }
  return false;
}

// One top-level field of a message: its number, wire type, and where it
// lies (`whole` the field with its tag, `payload` a LEN field's bytes).
struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  absl::string_view whole;
  absl::string_view payload;
};

// Reads the field at `p`; false for anything protobuf would have to
// refuse or recurse into (groups), which is then left to protobuf.
bool ReadField(const char*& p, const char* end, Field& field) {
  const char* start = p;
  uint64_t tag;
  if (!ReadVarint(p, end, tag, 5) || tag > UINT32_MAX || (tag >> 3) == 0) {
    return false;
  }
  field.number = static_cast<uint32_t>(tag >> 3);
  field.wire_type = static_cast<uint32_t>(tag & 7);
  uint64_t skip = 0;
  switch (field.wire_type) {
    case 0: {
      uint64_t ignored;
      if (!ReadVarint(p, end, ignored)) return false;
      break;
    }
    case 1:
      skip = 8;
      break;
    case 2:
      if (!ReadVarint(p, end, skip, 5) || skip > INT32_MAX) return false;
      break;
    case 5:
      skip = 4;
      break;
    default:
      return false;  // groups
  }
  if (skip > static_cast<uint64_t>(end - p)) return false;
  field.payload = absl::string_view(p, static_cast<size_t>(skip));
  p += skip;
  field.whole = absl::string_view(start, static_cast<size_t>(p - start));
  return true;
}

// Merges `bytes` into `message` as the nested message it is at `depth`
// (protobuf's recursion budget counted as in one parse of the whole).
bool MergeAt(Message& message, absl::string_view bytes, int depth) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                      static_cast<int>(bytes.size()));
  in.SetRecursionLimit(CodedInputStream::GetDefaultRecursionLimit() - depth);
  return message.MergePartialFromCodedStream(&in) &&
         in.ConsumedEntireMessage();
}

// The one LEN field `number` of kSpliceMinBytes or more in `message`, when
// every field there can be walked and it occurs once; else nullopt.
std::optional<Field> FindBulk(absl::string_view message, uint32_t number,
                              size_t min_bytes) {
  std::optional<Field> bulk;
  const char* p = message.data();
  const char* end = p + message.size();
  while (p < end) {
    Field field;
    if (!ReadField(p, end, field)) return std::nullopt;
    if (field.number != number) continue;
    if (bulk || field.wire_type != kLengthDelimited) return std::nullopt;
    bulk = field;
  }
  if (!bulk || bulk->payload.size() < min_bytes) return std::nullopt;
  return bulk;
}

// Parses one HostEvent's bytes into `event`, leaving its bulk field out
// when it can; false when protobuf would refuse them.
bool ParseEvent(absl::string_view bytes, HostEvent& event,
                std::optional<std::string_view>& bulk, size_t min_bytes) {
  bulk.reset();
  const char* p = bytes.data();
  const char* end = p + bytes.size();
  Field outer;
  if (ReadField(p, end, outer) && p == end &&
      outer.wire_type == kLengthDelimited &&
      (outer.number == kHostStartField || outer.number == kHostChunkField)) {
    const bool start = outer.number == kHostStartField;
    if (std::optional<Field> field = FindBulk(
            outer.payload, start ? kStartArgumentsField : kChunkDataField,
            min_bytes)) {
      Message& inner = start ? static_cast<Message&>(*event.mutable_start())
                             : *event.mutable_argument_chunk();
      const char* inner_begin = outer.payload.data();
      const char* inner_end = inner_begin + outer.payload.size();
      const char* cut_begin = field->whole.data();
      const char* cut_end = cut_begin + field->whole.size();
      // Depth 2: CallsRequest > HostEvent > this message.
      if (!MergeAt(inner,
                   absl::string_view(inner_begin,
                                     static_cast<size_t>(cut_begin - inner_begin)),
                   2) ||
          !MergeAt(inner,
                   absl::string_view(cut_end,
                                     static_cast<size_t>(inner_end - cut_end)),
                   2)) {
        return false;
      }
      bulk = std::string_view(field->payload.data(), field->payload.size());
      return true;
    }
  }
  return MergeAt(event, bytes, 1);
}

bool ParseWhole(absl::string_view bytes, SplicedRequest& out) {
  out.request.Clear();
  if (!out.request.ParseFromArray(bytes.data(),
                                  static_cast<int>(bytes.size()))) {
    out.request.Clear();  // not half a message
    out.bulk.clear();
    return false;
  }
  out.bulk.assign(static_cast<size_t>(out.request.events_size()),
                  std::nullopt);
  return true;
}

void AppendVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void AppendLengthHeader(std::string& out, uint32_t field, size_t length) {
  out.push_back(static_cast<char>(field << 3 | kLengthDelimited));
  AppendVarint(out, length);
}

// An event AppendMessagePieces writes around its bulk bytes: `head` (the
// event's bytes up to the bulk field's own, tag and length included),
// `data`, `tail` (the fields after it).
struct Spliced {
  std::string head;
  absl::string_view data;
  std::string tail;
};

// `inner` (the SandboxEvent's field `outer_field`) serialized around its
// bytes field `data` (field `data_field`): `before` holds inner's fields
// numbered below data_field, `after` those above. The result is checked
// against the event's size, so anything protobuf would write differently
// (unknown fields, say) stays on protobuf's path.
std::optional<Spliced> Around(uint32_t outer_field, const Message& before,
                              uint32_t data_field, const std::string& data,
                              const Message& after, size_t event_size) {
  Spliced out;
  const size_t inner_size = before.ByteSizeLong() +
                            FramedItemBytes(data.size()) + after.ByteSizeLong();
  if (FramedItemBytes(inner_size) != event_size) return std::nullopt;
  AppendLengthHeader(out.head, outer_field, inner_size);
  before.AppendToString(&out.head);
  AppendLengthHeader(out.head, data_field, data.size());
  out.data = data;
  after.AppendToString(&out.tail);
  return out;
}

// Result chunks, results and stream items with kSpliceMinBytes or more of
// data (field numbers of runtime.proto; all below 16, one-byte tags).
std::optional<Spliced> SpliceEvent(const SandboxEvent& event,
                                   size_t event_size) {
  if (event.has_result_chunk()) {
    const auto& chunk = event.result_chunk();
    if (chunk.data().size() < kSpliceMinBytes) return std::nullopt;
    runtime::v1::ResultChunk before;
    before.set_call_id(chunk.call_id());
    return Around(1, before, 2, chunk.data(), runtime::v1::ResultChunk(),
                  event_size);
  }
  if (event.has_result()) {
    const auto& result = event.result();
    if (result.value().size() < kSpliceMinBytes) return std::nullopt;
    runtime::v1::CallResult before, after;
    before.set_call_id(result.call_id());
    before.set_encoding(result.encoding());
    after.set_value_size(result.value_size());
    after.set_log_seq(result.log_seq());
    after.set_trace_seq(result.trace_seq());
    return Around(2, before, 3, result.value(), after, event_size);
  }
  if (event.has_stream_item()) {
    const auto& item = event.stream_item();
    if (item.value().size() < kSpliceMinBytes) return std::nullopt;
    runtime::v1::StreamItem before, after;
    before.set_call_id(item.call_id());
    before.set_index(item.index());
    before.set_encoding(item.encoding());
    after.set_log_seq(item.log_seq());
    after.set_trace_seq(item.trace_seq());
    return Around(4, before, 4, item.value(), after, event_size);
  }
  return std::nullopt;
}

// One HostEvent whose bulk field's bytes are `data`, left out of `bytes`
// at offset `cut` (the event's bytes as they came, the field's tag and
// length included, its content not).
absl::Status ParseEventWithPiece(absl::string_view bytes, size_t cut,
                                 std::string_view data, HostEvent& event) {
  const char* const begin = bytes.data();
  const char* const end = begin + bytes.size();
  const char* p = begin;
  uint64_t tag = 0, length = 0;
  if (!ReadVarint(p, end, tag, 5) || (tag & 7) != kLengthDelimited ||
      ((tag >> 3) != kHostStartField && (tag >> 3) != kHostChunkField) ||
      !ReadVarint(p, end, length, 5) ||
      length != static_cast<uint64_t>(end - p) + data.size()) {
    return absl::InvalidArgumentError(
        "a ring piece lies in an event that is not exactly one StartCall or "
        "ArgumentChunk");
  }
  const bool start = (tag >> 3) == kHostStartField;
  const uint32_t bulk_number = start ? kStartArgumentsField : kChunkDataField;
  const char* const inner_begin = p;
  const char* cut_begin = nullptr;
  const char* cut_end = nullptr;
  while (p < end) {
    const char* const field_start = p;
    uint64_t field_tag = 0, field_length = 0;
    if (!ReadVarint(p, end, field_tag, 5)) break;
    const char* q = p;
    if ((field_tag & 7) == kLengthDelimited &&
        ReadVarint(q, end, field_length, 5) &&
        static_cast<size_t>(q - begin) == cut) {
      if ((field_tag >> 3) != bulk_number || field_length != data.size() ||
          cut_begin != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a ring piece of ", data.size(), " bytes is not the ",
            start ? "StartCall.arguments" : "ArgumentChunk.data",
            " field it stands in"));
      }
      cut_begin = field_start;
      cut_end = p = q;
      continue;
    }
    p = field_start;
    Field field;
    if (!ReadField(p, end, field)) {
      return absl::InvalidArgumentError(
          "an event with a ring piece is not a valid protobuf encoding");
    }
    if (field.number == bulk_number ||
        (static_cast<size_t>(field_start - begin) < cut &&
         cut < static_cast<size_t>(p - begin))) {
      return absl::InvalidArgumentError(
          "a ring piece lies inside another field, or its field is repeated");
    }
  }
  if (cut_begin == nullptr) {
    return absl::InvalidArgumentError(
        "a ring piece is not at its event's bulk field");
  }
  Message& inner = start ? static_cast<Message&>(*event.mutable_start())
                         : *event.mutable_argument_chunk();
  // Depth 2: CallsRequest > HostEvent > this message.
  if (!MergeAt(inner,
               absl::string_view(inner_begin,
                                 static_cast<size_t>(cut_begin - inner_begin)),
               2) ||
      !MergeAt(inner,
               absl::string_view(cut_end, static_cast<size_t>(end - cut_end)),
               2)) {
    return absl::InvalidArgumentError(
        "an event with a ring piece is not a valid protobuf encoding");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseCallsRequestWithRing(absl::string_view bytes,
                                       const std::vector<RingPiece>& pieces,
                                       SplicedRequest& out) {
  out.request.Clear();
  out.bulk.clear();
  auto fail = [&out](absl::Status status) {
    out.request.Clear();
    out.bulk.clear();
    return status;
  };
  const char* const begin = bytes.data();
  const char* const end = begin + bytes.size();
  const char* p = begin;
  size_t next = 0;  // the next piece not yet placed
  while (p < end) {
    uint64_t tag = 0, length = 0;
    if (!ReadVarint(p, end, tag, 5) || tag >> 3 != kEventsField ||
        (tag & 7) != kLengthDelimited || !ReadVarint(p, end, length, 5) ||
        length > INT32_MAX) {
      return fail(absl::InvalidArgumentError(
          "a CallsRequest with ring pieces holds only events"));
    }
    const size_t offset = static_cast<size_t>(p - begin);
    const size_t left = static_cast<size_t>(end - p);
    std::optional<std::string_view> bulk;
    HostEvent* event = out.request.add_events();
    if (next < pieces.size() && pieces[next].at >= offset &&
        pieces[next].data.size() <= length &&
        pieces[next].at - offset <= length - pieces[next].data.size()) {
      // The event holds this piece: its bytes here are the rest of it.
      const RingPiece& piece = pieces[next++];
      const size_t here = static_cast<size_t>(length) - piece.data.size();
      if (here > left) {
        return fail(absl::InvalidArgumentError(
            "a CallsRequest with ring pieces is truncated"));
      }
      absl::Status parsed = ParseEventWithPiece(
          absl::string_view(p, here), piece.at - offset, piece.data, *event);
      if (!parsed.ok()) return fail(parsed);
      bulk = piece.data;
      p += here;
    } else {
      if (length > left) {
        return fail(absl::InvalidArgumentError(
            "a CallsRequest with ring pieces is truncated"));
      }
      if (!ParseEvent(absl::string_view(p, static_cast<size_t>(length)),
                      *event, bulk, kSpliceMinBytes)) {
        return fail(absl::InvalidArgumentError(
            "a CallsRequest with ring pieces is not a valid protobuf "
            "encoding"));
      }
      p += length;
    }
    out.bulk.push_back(bulk);
  }
  if (next != pieces.size()) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        pieces.size() - next, " ring piece(s) are not in any event")));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParseRingMessage(absl::string_view payload,
                                          size_t max_message_bytes,
                                          const ipc::PayloadArea& ring,
                                          std::vector<RingPiece>& pieces,
                                          SplicedRequest& out) {
  absl::StatusOr<RingMessage> message =
      DecodeRingMessage(payload, max_message_bytes);
  if (!message.ok()) return message.status();
  pieces.clear();
  uint64_t end = 0;
  for (const RingPieceRef& ref : message->pieces) {
    // Pieces come in ring order: one before the end of the previous one
    // overlaps it (Get refuses what was released already).
    if (ref.pos < end) {
      return absl::InvalidArgumentError(
          absl::StrCat("ring piece at ", ref.pos,
                       " overlaps the one before it (ending at ", end, ")"));
    }
    absl::StatusOr<std::string_view> data = ring.Get(ref.pos, ref.size);
    if (!data.ok()) return data.status();
    pieces.push_back({ref.at, *data});
    end = ref.pos + ref.size;
  }
  absl::Status parsed = ParseCallsRequestWithRing(message->bytes, pieces, out);
  if (!parsed.ok()) return parsed;
  return end;
}

bool ParseCallsRequestSpliced(absl::string_view bytes, SplicedRequest& out,
                              size_t min_bytes) {
  // Small messages hold no bulk field worth splicing: protobuf as before.
  if (bytes.size() < min_bytes) return ParseWhole(bytes, out);
  out.request.Clear();
  out.bulk.clear();
  const char* p = bytes.data();
  const char* end = p + bytes.size();
  while (p < end) {
    Field field;
    if (!ReadField(p, end, field) || field.number != kEventsField ||
        field.wire_type != kLengthDelimited) {
      return ParseWhole(bytes, out);  // unknown fields, or malformed
    }
    std::optional<std::string_view> bulk;
    if (!ParseEvent(field.payload, *out.request.add_events(), bulk,
                    min_bytes)) {
      return ParseWhole(bytes, out);  // refused as protobuf refuses it
    }
    out.bulk.push_back(bulk);
  }
  return true;
}

bool HasBulk(const std::vector<SandboxEventPtr>& events) {
  for (const SandboxEventPtr& event : events) {
    if ((event->has_result_chunk() &&
         event->result_chunk().data().size() >= kSpliceMinBytes) ||
        (event->has_result() &&
         event->result().value().size() >= kSpliceMinBytes) ||
        (event->has_stream_item() &&
         event->stream_item().value().size() >= kSpliceMinBytes)) {
      return true;
    }
  }
  return false;
}

void AppendMessagePieces(const std::vector<SandboxEventPtr>& events,
                         std::deque<OutPiece>& out, ipc::PayloadArea* ring) {
  size_t i = 0;
  while (i < events.size()) {
    // The batch [i, j): as many events as fit kMaxBatchBytes (at least one).
    size_t j = i;
    size_t bytes = 0;
    for (; j < events.size(); ++j) {
      const size_t framed = FramedItemBytes(events[j]->ByteSizeLong());
      if (j > i && bytes + framed > kMaxBatchBytes) break;
      bytes += framed;
    }
    // The frame's pieces; the first starts with room for its header, and
    // `written` counts their bytes after it.
    std::deque<OutPiece> frame;
    std::vector<RingPieceRef> in_ring;
    size_t written = 0;
    std::string current(kFrameHeaderBytes, '\0');
    size_t header = kFrameHeaderBytes;  // of `current`: not counted
    for (size_t k = i; k < j; ++k) {
      const SandboxEvent& event = *events[k];
      const size_t size = event.GetCachedSize();  // ByteSizeLong above
      AppendLengthHeader(current, kEventsField, size);
      if (std::optional<Spliced> spliced = SpliceEvent(event, size)) {
        // The bytes protobuf writes for it, the data's own left in place.
        current += spliced->head;
        std::optional<uint64_t> pos;
        if (ring != nullptr && in_ring.size() < kMaxRingPieces) {
          pos = ring->Put(
              std::string_view(spliced->data.data(), spliced->data.size()));
        }
        if (pos.has_value()) {
          in_ring.push_back(
              {static_cast<uint32_t>(written + current.size() - header), *pos,
               spliced->data.size()});
        } else {
          written += current.size() - header;
          header = 0;
          frame.emplace_back(std::move(current), /*frame_end=*/false);
          written += spliced->data.size();
          frame.emplace_back(events[k], spliced->data, /*frame_end=*/false);
          current.clear();
        }
        current += spliced->tail;
      } else {
        const size_t at = current.size();
        current.resize(at + size);
        event.SerializeWithCachedSizesToArray(
            reinterpret_cast<uint8_t*>(current.data() + at));
      }
    }
    if (!current.empty()) {
      written += current.size() - header;
      frame.emplace_back(std::move(current), /*frame_end=*/false);
    }
    std::string* first = frame.front().owned();
    if (in_ring.empty()) {
      EncodeFrameHeader(FrameKind::kMessage, static_cast<uint32_t>(bytes),
                        first->data());
    } else {
      // A RING_MESSAGE: the pieces' places go between header and bytes.
      std::string head(kFrameHeaderBytes, '\0');
      head += EncodeRingHead(in_ring);
      EncodeFrameHeader(FrameKind::kRingMessage,
                        static_cast<uint32_t>(head.size() - kFrameHeaderBytes +
                                              written),
                        head.data());
      first->replace(0, kFrameHeaderBytes, head);
    }
    frame.back().set_frame_end();
    for (OutPiece& piece : frame) out.push_back(std::move(piece));
    i = j;
  }
}

void OutQueue::Push(OutPiece piece) {
  bytes_ += piece.bytes().size();
  pieces_.push_back(std::move(piece));
}

size_t OutQueue::Gather(iovec* iov, size_t max) const {
  size_t count = 0;
  for (auto it = pieces_.begin(); it != pieces_.end() && count < max;
       ++it, ++count) {
    const size_t skip = count == 0 ? front_written_ : 0;
    const absl::string_view bytes = it->bytes();
    iov[count].iov_base = const_cast<char*>(bytes.data()) + skip;
    iov[count].iov_len = bytes.size() - skip;
  }
  return count;
}

void OutQueue::Consume(size_t n) {
  bytes_ -= n;
  while (n > 0) {
    const size_t left = pieces_.front().bytes().size() - front_written_;
    if (n < left) {
      front_written_ += n;
      return;
    }
    n -= left;
    mid_frame_ = !pieces_.front().frame_end();
    pieces_.pop_front();
    front_written_ = 0;
  }
}

void OutQueue::Drop(bool keep_partial_frame) {
  size_t kept = 0;
  size_t kept_bytes = 0;
  if (keep_partial_frame && (front_written_ > 0 || mid_frame_)) {
    for (const OutPiece& piece : pieces_) {
      ++kept;
      kept_bytes += piece.bytes().size();
      if (piece.frame_end()) break;
    }
    kept_bytes -= std::min(kept_bytes, front_written_);
  }
  if (kept == 0) {
    front_written_ = 0;
    mid_frame_ = false;
  }
  pieces_.erase(pieces_.begin() + static_cast<std::ptrdiff_t>(kept),
                pieces_.end());
  bytes_ = kept_bytes;
}

}  // namespace agentix::sandbox
