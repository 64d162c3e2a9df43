// CallTable: the call state of host clients as one owner keeps it — the
// daemon's SessionManager (every relayed client) and the worker's
// DirectSession (one direct client) share it, so the two owners of
// docs/DIRECT-CALLS.md cannot drift. It holds what docs/RELIABILITY.md
// "Calls" promises about a call id:
// - id rules: empty or over kMaxCallIdBytes → BadRequest, never stored;
// - at most once: a known id from its own client is ignored, from another
//   client refused (CallIdInUse); finished ids (acknowledged, evicted,
//   refused) are remembered (FinishedIds) and a re-sent start of one gets
//   ResultUnavailable;
// - the argument checks (encoding, call context, sizes, max_payload_bytes)
//   and the upload's bookkeeping (offsets, gaps, idle uploads);
// - exactly one terminal event; every event kept for replay until the call
//   is acknowledged (StreamAck frees consumed items), finished calls bounded
//   by count and bytes, the oldest evicted (then ResultUnavailable);
// - Resume re-attaches a call to the resuming sink and replays its events.
//
// No locks, threads, clocks of its own beyond absl::Now, or I/O: its owner
// serializes every call (the daemon under its session lock) and does what
// reaches a worker (dispatch, argument bytes, cancel, stream acks) and the
// delivery of the `Out` events to their sinks.
//
// `Sink` is the owner's stream type (compared by address, kept alive while a
// call points at it); `Extra` is the owner's own per-call state, a base of
// Call (the daemon's worker generation, queue state, side-channel seqs).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "base/log.h"
#include "calls/call_errors.h"
#include "wire/finished_ids.h"
#include "wire/sandbox_event.h"
#include "worker/ipc/chunking.h"
#include "worker/ipc/frame.h"

namespace agentix::calls {

struct CallTableLimits {
  // Finished, unacknowledged results kept for resume; oldest evicted first.
  size_t max_retained_results = 4096;
  // Finished results' total serialized size; the newest is always kept.
  uint64_t max_retained_bytes = uint64_t{512} << 20;
  // Largest accepted encoded arguments of one call (PayloadTooLarge).
  uint64_t max_payload_bytes = uint64_t{1} << 30;
  // Arguments that stop arriving for this long: UploadTimeout.
  absl::Duration upload_idle_timeout = absl::Seconds(60);
  // Largest stream window passed to the worker (unacknowledged items are
  // retained by the owner, so the host's window must not size its memory).
  uint32_t max_stream_window = 1024;
  // Finished ids remembered (about 100 bytes each), in 2^N sets.
  size_t remembered_finished = 65536;
  int finished_ids_shard_bits = sandbox::FinishedIds::kShardBits;
};

// A start without argument bytes (neither inline nor announced) means no
// arguments: a copy carrying `[[], {}]` in its encoding.
bool HasNoArguments(const runtime::v1::StartCall& start,
                    std::string_view args);
runtime::v1::StartCall WithEmptyArguments(const runtime::v1::StartCall& start);

// The refusal of a start's arguments (wrong encoding byte, bad context,
// more bytes than announced, over `max_payload_bytes`), or null.
SandboxEventPtr RefuseArguments(const runtime::v1::StartCall& start,
                                std::string_view args,
                                uint64_t max_payload_bytes);

// The `call` frame for the worker (no argument bytes: the caller adds the
// first piece): callable, encoding (unspecified → pickle), total size,
// context, the stream window clamped to `max_stream_window`.
ipc::Frame MakeCallFrame(const std::string& id,
                         const runtime::v1::StartCall& start,
                         uint64_t total_size, uint32_t max_stream_window);

// The event for a worker's result, result_chunk, stream_item or error frame
// (frame.data moved out); `terminal` says whether it ends the call.
std::shared_ptr<runtime::v1::SandboxEvent> EventFromWorkerFrame(
    ipc::Frame& frame, bool& terminal);

SandboxEventPtr UploadTimeoutError(const std::string& id, uint64_t received,
                                   uint64_t expected, absl::Duration idle);

// Whether a worker frame of `type` is a call's output (TakeWorkerOutput).
inline bool IsCallOutput(ipc::FrameType type) {
  return type == ipc::FrameType::kResultChunk ||
         type == ipc::FrameType::kResult || type == ipc::FrameType::kError ||
         type == ipc::FrameType::kStreamItem;
}

template <typename Sink, typename Extra>
class CallTable {
 public:
  using SinkPtr = std::shared_ptr<Sink>;
  struct Call : Extra {
    SinkPtr sink;        // null while no stream owns the call
    std::string client;  // the host client that started it
    uint64_t args_expected = 0;
    uint64_t args_received = 0;
    absl::Time last_upload_progress;  // while args_received < args_expected
    bool terminal = false;
    // Every event sent for this call, kept for replay until acknowledged.
    // Most calls have one (their result): kept inline, no allocation.
    absl::InlinedVector<SandboxEventPtr, 1> delivered;
    std::list<std::string>::iterator retained_pos;
    uint64_t retained_bytes = 0;  // of `delivered`, once terminal
  };
  // An event for a sink; the owner hands them over in order.
  struct Delivery {
    SinkPtr sink;
    SandboxEventPtr event;
  };
  using Out = std::vector<Delivery>;
  using Map = absl::flat_hash_map<std::string, Call>;

  explicit CallTable(const CallTableLimits& limits)
      : limits_(limits),
        finished_(limits.remembered_finished, limits.finished_ids_shard_bits) {}

  const CallTableLimits& limits() const { return limits_; }
  Map& calls() { return calls_; }
  Call* Find(const std::string& id) {
    auto it = calls_.find(id);
    return it == calls_.end() ? nullptr : &it->second;
  }
  // A call that has not reached its terminal event (what a cancel ends).
  Call* FindOpen(const std::string& id) {
    Call* call = Find(id);
    return call != nullptr && !call->terminal ? call : nullptr;
  }
  bool IsFinished(std::string_view id) const { return finished_.Contains(id); }
  const sandbox::FinishedIds& finished() const { return finished_; }
  // Called with each call the table forgets on its own (evicted past the
  // retention bounds) just before it is erased; acks are the owner's call.
  void set_on_evict(std::function<void(const std::string&, Call&)> f) {
    on_evict_ = std::move(f);
  }
  // Remembers that `id` finished, so a re-sent start of it is refused.
  void RememberFinished(std::string_view id) { finished_.Remember(id); }
  uint32_t StreamWindow(const runtime::v1::StartCall& start) const {
    return std::min(start.stream_window(), limits_.max_stream_window);
  }
  uint64_t retained_bytes() const { return retained_bytes_; }
  size_t retained_results() const { return retained_order_.size(); }

  // A StartCall's id rules and at-most-once check: false when the start is
  // answered (BadRequest, CallIdInUse, ResultUnavailable) or ignored (its
  // client re-sent a known id); true for a new id.
  bool IsNewStart(const SinkPtr& sink, const std::string& client,
                  const std::string& id, Out& out) {
    if (id.empty()) {
      out.push_back({sink, BadRequest("", "missing call_id")});
      return false;
    }
    if (IdTooLong(id)) {
      out.push_back({sink, IdTooLongError(id)});
      return false;
    }
    if (auto known = calls_.find(id); known != calls_.end()) {
      // The owner re-sending it (after a reconnect) is ignored; another
      // client is refused at once, the call untouched.
      if (known->second.client != client) {
        out.push_back({sink, CallIdInUse(id)});
      }
      return false;
    }
    if (finished_.Contains(id)) {
      // The call ran and its result is gone. Never run it again.
      out.push_back({sink, AlreadyRanError(id)});
      return false;
    }
    return true;
  }

  // A new start's arguments checked (RefuseArguments) and the call stored,
  // owned by `sink`; null if refused (answered, its id remembered so that
  // chunks still on their way are dropped, not answered again).
  Call* Admit(const SinkPtr& sink, const std::string& client,
              const runtime::v1::StartCall& start, std::string_view args,
              Out& out) {
    const std::string& id = start.call_id();
    if (SandboxEventPtr refusal =
            RefuseArguments(start, args, limits_.max_payload_bytes)) {
      out.push_back({sink, std::move(refusal)});
      finished_.Remember(id);
      return nullptr;
    }
    Call& call = calls_[id];
    call.sink = sink;
    call.client = client;
    call.args_expected =
        start.arguments_size() == 0 ? args.size() : start.arguments_size();
    call.args_received = args.size();
    if (call.args_received < call.args_expected) {
      call.last_upload_progress = absl::Now();
      uploading_.insert(id);
    }
    return &call;
  }

  // What an ArgumentChunk does to its call: `call` null when there is
  // nothing more to do (answered, or ignored: a finished call's resumed
  // upload, another client's call, a closed call, bytes already seen);
  // `failure` non-empty when the upload is broken (a gap, more bytes than
  // announced): the owner ends the call with BadRequest(failure); otherwise
  // `data` are the new bytes (a re-sent overlap trimmed), already counted.
  struct ChunkUpdate {
    Call* call = nullptr;
    std::string_view data;
    std::string failure;
  };
  ChunkUpdate AddChunk(const SinkPtr& sink, const std::string& client,
                       const runtime::v1::ArgumentChunk& chunk,
                       std::string_view data, Out& out) {
    const std::string& id = chunk.call_id();
    if (IdTooLong(id)) {
      out.push_back({sink, IdTooLongError(id)});
      return {};
    }
    auto it = calls_.find(id);
    if (it == calls_.end()) {
      // A resumed upload of a call that already finished is quiet.
      if (!finished_.Contains(id)) {
        out.push_back({sink, BadRequest(id, "argument chunk for unknown "
                                            "call_id '" + id + "'")});
      }
      return {};
    }
    Call& call = it->second;
    // Another client's call: its StartCall was refused (CallIdInUse).
    if (call.client != client) return {};
    if (call.terminal) return {};  // e.g. cancelled while uploading
    if (chunk.has_offset()) {
      // A host resuming an upload after a reconnect sends pieces again from
      // where it lost track; the bytes already received are skipped.
      if (chunk.offset() > call.args_received) {
        return {&call, {},
                "argument chunk at offset " + std::to_string(chunk.offset()) +
                    " leaves a gap (" + std::to_string(call.args_received) +
                    " bytes received)"};
      }
      const uint64_t seen = call.args_received - chunk.offset();
      if (seen >= data.size()) return {};
      data.remove_prefix(seen);
    }
    if (call.args_received + data.size() > call.args_expected) {
      return {&call, {},
              "argument chunks exceed arguments_size (" +
                  std::to_string(call.args_expected) + " bytes)"};
    }
    call.args_received += data.size();
    if (call.args_received == call.args_expected) {
      uploading_.erase(id);
    } else if (!data.empty()) {
      call.last_upload_progress = absl::Now();
    }
    return {&call, data, ""};
  }

  // Moves each named call of `client` to `sink` and replays what it
  // produced (unless `sink` already had it live); ResultUnavailable for ids
  // not held, CallIdInUse for another client's.
  void Resume(const SinkPtr& sink, const std::string& client,
              const runtime::v1::ResumeCalls& resume, Out& out) {
    for (const std::string& id : resume.call_ids()) {
      if (IdTooLong(id)) {
        out.push_back({sink, IdTooLongError(id)});
        continue;
      }
      auto it = calls_.find(id);
      if (it == calls_.end()) {
        out.push_back({sink, NotHeldError(id)});
        continue;
      }
      Call& call = it->second;
      if (call.client != client) {
        out.push_back({sink, CallIdInUse(id)});
        continue;
      }
      if (call.sink == sink) continue;
      call.sink = sink;
      for (const auto& event : call.delivered) out.push_back({sink, event});
    }
  }

  // Drops the retained copies of consumed items (and the ResultChunks in
  // front of them, their leading bytes), so a long stream holds about one
  // window here. Returns the call when it still runs: the owner passes the
  // ack on to its worker.
  Call* AckStreamItems(const std::string& client,
                       const runtime::v1::StreamAck& ack) {
    auto it = calls_.find(ack.call_id());
    if (it == calls_.end() || it->second.client != client) return nullptr;
    Call& call = it->second;
    auto& delivered = call.delivered;
    auto consumed_end = delivered.begin();
    for (auto e = delivered.begin(); e != delivered.end(); ++e) {
      if ((*e)->has_stream_item() &&
          (*e)->stream_item().index() < ack.next_index()) {
        consumed_end = e + 1;
      }
    }
    delivered.erase(
        std::remove_if(delivered.begin(), consumed_end,
                       [&](const SandboxEventPtr& e) {
                         return e->has_result_chunk() ||
                                (e->has_stream_item() &&
                                 e->stream_item().index() < ack.next_index());
                       }),
        consumed_end);
    return call.terminal ? nullptr : &call;
  }

  // Frees a finished call of `client` and remembers its id; false (nothing
  // changes) for a running, unknown or other client's call.
  bool Ack(const std::string& client, const std::string& id) {
    auto it = calls_.find(id);
    if (it == calls_.end() || !it->second.terminal ||
        it->second.client != client) {
      return false;
    }
    Recycle(it->second.retained_pos);
    retained_bytes_ -= std::min(retained_bytes_, it->second.retained_bytes);
    calls_.erase(it);
    finished_.Remember(id);
    return true;
  }

  // Records `event` for `call` (terminal or not) and queues its delivery.
  // A terminal event retains the call, then evicts the oldest finished
  // calls past the bounds: with max_retained_results 0 that may be `call`
  // itself, so the owner must not use `call` after a terminal Emit.
  void Emit(const std::string& id, Call& call, SandboxEventPtr event,
            bool terminal, Out& out) {
    call.delivered.push_back(event);
    if (call.sink) out.push_back({call.sink, std::move(event)});
    if (!terminal) return;
    call.terminal = true;
    if (call.args_received < call.args_expected) uploading_.erase(id);
    call.retained_pos = Retain(id);
    call.retained_bytes = 0;
    for (const auto& e : call.delivered) call.retained_bytes += e->ByteSizeLong();
    retained_bytes_ += call.retained_bytes;
    // Bounded by count and by bytes: a host whose acks were lost (e.g. in a
    // connection cut) must not pin large results for ever.
    while (retained_order_.size() > limits_.max_retained_results ||
           (retained_bytes_ > limits_.max_retained_bytes &&
            retained_order_.size() > 1)) {
      Recycle(retained_order_.begin());
      const std::string& oldest = spare_order_.front();  // until the next one
      auto victim = calls_.find(oldest);
      if (victim != calls_.end()) {
        if (on_evict_) on_evict_(oldest, victim->second);
        retained_bytes_ -=
            std::min(retained_bytes_, victim->second.retained_bytes);
        calls_.erase(victim);
      }
      finished_.Remember(oldest);
      if (evicted_++ % 1000 == 0) {
        AGX_LOG(Warning,
                "retained-result buffer full (max {} results, {} bytes): "
                "evicted unacknowledged result of call {} (evictions so far: "
                "{})",
                limits_.max_retained_results, limits_.max_retained_bytes,
                oldest, evicted_);
      }
    }
  }

  // A worker's output frame for `call` as its events: the leading whole
  // chunks of a value over ipc::kChunkBytes emitted as ResultChunks (so
  // every event fits a default client's message), the returned event (not
  // yet emitted: the daemon stamps barrier seqs on it first) with the rest.
  std::shared_ptr<runtime::v1::SandboxEvent> TakeWorkerOutput(
      const std::string& id, Call& call, ipc::Frame& frame, bool& terminal,
      Out& out) {
    if (frame.type != ipc::FrameType::kError &&
        frame.data.size() > ipc::kChunkBytes) {
      EmitLeadingChunks(id, call, frame.data, out);
    }
    return EventFromWorkerFrame(frame, terminal);
  }

  // Emits the leading whole chunks of `data` as ResultChunk events and
  // leaves the rest (at most one chunk) in `data`.
  void EmitLeadingChunks(const std::string& id, Call& call, std::string& data,
                         Out& out) {
    const size_t lead =
        ipc::SplitWithTail(data.size()).full * ipc::kChunkBytes;
    for (size_t off = 0; off < lead; off += ipc::kChunkBytes) {
      auto chunk_event = std::make_shared<runtime::v1::SandboxEvent>();
      auto* chunk = chunk_event->mutable_result_chunk();
      chunk->set_call_id(id);
      chunk->set_data(data.substr(off, ipc::kChunkBytes));
      Emit(id, call, std::move(chunk_event), /*terminal=*/false, out);
    }
    data.erase(0, lead);
  }

  // Whether any upload is in progress (the watchdog sleeps otherwise).
  bool uploading() const { return !uploading_.empty(); }
  // The open calls whose arguments made no progress for
  // upload_idle_timeout by `now`; they stop being watched. The owner ends
  // each with UploadTimeoutError and tells its worker.
  std::vector<std::string> ExpiredUploads(absl::Time now) {
    std::vector<std::string> expired;
    for (const std::string& id : uploading_) {
      auto it = calls_.find(id);
      if (it == calls_.end() || now - it->second.last_upload_progress >=
                                    limits_.upload_idle_timeout) {
        expired.push_back(id);
      }
    }
    std::vector<std::string> open;
    for (std::string& id : expired) {
      uploading_.erase(id);
      if (FindOpen(id) != nullptr) open.push_back(std::move(id));
    }
    return open;
  }

  // The stream behind `sink` ended: its calls keep running, their events
  // retained until a resume or eviction.
  void Detach(const Sink* sink) {
    for (auto& [id, call] : calls_) {
      if (call.sink.get() == sink) call.sink.reset();
    }
  }
  // Whether a call owned by `sink` has not reached its terminal event.
  bool HasOpenCalls(const Sink* sink) const {
    for (const auto& [id, call] : calls_) {
      if (!call.terminal && call.sink.get() == sink) return true;
    }
    return false;
  }

 private:
  // The retention order's node for `id`, at the back: a spare node when
  // there is one, so a call in the steady state allocates neither a node
  // nor its id's copy (the spare's string keeps its capacity).
  std::list<std::string>::iterator Retain(const std::string& id) {
    if (spare_order_.empty()) {
      return retained_order_.insert(retained_order_.end(), id);
    }
    spare_order_.front().assign(id);
    retained_order_.splice(retained_order_.end(), spare_order_,
                           spare_order_.begin());
    return std::prev(retained_order_.end());
  }
  // Takes `pos` out of the retention order into the spare nodes' front (its
  // id readable there until the next Retain or Recycle).
  void Recycle(std::list<std::string>::iterator pos) {
    spare_order_.splice(spare_order_.begin(), retained_order_, pos);
    if (spare_order_.size() > kSpareOrderNodes) spare_order_.pop_back();
  }
  // Enough for the retained count's usual swings; ~100 bytes each.
  static constexpr size_t kSpareOrderNodes = 1024;

  const CallTableLimits limits_;
  Map calls_;
  std::list<std::string> retained_order_;
  std::list<std::string> spare_order_;  // Recycle'd nodes, for Retain
  uint64_t retained_bytes_ = 0;
  uint64_t evicted_ = 0;
  sandbox::FinishedIds finished_;
  // Calls whose arguments are still arriving (watched for idleness).
  absl::flat_hash_set<std::string> uploading_;
  std::function<void(const std::string&, Call&)> on_evict_;
};

}  // namespace agentix::calls
