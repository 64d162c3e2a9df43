#include "sandbox/session_manager.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <optional>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/malloc_tuning.h"
#include "base/status_macros.h"
#include "sandbox/startup_env.h"
#include "wire/namespace_rules.h"
#include "wire/wire_limits.h"
#include "worker/ipc/chunking.h"

namespace agentix::sandbox {

using runtime::v1::HostEvent;
using runtime::v1::SandboxEvent;

using calls::BadRequest;
using calls::NewCallError;

calls::CallTableLimits SessionManager::TableLimits(
    const SessionOptions& options) {
  calls::CallTableLimits limits;
  limits.max_retained_results = options.max_retained_results;
  limits.max_retained_bytes = options.max_retained_bytes;
  limits.max_payload_bytes = options.max_payload_bytes;
  limits.upload_idle_timeout = options.upload_idle_timeout;
  limits.max_stream_window = options.max_stream_window;
  limits.finished_ids_shard_bits = options.finished_ids_shard_bits;
  return limits;
}

SessionManager::SessionManager(SessionOptions options)
    : options_(std::move(options)),
      logs_(MakeLogBuffer(options_.log_buffer_records)),
      traces_(MakeTraceBuffer(options_.trace_buffer_events, logs_.get())),
      namespaces_(options_.max_namespace_streams) {
  logs_->SetMaxSubscribers(options_.max_log_subscribers);
  traces_->SetMaxSubscribers(options_.max_log_subscribers);
  upload_watch_ = std::thread([this] { WatchUploads(); });
}

SessionManager::~SessionManager() { Shutdown(absl::Seconds(2)); }

void SessionManager::WatchUploads() {
  // Sleeps while no upload is in progress; otherwise checks a few times per
  // timeout (at most once a second), so an idle upload ends within ~1.25x.
  const absl::Duration tick = std::clamp(options_.upload_idle_timeout / 4,
                                         absl::Milliseconds(5), absl::Seconds(1));
  while (true) {
    std::vector<Delivery> out;
    bool release = false;
    bool deliver = false;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shut_down_ || table_.uploading() || release_memory_ ||
               env_pending_generation_ != 0;
      };
      mu_.Await(absl::Condition(&wake));
      if (shut_down_) return;
      release = std::exchange(release_memory_, false);
      if (!release) {
        // Also bounds a set_env without an answer (env_pending_*).
        const uint64_t pending = env_pending_generation_;
        absl::Time until = absl::Now() + tick;
        if (pending != 0) until = std::min(until, env_pending_deadline_);
        auto stop = [this, pending]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return shut_down_ ||
                 (pending != 0 && env_pending_generation_ != pending);
        };
        mu_.AwaitWithDeadline(absl::Condition(&stop), until);
        if (shut_down_) return;
        if (pending != 0 && env_pending_generation_ == pending &&
            absl::Now() >= env_pending_deadline_) {
          EndEnvPending("no answer to set_env in time", out);
        }
        if (table_.uploading()) ExpireUploads(absl::Now(), out);
        if (!out.empty()) {
          DispatchQueued(out);
          FlushToWorker();
          Post(out);
          deliver = true;
        }
      }
    }
    if (release) base::ReleaseFreeMemory();
    if (deliver) DeliverPosted();
  }
}

void SessionManager::ExpireUploads(absl::Time now, std::vector<Delivery>& out) {
  for (const std::string& id : table_.ExpiredUploads(now)) {
    Call& call = *table_.FindOpen(id);
    FailCall(id, call,
             calls::UploadTimeoutError(id, call.args_received,
                                       call.args_expected,
                                       options_.upload_idle_timeout),
             out);
  }
}

void SessionManager::FailCall(const std::string& id, Call& call,
                              SandboxEventPtr event,
                              std::vector<Delivery>& out) {
  const uint64_t generation = call.generation;  // `call` may be evicted
  Emit(id, call, std::move(event), /*terminal=*/true, out);
  if (worker_ && generation != 0 && worker_->generation() == generation) {
    ipc::Frame cancel;
    cancel.type = ipc::FrameType::kCancel;
    cancel.call_id = id;
    SendToWorker(cancel);
  }
}

bool AcksCanFollowStarts(
    const google::protobuf::RepeatedPtrField<HostEvent>& events) {
  // Small: a sequential caller's message is its previous call's ack and its
  // next StartCall; a pipelined one's a few of each.
  absl::InlinedVector<std::string_view, 4> acked;
  bool starts = false;
  for (const HostEvent& event : events) {
    switch (event.kind_case()) {
      case HostEvent::kAck:
        acked.push_back(event.ack().call_id());
        break;
      case HostEvent::kStart:
        starts = true;
        break;
      default:
        return false;  // a resume, cancel or chunk sees the acks in order
    }
  }
  if (!starts || acked.empty()) return false;
  absl::flat_hash_set<std::string_view> acked_set;
  if (acked.size() > 8) acked_set.insert(acked.begin(), acked.end());
  for (const HostEvent& event : events) {
    if (event.kind_case() != HostEvent::kStart) continue;
    const std::string_view id = event.start().call_id();
    const bool same = acked.size() > 8
                          ? acked_set.contains(id)
                          : std::find(acked.begin(), acked.end(), id) != acked.end();
    // A start of an id acked before it must find it finished (refused).
    if (same) return false;
  }
  return true;
}

void SessionManager::HandleHostEvent(const std::shared_ptr<CallSink>& sink,
                                     const HostEvent& event) {
  google::protobuf::RepeatedPtrField<HostEvent> one;
  *one.Add() = event;
  HandleHostEvents(sink, one, {});
}

void SessionManager::HandleHostEvents(
    const std::shared_ptr<CallSink>& sink,
    const google::protobuf::RepeatedPtrField<HostEvent>& events) {
  HandleHostEvents(sink, events, {});
}

void SessionManager::HandleHostEvents(
    const std::shared_ptr<CallSink>& sink,
    const google::protobuf::RepeatedPtrField<HostEvent>& events,
    absl::Span<const std::optional<std::string_view>> bulk) {
  static const std::optional<std::string_view> kInMessage;
  std::vector<Delivery> out;
  const bool acks_last = options_.acks_after_starts && AcksCanFollowStarts(events);
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < events.size(); ++i) {
      if (acks_last && events[i].kind_case() == HostEvent::kAck) continue;
      ApplyHostEvent(sink, events[i],
                     static_cast<size_t>(i) < bulk.size() ? bulk[i] : kInMessage,
                     out);
    }
    DispatchQueued(out);
    FlushToWorker();
    Post(out);
  }
  DeliverPosted();
  if (acks_last) {
    // The previous calls' acks once this message's calls are on their way
    // to the worker: freeing a result and remembering its id (at times a
    // fresh page or a heap growth) is no longer on the next call's path.
    // Not under the lock the starts took: a worker that woke on this CPU
    // and answers at once must not find the session lock held.
    absl::MutexLock lock(&mu_);
    for (const HostEvent& event : events) {
      if (event.kind_case() == HostEvent::kAck) {
        Ack(*sink, event.ack().call_id());
      }
    }
  }
  ReapDeadWorkers();
}

void SessionManager::ApplyHostEvent(
    const std::shared_ptr<CallSink>& sink, const HostEvent& event,
    const std::optional<std::string_view>& bulk, std::vector<Delivery>& out) {
  switch (event.kind_case()) {
    case HostEvent::kStart:
      StartCall(sink, event.start(),
                bulk ? *bulk : std::string_view(event.start().arguments()),
                out);
      break;
    case HostEvent::kArgumentChunk:
      AddArgumentChunk(
          sink, event.argument_chunk(),
          bulk ? *bulk : std::string_view(event.argument_chunk().data()), out);
      break;
    case HostEvent::kCancel:
      Cancel(event.cancel().call_id(), out);
      break;
    case HostEvent::kResume:
      Resume(sink, event.resume(), out);
      break;
    case HostEvent::kAck:
      Ack(*sink, event.ack().call_id());
      break;
    case HostEvent::kStreamAck:
      AckStreamItems(*sink, event.stream_ack());
      break;
    case HostEvent::KIND_NOT_SET:
      out.push_back({sink, BadRequest("", "host event has no kind set")});
      break;
  }
}

void SessionManager::SendToWorker(const ipc::Frame& frame) {
  absl::Status status = ipc::AppendFrame(frame, to_worker_);
  if (!status.ok()) {
    // Payloads are chunked to kChunkBytes, so this is a bug, not bad input.
    AGX_LOG(Error, "dropping unencodable {} frame: {}",
            ipc::FrameTypeName(frame.type), status.ToString());
  }
}

void SessionManager::FlushToWorker() {
  // Frames queued for a worker that has since died are moot: its exit
  // callback fails the calls they belonged to.
  if (worker_ && !to_worker_.empty()) {
    worker_->SendEncoded(std::move(to_worker_));
  }
  to_worker_.clear();
}

void SessionManager::StartCall(const std::shared_ptr<CallSink>& sink,
                               const runtime::v1::StartCall& start,
                               std::string_view args,
                               std::vector<Delivery>& out) {
  const std::string& id = start.call_id();
  if (!table_.IsNewStart(sink, sink->client_id(), id, out)) return;
  if (shut_down_) {
    out.push_back({sink, MakeCallError(id, "Unavailable",
                                       "sandbox daemon is shutting down",
                                       absl::StatusCode::kUnavailable)});
    return;
  }
  // No argument bytes at all mean no arguments: `[[], {}]` in the call's
  // encoding (hosts that send arguments never get here).
  if (calls::HasNoArguments(start, args)) {
    const runtime::v1::StartCall with_empty = calls::WithEmptyArguments(start);
    StartCall(sink, with_empty, with_empty.arguments(), out);
    return;
  }
  Call* admitted = table_.Admit(sink, sink->client_id(), start, args, out);
  if (admitted == nullptr) return;
  Call& call = *admitted;
  const size_t limit = options_.max_concurrent_calls;
  if (env_pending_generation_ != 0 ||
      (limit > 0 && (running_calls_ >= limit || !call_queue_.empty()))) {
    if (call_queue_.size() >= options_.max_queued_calls) {
      Emit(id, call,
           MakeCallError(
               id, "TooManyCalls",
               absl::StrCat(running_calls_, " calls are running and ",
                            call_queue_.size(),
                            " waiting (--max-concurrent-calls ", limit,
                            ", --max-queued-calls ",
                            options_.max_queued_calls, "); retry later"),
               absl::StatusCode::kResourceExhausted),
           /*terminal=*/true, out);
      return;
    }
    call.queued = true;
    call.start = start;
    call.start.clear_arguments();
    call.queued_args.assign(args.data(), args.size());
    call_queue_.push_back(id);
    return;
  }
  Dispatch(id, call, start, args, out);
}

void SessionManager::Dispatch(const std::string& id, Call& call,
                              const runtime::v1::StartCall& start,
                              std::string_view args,
                              std::vector<Delivery>& out) {
  auto worker = EnsureWorker();
  if (!worker.ok()) {
    Emit(id, call,
         MakeCallError(id, "WorkerBootError",
                       absl::StrCat("runtime worker could not be started: ",
                                    worker.status().message()),
                       absl::StatusCode::kUnavailable),
         /*terminal=*/true, out);
    return;
  }
  call.generation = (*worker)->generation();
  call.dispatched = true;
  call.unattributed_log_mark = unattributed_log_seq_;
  call.unattributed_trace_mark = unattributed_trace_seq_;
  ++running_calls_;

  ipc::Frame frame = calls::MakeCallFrame(id, start, call.args_expected,
                                         options_.max_stream_window);
  const size_t first = std::min(args.size(), ipc::kChunkBytes);
  if (!PutInRing(args.substr(0, first), frame)) {
    frame.data.assign(args.data(), first);
  }
  SendToWorker(frame);
  if (args.size() > first) ForwardArguments(id, args.substr(first));
}

void SessionManager::DispatchQueued(std::vector<Delivery>& out) {
  if (env_pending_generation_ != 0) return;  // they wait for env_set
  const size_t limit = options_.max_concurrent_calls;
  while (!call_queue_.empty() && !shut_down_ &&
         (limit == 0 || running_calls_ < limit)) {
    const std::string id = std::move(call_queue_.front());
    call_queue_.pop_front();
    Call* queued = table_.Find(id);
    if (queued == nullptr || !queued->queued) continue;
    Call& call = *queued;
    call.queued = false;
    std::string args = std::move(call.queued_args);
    call.queued_args.clear();
    Dispatch(id, call, call.start, args, out);
  }
}

void SessionManager::ForwardArguments(const std::string& call_id,
                                      std::string_view bytes) {
  if (!worker_) return;
  ipc::ForEachChunk(bytes, [&](std::string_view piece) {
    ipc::Frame frame;
    frame.type = ipc::FrameType::kArgChunk;
    absl::Status status;
    if (PutInRing(piece, frame)) {
      frame.call_id = call_id;
      status = ipc::AppendFrame(frame, to_worker_);
    } else {
      status = ipc::AppendDataFrame(ipc::FrameType::kArgChunk, call_id, piece,
                                    to_worker_);
    }
    if (!status.ok()) {
      AGX_LOG(Error, "dropping unencodable argument chunk: {}",
              status.ToString());
    }
  });
}

bool SessionManager::PutInRing(std::string_view piece, ipc::Frame& frame) {
  ipc::PayloadArea* ring = worker_ ? worker_->payloads() : nullptr;
  if (ring == nullptr || piece.size() < ipc::kRingMinPieceBytes) return false;
  const std::optional<uint64_t> pos = ring->Put(piece);
  if (!pos) return false;
  frame.in_ring = true;
  frame.ring_pos = *pos;
  frame.ring_size = piece.size();
  return true;
}

void SessionManager::AddArgumentChunk(const std::shared_ptr<CallSink>& sink,
                                      const runtime::v1::ArgumentChunk& chunk,
                                      std::string_view data,
                                      std::vector<Delivery>& out) {
  const std::string& id = chunk.call_id();
  Table::ChunkUpdate update =
      table_.AddChunk(sink, sink->client_id(), chunk, data, out);
  if (update.call == nullptr) return;
  Call& call = *update.call;
  // A broken upload ends the call: its one terminal event is this error, and
  // the worker is told to drop it.
  if (!update.failure.empty()) {
    FailCall(id, call, BadRequest(id, std::move(update.failure)), out);
    return;
  }
  if (call.queued) {
    call.queued_args.append(update.data.data(), update.data.size());
  } else if (worker_ && worker_->generation() == call.generation) {
    ForwardArguments(id, update.data);
  }
}

void SessionManager::Cancel(const std::string& call_id,
                            std::vector<Delivery>& out) {
  Call* call = table_.FindOpen(call_id);
  if (call == nullptr) {
    // Perhaps another client's direct call: the worker's session tells its
    // owner Cancelled (the driver answers the cancel), or nothing happens.
    if (!direct_held_.empty() && worker_ && !call_id.empty() &&
        call_id.size() <= kMaxCallIdBytes) {
      ipc::Frame cancel;
      cancel.type = ipc::FrameType::kCancel;
      cancel.call_id = call_id;
      SendToWorker(cancel);
    }
    return;
  }
  // The owner is told, whoever sent the cancel (the original left it hanging).
  FailCall(call_id, *call,
           MakeCallError(call_id, "Cancelled", "remote call cancelled",
                         absl::StatusCode::kCancelled),
           out);
}

void SessionManager::Resume(const std::shared_ptr<CallSink>& sink,
                            const runtime::v1::ResumeCalls& resume,
                            std::vector<Delivery>& out) {
  table_.Resume(sink, sink->client_id(), resume, out);
}

void SessionManager::AckStreamItems(const CallSink& sink,
                                    const runtime::v1::StreamAck& ack) {
  Call* call = table_.AckStreamItems(sink.client_id(), ack);
  if (call == nullptr || !worker_ ||
      worker_->generation() != call->generation) {
    return;
  }
  ipc::Frame frame;
  frame.type = ipc::FrameType::kStreamAck;
  frame.call_id = ack.call_id();
  frame.index = ack.next_index();
  SendToWorker(frame);
}

void SessionManager::Ack(const CallSink& sink, const std::string& call_id) {
  table_.Ack(sink.client_id(), call_id);
}

void SessionManager::Emit(const std::string& call_id, Call& call,
                          SandboxEventPtr event, bool terminal,
                          std::vector<Delivery>& out) {
  if (terminal) {
    if (call.dispatched) {
      call.dispatched = false;
      --running_calls_;
    }
    // One clock read per burst of calls, not per call, when calls overlap.
    if (running_calls_ == 0) last_call_end_ = absl::Now();
    if (call.queued) {  // cancelled or refused while waiting
      call.queued = false;
      call.queued_args.clear();
      call_queue_.erase(
          std::remove(call_queue_.begin(), call_queue_.end(), call_id),
          call_queue_.end());
    }
  }
  table_.Emit(call_id, call, std::move(event), terminal, out);
}

absl::StatusOr<WorkerProcess*> SessionManager::EnsureWorker() {
  if (worker_) return worker_.get();
  // posix_spawn under the lock is deliberate: it takes about a millisecond
  // and keeps "exactly one live worker" trivially true.
  absl::StatusOr<std::unique_ptr<WorkerProcess>> worker;
  if (extra_env_.empty()) {
    worker = WorkerProcess::Start(options_.worker, next_generation_, this);
  } else {
    WorkerOptions with_env = options_.worker;
    absl::flat_hash_set<std::string_view> keys;
    for (const std::string& entry : extra_env_) {
      keys.insert(std::string_view(entry).substr(0, entry.find('=')));
    }
    auto& env = with_env.env;
    env.erase(std::remove_if(env.begin(), env.end(),
                             [&](const std::string& entry) {
                               return keys.contains(std::string_view(entry).substr(
                                   0, entry.find('=')));
                             }),
              env.end());
    env.insert(env.end(), extra_env_.begin(), extra_env_.end());
    worker = WorkerProcess::Start(with_env, next_generation_, this);
  }
  if (!worker.ok()) return worker.status();
  ++next_generation_;
  ++workers_started_;
  worker_ = std::move(*worker);
  return worker_.get();
}

void SessionManager::OnWorkerFrames(uint64_t generation,
                                    std::vector<ipc::Frame>& frames) {
  // A side-channel frame's record string is moved into its buffered record.
  std::vector<ipc::Frame*> log_frames;
  std::vector<ipc::Frame*> trace_frames;
  std::vector<const ipc::Frame*> namespace_events;
  for (ipc::Frame& frame : frames) {
    if (frame.type == ipc::FrameType::kLog) {
      log_frames.push_back(&frame);
    } else if (frame.type == ipc::FrameType::kTrace) {
      trace_frames.push_back(&frame);
    } else if (frame.type == ipc::FrameType::kNamespaceEvent) {
      namespace_events.push_back(&frame);
    }
  }
  // Side channels first: the worker writes what a call logged before its
  // result, so the records are numbered before the result is emitted and
  // the result carries their seqs (the barrier the host waits on).
  uint64_t first_log = 0;
  uint64_t first_trace = 0;
  // The calls the records name, in frame order, as runs (the records
  // themselves are moved into the buffers).
  std::vector<IdRun> log_calls;
  std::vector<IdRun> trace_calls;
  // Each record's direct connection (0: relayed), when a batch has any
  // (docs/DIRECT-CALLS.md, stage 5); empty otherwise.
  std::vector<uint64_t> log_conns;
  std::vector<uint64_t> trace_conns;
  auto note_conn = [](std::vector<uint64_t>& conns, size_t index,
                      uint64_t conn) {
    if (conn == 0 && conns.empty()) return;
    conns.resize(index, 0);
    conns.push_back(conn);
  };
  if (!log_frames.empty() || !trace_frames.empty()) {
    std::string worker_id;
    std::vector<IdRun> log_owners;
    std::vector<IdRun> trace_owners;
    // Checked before taking mu_: the worker's bytes are the records.
    std::vector<LogRecordWire> records;
    records.reserve(log_frames.size());
    std::string call_id;  // reused: no string per record
    for (ipc::Frame* f : log_frames) {
      records.push_back(
          ToWireLogRecord(std::move(f->record), "", &call_id));
      AddToRuns(log_calls, call_id);
      note_conn(log_conns, records.size() - 1, f->direct_conn.conn);
    }
    std::vector<TraceEventWire> events;
    events.reserve(trace_frames.size());
    for (ipc::Frame* f : trace_frames) {
      const size_t size = f->record.size();
      std::optional<TraceEventWire> e =
          ToWireTraceEvent(std::move(f->record), "", &call_id);
      if (!e.has_value()) {
        // Only code writing to the channel fd by hand gets here: the loss
        // is reported on the Logs stream, and the worker keeps serving.
        records.push_back(WireOf(RuntimeWarning(
            "agentix.sandbox",
            absl::StrCat("a trace event from the worker could not be "
                         "decoded (", size, " bytes)"))));
        AddToRuns(log_calls, "");
        continue;
      }
      AddToRuns(trace_calls, call_id);
      events.push_back(std::move(*e));
      note_conn(trace_conns, events.size() - 1, f->direct_conn.conn);
    }
    if (!log_conns.empty()) log_conns.resize(records.size(), 0);
    if (!trace_conns.empty()) trace_conns.resize(events.size(), 0);
    {
      absl::MutexLock lock(&mu_);
      if (worker_ && worker_->generation() == generation) {
        worker_id = worker_->worker_id();
      }
      log_owners = OwnersOf(log_calls);
      trace_owners = OwnersOf(trace_calls);
    }
    if (!log_conns.empty()) {
      log_owners = direct_side_.Owners(generation, log_calls, log_conns, log_owners);
    }
    if (!trace_conns.empty()) {
      trace_owners =
          direct_side_.Owners(generation, trace_calls, trace_conns, trace_owners);
    }
    if (!records.empty()) {
      for (LogRecordWire& r : records) r.set_worker_id(worker_id);
      first_log = logs_->AppendRuns(std::move(records), log_owners);
    }
    if (!events.empty()) {
      for (TraceEventWire& e : events) e.set_worker_id(worker_id);
      first_trace = traces_->AppendRuns(std::move(events), trace_owners);
    }
  }
  std::vector<Delivery> out;
  bool barrier = false;
  {
    absl::MutexLock lock(&mu_);
    if (!log_calls.empty()) {
      TrackSeqs(log_calls, first_log, &Call::log_seq, unattributed_log_seq_);
    }
    if (!trace_calls.empty()) {
      TrackSeqs(trace_calls, first_trace, &Call::trace_seq,
                unattributed_trace_seq_);
    }
    if (!log_conns.empty()) {
      direct_side_.TrackSeqs(generation, log_calls, log_conns, first_log,
                             /*trace=*/false);
    }
    if (!trace_conns.empty()) {
      direct_side_.TrackSeqs(generation, trace_calls, trace_conns, first_trace,
                             /*trace=*/true);
    }
    bool answered = false;
    for (ipc::Frame& frame : frames) {
      if (frame.type == ipc::FrameType::kBarrierAsk) {
        AnswerBarrier(generation, frame);
        answered = barrier = true;
      } else if (frame.type != ipc::FrameType::kLog &&
                 frame.type != ipc::FrameType::kTrace &&
                 frame.type != ipc::FrameType::kNamespaceEvent) {
        barrier |= ApplyWorkerFrame(generation, frame, out);
      }
    }
    if (answered) FlushToWorker();
    if (!call_queue_.empty()) {
      DispatchQueued(out);
      FlushToWorker();
    }
    Post(out);
  }
  if (!namespace_events.empty()) RouteNamespaceEvents(namespace_events);
  if (barrier) {
    // A host waits for these records before it returns the result: they
    // must not sit out the Logs stream's coalescing delay.
    logs_->FlushSubscribers();
    traces_->FlushSubscribers();
  }
  DeliverPosted();
  ThrottleResults();
}

void SessionManager::AnswerBarrier(uint64_t generation,
                                   const ipc::Frame& ask) {
  // The records before the ask (in the link's order) are numbered: the
  // seqs they got, or the untagged ones' when the call saw some.
  const DirectSideChannels::Seqs seqs = direct_side_.Take(generation, ask.call_id);
  ipc::Frame answer;
  answer.type = ipc::FrameType::kBarrier;
  answer.call_id = ask.call_id;
  answer.log_seq = seqs.log_seq;
  answer.trace_seq = seqs.trace_seq;
  if (ask.untagged) {
    answer.log_seq = std::max(answer.log_seq, unattributed_log_seq_);
    answer.trace_seq = std::max(answer.trace_seq, unattributed_trace_seq_);
  }
  // Only the asking worker waits for it (a later one never asked).
  if (worker_ && worker_->generation() == generation) SendToWorker(answer);
}

void SessionManager::TellDirectCallsCpu(std::string_view value) {
  absl::MutexLock lock(&mu_);
  if (!worker_ || !worker_->direct_capable()) return;
  // The probe's answer placed the call path on a direct host's CPU (or
  // unpinned it): no relayed read will publish it.
  worker_->PublishPlacement();
  ipc::Frame answer;
  answer.type = ipc::FrameType::kCallsCpuAnswer;
  answer.detail = std::string(value);
  SendToWorker(answer);
  FlushToWorker();
}

std::vector<IdRun> SessionManager::OwnersOf(
    const std::vector<IdRun>& call_ids) {
  std::vector<IdRun> owners;
  for (const IdRun& run : call_ids) {
    const Call* call = run.id.empty() ? nullptr : table_.Find(run.id);
    AddToRuns(owners, call == nullptr ? std::string_view() : call->client,
              run.count);
  }
  return owners;
}

void SessionManager::TrackSeqs(const std::vector<IdRun>& call_ids,
                               uint64_t first,
                               uint64_t Call::*call_seq,
                               uint64_t& unattributed) {
  uint64_t seq = first;
  for (const IdRun& run : call_ids) {
    seq += run.count;
    const uint64_t last = seq - 1;  // the run's last record
    if (run.id.empty()) {
      unattributed = last;
      continue;
    }
    if (Call* call = table_.FindOpen(run.id)) call->*call_seq = last;
  }
}

bool SessionManager::StampBarrier(const Call& call, SandboxEvent& event) {
  uint64_t log_seq = call.log_seq;
  if (unattributed_log_seq_ > call.unattributed_log_mark) {
    log_seq = std::max(log_seq, unattributed_log_seq_);
  }
  uint64_t trace_seq = call.trace_seq;
  if (unattributed_trace_seq_ > call.unattributed_trace_mark) {
    trace_seq = std::max(trace_seq, unattributed_trace_seq_);
  }
  if (log_seq == 0 && trace_seq == 0) return false;
  switch (event.kind_case()) {
    case SandboxEvent::kResult:
      event.mutable_result()->set_log_seq(log_seq);
      event.mutable_result()->set_trace_seq(trace_seq);
      break;
    case SandboxEvent::kError:
      event.mutable_error()->set_log_seq(log_seq);
      event.mutable_error()->set_trace_seq(trace_seq);
      break;
    case SandboxEvent::kStreamItem:
      event.mutable_stream_item()->set_log_seq(log_seq);
      event.mutable_stream_item()->set_trace_seq(trace_seq);
      break;
    default:
      return false;
  }
  return true;
}

void SessionManager::ThrottleResults() {
  const auto cap = static_cast<int64_t>(options_.max_retained_bytes);
  int64_t lowest = unwritten_->load(std::memory_order_relaxed);
  if (lowest <= cap) return;
  // Not reading the worker's pipe makes it wait: its calls produce no more
  // until the hosts have taken what they were sent.
  absl::Time progress = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return;
    }
    const int64_t now_bytes = unwritten_->load(std::memory_order_relaxed);
    if (now_bytes <= cap) return;
    if (now_bytes < lowest) {
      lowest = now_bytes;
      progress = absl::Now();
    } else if (absl::Now() - progress >= options_.stalled_host_timeout) {
      AbortMostBacklogged();
      lowest = unwritten_->load(std::memory_order_relaxed);
      progress = absl::Now();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

void SessionManager::AbortMostBacklogged() {
  std::vector<std::shared_ptr<CallSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [ptr, weak] : sinks_) {
      if (auto sink = weak.lock()) sinks.push_back(std::move(sink));
    }
  }
  std::shared_ptr<CallSink> worst;
  size_t worst_bytes = 0;
  for (const auto& sink : sinks) {
    const size_t bytes = sink->UnwrittenBytes();
    if (bytes > worst_bytes) {
      worst = sink;
      worst_bytes = bytes;
    }
  }
  if (!worst) return;
  AGX_LOG(Warning,
          "a host stream has not read {} bytes of results for {}: ending it "
          "(its calls stay retained for a resume)",
          worst_bytes, absl::FormatDuration(options_.stalled_host_timeout));
  worst->Abort(absl::StrCat(
      "the host did not read its results (", worst_bytes,
      " bytes unwritten) for ",
      absl::FormatDuration(options_.stalled_host_timeout),
      " while the daemon's unwritten results exceeded --max-retained-bytes (",
      options_.max_retained_bytes,
      "); reconnect and resume the calls"));
}

void SessionManager::RouteNamespaceEvents(
    const std::vector<const ipc::Frame*>& frames) {
  // Consecutive events of one namespace go out as one batch.
  size_t begin = 0;
  while (begin < frames.size()) {
    const std::string& name = frames[begin]->ns.name;
    size_t end = begin;
    std::vector<NamespaceEventPtr> batch;
    std::vector<runtime::v1::LogRecord> oversize;
    while (end < frames.size() && frames[end]->ns.name == name) {
      auto event = std::make_shared<runtime::v1::NamespaceEvent>();
      FillNamespaceEvent(*frames[end], *event);
      // Payloads cannot be cut: one that cannot fit a default client's
      // 4 MiB message is not delivered, and the hosts' logs say so.
      if (event->ByteSizeLong() > kMaxWireItemBytes) {
        oversize.push_back(RuntimeWarning("agentix.sio", absl::StrCat(
            "sandbox emitted event '", frames[end]->ns.event.substr(0, 1024),
            "' on namespace ", name, " with ", event->ByteSizeLong(),
            " bytes, over the ", kMaxWireItemBytes,
            "-byte limit of one message; the event was dropped. Send large "
            "data in several events.")));
      } else {
        batch.push_back(std::move(event));
      }
      ++end;
    }
    if (!oversize.empty()) logs_->Append(std::move(oversize));
    if (batch.empty()) {
      begin = end;
      continue;
    }
    if (namespaces_.Broadcast(name, batch) == 0) {
      // As in the original, an event with no listening host is not kept,
      // but it is never lost silently: the first one of each event name is
      // reported to the hosts' logs.
      std::vector<runtime::v1::LogRecord> warnings;
      {
        absl::MutexLock lock(&mu_);
        for (size_t i = begin; i < end; ++i) {
          const std::string& event = frames[i]->ns.event;
          if (!unrouted_reported_.insert(absl::StrCat(name, std::string(1, '\0'), event)).second) {
            continue;
          }
          warnings.push_back(RuntimeWarning("agentix.sio", absl::StrCat(
              "sandbox emitted event '", event, "' on namespace ", name,
              " while no host had it open; the event was dropped (later "
              "drops of this event are not reported). Register the "
              "namespace on the host (RuntimeClient.register_namespace) "
              "before the first call.")));
        }
      }
      if (!warnings.empty()) logs_->Append(std::move(warnings));
    }
    begin = end;
  }
}

absl::Status SessionManager::SendNamespaceEvent(
    const std::string& name, const runtime::v1::NamespaceEvent& event) {
  const ipc::Frame frame = NamespaceEventFrame(name, event);
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    return absl::UnavailableError("sandbox daemon is shutting down");
  }
  auto worker = EnsureWorker();
  if (!worker.ok()) {
    return absl::UnavailableError(
        absl::StrCat("runtime worker could not be started: ",
                     worker.status().message()));
  }
  // Encoded straight into the outgoing buffer (a refused frame leaves it
  // unchanged), not through a temporary copy of a payload that may be large.
  AGX_RETURN_IF_ERROR(ipc::AppendFrame(frame, to_worker_));
  FlushToWorker();
  return absl::OkStatus();
}

bool SessionManager::ApplyWorkerFrame(uint64_t generation, ipc::Frame& frame,
                                      std::vector<Delivery>& out) {
  using ipc::FrameType;
  if (frame.type == FrameType::kReady || frame.type == FrameType::kBootError) {
    return false;  // WorkerProcess tracks readiness and reports boot errors
  }
  if (!calls::IsCallOutput(frame.type)) {
    if (frame.type == FrameType::kSessionState) {
      ApplySessionState(generation, frame, out);
      return false;
    }
    if (frame.type == FrameType::kEnvSet) {  // the calls wait for it
      env_set_generation_ = generation;
      env_set_detail_ = std::move(frame.detail);
      if (generation == env_pending_generation_) {
        EndEnvPending(env_set_detail_.empty()
                          ? ""
                          : absl::StrCat("it could not apply the environment: ",
                                         env_set_detail_),
                      out);
      }
      return false;
    }
    AGX_LOG(Warning, "ignoring unexpected '{}' frame from the worker",
            ipc::FrameTypeName(frame.type));
    return false;
  }
  Call* open = table_.FindOpen(frame.call_id);
  // Closed calls are quiet: late frames (after a cancel, say) are dropped.
  if (open == nullptr || open->generation != generation) return false;
  Call& call = *open;
  bool terminal = true;
  std::shared_ptr<SandboxEvent> event =
      table_.TakeWorkerOutput(frame.call_id, call, frame, terminal, out);
  const bool barrier =
      frame.type != ipc::FrameType::kResultChunk && StampBarrier(call, *event);
  Emit(frame.call_id, call, std::move(event), terminal, out);
  return barrier;
}

void SessionManager::OnWorkerExit(uint64_t generation,
                                  const WorkerExit& exit) {
  std::vector<Delivery> out;
  {
    absl::MutexLock lock(&mu_);
    // Collected first: a terminal Emit may evict other calls.
    std::vector<std::string> running;
    for (auto& [id, call] : table_.calls()) {
      if (!call.terminal && call.generation == generation) {
        running.push_back(id);
      }
    }
    for (const std::string& id : running) {
      Call* open = table_.FindOpen(id);
      if (open == nullptr) continue;
      Call& call = *open;
      auto event = NewCallError(id, exit.error_type, exit.message,
                                absl::StatusCode::kUnavailable, "",
                                exit.returncode);
      StampBarrier(call, *event);  // what it logged before the worker died
      Emit(id, call, std::move(event), /*terminal=*/true, out);
    }
    // Its direct calls, from the ledger, in the same hold of the lock: a
    // host reconnecting now finds them (and is relayed: eligibility 4).
    AdoptDeadWorkersLedger(generation, exit, out);
    direct_side_.ForgetWorker(generation);
    if (worker_ && worker_->generation() == generation) {
      // Destroyed later from another thread: this is its reader thread.
      dead_workers_.push_back(std::move(worker_));
    }
    // It died before answering set_env: the next worker is spawned with
    // the full environment.
    if (generation == env_pending_generation_) env_pending_generation_ = 0;
    // Waiting calls go to the next worker.
    if (!call_queue_.empty()) {
      DispatchQueued(out);
      FlushToWorker();
    }
    Post(out);
  }
  DeliverPosted();
  {
    // Last, after the ledger's calls are the daemon's: a connection waiting
    // for a collapse of this worker's sessions goes on (CollapseDirect).
    absl::MutexLock lock(&mu_);
    absl::erase_if(direct_held_, [generation](const auto& entry) {
      return entry.second.generation == generation;
    });
  }
}

void SessionManager::ReleaseMemorySoon() {
  absl::MutexLock lock(&mu_);
  release_memory_ = true;
}

void SessionManager::RegisterSink(const std::shared_ptr<CallSink>& sink) {
  absl::MutexLock lock(&mu_);
  sinks_[sink.get()] = sink;
}

void SessionManager::DetachSink(const CallSink* sink) {
  absl::MutexLock lock(&mu_);
  sinks_.erase(sink);
  table_.Detach(sink);
}

bool SessionManager::HasOpenCalls(const CallSink* sink) {
  absl::MutexLock lock(&mu_);
  if (table_.HasOpenCalls(sink)) return true;
  // Posted events not yet handed to the sink (e.g. a terminal one) keep it
  // open; handing them over writes to it, which asks again.
  for (const Delivery& d : posted_) {
    if (d.sink.get() == sink) return true;
  }
  // Taken from posted_ and being handed over right now (DeliverPosted).
  return std::find(in_hand_.begin(), in_hand_.end(), sink) != in_hand_.end();
}

absl::Status SessionManager::StartWorker() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("shutting down");
  return EnsureWorker().status();
}

absl::Status SessionManager::AdoptWorker(const AdoptedWorker& adopted) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("shutting down");
  if (worker_ || !extra_env_.empty()) {
    // The fds are ours to close whatever happens.
    for (int fd : {adopted.channel_fd, adopted.stderr_fd, adopted.payload_fd}) {
      if (fd >= 0) ::close(fd);
    }
    return absl::FailedPreconditionError(
        "a worker is already running or its environment changed: nothing to adopt");
  }
  absl::StatusOr<std::unique_ptr<WorkerProcess>> worker =
      WorkerProcess::Adopt(options_.worker, adopted, next_generation_, this);
  if (!worker.ok()) return worker.status();
  ++next_generation_;
  ++workers_started_;
  worker_ = std::move(*worker);
  return absl::OkStatus();
}

absl::Status SessionManager::AddWorkerEnv(
    const std::vector<std::string>& entries) {
  absl::MutexLock lock(&mu_);
  if (worker_) {
    return absl::FailedPreconditionError(
        "the worker is already running; its environment cannot change");
  }
  MergeWorkerEnv(entries);
  return absl::OkStatus();
}

void SessionManager::MergeWorkerEnv(const std::vector<std::string>& entries) {
  // A key given again replaces its earlier entry.
  for (const std::string& entry : entries) {
    const std::string_view key = std::string_view(entry).substr(0, entry.find('='));
    extra_env_.erase(
        std::remove_if(extra_env_.begin(), extra_env_.end(),
                       [&](const std::string& e) {
                         return std::string_view(e).substr(0, e.find('=')) == key;
                       }),
        extra_env_.end());
    extra_env_.push_back(entry);
  }
}

void SessionManager::ReplaceWorker(absl::string_view why) {
  if (worker_) {
    AGX_LOG(Info, "replacing worker {} (pid {}): {}", worker_->worker_id(),
            worker_->pid(), std::string(why));
    // It ran no call: killing it loses nothing. Its exit is reported for its
    // own generation, which no call and no live worker has.
    worker_->Kill();
    dead_workers_.push_back(std::move(worker_));
  }
  const absl::Status started = EnsureWorker().status();
  if (!started.ok()) {
    // Not fatal: the next call tries again and reports the reason.
    AGX_LOG(Warning, "could not start a fresh worker: {}",
            std::string(started.message()));
  }
}

absl::Status SessionManager::ApplyWorkerEnv(
    const std::vector<std::string>& entries, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (running_calls_ != 0 || !call_queue_.empty()) {
    return absl::FailedPreconditionError(
        "calls are running; the worker's environment cannot change");
  }
  MergeWorkerEnv(entries);
  if (!worker_ || shut_down_) return absl::OkStatus();  // the next spawn has it
  if (auto key = FirstStartupOnlyEnvVar(entries)) {
    ReplaceWorker(absl::StrCat(*key, " takes effect only in a new process"));
    return absl::OkStatus();
  }
  std::string block;
  for (const std::string& entry : entries) {
    block.append(entry).push_back('\0');
  }
  ipc::Frame frame;
  frame.type = ipc::FrameType::kSetEnv;
  frame.data = std::move(block);
  const absl::Status encoded = ipc::AppendFrame(frame, to_worker_);
  if (!encoded.ok()) {
    ReplaceWorker(encoded.message());
    return absl::OkStatus();
  }
  env_set_generation_ = 0;
  FlushToWorker();
  // No wait for the answer: calls that arrive before it wait in the queue
  // (the frames are ordered anyway; the queue is for a worker that refuses
  // or never answers, which is replaced before any call runs in it).
  env_pending_generation_ = worker_->generation();
  env_pending_deadline_ = absl::Now() + timeout;
  return absl::OkStatus();
}

void SessionManager::EndEnvPending(absl::string_view why_replace,
                                   std::vector<Delivery>& out) {
  env_pending_generation_ = 0;
  if (!why_replace.empty() && !shut_down_) ReplaceWorker(why_replace);
  if (!call_queue_.empty()) {
    DispatchQueued(out);
    FlushToWorker();
  }
}

SessionInfo SessionManager::Info() {
  absl::MutexLock lock(&mu_);
  SessionInfo info;
  info.last_call_end = last_call_end_;
  info.worker_pid = worker_ ? worker_->pid() : 0;
  info.worker_booting = worker_ && !worker_->booted();
  info.workers_started = workers_started_;
  for (const auto& [id, call] : table_.calls()) {
    if (!call.terminal && !call.queued) ++info.calls_in_flight;
  }
  info.calls_queued = call_queue_.size();
  info.namespace_streams = namespaces_.OpenStreams();
  if (const ipc::PayloadArea* area = worker_ ? worker_->payloads() : nullptr) {
    info.calls_in_flight += static_cast<uint64_t>(area->DirectRunning());
    info.last_call_end =
        std::max(info.last_call_end, DirectLastEnd(area->DirectLastEndNs()));
  }
  return info;
}

SessionManager::CallPathQuiet SessionManager::Quiet() {
  absl::MutexLock lock(&mu_);
  CallPathQuiet quiet;
  quiet.calls_running = running_calls_ != 0 || !call_queue_.empty();
  quiet.worker_booting = worker_ && !worker_->booted();
  quiet.last_call_end = last_call_end_;
  if (const ipc::PayloadArea* area = worker_ ? worker_->payloads() : nullptr) {
    quiet.calls_running |= area->DirectRunning() > 0;
    quiet.last_call_end =
        std::max(quiet.last_call_end, DirectLastEnd(area->DirectLastEndNs()));
  }
  return quiet;
}

absl::Time SessionManager::DirectLastEnd(int64_t monotonic_ns) {
  if (monotonic_ns <= 0) return absl::InfinitePast();
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t now_ns = int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  // The worker's clock is the same CLOCK_MONOTONIC; a time in the future
  // (garbage) reads as now.
  return absl::Now() - absl::Nanoseconds(std::max<int64_t>(0, now_ns - monotonic_ns));
}

size_t SessionManager::AdoptDirectSession(const std::string& client,
                                          const ipc::SessionState& state) {
  std::vector<Delivery> out;
  size_t adopted = 0;
  {
    absl::MutexLock lock(&mu_);
    adopted = AdoptCollapsed(worker_ ? worker_->generation() : 0, client,
                             state, out);
    Post(out);
  }
  DeliverPosted();
  return adopted;
}

size_t SessionManager::AdoptCollapsed(uint64_t generation,
                                      const std::string& client,
                                      const ipc::SessionState& state,
                                      std::vector<Delivery>& out) {
  const bool live = worker_ && worker_->generation() == generation;
  size_t adopted = 0;
  {
    for (const std::string& id : state.finished) table_.RememberFinished(id);
    for (const ipc::CollapsedCall& collapsed : state.calls) {
      if (table_.Find(collapsed.id) != nullptr ||
          table_.IsFinished(collapsed.id)) {
        continue;
      }
      std::vector<SandboxEventPtr> events;
      for (const std::string& bytes : collapsed.delivered) {
        auto event = std::make_shared<runtime::v1::SandboxEvent>();
        if (!event->ParseFromString(bytes)) {
          AGX_LOG(Warning, "collapsed direct call {}: an undecodable event "
                  "skipped", collapsed.id);
          continue;
        }
        events.push_back(std::move(event));
      }
      if (!collapsed.running && events.empty()) continue;  // nothing to keep
      Call& call = table_.calls()[collapsed.id];
      call.client = client;
      if (collapsed.running) {
        if (!live) {
          // The worker is gone: it ends as its other calls did.
          events.push_back(NewCallError(
              collapsed.id, "WorkerDied", "runtime worker exited",
              absl::StatusCode::kUnavailable, "", std::nullopt));
        } else {
          call.generation = worker_->generation();
          call.dispatched = true;
          ++running_calls_;
        }
      }
      for (size_t i = 0; i < events.size(); ++i) {
        const bool terminal =
            i + 1 == events.size() && (!collapsed.running || !live);
        Emit(collapsed.id, call, std::move(events[i]), terminal, out);
      }
      ++adopted;
    }
  }
  return adopted;
}

size_t SessionManager::AdoptLedger(const ipc::LedgerContents& ledger,
                                   const WorkerExit& exit) {
  std::vector<Delivery> out;
  size_t made = 0;
  {
    absl::MutexLock lock(&mu_);
    made = AdoptLedgerLocked(ledger, exit, out);
    Post(out);
  }
  DeliverPosted();
  return made;
}

size_t SessionManager::AdoptLedgerLocked(const ipc::LedgerContents& ledger,
                                         const WorkerExit& exit,
                                         std::vector<Delivery>& out) {
  size_t made = 0;
  for (const ipc::LedgerFinished& done : ledger.finished) {
    if (table_.Find(done.id) == nullptr) table_.RememberFinished(done.id);
  }
  for (const ipc::LedgerCall& held : ledger.calls) {
    if (table_.Find(held.id) != nullptr) continue;
    Call& call = table_.calls()[held.id];
    call.client = held.client;
    Emit(held.id, call,
         NewCallError(held.id, exit.error_type, exit.message,
                      absl::StatusCode::kUnavailable, "", exit.returncode),
         /*terminal=*/true, out);
    ++made;
  }
  return made;
}

void SessionManager::AdoptDeadWorkersLedger(uint64_t generation,
                                            const WorkerExit& exit,
                                            std::vector<Delivery>& out) {
  // Alive until this callback returns: it runs on the worker's reader
  // thread, which its destructor joins.
  WorkerProcess* dead = nullptr;
  if (worker_ && worker_->generation() == generation) dead = worker_.get();
  for (const auto& replaced : dead_workers_) {
    if (replaced->generation() == generation) dead = replaced.get();
  }
  if (dead == nullptr) return;
  absl::StatusOr<ipc::LedgerContents> ledger = dead->ReadLedger();
  if (!ledger.ok()) {
    AGX_LOG(Warning, "worker {}'s direct calls' ledger unreadable, its direct "
            "calls' ids are lost: {}", dead->worker_id(),
            ledger.status().ToString());
    return;
  }
  if (ledger->skipped > 0) {
    AGX_LOG(Warning, "worker {}'s direct calls' ledger: {} slot(s) held "
            "garbage and were skipped", dead->worker_id(), ledger->skipped);
  }
  if (ledger->calls.empty() && ledger->finished.empty()) return;
  const size_t made = AdoptLedgerLocked(*ledger, exit, out);
  AGX_LOG(Info, "worker {}'s direct calls: {} ended with {}, {} finished ids "
          "remembered", dead->worker_id(), made, exit.error_type,
          ledger->finished.size());
}

void SessionManager::Shutdown(absl::Duration grace) {
  std::unique_ptr<WorkerProcess> worker;
  std::vector<Delivery> out;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    worker = std::move(worker_);
    while (!call_queue_.empty()) {
      const std::string id = call_queue_.front();
      Call* queued = table_.FindOpen(id);
      if (queued == nullptr) {
        call_queue_.pop_front();
        continue;
      }
      Emit(id, *queued,  // removes it from the queue
           MakeCallError(id, "Unavailable", "sandbox daemon is shutting down",
                         absl::StatusCode::kUnavailable),
           /*terminal=*/true, out);
    }
    Post(out);
  }
  DeliverPosted();
  if (upload_watch_.joinable() &&
      upload_watch_.get_id() != std::this_thread::get_id()) {
    upload_watch_.join();
  }
  if (worker) worker->Shutdown(grace);
  worker.reset();  // joins; its exit callback fails any call still running
  ReapDeadWorkers();
}

void SessionManager::Post(std::vector<Delivery>& out) {
  if (posted_.empty()) {
    posted_.swap(out);
  } else {
    posted_.insert(posted_.end(), std::make_move_iterator(out.begin()),
                   std::make_move_iterator(out.end()));
  }
  out.clear();
}

void SessionManager::DeliverPosted() {
  {
    absl::MutexLock lock(&mu_);
    // Another thread is delivering: it takes what was posted meanwhile
    // (ours included) once its current batch is handed over, in order.
    if (delivering_now_ || posted_.empty()) return;
    delivering_now_ = true;
  }
  // The sinks handed something, told once none is counted in hand.
  std::vector<std::shared_ptr<CallSink>> handed;
  while (true) {
    std::vector<Delivery> batch;
    {
      absl::MutexLock lock(&mu_);
      in_hand_.clear();
      if (posted_.empty()) {
        delivering_now_ = false;
        break;
      }
      batch.swap(posted_);
      for (const Delivery& d : batch) {
        if (std::find(in_hand_.begin(), in_hand_.end(), d.sink.get()) ==
            in_hand_.end()) {
          in_hand_.push_back(d.sink.get());
          if (std::find(handed.begin(), handed.end(), d.sink) == handed.end()) {
            handed.push_back(d.sink);
          }
        }
      }
    }
    Deliver(batch);
  }
  for (const auto& sink : handed) sink->OnDelivered();
}

void SessionManager::Deliver(std::vector<Delivery>& out) {
  // Group by sink (usually one or two), keeping each sink's order.
  while (!out.empty()) {
    CallSink* sink = out.front().sink.get();
    std::shared_ptr<CallSink> owner = out.front().sink;
    std::vector<SandboxEventPtr> batch;
    std::vector<Delivery> rest;
    for (auto& d : out) {
      if (d.sink.get() == sink) {
        batch.push_back(std::move(d.event));
      } else {
        rest.push_back(std::move(d));
      }
    }
    owner->Deliver(std::move(batch));
    out.swap(rest);
  }
}

void SessionManager::ReapDeadWorkers() {
  std::vector<std::unique_ptr<WorkerProcess>> dead;
  {
    absl::MutexLock lock(&mu_);
    if (dead_workers_.empty()) return;
    dead.swap(dead_workers_);
  }
  dead.clear();  // joins their threads outside the lock
}

SessionManager::DirectHandOver SessionManager::HandOverDirect(
    const std::string& client_id,
    absl::FunctionRef<bool(WorkerProcess& worker)> hand_over) {
  absl::MutexLock lock(&mu_);
  if (shut_down_ || worker_ == nullptr) return DirectHandOver::kNoWorker;
  if (!worker_->booted()) return DirectHandOver::kBooting;
  if (env_pending_generation_ != 0) return DirectHandOver::kNotEligible;
  // A session on its way back is the daemon's already.
  if (auto held = direct_held_.find(client_id);
      held != direct_held_.end() && held->second.collapse_asked) {
    return DirectHandOver::kNotEligible;
  }
  for (const auto& [id, call] : table_.calls()) {
    if (call.client == client_id) return DirectHandOver::kNotEligible;
  }
  if (!hand_over(*worker_)) return DirectHandOver::kNotEligible;
  // The host's CPU its HELLO named may have placed the call path: no
  // relayed read will publish it for this connection's calls.
  worker_->PublishPlacement();
  direct_held_[client_id].generation = worker_->generation();
  return DirectHandOver::kHandedOver;
}

SessionManager::DirectHandOver SessionManager::HandOverNamespace(
    const std::string& name,
    absl::FunctionRef<bool(WorkerProcess& worker)> hand_over) {
  absl::MutexLock lock(&mu_);
  if (shut_down_ || worker_ == nullptr) return DirectHandOver::kNoWorker;
  if (!worker_->booted()) return DirectHandOver::kBooting;
  if (env_pending_generation_ != 0) return DirectHandOver::kNotEligible;
  if (!hand_over(*worker_)) return DirectHandOver::kNotEligible;
  SendToWorker(NamespaceEventFrame(name, HostConnectedEvent()));
  FlushToWorker();
  return DirectHandOver::kHandedOver;
}

void SessionManager::TellNamespaceRelayed(const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (shut_down_ || worker_ == nullptr) return;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kNsRelayed;
  frame.ns.name = name;
  SendToWorker(frame);
  FlushToWorker();
}

bool SessionManager::HoldsDirectSession(const std::string& client) {
  absl::MutexLock lock(&mu_);
  return direct_held_.contains(client);
}

void SessionManager::SendCollapse(const std::string& client,
                                  HeldSession& held) {
  held.collapse_asked = true;
  // A replaced worker's exit ends the wait (OnWorkerExit).
  if (!worker_ || worker_->generation() != held.generation) return;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kCollapse;
  frame.direct_conn.client = client;
  SendToWorker(frame);
  FlushToWorker();
}

bool SessionManager::AskCollapse(const std::string& client,
                                 absl::FunctionRef<bool()> still_wanted) {
  absl::MutexLock lock(&mu_);
  auto it = direct_held_.find(client);
  if (it == direct_held_.end() || it->second.collapse_asked ||
      !still_wanted()) {
    return false;
  }
  SendCollapse(client, it->second);
  return true;
}

absl::Status SessionManager::CollapseDirect(const std::string& client,
                                            absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto it = direct_held_.find(client);
  if (it == direct_held_.end()) return absl::OkStatus();
  if (!it->second.collapse_asked) SendCollapse(client, it->second);
  // The reader thread adopts the session and erases its entry; the
  // worker's exit erases it too.
  auto settled = [this, &client]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return shut_down_ || !direct_held_.contains(client);
  };
  mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
  if (!direct_held_.contains(client)) return absl::OkStatus();
  if (shut_down_) {
    return absl::UnavailableError("the sandbox daemon is shutting down");
  }
  return absl::UnavailableError(absl::StrCat(
      "the runtime worker did not hand back this client's direct calls "
      "within ", absl::FormatDuration(timeout), "; reconnect to retry"));
}

void SessionManager::ApplySessionState(uint64_t generation, ipc::Frame& frame,
                                       std::vector<Delivery>& out) {
  const std::string& client = frame.direct_conn.client;
  auto it = direct_held_.find(client);
  if (it == direct_held_.end() || !it->second.collapse_asked ||
      it->second.generation != generation) {
    AGX_LOG(Warning, "worker generation {} sent a 'session_state' frame for "
            "a client whose session was not asked back ({} bytes of id); "
            "ignored", generation, client.size());
    return;
  }
  HeldSession& held = it->second;
  // Retained results are bounded in the worker as here; the finished ids
  // add at most 65,536 ids. Past that the worker is not to be believed.
  const size_t bound = options_.max_retained_bytes + (size_t{64} << 20);
  held.received_bytes += frame.record.size();
  if (held.received_bytes > bound) {
    AGX_LOG(Warning, "a collapsed direct session is over {} bytes: the rest "
            "of it is dropped", bound);
  } else if (absl::Status decoded =
                 ipc::DecodeSessionStatePiece(frame.record, held.received);
             !decoded.ok()) {
    AGX_LOG(Warning, "a collapsed direct session's piece is malformed ({}); "
            "dropped", std::string(decoded.message()));
  }
  if (!frame.last) return;
  const size_t adopted = AdoptCollapsed(generation, client, held.received, out);
  AGX_LOG(Debug, "a direct session came back from the worker: {} calls, {} "
          "finished ids", adopted, held.received.finished.size());
  direct_held_.erase(it);
}

}  // namespace agentix::sandbox
