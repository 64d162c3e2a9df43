// See side_wire.h. Field numbers are runtime.proto's.
#include "host/python/native/side_wire.h"

#include <cstring>

#include "host/python/native/proto_wire.h"

namespace agentix::host {
namespace {

using wire::kFixed64;
using wire::kLengthDelimited;
using wire::kVarint;
using wire::ReadFields;
using wire::ReadString;
using wire::WireReader;

// Scalar fields as protobuf reads them: a field given twice keeps its last
// value; int32 and enum fields keep the low 32 bits of the varint.
bool ReadUint64(WireReader& in, int wire_type, uint64_t* out) {
  return wire_type == kVarint && in.Varint(out);
}

bool ReadInt64(WireReader& in, int wire_type, int64_t* out) {
  uint64_t value;
  if (wire_type != kVarint || !in.Varint(&value)) return false;
  *out = static_cast<int64_t>(value);
  return true;
}

bool ReadInt32(WireReader& in, int wire_type, int32_t* out) {
  uint64_t value;
  if (wire_type != kVarint || !in.Varint(&value)) return false;
  *out = static_cast<int32_t>(static_cast<uint32_t>(value));
  return true;
}

bool ReadBytes(WireReader& in, int wire_type, std::string_view* out) {
  return wire_type == kLengthDelimited && in.LengthDelimited(out);
}

// AttributeValue {oneof value: 1 string, 2 bool, 3 int64, 4 double,
// 5 bytes}, merged into `out` (protobuf merges a message field given
// twice: a later member replaces the set one, an empty message changes
// nothing).
bool MergeAttributeValue(std::string_view bytes, AttributeView* out) {
  return ReadFields(bytes, [out](WireReader& in, uint32_t field,
                                 int wire_type) {
    uint64_t number;
    switch (field) {
      case 1:
        out->kind = AttributeView::Kind::kString;
        return ReadString(in, wire_type, &out->text);
      case 2:
        if (wire_type != kVarint || !in.Varint(&number)) return false;
        out->kind = AttributeView::Kind::kBool;
        out->integer = number != 0;
        return true;
      case 3:
        out->kind = AttributeView::Kind::kInt;
        return ReadInt64(in, wire_type, &out->integer);
      case 4:
        if (wire_type != kFixed64 || !in.Fixed64(&number)) return false;
        out->kind = AttributeView::Kind::kDouble;
        std::memcpy(&out->number, &number, sizeof number);
        return true;
      case 5:
        out->kind = AttributeView::Kind::kBytes;
        return ReadBytes(in, wire_type, &out->text);
      default:
        return in.SkipUnknown(wire_type);
    }
  });
}

// Attribute {1: key, 2: value}.
bool DecodeAttribute(std::string_view bytes, AttributeView* out) {
  return ReadFields(bytes, [out](WireReader& in, uint32_t field,
                                 int wire_type) {
    std::string_view value;
    switch (field) {
      case 1:
        return ReadString(in, wire_type, &out->key);
      case 2:
        return ReadBytes(in, wire_type, &value) &&
               MergeAttributeValue(value, out);
      default:
        return in.SkipUnknown(wire_type);
    }
  });
}

// A repeated Attribute field's next element.
bool AppendAttribute(WireReader& in, int wire_type,
                     std::vector<AttributeView>* out) {
  std::string_view bytes;
  return ReadBytes(in, wire_type, &bytes) &&
         DecodeAttribute(bytes, &out->emplace_back());
}

// SpanEventRecord {1: name, 2: time_unix_nanos, 3: attributes}.
bool DecodeSpanEvent(std::string_view bytes, SpanEventView* out) {
  return ReadFields(bytes, [out](WireReader& in, uint32_t field,
                                 int wire_type) {
    switch (field) {
      case 1:
        return ReadString(in, wire_type, &out->name);
      case 2:
        return ReadInt64(in, wire_type, &out->time_unix_nanos);
      case 3:
        return AppendAttribute(in, wire_type, &out->attributes);
      default:
        return in.SkipUnknown(wire_type);
    }
  });
}

bool DecodeLogRecord(std::string_view bytes, LogRecordView* out) {
  return ReadFields(bytes, [out](WireReader& in, uint32_t field,
                                 int wire_type) {
    switch (field) {
      case 1:
        return ReadUint64(in, wire_type, &out->seq);
      case 2:
        return ReadString(in, wire_type, &out->logger);
      case 3:
        return ReadInt32(in, wire_type, &out->level);
      case 4:
        return ReadString(in, wire_type, &out->level_name);
      case 5:
        return ReadString(in, wire_type, &out->message);
      case 6:
        return ReadInt64(in, wire_type, &out->time_unix_nanos);
      case 7:
        return ReadString(in, wire_type, &out->file);
      case 8:
        return ReadInt32(in, wire_type, &out->line);
      case 9:
        return ReadString(in, wire_type, &out->function);
      case 10:
        return ReadString(in, wire_type, &out->module);
      case 11:
        return ReadString(in, wire_type, &out->exception_text);
      case 12:
        return ReadInt32(in, wire_type, &out->origin);
      case 13:
        return ReadString(in, wire_type, &out->worker_id);
      case 14:
        return ReadString(in, wire_type, &out->call_id);
      case 15:
        return ReadString(in, wire_type, &out->context);
      case 16:
        return ReadBytes(in, wire_type, &out->extras);
      case 17:
        return ReadString(in, wire_type, &out->stack_info);
      default:
        return in.SkipUnknown(wire_type);
    }
  });
}

bool DecodeTraceEvent(std::string_view bytes, TraceEventView* out) {
  return ReadFields(bytes, [out](WireReader& in, uint32_t field,
                                 int wire_type) {
    std::string_view ignored;
    switch (field) {
      case 1:
        return ReadUint64(in, wire_type, &out->seq);
      case 2:
        return ReadInt32(in, wire_type, &out->kind);
      case 3:
      case 4:
      case 5:
        return ReadBytes(in, wire_type, &ignored);
      case 6:
        return ReadString(in, wire_type, &out->agentix_trace_id);
      case 7:
        return ReadString(in, wire_type, &out->agentix_span_id);
      case 8:
        return ReadString(in, wire_type, &out->agentix_parent_id);
      case 9:
        return ReadString(in, wire_type, &out->name);
      case 10:
        return ReadInt64(in, wire_type, &out->start_time_unix_nanos);
      case 11:
        return ReadInt64(in, wire_type, &out->end_time_unix_nanos);
      case 12:
        return AppendAttribute(in, wire_type, &out->attributes);
      case 13: {
        std::string_view value;
        return ReadBytes(in, wire_type, &value) &&
               DecodeSpanEvent(value, &out->events.emplace_back());
      }
      case 14:
        return ReadInt32(in, wire_type, &out->status);
      case 15:
        return ReadString(in, wire_type, &out->status_description);
      case 16:
        return ReadString(in, wire_type, &out->error_message);
      case 17:
        return AppendAttribute(in, wire_type, &out->error_data);
      case 18:
        return ReadString(in, wire_type, &out->call_id);
      case 19:
        return ReadString(in, wire_type, &out->worker_id);
      default:
        return in.SkipUnknown(wire_type);
    }
  });
}

// {1: repeated Item, 2: instance_id}, the shape of both responses, into
// *out (its items' capacity kept: see side_wire.h).
// `typical_item_bytes`: a low guess of an item's size, to reserve the items
// once for a whole response.
template <typename View, typename Item>
bool DecodeResponse(std::string_view bytes,
                    bool (*decode_item)(std::string_view, Item*),
                    std::vector<Item> View::*items, size_t typical_item_bytes,
                    View* out) {
  out->instance_id = {};
  std::vector<Item>& decoded = out->*items;
  decoded.clear();
  decoded.reserve(bytes.size() / typical_item_bytes);
  return ReadFields(bytes, [&](WireReader& in, uint32_t field,
                               int wire_type) {
    std::string_view value;
    switch (field) {
      case 1:
        return ReadBytes(in, wire_type, &value) &&
               decode_item(value, &decoded.emplace_back());
      case 2:
        return ReadString(in, wire_type, &out->instance_id);
      default:
        return in.SkipUnknown(wire_type);
    }
  });
}

}  // namespace

bool DecodeLogsResponseInto(std::string_view bytes, LogsResponseView* out) {
  return DecodeResponse(bytes, DecodeLogRecord, &LogsResponseView::records, 64,
                        out);
}

bool DecodeTracesResponseInto(std::string_view bytes,
                              TracesResponseView* out) {
  return DecodeResponse(bytes, DecodeTraceEvent, &TracesResponseView::events,
                        96, out);
}

std::optional<LogsResponseView> DecodeLogsResponse(std::string_view bytes) {
  LogsResponseView out;
  if (!DecodeLogsResponseInto(bytes, &out)) return std::nullopt;
  return out;
}

std::optional<TracesResponseView> DecodeTracesResponse(
    std::string_view bytes) {
  TracesResponseView out;
  if (!DecodeTracesResponseInto(bytes, &out)) return std::nullopt;
  return out;
}

}  // namespace agentix::host
