#include "worker/direct/direct_session.h"

#include <time.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "calls/call_errors.h"
#include "worker/ipc/chunking.h"
#include "worker/ipc/session_state.h"

namespace agentix::worker {

using runtime::v1::HostEvent;
using sandbox::SandboxEventPtr;

calls::CallTableLimits DirectSession::TableLimits(const DirectLimits& limits) {
  calls::CallTableLimits table;
  table.max_retained_results = limits.max_retained_results;
  table.max_retained_bytes = limits.max_retained_bytes;
  table.max_payload_bytes = limits.max_payload_bytes;
  table.upload_idle_timeout = limits.upload_idle_timeout;
  table.max_stream_window = limits.max_stream_window;
  return table;
}

namespace {

// The side-channel barrier the daemon answered for a direct call
// (ipc::Frame::log_seq / trace_seq, set by DirectConns), on its event as
// SessionManager::StampBarrier puts it on a relayed call's.
void StampBarrier(const ipc::Frame& frame, runtime::v1::SandboxEvent& event) {
  if (frame.log_seq == 0 && frame.trace_seq == 0) return;
  if (event.has_result()) {
    event.mutable_result()->set_log_seq(frame.log_seq);
    event.mutable_result()->set_trace_seq(frame.trace_seq);
  } else if (event.has_error()) {
    event.mutable_error()->set_log_seq(frame.log_seq);
    event.mutable_error()->set_trace_seq(frame.trace_seq);
  } else if (event.has_stream_item()) {
    event.mutable_stream_item()->set_log_seq(frame.log_seq);
    event.mutable_stream_item()->set_trace_seq(frame.trace_seq);
  }
}

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no system call
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

DirectSession::DirectSession(std::string client, const DirectLimits& limits,
                             DriverSink& driver, const DirectRecords& records,
                             std::shared_ptr<ChunkBuffers> chunk_buffers)
    : client_(std::move(client)),
      driver_(driver),
      records_(records),
      chunk_buffers_(std::move(chunk_buffers)),
      table_(NewTable(TableLimits(limits))) {}

std::unique_ptr<DirectSession::Table> DirectSession::NewTable(
    const calls::CallTableLimits& limits) {
  auto table = std::make_unique<Table>(limits);
  // Only called under mu_ (from Table::Emit).
  table->set_on_evict([this](const std::string&, Call& call)
                          ABSL_NO_THREAD_SAFETY_ANALYSIS { Forgotten(call); });
  return table;
}

void DirectSession::Forgotten(Call& call) {
  if (records_.ledger != nullptr && call.ledger_slot) {
    records_.ledger->Finished(*call.ledger_slot);
    call.ledger_slot.reset();
  }
}

void DirectSession::HandleRequest(
    const std::shared_ptr<DirectResponseSink>& conn,
    const runtime::v1::CallsRequest& request,
    absl::Span<const std::optional<std::string_view>> bulk) {
  static const std::optional<std::string_view> kInMessage;
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < request.events_size(); ++i) {
    Apply(conn, request.events(i),
          static_cast<size_t>(i) < bulk.size() ? bulk[i] : kInMessage, out_,
          to_driver_);
  }
  Flush(out_, to_driver_);
}

void DirectSession::Apply(const std::shared_ptr<DirectResponseSink>& conn,
                          const HostEvent& event,
                          const std::optional<std::string_view>& bulk,
                          Out& out, std::vector<ipc::Frame>& to_driver) {
  switch (event.kind_case()) {
    case HostEvent::kStart:
      StartCall(conn, event.start(),
                bulk ? *bulk : std::string_view(event.start().arguments()),
                out, to_driver);
      break;
    case HostEvent::kArgumentChunk: {
      const std::string& id = event.argument_chunk().call_id();
      Table::ChunkUpdate update = table_->AddChunk(
          conn, client_, event.argument_chunk(),
          bulk ? *bulk : std::string_view(event.argument_chunk().data()), out);
      if (update.call == nullptr) break;
      if (!update.failure.empty()) {
        FailCall(id, *update.call,
                 calls::BadRequest(id, std::move(update.failure)), out,
                 to_driver);
        break;
      }
      ArgChunkFrames(id, update.data, to_driver);
      break;
    }
    case HostEvent::kCancel: {
      const std::string& id = event.cancel().call_id();
      if (Call* call = table_->FindOpen(id)) {
        FailCall(id, *call,
                 calls::MakeCallError(id, "Cancelled", "remote call cancelled",
                                      absl::StatusCode::kCancelled),
                 out, to_driver);
      }
      break;
    }
    case HostEvent::kResume:
      table_->Resume(conn, client_, event.resume(), out);
      break;
    case HostEvent::kAck: {
      const std::string& id = event.ack().call_id();
      Call* call = table_->Find(id);
      if (call != nullptr && call->terminal && call->client == client_) {
        Forgotten(*call);
      }
      table_->Ack(client_, id);
      break;
    }
    case HostEvent::kStreamAck:
      if (table_->AckStreamItems(client_, event.stream_ack()) != nullptr) {
        ipc::Frame ack;
        ack.type = ipc::FrameType::kStreamAck;
        ack.call_id = event.stream_ack().call_id();
        ack.index = event.stream_ack().next_index();
        to_driver.push_back(std::move(ack));
      }
      break;
    case HostEvent::KIND_NOT_SET:
      out.push_back({conn, calls::BadRequest("", "host event has no kind set")});
      break;
  }
}

void DirectSession::StartCall(const std::shared_ptr<DirectResponseSink>& conn,
                              const runtime::v1::StartCall& start,
                              std::string_view args, Out& out,
                              std::vector<ipc::Frame>& to_driver) {
  const std::string& id = start.call_id();
  if (!table_->IsNewStart(conn, client_, id, out)) return;
  if (calls::HasNoArguments(start, args)) {
    const runtime::v1::StartCall with_empty = calls::WithEmptyArguments(start);
    StartCall(conn, with_empty, with_empty.arguments(), out, to_driver);
    return;
  }
  Call* call = table_->Admit(conn, client_, start, args, out);
  if (call == nullptr) return;
  ++running_;
  if (records_.area != nullptr) records_.area->AddDirectRunning(1);
  if (records_.ledger != nullptr) {
    call->ledger_slot = records_.ledger->Started(records_.client_slot, id);
  }
  ipc::Frame frame = calls::MakeCallFrame(
      id, start, call->args_expected, table_->limits().max_stream_window);
  const size_t first = std::min(args.size(), ipc::kChunkBytes);
  PutArgBytes(frame, args.substr(0, first));
  to_driver.push_back(std::move(frame));
  ArgChunkFrames(id, args.substr(first), to_driver);
}

void DirectSession::ArgChunkFrames(const std::string& id,
                                   std::string_view data,
                                   std::vector<ipc::Frame>& to_driver) {
  ipc::ForEachChunk(data, [&](std::string_view piece) {
    ipc::Frame chunk;
    chunk.type = ipc::FrameType::kArgChunk;
    chunk.call_id = id;
    PutArgBytes(chunk, piece);
    to_driver.push_back(std::move(chunk));
  });
}

void DirectSession::PutArgBytes(ipc::Frame& frame, std::string_view piece) {
  if (driver_.Land(frame, piece)) return;
  if (chunk_buffers_ == nullptr || piece.size() < kRecycledArgBytes) {
    frame.data.assign(piece);
    return;
  }
  frame.data = chunk_buffers_->Take(piece.size());
  frame.data.append(piece);
}

void DirectSession::Emit(const std::string& id, Call& call,
                         SandboxEventPtr event, bool terminal, Out& out) {
  if (terminal) {
    --running_;
    if (records_.area != nullptr) {
      records_.area->AddDirectRunning(-1);
      records_.area->PublishDirectCallEnd(MonotonicNs());
    }
    if (records_.ledger != nullptr && call.ledger_slot) {
      records_.ledger->Retained(*call.ledger_slot);
    }
  }
  // May evict `call` itself (Forgotten then frees its ledger slot).
  table_->Emit(id, call, std::move(event), terminal, out);
}

void DirectSession::FailCall(const std::string& id, Call& call,
                             SandboxEventPtr event, Out& out,
                             std::vector<ipc::Frame>& to_driver) {
  Emit(id, call, std::move(event), /*terminal=*/true, out);
  ipc::Frame cancel;
  cancel.type = ipc::FrameType::kCancel;
  cancel.call_id = id;
  to_driver.push_back(std::move(cancel));
}

absl::Status DirectSession::HandleDriverFrames(
    std::vector<ipc::Frame>& frames) {
  absl::MutexLock lock(&mu_);
  return HandleDriverFramesLocked(frames);
}

bool DirectSession::HandleCallOutput(std::vector<ipc::Frame>& frames) {
  absl::MutexLock lock(&mu_);
  if (frames.empty() || table_->FindOpen(frames.front().call_id) == nullptr) {
    return false;
  }
  (void)HandleDriverFramesLocked(frames);
  return true;
}

absl::Status DirectSession::HandleDriverFramesLocked(
    std::vector<ipc::Frame>& frames) {
  absl::Status status;
  Out& out = out_;
  for (ipc::Frame& frame : frames) {
    if (!calls::IsCallOutput(frame.type)) {
      if (status.ok()) {
        status = absl::InvalidArgumentError(
            absl::StrCat("a '", std::string(ipc::FrameTypeName(frame.type)),
                         "' frame is not a call's output"));
      }
      continue;
    }
    Call* call = table_->FindOpen(frame.call_id);
    if (call == nullptr) continue;  // closed: late frames are dropped
    bool terminal = true;
    std::shared_ptr<runtime::v1::SandboxEvent> event;
    if (chunk_buffers_ != nullptr &&
        frame.type == ipc::FrameType::kResultChunk &&
        frame.data.size() <= ipc::kChunkBytes) {
      // What TakeWorkerOutput makes of it, its buffer recycled.
      event = chunk_buffers_->ChunkEvent(frame.call_id, std::move(frame.data));
      terminal = false;
    } else {
      event = table_->TakeWorkerOutput(frame.call_id, *call, frame, terminal,
                                       out);
    }
    if (event != nullptr) StampBarrier(frame, *event);
    Emit(frame.call_id, *call, std::move(event), terminal, out);
  }
  Flush(out, to_driver_);
  return status;
}

bool DirectSession::ExpireUploads(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!table_->uploading()) return false;  // the common case: nothing to do
  for (const std::string& id : table_->ExpiredUploads(now)) {
    Call& call = *table_->FindOpen(id);
    FailCall(id, call,
             calls::UploadTimeoutError(id, call.args_received,
                                       call.args_expected,
                                       table_->limits().upload_idle_timeout),
             out_, to_driver_);
  }
  Flush(out_, to_driver_);
  return table_->uploading();
}

void DirectSession::Flush(Out& out, std::vector<ipc::Frame>& to_driver) {
  // Consecutive events of one connection go in one Send, in order.
  for (size_t i = 0; i < out.size();) {
    DirectResponseSink* conn = out[i].sink.get();
    batch_.clear();
    size_t j = i;
    for (; j < out.size() && out[j].sink.get() == conn; ++j) {
      batch_.push_back(std::move(out[j].event));
    }
    conn->Send(absl::MakeSpan(batch_));
    i = j;
  }
  batch_.clear();
  out.clear();
  if (!to_driver.empty()) driver_.Send(absl::MakeSpan(to_driver));
  to_driver.clear();
}

void DirectSession::Detach(const DirectResponseSink* conn) {
  absl::MutexLock lock(&mu_);
  table_->Detach(conn);
}

bool DirectSession::HasOpenCalls(const DirectResponseSink* conn) {
  absl::MutexLock lock(&mu_);
  return table_->HasOpenCalls(conn);
}

bool DirectSession::Runs(const std::string& id) {
  absl::MutexLock lock(&mu_);
  return table_->FindOpen(id) != nullptr;
}

size_t DirectSession::running() {
  absl::MutexLock lock(&mu_);
  return running_;
}

bool DirectSession::Owns(const std::string& id) {
  absl::MutexLock lock(&mu_);
  return table_->FindOpen(id) != nullptr;
}

std::vector<ipc::Frame> DirectSession::Collapse() {
  ipc::SessionState state;
  std::vector<ipc::Frame> to_driver;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, call] : table_->calls()) {
      ipc::CollapsedCall& out = state.calls.emplace_back();
      out.id = id;
      out.running = !call.terminal;
      out.delivered.reserve(call.delivered.size());
      for (const SandboxEventPtr& event : call.delivered) {
        out.delivered.push_back(event->SerializeAsString());
      }
      if (out.running && call.args_received < call.args_expected) {
        // Its upload cannot move (the daemon has none of its bytes, and the
        // host's re-sent start is a known id there): it ends here, typed,
        // and the driver drops what arrived (its Cancelled answer reaches
        // the daemon after this state, for a call already ended: dropped).
        out.running = false;
        out.delivered.push_back(
            calls::MakeCallError(
                id, "Unavailable",
                "the call's arguments were still arriving when its direct "
                "session moved back to the sandbox daemon; call it again",
                absl::StatusCode::kUnavailable)
                ->SerializeAsString());
        ipc::Frame cancel;
        cancel.type = ipc::FrameType::kCancel;
        cancel.call_id = id;
        to_driver.push_back(std::move(cancel));
      }
      if (records_.ledger != nullptr && call.ledger_slot) {
        records_.ledger->Forget(*call.ledger_slot);
      }
    }
    table_->finished().ForEach(
        [&](std::string_view id) { state.finished.emplace_back(id); });
    if (records_.area != nullptr && running_ > 0) {
      records_.area->AddDirectRunning(-static_cast<int64_t>(running_));
    }
    running_ = 0;
    // A fresh table: the ids are the daemon's from here on.
    table_ = NewTable(table_->limits());
  }
  std::vector<ipc::Frame> frames;
  for (std::string& piece : ipc::EncodeSessionState(state)) {
    ipc::Frame& frame = frames.emplace_back();
    frame.type = ipc::FrameType::kSessionState;
    frame.direct_conn.client = client_;
    frame.record = std::move(piece);
  }
  frames.back().last = true;
  if (!to_driver.empty()) driver_.Send(absl::MakeSpan(to_driver));
  return frames;
}

}  // namespace agentix::worker
