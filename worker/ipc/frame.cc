#include "worker/ipc/frame.h"

#include <msgpack.hpp>

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace agentix::ipc {
namespace {

struct TypeName {
  FrameType type;
  std::string_view name;
};

constexpr TypeName kTypeNames[] = {
    {FrameType::kCall, "call"},
    {FrameType::kArgChunk, "arg_chunk"},
    {FrameType::kCancel, "cancel"},
    {FrameType::kShutdown, "shutdown"},
    {FrameType::kReady, "ready"},
    {FrameType::kBootError, "boot_error"},
    {FrameType::kResultChunk, "result_chunk"},
    {FrameType::kResult, "result"},
    {FrameType::kError, "error"},
    {FrameType::kStreamAck, "stream_ack"},
    {FrameType::kStreamItem, "stream_item"},
    {FrameType::kLog, "log"},
    {FrameType::kTrace, "trace"},
    {FrameType::kNamespaceEvent, "ns_event"},
    {FrameType::kSetEnv, "set_env"},
    {FrameType::kEnvSet, "env_set"},
    {FrameType::kDirectConn, "direct_conn"},
    {FrameType::kDirectClosed, "direct_closed"},
    {FrameType::kCollapse, "collapse"},
    {FrameType::kSessionState, "session_state"},
    {FrameType::kBarrierAsk, "barrier_ask"},
    {FrameType::kBarrier, "barrier"},
    {FrameType::kCallsCpuAnswer, "calls_cpu_answer"},
    {FrameType::kNsRelayed, "ns_relayed"},
};

std::optional<FrameType> ParseType(std::string_view name) {
  for (const auto& t : kTypeNames) {
    if (t.name == name) return t.type;
  }
  return std::nullopt;
}

// msgpack's packer writes into anything with write(const char*, size_t).
struct StringSink {
  std::string& out;
  void write(const char* data, size_t size) { out.append(data, size); }
};

using Packer = msgpack::packer<StringSink>;

void PackStr(Packer& p, std::string_view key, std::string_view value) {
  p.pack_str(key.size());
  p.pack_str_body(key.data(), key.size());
  p.pack_str(value.size());
  p.pack_str_body(value.data(), value.size());
}

void PackBin(Packer& p, std::string_view key, std::string_view value) {
  p.pack_str(key.size());
  p.pack_str_body(key.data(), key.size());
  p.pack_bin(value.size());
  p.pack_bin_body(value.data(), value.size());
}

template <typename T>
void PackInt(Packer& p, std::string_view key, T value) {
  p.pack_str(key.size());
  p.pack_str_body(key.data(), key.size());
  p.pack(value);
}

void PackKey(Packer& p, std::string_view key) {
  p.pack_str(key.size());
  p.pack_str_body(key.data(), key.size());
}

void PackNamespace(Packer& p, const NamespaceEntry& n) {
  PackKey(p, "ns");
  p.pack_map(n.has_error ? 6 : 3);
  PackStr(p, "name", n.name);
  PackStr(p, "event", n.event);
  PackStr(p, "request_id", n.request_id);
  if (n.has_error) {
    PackStr(p, "error_type", n.error_type);
    PackStr(p, "error_message", n.error_message);
    PackInt(p, "status_code", n.status_code);
  }
}

void PackError(Packer& p, const ErrorInfo& e) {
  PackKey(p, "error");
  p.pack_map(5 + (e.returncode.has_value() ? 1 : 0) +
             (e.type_module.empty() ? 0 : 1) +
             (e.type_qualname.empty() ? 0 : 1) + (e.state.empty() ? 0 : 1));
  PackInt(p, "code", e.code);
  PackStr(p, "type", e.type);
  PackStr(p, "message", e.message);
  PackStr(p, "traceback", e.traceback);
  PackKey(p, "cancelled");
  if (e.cancelled) p.pack_true(); else p.pack_false();
  if (e.returncode.has_value()) PackInt(p, "returncode", *e.returncode);
  if (!e.type_module.empty()) PackStr(p, "type_module", e.type_module);
  if (!e.type_qualname.empty()) PackStr(p, "type_qualname", e.type_qualname);
  if (!e.state.empty()) PackBin(p, "state", e.state);
}

absl::Status InvalidField(std::string_view key, std::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("frame field '", std::string(key), "' is not ",
                   std::string(want)));
}

// Reads str or bin into `out`.
absl::Status ReadBytes(const msgpack::object& o, std::string_view key,
                       std::string& out) {
  if (o.type == msgpack::type::STR) {
    out.assign(o.via.str.ptr, o.via.str.size);
  } else if (o.type == msgpack::type::BIN) {
    out.assign(o.via.bin.ptr, o.via.bin.size);
  } else if (o.type == msgpack::type::NIL) {
    out.clear();
  } else {
    return InvalidField(key, "a string");
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ReadInt(const msgpack::object& o, std::string_view key, T& out) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    out = static_cast<T>(o.via.u64);
  } else if (o.type == msgpack::type::NEGATIVE_INTEGER) {
    out = static_cast<T>(o.via.i64);
  } else {
    return InvalidField(key, "an integer");
  }
  return absl::OkStatus();
}

// Reads str or bin as a view into the decoded body (see FrameReader::Next).
absl::Status ReadView(const msgpack::object& o, std::string_view key,
                      std::string_view& out) {
  if (o.type == msgpack::type::STR) {
    out = std::string_view(o.via.str.ptr, o.via.str.size);
  } else if (o.type == msgpack::type::BIN) {
    out = std::string_view(o.via.bin.ptr, o.via.bin.size);
  } else if (o.type == msgpack::type::NIL) {
    out = {};
  } else {
    return InvalidField(key, "a string");
  }
  return absl::OkStatus();
}

std::string_view KeyOf(const msgpack::object_kv& kv) {
  if (kv.key.type != msgpack::type::STR) return {};
  return std::string_view(kv.key.via.str.ptr, kv.key.via.str.size);
}

absl::Status ReadNamespace(const msgpack::object& o, NamespaceEntry& n) {
  if (o.type != msgpack::type::MAP) return InvalidField("ns", "a map");
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const auto& kv = o.via.map.ptr[i];
    std::string_view key = KeyOf(kv);
    absl::Status s;
    if (key == "name") s = ReadBytes(kv.val, key, n.name);
    else if (key == "event") s = ReadBytes(kv.val, key, n.event);
    else if (key == "request_id") s = ReadBytes(kv.val, key, n.request_id);
    else if (key == "error_type") { s = ReadBytes(kv.val, key, n.error_type); n.has_error = true; }
    else if (key == "error_message") s = ReadBytes(kv.val, key, n.error_message);
    else if (key == "status_code") s = ReadInt(kv.val, key, n.status_code);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReadError(const msgpack::object& o, ErrorInfo& e) {
  if (o.type != msgpack::type::MAP) return InvalidField("error", "a map");
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const auto& kv = o.via.map.ptr[i];
    std::string_view key = KeyOf(kv);
    absl::Status s;
    if (key == "code") {
      s = ReadInt(kv.val, key, e.code);
    } else if (key == "type") {
      s = ReadBytes(kv.val, key, e.type);
    } else if (key == "message") {
      s = ReadBytes(kv.val, key, e.message);
    } else if (key == "traceback") {
      s = ReadBytes(kv.val, key, e.traceback);
    } else if (key == "cancelled") {
      if (kv.val.type != msgpack::type::BOOLEAN) return InvalidField(key, "a bool");
      e.cancelled = kv.val.via.boolean;
    } else if (key == "returncode") {
      int rc = 0;
      s = ReadInt(kv.val, key, rc);
      e.returncode = rc;
    } else if (key == "type_module") {
      s = ReadBytes(kv.val, key, e.type_module);
    } else if (key == "type_qualname") {
      s = ReadBytes(kv.val, key, e.type_qualname);
    } else if (key == "state") {
      s = ReadBytes(kv.val, key, e.state);
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

size_t DescriptorsCarried(const Frame& frame) {
  if (frame.type != FrameType::kDirectConn) return 0;
  return frame.direct_conn.ring ? 2 : 1;
}

std::string_view FrameTypeName(FrameType type) {
  for (const auto& t : kTypeNames) {
    if (t.type == type) return t.name;
  }
  return "?";
}

namespace {

// Writes the little-endian length `body` into the 4 bytes at `at`, or fails
// if the body is too large.
absl::Status PutLength(size_t body, char* at) {
  if (body > kMaxFrameBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "frame of ", body, " bytes exceeds the ", kMaxFrameBytes,
        "-byte frame limit"));
  }
  const uint32_t len = static_cast<uint32_t>(body);
  const unsigned char prefix[4] = {
      static_cast<unsigned char>(len & 0xff),
      static_cast<unsigned char>((len >> 8) & 0xff),
      static_cast<unsigned char>((len >> 16) & 0xff),
      static_cast<unsigned char>((len >> 24) & 0xff)};
  std::memcpy(at, prefix, 4);
  return absl::OkStatus();
}

// Writes the length of the body that follows the 4 bytes reserved at
// `start`, or undoes the frame if the body is too large.
absl::Status FinishFrame(size_t start, std::string& out) {
  absl::Status status = PutLength(out.size() - start - 4, out.data() + start);
  if (!status.ok()) out.resize(start);
  return status;
}

}  // namespace

absl::Status AppendDataFrame(FrameType type, std::string_view call_id,
                             std::string_view data, std::string& out) {
  if (type != FrameType::kArgChunk && type != FrameType::kResultChunk) {
    return absl::InvalidArgumentError("AppendDataFrame: not a chunk type");
  }
  const size_t start = out.size();
  out.reserve(start + 64 + call_id.size() + data.size());
  out.append(4, '\0');
  StringSink sink{out};
  Packer p(sink);
  p.pack_map(3);
  PackStr(p, "t", FrameTypeName(type));
  PackStr(p, "call_id", call_id);
  PackBin(p, "data", data);
  return FinishFrame(start, out);
}

namespace {

// The fields of a frame that carries a payload, other than the payload
// itself: those that come before it go to `head`, those after it to `tail`,
// in a map sized for them plus `payload_fields` entries (1 for "data", 2 for
// ring_pos and ring_size). One field list for the inline, the zero-copy and
// the ring encodings. False for a type without a payload.
bool PackPayloadFrameFields(const Frame& f, uint32_t payload_fields,
                            Packer& head, Packer& tail) {
  switch (f.type) {
    case FrameType::kCall:
      head.pack_map(7 + payload_fields);
      PackStr(head, "t", "call");
      PackStr(head, "call_id", f.call_id);
      PackStr(head, "callable", f.callable);
      PackInt(head, "encoding", f.encoding);
      PackInt(tail, "total_size", f.total_size);
      PackBin(tail, "context", f.context);
      PackInt(tail, "stream_window", f.stream_window);
      return true;
    case FrameType::kArgChunk:
    case FrameType::kResultChunk:
      head.pack_map(2 + payload_fields);
      PackStr(head, "t", FrameTypeName(f.type));
      PackStr(head, "call_id", f.call_id);
      return true;
    case FrameType::kResult:
      head.pack_map(4 + payload_fields);
      PackStr(head, "t", "result");
      PackStr(head, "call_id", f.call_id);
      PackInt(head, "encoding", f.encoding);
      PackInt(tail, "total_size", f.total_size);
      return true;
    case FrameType::kStreamItem:
      head.pack_map(4 + payload_fields);
      PackStr(head, "t", "stream_item");
      PackStr(head, "call_id", f.call_id);
      PackInt(head, "index", f.index);
      PackInt(head, "encoding", f.encoding);
      return true;
    default:
      return false;
  }
}

// EncodeFrameAround for every type with a payload (kCall included).
absl::Status EncodeAround(const Frame& f, size_t data_size, std::string& head,
                          std::string& tail) {
  head.assign(4, '\0');
  tail.clear();
  StringSink head_sink{head};
  Packer h(head_sink);
  StringSink tail_sink{tail};
  Packer t(tail_sink);
  if (!PackPayloadFrameFields(f, 1, h, t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(FrameTypeName(f.type)),
                     "' frames carry no payload"));
  }
  PackKey(h, "data");
  if (data_size > kMaxFrameBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "frame payload of ", data_size, " bytes exceeds the ", kMaxFrameBytes,
        "-byte frame limit"));
  }
  h.pack_bin(static_cast<uint32_t>(data_size));
  return PutLength(head.size() - 4 + data_size + tail.size(), head.data());
}

}  // namespace

absl::Status EncodeFrameAround(const Frame& f, size_t data_size,
                               std::string& head, std::string& tail) {
  if (f.type == FrameType::kCall) {
    return absl::InvalidArgumentError(
        "EncodeFrameAround: 'call' frames do not end with their payload");
  }
  return EncodeAround(f, data_size, head, tail);
}

namespace {

bool CarriesRingPayload(FrameType type) {
  return type == FrameType::kCall || type == FrameType::kArgChunk ||
         type == FrameType::kResultChunk || type == FrameType::kResult;
}

// A frame whose payload lies in a payload ring: the fields of its inline
// form, with ring_pos and ring_size where "data" would be.
absl::Status AppendRingFrame(const Frame& f, std::string& out) {
  if (!CarriesRingPayload(f.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(FrameTypeName(f.type)),
                     "' frames carry no ring payload"));
  }
  const size_t start = out.size();
  out.append(4, '\0');
  StringSink sink{out};
  Packer p(sink);
  PackPayloadFrameFields(f, 2, p, p);
  PackInt(p, "ring_pos", f.ring_pos);
  PackInt(p, "ring_size", f.ring_size);
  return FinishFrame(start, out);
}

}  // namespace

absl::Status AppendFrame(const Frame& f, std::string& out) {
  if (f.in_ring) return AppendRingFrame(f, out);
  const size_t start = out.size();
  out.append(4, '\0');
  StringSink sink{out};
  Packer p(sink);
  switch (f.type) {
    case FrameType::kStreamAck:
      p.pack_map(3);
      PackStr(p, "t", "stream_ack");
      PackStr(p, "call_id", f.call_id);
      PackInt(p, "index", f.index);
      break;
    case FrameType::kLog:
    case FrameType::kTrace: {
      // The tag only when set: a relayed call's record is today's frame.
      const uint64_t conn = f.direct_conn.conn;
      p.pack_map(conn != 0 ? 3 : 2);
      PackStr(p, "t", FrameTypeName(f.type));
      PackBin(p, "record", f.record);
      if (conn != 0) PackInt(p, "conn", conn);
      break;
    }
    case FrameType::kBarrierAsk:
      p.pack_map(3);
      PackStr(p, "t", "barrier_ask");
      PackStr(p, "call_id", f.call_id);
      PackKey(p, "untagged");
      if (f.untagged) {
        p.pack_true();
      } else {
        p.pack_false();
      }
      break;
    case FrameType::kBarrier:
      p.pack_map(4);
      PackStr(p, "t", "barrier");
      PackStr(p, "call_id", f.call_id);
      PackInt(p, "log_seq", f.log_seq);
      PackInt(p, "trace_seq", f.trace_seq);
      break;
    case FrameType::kCallsCpuAnswer:
      p.pack_map(2);
      PackStr(p, "t", "calls_cpu_answer");
      PackStr(p, "value", f.detail);
      break;
    case FrameType::kNamespaceEvent:
      p.pack_map(3);
      PackStr(p, "t", "ns_event");
      PackNamespace(p, f.ns);
      PackBin(p, "data", f.data);
      break;
    case FrameType::kNsRelayed:
      p.pack_map(2);
      PackStr(p, "t", "ns_relayed");
      PackNamespace(p, f.ns);
      break;
    case FrameType::kCall:
    case FrameType::kStreamItem:
    case FrameType::kArgChunk:
    case FrameType::kResultChunk:
    case FrameType::kResult: {
      // Frames with a payload: one field list for every path, so the
      // copying, zero-copy and ring senders agree on the wire.
      out.resize(start);
      std::string head, tail;
      absl::Status status = EncodeAround(f, f.data.size(), head, tail);
      if (!status.ok()) return status;
      out.append(head).append(f.data).append(tail);
      return absl::OkStatus();
    }
    case FrameType::kCancel:
      p.pack_map(2);
      PackStr(p, "t", "cancel");
      PackStr(p, "call_id", f.call_id);
      break;
    case FrameType::kShutdown:
      p.pack_map(1);
      PackStr(p, "t", "shutdown");
      break;
    case FrameType::kSetEnv:
      p.pack_map(2);
      PackStr(p, "t", "set_env");
      PackBin(p, "data", f.data);
      break;
    case FrameType::kEnvSet:
      p.pack_map(2);
      PackStr(p, "t", "env_set");
      PackStr(p, "detail", f.detail);
      break;
    case FrameType::kReady:
      // The capability only when set: an older daemon sees today's frame.
      p.pack_map(f.direct ? 4 : 3);
      PackStr(p, "t", "ready");
      PackInt(p, "pid", f.pid);
      PackStr(p, "detail", f.detail);
      if (f.direct) {
        PackKey(p, "direct");
        p.pack_true();
      }
      break;
    case FrameType::kDirectConn: {
      const DirectConnInfo& d = f.direct_conn;
      const bool ns = !d.ns_name.empty();
      p.pack_map(ns ? 15 : 13);
      PackStr(p, "t", "direct_conn");
      PackInt(p, "conn", d.conn);
      PackStr(p, "client", d.client);
      PackBin(p, "pre", f.data);
      PackKey(p, "ring");
      if (d.ring) {
        p.pack_true();
      } else {
        p.pack_false();
      }
      PackInt(p, "follow", d.follow);
      PackInt(p, "max_payload", d.max_payload);
      PackInt(p, "upload_idle_ms", d.upload_idle_ms);
      PackInt(p, "max_retained", d.max_retained);
      PackInt(p, "max_retained_bytes", d.max_retained_bytes);
      PackInt(p, "max_stream_window", d.max_stream_window);
      PackInt(p, "stalled_ms", d.stalled_ms);
      PackInt(p, "client_slot", d.client_slot);
      if (ns) {
        PackStr(p, "ns_name", d.ns_name);
        PackStr(p, "instance", d.instance_id);
      }
      break;
    }
    case FrameType::kDirectClosed:
      p.pack_map(3);
      PackStr(p, "t", "direct_closed");
      PackInt(p, "conn", f.direct_conn.conn);
      PackStr(p, "why", f.detail);
      break;
    case FrameType::kCollapse:
      p.pack_map(2);
      PackStr(p, "t", "collapse");
      PackStr(p, "client", f.direct_conn.client);
      break;
    case FrameType::kSessionState:
      p.pack_map(4);
      PackStr(p, "t", "session_state");
      PackStr(p, "client", f.direct_conn.client);
      PackBin(p, "record", f.record);
      PackKey(p, "last");
      if (f.last) {
        p.pack_true();
      } else {
        p.pack_false();
      }
      break;
    case FrameType::kBootError:
      p.pack_map(2);
      PackStr(p, "t", "boot_error");
      PackError(p, f.error);
      break;
    case FrameType::kError:
      p.pack_map(3);
      PackStr(p, "t", "error");
      PackStr(p, "call_id", f.call_id);
      PackError(p, f.error);
      break;
  }
  return FinishFrame(start, out);
}

namespace {

// Decodes into `f`, a default-constructed Frame (on an error it holds
// part of the frame).
absl::Status DecodeBody(std::string_view body, std::string_view* data_view,
                        msgpack::zone* scratch, Frame& f) {
  msgpack::object_handle handle;
  msgpack::object root_object;
  try {
    // Limits keep a hostile frame from making msgpack allocate huge arrays.
    msgpack::unpack_limit limits(/*array=*/64, /*map=*/64, /*str=*/kMaxFrameBytes,
                                 /*bin=*/kMaxFrameBytes, /*ext=*/0,
                                 /*depth=*/8);
    std::size_t offset = 0;
    // Strings and binaries reference `body` instead of being copied into
    // the zone; they are copied once, into the Frame, before returning.
    auto reference_all = [](msgpack::type::object_type, std::size_t,
                            void*) { return true; };
    if (scratch != nullptr) {
      // A reader's own zone, emptied per frame: its first chunk is kept, so
      // a stream of small frames does not malloc and free 8 KiB each (a
      // request that size also makes glibc consolidate its fast bins).
      scratch->clear();
      root_object = msgpack::unpack(*scratch, body.data(), body.size(), offset,
                                    reference_all, nullptr, limits);
    } else {
      handle = msgpack::unpack(body.data(), body.size(), offset,
                               reference_all, nullptr, limits);
      root_object = handle.get();
    }
    if (offset != body.size()) {
      return absl::InvalidArgumentError("trailing bytes after the frame body");
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("undecodable frame body: ", e.what()));
  }
  const msgpack::object& root = root_object;
  if (root.type != msgpack::type::MAP) {
    return absl::InvalidArgumentError("frame body is not a msgpack map");
  }
  bool have_type = false;
  bool has_inline_data = false;
  bool has_ring_pos = false;
  bool has_ring_size = false;
  for (uint32_t i = 0; i < root.via.map.size; ++i) {
    const auto& kv = root.via.map.ptr[i];
    std::string_view key = KeyOf(kv);
    absl::Status s;
    if (key == "t") {
      std::string name;
      s = ReadBytes(kv.val, key, name);
      if (!s.ok()) return s;
      auto type = ParseType(name);
      if (!type) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown frame type '", name, "'"));
      }
      f.type = *type;
      have_type = true;
    } else if (key == "call_id") {
      s = ReadBytes(kv.val, key, f.call_id);
    } else if (key == "callable") {
      s = ReadBytes(kv.val, key, f.callable);
    } else if (key == "encoding") {
      s = ReadInt(kv.val, key, f.encoding);
    } else if (key == "data") {
      s = data_view != nullptr ? ReadView(kv.val, key, *data_view)
                               : ReadBytes(kv.val, key, f.data);
    } else if (key == "total_size") {
      s = ReadInt(kv.val, key, f.total_size);
    } else if (key == "context") {
      s = ReadBytes(kv.val, key, f.context);
    } else if (key == "pid") {
      s = ReadInt(kv.val, key, f.pid);
    } else if (key == "detail") {
      s = ReadBytes(kv.val, key, f.detail);
    } else if (key == "error") {
      s = ReadError(kv.val, f.error);
    } else if (key == "stream_window") {
      s = ReadInt(kv.val, key, f.stream_window);
    } else if (key == "index") {
      s = ReadInt(kv.val, key, f.index);
    } else if (key == "record") {
      s = ReadBytes(kv.val, key, f.record);
    } else if (key == "ns") {
      s = ReadNamespace(kv.val, f.ns);
    } else if (key == "last") {
      if (kv.val.type != msgpack::type::BOOLEAN) return InvalidField(key, "a bool");
      f.last = kv.val.via.boolean;
    } else if (key == "direct" || key == "ring") {
      if (kv.val.type != msgpack::type::BOOLEAN) return InvalidField(key, "a bool");
      (key == "direct" ? f.direct : f.direct_conn.ring) = kv.val.via.boolean;
    } else if (key == "conn") {
      s = ReadInt(kv.val, key, f.direct_conn.conn);
    } else if (key == "client") {
      s = ReadBytes(kv.val, key, f.direct_conn.client);
    } else if (key == "pre") {
      s = ReadBytes(kv.val, key, f.data);
    } else if (key == "why" || key == "value") {
      s = ReadBytes(kv.val, key, f.detail);
    } else if (key == "untagged") {
      if (kv.val.type != msgpack::type::BOOLEAN) return InvalidField(key, "a bool");
      f.untagged = kv.val.via.boolean;
    } else if (key == "log_seq") {
      s = ReadInt(kv.val, key, f.log_seq);
    } else if (key == "trace_seq") {
      s = ReadInt(kv.val, key, f.trace_seq);
    } else if (key == "follow") {
      s = ReadInt(kv.val, key, f.direct_conn.follow);
    } else if (key == "max_payload") {
      s = ReadInt(kv.val, key, f.direct_conn.max_payload);
    } else if (key == "upload_idle_ms") {
      s = ReadInt(kv.val, key, f.direct_conn.upload_idle_ms);
    } else if (key == "max_retained") {
      s = ReadInt(kv.val, key, f.direct_conn.max_retained);
    } else if (key == "max_retained_bytes") {
      s = ReadInt(kv.val, key, f.direct_conn.max_retained_bytes);
    } else if (key == "max_stream_window") {
      s = ReadInt(kv.val, key, f.direct_conn.max_stream_window);
    } else if (key == "stalled_ms") {
      s = ReadInt(kv.val, key, f.direct_conn.stalled_ms);
    } else if (key == "client_slot") {
      s = ReadInt(kv.val, key, f.direct_conn.client_slot);
    } else if (key == "ns_name") {
      s = ReadBytes(kv.val, key, f.direct_conn.ns_name);
    } else if (key == "instance") {
      s = ReadBytes(kv.val, key, f.direct_conn.instance_id);
    } else if (key == "ring_pos") {
      s = ReadInt(kv.val, key, f.ring_pos);
      has_ring_pos = true;
    } else if (key == "ring_size") {
      s = ReadInt(kv.val, key, f.ring_size);
      has_ring_size = true;
    }
    if (!s.ok()) return s;
    if (key == "data") has_inline_data = true;
  }
  if (!have_type) return absl::InvalidArgumentError("frame has no type ('t')");
  if (has_ring_pos || has_ring_size) {
    f.in_ring = true;
    if (!CarriesRingPayload(f.type) || !has_ring_pos || !has_ring_size ||
        f.ring_size == 0 || has_inline_data) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad ring payload reference in a '",
                       std::string(FrameTypeName(f.type)), "' frame"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Frame> DecodeFrameBody(std::string_view body) {
  Frame f;
  absl::Status decoded = DecodeBody(body, nullptr, nullptr, f);
  if (!decoded.ok()) return decoded;
  return f;
}

struct FrameReader::Scratch {
  msgpack::zone zone;
};

char* FrameReader::Reserve(size_t n) {
  // Compacted here rather than in Next(), so views Next() returned stay
  // valid until now; appends stay amortised.
  if (offset_ == size_) {
    size_ = offset_ = 0;
  } else if (offset_ > (1u << 20) && offset_ * 2 > size_) {
    std::memmove(buffer_.get(), buffer_.get() + offset_, size_ - offset_);
    size_ -= offset_;
    offset_ = 0;
  }
  if (capacity_ - size_ < n) {
    const size_t live = size_ - offset_;
    const size_t capacity = std::max(capacity_ * 2, live + n);
    std::unique_ptr<char[]> grown(new char[capacity]);
    if (live > 0) std::memcpy(grown.get(), buffer_.get() + offset_, live);
    buffer_ = std::move(grown);
    capacity_ = capacity;
    size_ = live;
    offset_ = 0;
  }
  return buffer_.get() + size_;
}

void FrameReader::Append(const char* data, size_t size) {
  if (size == 0) return;
  std::memcpy(Reserve(size), data, size);
  size_ += size;
}

ssize_t FrameReader::ReadFrom(int fd, size_t max_bytes) {
  const ssize_t n = ::read(fd, Reserve(max_bytes), max_bytes);
  if (n > 0) size_ += static_cast<size_t>(n);
  return n;
}

ssize_t FrameReader::ReceiveFrom(int fd, size_t max_bytes, msghdr& msg,
                                 int flags) {
  iovec iov{Reserve(max_bytes), max_bytes};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  const ssize_t n = ::recvmsg(fd, &msg, flags);
  msg.msg_iov = nullptr;
  msg.msg_iovlen = 0;
  if (n > 0) size_ += static_cast<size_t>(n);
  return n;
}

size_t FrameReader::CompleteFrames() const {
  size_t count = 0;
  size_t at = offset_;
  while (size_ - at >= 4) {
    const auto* p = reinterpret_cast<const unsigned char*>(buffer_.get() + at);
    const size_t len = static_cast<size_t>(p[0]) |
                       (static_cast<size_t>(p[1]) << 8) |
                       (static_cast<size_t>(p[2]) << 16) |
                       (static_cast<size_t>(p[3]) << 24);
    if (size_ - at - 4 < len) break;
    at += 4 + len;
    ++count;
  }
  return count;
}

absl::StatusOr<bool> FrameReader::NextInto(Frame& frame,
                                           std::string_view* data) {
  if (buffered() < 4) return false;
  const auto* p =
      reinterpret_cast<const unsigned char*>(buffer_.get() + offset_);
  const uint32_t len = static_cast<uint32_t>(p[0]) |
                       (static_cast<uint32_t>(p[1]) << 8) |
                       (static_cast<uint32_t>(p[2]) << 16) |
                       (static_cast<uint32_t>(p[3]) << 24);
  if (len > kMaxFrameBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "frame length ", len, " exceeds the ", kMaxFrameBytes,
        "-byte frame limit"));
  }
  if (buffered() - 4 < len) return false;
  if (data != nullptr) *data = {};
  if (scratch_ == nullptr) scratch_ = std::make_shared<Scratch>();
  absl::Status decoded =
      DecodeBody(std::string_view(buffer_.get() + offset_ + 4, len), data,
                 &scratch_->zone, frame);
  offset_ += 4 + len;
  last_frame_bytes_ = 4 + size_t{len};
  if (!decoded.ok()) return decoded;
  return true;
}

absl::StatusOr<std::optional<Frame>> FrameReader::Next(
    std::string_view* data) {
  Frame frame;
  absl::StatusOr<bool> got = NextInto(frame, data);
  if (!got.ok()) return got.status();
  if (!*got) return std::optional<Frame>();
  return std::optional<Frame>(std::move(frame));
}

}  // namespace agentix::ipc
