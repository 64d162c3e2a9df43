// The worker IPC protocol: the frames the sandbox daemon and the worker
// exchange over their private socketpair (fd 3 in the worker), and their
// codec. Each frame on the wire is a 4-byte little-endian length followed by
// a msgpack map with string keys; "t" names the frame type.
//
// This library is the whole protocol; neither side includes the other's
// headers. It depends only on msgpack and //base.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <string_view>

#include <sys/socket.h>

#include "absl/status/statusor.h"
#include "worker/ipc/chunking.h"  // kChunkBytes: payload frames carry one chunk

namespace agentix::ipc {

// Largest frame body accepted or produced (the original's MAX_FRAME_BYTES).
inline constexpr uint32_t kMaxFrameBytes = 256u * 1024 * 1024;
// The fd number the worker finds its end of the socketpair on. Low, so that
// it is valid under any open-file limit (a worker run with `ulimit -n 64`
// must still boot); the spawn closes every other fd above 2.
inline constexpr int kWorkerChannelFd = 3;

enum class FrameType {
  // daemon -> worker
  kCall,       // call_id, callable, encoding, data (first bytes), total_size,
               // context, stream_window
  kArgChunk,   // call_id, data
  kCancel,     // call_id
  kShutdown,   // (no fields)
  kStreamAck,  // call_id, index (the next index the host has not consumed)
  kSetEnv,     // data: "K=V\0" entries to set in the running worker's
               // environment (SandboxAdmin.Activate's env); answered by kEnvSet
  kDirectConn,  // direct (DirectConnInfo), data ("pre": the bytes the daemon
                // read past HELLO); sent with SCM_RIGHTS: the host's Calls
                // socket, then its payload ring's memfd when direct.ring
                // (docs/DIRECT-CALLS.md). Expects kDirectClosed, never a reply.
  kCollapse,  // direct.client: hand that client's direct session to the
              // daemon; answered by kSessionState pieces (the last: `last`)
  kBarrier,   // call_id, log_seq, trace_seq: the answer to kBarrierAsk
  kCallsCpuAnswer,  // detail ("value": "wait" or "off"): the daemon's changed
                    // calls-CPU answer, for direct hosts that follow changes
  kNsRelayed,  // ns.name: a relayed Namespace stream opened on a name whose
               // stream was handed over; the worker writes that name's
               // events on the link too, while the direct stream lives
  // both directions
  kNamespaceEvent,  // ns (see NamespaceEntry), data (msgpack payload)
  // worker -> daemon
  kReady,        // pid, detail (python version), direct (optional: the
                 // worker serves kDirectConn connections)
  kBootError,    // error
  kResultChunk,  // call_id, data
  kResult,       // call_id, encoding, data (last bytes), total_size
  kError,        // call_id, error
  kStreamItem,   // call_id, index, encoding, data (one whole encoded item)
  kEnvSet,       // detail: empty once kSetEnv's entries are applied, else why
                 // they could not be
  kLog,          // record: one serialized agentix.runtime.v1.LogRecord;
                 // direct.conn (optional, key "conn"): emitted by a direct
                 // call of that handed-over connection
  kTrace,        // record: one serialized agentix.runtime.v1.TraceEvent;
                 // direct.conn as kLog
  kBarrierAsk,   // call_id, untagged: the seqs the daemon gave the records
                 // of a direct call sent before this frame (answered by
                 // kBarrier); `untagged`: records without a call id were
                 // sent while it ran
  kDirectClosed,  // direct.conn, detail ("why"): a handed-over connection
                  // ended; its descriptors are closed in the worker
  kSessionState,  // direct.client, record (one piece, session_state.h),
                  // last: a collapsed session's calls and finished ids
};

// "call", "arg_chunk", ... as used in the "t" key.
std::string_view FrameTypeName(FrameType type);

// A failure carried as data across the process boundary (after SAPI's
// status.proto): the canonical code plus the Python-facing fields.
struct ErrorInfo {
  int code = 2;  // absl::StatusCode; kUnknown by default
  std::string type;
  std::string message;
  std::string traceback;
  bool cancelled = false;
  std::optional<int> returncode;
  // For an exception raised by Python code: its class's __module__ and
  // __qualname__, and its (args, members, __dict__) pickled (protocol 4) when
  // that fits kMaxExceptionStateBytes; empty otherwise. The host decodes the
  // state through its allowlist only.
  std::string type_module;
  std::string type_qualname;
  std::string state;
};

// Bound on ErrorInfo::state: larger states are dropped by the worker (and by
// the daemon if a worker sends one anyway); the host then raises the plain
// RemoteCallError.
inline constexpr size_t kMaxExceptionStateBytes = 64 * 1024;

// One plugin-namespace event (agentix.runtime.v1.NamespaceEvent plus its
// namespace); the payload travels in Frame::data.
struct NamespaceEntry {
  std::string name;  // "/abridge"
  std::string event;
  std::string request_id;  // informational, may be empty
  bool has_error = false;
  std::string error_type;
  std::string error_message;
  int status_code = 0;
};

// A handed-over Calls connection (kDirectConn; kDirectClosed uses `conn`).
// The limits are the daemon's flags, which the worker applies to the calls
// of this connection as the daemon would.
struct DirectConnInfo {
  uint64_t conn = 0;     // the daemon's number for the connection
  std::string client;    // HELLO's agentix-client-id ("" for none)
  bool ring = false;     // the payload ring's memfd follows the socket
  uint32_t follow = 0;   // calls-CPU answers asked: 0 none, 1 first, 2 changes
  uint64_t max_payload = 0;         // --max_payload_bytes
  uint64_t upload_idle_ms = 0;      // --upload_idle_timeout
  uint64_t max_retained = 0;        // --max_retained_results
  uint64_t max_retained_bytes = 0;  // --max_retained_bytes
  uint64_t max_stream_window = 0;   // --max_stream_window
  uint64_t stalled_ms = 0;          // --stalled_host_timeout
  // The client's slot in the payload area's ledger (ledger.h), assigned by
  // the daemon at the client's first hand-over.
  uint32_t client_slot = 0;
  // A Namespace stream's connection (docs/DIRECT-CALLS.md stage 8): the
  // namespace it opened (empty: a Calls connection) and the daemon's
  // instance id, which every NamespaceResponse carries.
  std::string ns_name;
  std::string instance_id;
};

// One decoded frame. Only the fields its type lists are meaningful.
struct Frame {
  FrameType type = FrameType::kShutdown;
  std::string call_id;
  std::string callable;
  int encoding = 0;
  std::string data;
  uint64_t total_size = 0;
  std::string context;
  ErrorInfo error;
  int64_t pid = 0;
  std::string detail;
  uint32_t stream_window = 0;  // kCall: non-zero for a streaming call
  uint64_t index = 0;          // kStreamItem, kStreamAck
  // kLog, kTrace: the serialized agentix.runtime.v1.LogRecord or TraceEvent
  // (runtime.proto is each record's one schema; this library only carries
  // its bytes, and the daemon sets the fields it owns: seq, worker_id, ...).
  std::string record;
  NamespaceEntry ns;           // kNamespaceEvent
  bool direct = false;         // kReady: the direct-calls capability
  DirectConnInfo direct_conn;  // kDirectConn; kDirectClosed, kLog, kTrace:
                               // conn only (0: none); kCollapse,
                               // kSessionState: client only
  bool last = false;           // kSessionState: the session's last piece
  bool untagged = false;       // kBarrierAsk
  uint64_t log_seq = 0;        // kBarrier
  uint64_t trace_seq = 0;      // kBarrier
  // kCall, kArgChunk, kResultChunk, kResult: the payload lies in the
  // sender's payload ring (payload_area.h) at ring_pos, ring_size bytes,
  // instead of in "data" (keys "ring_pos", "ring_size"; "data" is absent).
  bool in_ring = false;
  uint64_t ring_pos = 0;
  uint64_t ring_size = 0;
  // Never encoded. kCall, kArgChunk of a direct call: this many argument
  // bytes were already copied into the call's upload (DriverSink::Land),
  // instead of being in "data".
  uint64_t landed = 0;
};

// Descriptors that travel with a frame (SCM_RIGHTS on its first byte):
// 1 or 2 for kDirectConn (the socket; the ring's memfd when `ring`), none
// for any other frame.
size_t DescriptorsCarried(const Frame& frame);

// Appends the encoded frame (length prefix included) to `out`.
// kResourceExhausted if the body would exceed kMaxFrameBytes;
// kInvalidArgument for `in_ring` on a type that carries no ring payload.
absl::Status AppendFrame(const Frame& frame, std::string& out);

// Appends an arg_chunk or result_chunk frame straight from views, so large
// payload pieces are copied once (into `out`). kInvalidArgument for another
// type; kResourceExhausted as AppendFrame.
absl::Status AppendDataFrame(FrameType type, std::string_view call_id,
                             std::string_view data, std::string& out);

// Encodes `frame` (kArgChunk, kResultChunk, kResult or kStreamItem) around a
// payload of `data_size` bytes that the caller sends itself, e.g. with
// writev, so a large payload is never copied: head + payload + tail is
// exactly what AppendFrame produces with frame.data = payload. `head` (length
// prefix included) and `tail` are replaced; frame.data is ignored.
// kInvalidArgument for another type; kResourceExhausted as AppendFrame.
absl::Status EncodeFrameAround(const Frame& frame, size_t data_size,
                               std::string& head, std::string& tail);

// Decodes one frame body (without the length prefix).
// kInvalidArgument for garbage, a non-map body, an unknown type or a field of
// the wrong msgpack type.
absl::StatusOr<Frame> DecodeFrameBody(std::string_view body);

// Accumulates bytes read from a stream socket and cuts them into frames.
// Not thread-safe; one reader owns it.
class FrameReader {
 public:
  // Appends raw bytes as read from the socket. Invalidates the views
  // Next(&data) returned.
  void Append(const char* data, size_t size);
  // One read(2) of at most `max_bytes` from `fd` straight into the buffer
  // (no intermediate copy: payloads are large). Returns read(2)'s result
  // (-1 with errno set on failure; EINTR is not retried). Invalidates the
  // views Next(&data) returned.
  ssize_t ReadFrom(int fd, size_t max_bytes);
  // The same with recvmsg(2) and `flags`: `msg` brings its own control
  // buffer (ancillary data); its iovec is set here (DescriptorReader).
  ssize_t ReceiveFrom(int fd, size_t max_bytes, msghdr& msg, int flags);
  // Returns the next complete frame, std::nullopt when more bytes are needed,
  // or an error: kResourceExhausted for a length over kMaxFrameBytes (checked
  // before any body byte is buffered), kInvalidArgument for a bad body. After
  // an error the stream is desynchronised and the reader must be discarded.
  //
  // With `data`, the frame's "data" field is not copied into Frame::data but
  // returned in *data as a view into the reader's buffer, valid until the
  // next Append (large argument chunks are then copied once, straight to
  // where they belong).
  absl::StatusOr<std::optional<Frame>> Next(std::string_view* data = nullptr);
  // Next() into `frame`, which must be default-constructed (a caller's
  // vector element): true with a frame, false when more bytes are needed.
  // A reader of thousands of log frames a read saves moving each Frame (~20
  // strings) through the optional, the StatusOr and into its vector.
  absl::StatusOr<bool> NextInto(Frame& frame, std::string_view* data = nullptr);
  // Bytes buffered but not yet consumed (a truncated frame at EOF shows here).
  size_t buffered() const { return size_ - offset_; }
  // How many whole frames are buffered (by their length prefixes; bodies
  // are not looked at): what Next() will return at most before it needs
  // more bytes, so a caller can size its vector once.
  size_t CompleteFrames() const;
  // Bytes of the frame Next() returned last, length prefix included (where
  // it began in the stream, for DescriptorReader).
  size_t last_frame_bytes() const { return last_frame_bytes_; }

 private:
  // Room for `n` more bytes at buffer_ + size_: compacts consumed bytes
  // away or grows. Not zero-filled (a std::string would fill every read).
  char* Reserve(size_t n);

  // The msgpack zone frames are decoded in, reused (frame.cc).
  struct Scratch;
  std::shared_ptr<Scratch> scratch_;
  std::unique_ptr<char[]> buffer_;
  size_t capacity_ = 0;
  size_t size_ = 0;    // bytes filled
  size_t offset_ = 0;  // bytes consumed by Next()
  size_t last_frame_bytes_ = 0;
};

}  // namespace agentix::ipc
