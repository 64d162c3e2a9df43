// DirectSession: the worker's owner of one host client's calls when the
// client's Calls connections are handed to the worker (docs/DIRECT-CALLS.md,
// stage 2: the call state, without sockets). It is to a direct client what
// the daemon's SessionManager is to a relayed one, on the same CallTable
// (calls/call_table.h), so ids, at most once, limits, retention, acks,
// stream acks and resume behave the same for both owners.
//
// In: parsed CallsRequests from the client's connections (HandleRequest) and
// the driver's output for its calls (HandleDriverFrames: result,
// result_chunk, stream_item, error — what the worker's result sender writes
// for a relayed call). Out: CallsResponse events to the connection that
// started or last resumed each call (DirectResponseSink), and the records
// the daemon writes on the worker link for a relayed call — call (with its
// first argument piece), arg_chunk, cancel, stream_ack — to the driver
// (DriverSink). One session per client; several connections may attach.
//
// Thread-safe (one lock). No threads of its own: whoever serves the direct
// connections drives ExpireUploads (stage 3: the worker's watchdog).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "calls/call_table.h"
#include "wire/sandbox_event.h"
#include "worker/direct/chunk_buffers.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/ledger.h"
#include "worker/ipc/payload_area.h"

namespace agentix::worker {

// One direct Calls connection's way to its host.
class DirectResponseSink {
 public:
  virtual ~DirectResponseSink() = default;
  // Queues `events` (in order) to be written as CallsResponse frames,
  // moving them out (the session reuses the span's vector).
  // Called with the session's lock held, in the order the session produced
  // them: must not block on I/O and must not call into the session.
  virtual void Send(absl::Span<sandbox::SandboxEventPtr> events) = 0;
};

// The worker's driver, as the session's calls reach it.
class DriverSink {
 public:
  virtual ~DriverSink() = default;
  // Queues `frames` for the driver, in order: kCall (its first argument
  // piece, at most ipc::kChunkBytes, in `data`), kArgChunk, kCancel,
  // kStreamAck — what the daemon writes on the worker link for a relayed
  // call (docs/WORKER-PROTOCOL.md), moved out of the span. Same rules as
  // DirectResponseSink::Send.
  virtual void Send(absl::Span<ipc::Frame> frames) = 0;
  // Copies `bytes`, the next piece of a chunked call's arguments (`frame`
  // is its kCall, with call_id, encoding and total_size set, or its
  // kArgChunk), straight into the arguments' final home while the host's
  // ring or the read buffer still holds them, and sets frame.landed; the
  // frame then carries no data. False (the default) leaves the copy to the
  // caller. Called under the session's lock, on the poll side only
  // (DirectConns: Accept, Drive), before `frame` is queued by Send.
  virtual bool Land(ipc::Frame& /*frame*/, std::string_view /*bytes*/) {
    return false;
  }
};

// The daemon's per-call limits, as the `direct_conn` frame carries them.
struct DirectLimits {
  uint64_t max_payload_bytes = uint64_t{1} << 30;      // --max_payload_bytes
  absl::Duration upload_idle_timeout = absl::Seconds(60);
  size_t max_retained_results = 4096;                  // --max_retained_results
  uint64_t max_retained_bytes = uint64_t{512} << 20;   // --max_retained_bytes
  uint32_t max_stream_window = 1024;                   // --max_stream_window
  // The direct writer's bound on a host that stops reading (stage 3); the
  // session itself does not use it.
  absl::Duration stalled_host_timeout = absl::Seconds(20);
};

// Where a session records its calls for the daemon (stage 4,
// docs/DIRECT-CALLS.md): the payload area's counters (direct_running,
// direct_last_end_ns) and the ledger. Either may be null (no payload area:
// the hand-over's eligibility 5 makes that a test-only case).
struct DirectRecords {
  ipc::PayloadArea* area = nullptr;
  ipc::LedgerWriter* ledger = nullptr;
  uint32_t client_slot = 0;  // the daemon's (DirectConnInfo::client_slot)
};

class DirectSession {
 public:
  // `client`: the HELLO's agentix-client-id ("" for the anonymous client).
  // `driver` must outlive the session. `chunk_buffers`, when given, takes
  // back the buffers of the ResultChunk events made from whole-chunk
  // result_chunk frames (the channel fills those frames from it), and
  // gives the buffers of large arguments' call / arg_chunk frames that
  // `driver` does not land (the driver's intake gives them back).
  DirectSession(std::string client, const DirectLimits& limits,
                DriverSink& driver, const DirectRecords& records = {},
                std::shared_ptr<ChunkBuffers> chunk_buffers = nullptr);
  DirectSession(const DirectSession&) = delete;
  DirectSession& operator=(const DirectSession&) = delete;

  const std::string& client() const { return client_; }

  // Applies a request's events in order, as SessionManager::HandleHostEvents
  // does: problems are answered on `conn` as CallErrors. `bulk[i]`, when
  // set, is events[i]'s arguments or chunk data left out of the message
  // (frame_splice's view); `bulk` is empty or has one entry per event.
  // A cancel of an id this session does not hold does nothing (stage 3
  // passes it to the daemon: another client's call).
  void HandleRequest(
      const std::shared_ptr<DirectResponseSink>& conn,
      const runtime::v1::CallsRequest& request,
      absl::Span<const std::optional<std::string_view>> bulk = {});

  // The driver's output for this session's calls, in order: each frame
  // becomes its call's event(s) (values over ipc::kChunkBytes as leading
  // ResultChunks), sent to the call's connection and retained. Frames of
  // closed or unknown calls are dropped (late frames after a cancel).
  // InvalidArgument naming the first frame that is not a call's output
  // (the others are still applied).
  absl::Status HandleDriverFrames(std::vector<ipc::Frame>& frames);
  // HandleDriverFrames for the output of one call (every frame has its id)
  // if this session holds that call open; false, nothing done, otherwise.
  // One lookup where Runs then HandleDriverFrames take two.
  bool HandleCallOutput(std::vector<ipc::Frame>& frames);

  // Ends the calls whose arguments made no progress for
  // upload_idle_timeout by `now` with UploadTimeout (and cancels them in
  // the driver). Whether any upload is still watched.
  bool ExpireUploads(absl::Time now);

  // The connection ended: its calls keep running, their events retained
  // for a resume (or eviction).
  void Detach(const DirectResponseSink* conn);
  // A call owned by `conn` has not reached its terminal event (a
  // half-closed connection ends once this is false).
  bool HasOpenCalls(const DirectResponseSink* conn);
  // `id` is a call of this session that has not ended (the worker refuses
  // a relayed call of the same id: docs/DIRECT-CALLS.md, stage 3).
  bool Runs(const std::string& id);
  // Calls started and not terminal.
  size_t running();

  // The daemon's `collapse` of this client (docs/DIRECT-CALLS.md, "one
  // owner at a time"): the session's calls (delivered events serialized)
  // and finished ids as `session_state` frames (≤ 4 MiB pieces, the last
  // marked), for the link. Afterwards the session is empty and refuses
  // nothing — the registry drops it; Owns() is false for every call it
  // held, so the driver's later output for a running one goes to the link
  // as for a relayed call (the daemon now owns it). The connections are
  // detached; the caller ends them (STATUS 14). Its ledger slots are freed
  // without entering the finished ring: the daemon holds those ids now.
  // A call still uploading its arguments is exported running; chunks that
  // arrive after the collapse reach the daemon, which has no upload state
  // for it (left for stage 4's e2e: the daemon fails it UploadTimeout).
  std::vector<ipc::Frame> Collapse();
  // `id` is an open call of this session (before any Collapse): the
  // driver's output for it is this session's, not the link's.
  bool Owns(const std::string& id);

 private:
  struct DirectExtra {
    std::optional<uint32_t> ledger_slot;  // in DirectRecords::ledger
  };
  using Table = calls::CallTable<DirectResponseSink, DirectExtra>;
  using Call = Table::Call;
  using Out = Table::Out;

  static calls::CallTableLimits TableLimits(const DirectLimits& limits);
  std::unique_ptr<Table> NewTable(const calls::CallTableLimits& limits);
  void Apply(const std::shared_ptr<DirectResponseSink>& conn,
             const runtime::v1::HostEvent& event,
             const std::optional<std::string_view>& bulk, Out& out,
             std::vector<ipc::Frame>& to_driver)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartCall(const std::shared_ptr<DirectResponseSink>& conn,
                 const runtime::v1::StartCall& start, std::string_view args,
                 Out& out, std::vector<ipc::Frame>& to_driver)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The driver frames of argument bytes after a call's first frame, in
  // ipc::kChunkBytes pieces.
  void ArgChunkFrames(const std::string& id, std::string_view data,
                      std::vector<ipc::Frame>& to_driver);
  // Puts an argument piece on its driver frame: landed where the driver
  // keeps the arguments (DriverSink::Land: one copy), or else copied into
  // frame.data — a piece of at least kRecycledArgBytes into a buffer from
  // chunk_buffers_ (the intake gives it back once the piece is in the
  // call's bytes object), so large arguments reuse the same faulted-in
  // buffers whichever thread copies them.
  void PutArgBytes(ipc::Frame& frame, std::string_view piece);
  static constexpr size_t kRecycledArgBytes = size_t{64} << 10;
  // Records `event` and, for a terminal one, counts the call as ended.
  void Emit(const std::string& id, Call& call, sandbox::SandboxEventPtr event,
            bool terminal, Out& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a running call with `event` and cancels it in the driver.
  void FailCall(const std::string& id, Call& call,
                sandbox::SandboxEventPtr event, Out& out,
                std::vector<ipc::Frame>& to_driver)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands `out` to the connections (one Send per run of one connection)
  // and `to_driver` to the driver; both are left empty.
  void Flush(Out& out, std::vector<ipc::Frame>& to_driver)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status HandleDriverFramesLocked(std::vector<ipc::Frame>& frames)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The call left the table (ack or eviction): its ledger slot moves to
  // the finished ring.
  void Forgotten(Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string client_;
  DriverSink& driver_;
  const DirectRecords records_;
  const std::shared_ptr<ChunkBuffers> chunk_buffers_;
  absl::Mutex mu_;
  std::unique_ptr<Table> table_ ABSL_GUARDED_BY(mu_);  // replaced by Collapse
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  // One request's or one reply's work, reused (capacity kept) so that a
  // call allocates no vectors here (stop 42: the direct path's per-call
  // allocations run under the worker's GIL). Empty between calls.
  Out out_ ABSL_GUARDED_BY(mu_);
  std::vector<ipc::Frame> to_driver_ ABSL_GUARDED_BY(mu_);
  std::vector<sandbox::SandboxEventPtr> batch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace agentix::worker
