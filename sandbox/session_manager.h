// SessionManager: the daemon's domain logic, free of any gRPC types beyond
// the proto messages. It owns the worker process, the table of calls (running
// and finished-but-unacknowledged), and routes host events to the worker and
// worker frames back to the stream that owns each call.
//
// Guarantees (DESIGN.md, reliability contract):
// - exactly one terminal event (CallResult or CallError) per call_id; frames
//   for a closed call are dropped;
// - cancel ends a call with a "Cancelled" error;
// - a dead worker fails every call it was running with "WorkerDied" (or
//   "WorkerBootError" if it never became ready) and the next call gets a
//   fresh worker;
// - finished calls are retained until acknowledged (bounded, oldest evicted)
//   so a reconnecting host can `resume` them; items of a streaming call are
//   retained until the host's StreamAck says it consumed them;
// - a malformed event gets a "BadRequest" CallError and changes nothing else;
//   so does a call_id longer than kMaxCallIdBytes (it is never stored);
// - an upload that makes no progress for `upload_idle_timeout` ends its call
//   with "UploadTimeout" and frees what had arrived.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "calls/call_table.h"
#include "sandbox/call_sink.h"
#include "sandbox/direct_side_channels.h"
#include "wire/finished_ids.h"
#include "sandbox/log_buffer.h"
#include "sandbox/namespace_hub.h"
#include "sandbox/worker_process.h"
#include "worker/ipc/ledger.h"
#include "worker/ipc/session_state.h"

namespace agentix::sandbox {

// Longest accepted call_id (and namespace request_id); calls/call_errors.h.
inline constexpr size_t kMaxCallIdBytes = calls::kMaxCallIdBytes;

// The most --finished_ids_shard_bits takes (4,096 sets of ~16 ids).
inline constexpr int kMaxFinishedIdsShardBits = 12;

// True when `events` are acks and StartCalls only, with at least one of
// each, and no start names an id acked in the same message: then applying
// the acks after the starts gives the same outcome as in order.
bool AcksCanFollowStarts(
    const google::protobuf::RepeatedPtrField<runtime::v1::HostEvent>& events);

struct SessionOptions {
  WorkerOptions worker;
  // Finished, unacknowledged results kept for resume; oldest evicted first.
  size_t max_retained_results = 4096;
  // The remembered finished call ids in 2^N sets (FinishedIds; 0: one set).
  int finished_ids_shard_bits = FinishedIds::kShardBits;
  // A host message of acks and StartCalls (a sequential caller's previous
  // call's ack and its next call): the starts go to the worker first and
  // the acks are applied after (AcksCanFollowStarts); false (the default,
  // which measured faster quiet): in order.
  bool acks_after_starts = false;
  // Calls running at once (0: no limit); more wait in a queue of at most
  // max_queued_calls, beyond which a call fails with TooManyCalls
  // (RESOURCE_EXHAUSTED).
  size_t max_concurrent_calls = 0;
  size_t max_queued_calls = 10000;
  // Finished results' total serialized size; the newest is always kept.
  uint64_t max_retained_bytes = uint64_t{512} << 20;
  // Largest accepted encoded arguments of one call.
  uint64_t max_payload_bytes = uint64_t{1} << 30;
  // A call whose announced arguments stop arriving for this long fails with
  // UploadTimeout (DEADLINE_EXCEEDED) and its partial arguments are freed.
  absl::Duration upload_idle_timeout = absl::Seconds(60);
  // Results handed to host streams but not yet written (a host that stops
  // reading) are bounded too: past max_retained_bytes of them the worker's
  // output waits (back-pressure), and if no stream makes progress for
  // `stalled_host_timeout`, the stream with the largest backlog is ended
  // with RESOURCE_EXHAUSTED (its calls stay retained for a resume).
  absl::Duration stalled_host_timeout = absl::Seconds(20);
  // Largest stream window passed to the worker; a StartCall asking for more
  // gets this many. Unacknowledged items are retained here for replay, so
  // the host's window (up to 2^32-1) must not size the daemon's memory.
  uint32_t max_stream_window = 1024;
  // Log records and trace events kept for hosts that have not received them.
  size_t log_buffer_records = 10000;
  size_t trace_buffer_events = 10000;
  // Logs (and, separately, Traces) streams subscribed at once.
  size_t max_log_subscribers = 64;
  // A Logs or Traces subscriber paused because it fell behind
  // (kSideChannelMaxUnwrittenBytes) that reads nothing for this long is
  // ended with RESOURCE_EXHAUSTED: its subscriber place is freed, and what
  // it had not received stays in the buffer for its client's next stream.
  absl::Duration paused_subscriber_timeout = absl::Seconds(60);
  // Plugin-namespace streams open at once, over all hosts.
  size_t max_namespace_streams = 256;
  // Direct calls: how long a relayed stream of a client waits for the
  // worker to hand back that client's direct session (CollapseDirect).
  absl::Duration direct_collapse_timeout = absl::Seconds(5);
};

struct SessionInfo {
  int64_t worker_pid = 0;
  // A worker runs and has not sent `ready` yet.
  bool worker_booting = false;
  uint64_t workers_started = 0;
  uint64_t calls_in_flight = 0;
  uint64_t calls_queued = 0;
  uint64_t namespace_streams = 0;
  // When a call last reached its terminal event with no other call running
  // (the manager's construction until the first): the start of the idle
  // time SandboxAdmin.GetStatus reports.
  absl::Time last_call_end;
};

class SessionManager : public WorkerProcess::Listener {
 public:
  explicit SessionManager(SessionOptions options);
  // Stops the worker (Shutdown with a short grace) if still running.
  ~SessionManager() override;

  // Applies one host event arriving on `sink`'s stream. Problems with the
  // event are reported to `sink` as CallError events. Thread-safe; never
  // blocks on I/O (starting a worker is a posix_spawn).
  void HandleHostEvent(const std::shared_ptr<CallSink>& sink,
                       const runtime::v1::HostEvent& event);
  // The same for every event of one stream message, in order, under one
  // lock acquisition and with one write to the worker.
  void HandleHostEvents(
      const std::shared_ptr<CallSink>& sink,
      const google::protobuf::RepeatedPtrField<runtime::v1::HostEvent>&
          events);
  // The same, where `bulk[i]`, when set, is events[i]'s StartCall.arguments
  // or ArgumentChunk.data, left out of the message (a view of the caller's
  // buffer, read during the call: the frame wire's read buffer, so large
  // argument bytes go from there to the worker's ring in one copy). `bulk`
  // is empty or has one entry per event.
  void HandleHostEvents(
      const std::shared_ptr<CallSink>& sink,
      const google::protobuf::RepeatedPtrField<runtime::v1::HostEvent>& events,
      absl::Span<const std::optional<std::string_view>> bulk);
  // A host stream opened: `sink` is a candidate for AbortMostBacklogged
  // until DetachSink.
  void RegisterSink(const std::shared_ptr<CallSink>& sink);
  // The stream behind `sink` ended. Its calls keep running; their results
  // are retained until a resume or eviction.
  void DetachSink(const CallSink* sink);
  // A host stream ended: soon, on a background thread, freed memory is
  // given back to the OS (base::ReleaseFreeMemory), so what a departed
  // client made the daemon hold does not stay resident.
  void ReleaseMemorySoon();
  // True if a call owned by `sink` has not reached its terminal event, or
  // events posted for `sink` still wait to be handed to it (or are being
  // handed to it; CallSink::OnDelivered follows).
  bool HasOpenCalls(const CallSink* sink);
  SessionInfo Info();
  // What --calls_cpu=probe's re-probe waits for a pause of (sandboxd_main.cc):
  // one lock, no walk over the calls (Info walks them).
  struct CallPathQuiet {
    bool calls_running = false;  // dispatched and not ended, or queued
    bool worker_booting = false;
    absl::Time last_call_end;  // SessionInfo::last_call_end
  };
  CallPathQuiet Quiet();

  // Direct calls, stage 4 (docs/DIRECT-CALLS.md). A direct client's
  // session collapsed back into the daemon: `state` is the worker's
  // session_state pieces, decoded (ipc::DecodeSessionStatePiece). Running
  // calls become this daemon's, on the live worker (their later output
  // arrives as ordinary frames); terminal ones are retained with their
  // delivered events; finished ids remembered. No stream owns them until
  // the host's Resume. An id the daemon already holds is skipped. Returns
  // the calls adopted.
  size_t AdoptDirectSession(const std::string& client,
                            const ipc::SessionState& state);
  // After a worker died with direct calls: each call its ledger held
  // (running or retained; ipc::ReadLedger) becomes a terminal call of its
  // client with `exit`'s error (WorkerDied: the only copy of a retained
  // result was in the worker), each finished id is remembered, so a
  // reconnecting host gets today's outcome. Ids the daemon holds are
  // skipped. Returns the calls made.
  size_t AdoptLedger(const ipc::LedgerContents& ledger, const WorkerExit& exit);
  // Starts the worker now if none is running (it otherwise starts with the
  // first call that needs it). Errors as posix_spawn reports them; a worker
  // that fails later in its boot is reported to the calls that wait for it.
  absl::Status StartWorker();
  // Takes over a worker a launcher started before this daemon's exec
  // (--adopt_worker, sandbox/launch_main.cc) as the worker StartWorker would
  // have started; a worker started later (after a crash) is spawned as
  // usual. Errors as WorkerProcess::Adopt; kFailedPrecondition also if a
  // worker is already running.
  absl::Status AdoptWorker(const AdoptedWorker& adopted);
  // Adds "K=V" entries to the environment of workers started from now on
  // (SandboxAdmin.Activate's env); they replace the daemon's own entries of
  // the same keys (the environment holds each key once).
  // FailedPrecondition if a worker is already running: its environment can
  // no longer change.
  absl::Status AddWorkerEnv(const std::vector<std::string>& entries);
  // SandboxAdmin.Activate's env for a worker that may already be running
  // (--prestart-worker): adds `entries` for workers started from now on, as
  // AddWorkerEnv, and brings the running worker (if any) up to date before
  // any call runs in it. Without a startup-only key (startup_env.h), the
  // worker sets them in its os.environ (`set_env` frame); this returns once
  // the frame is sent, and calls that arrive before the worker's `env_set`
  // answer wait for it (at most `timeout`). With a startup-only key, or if
  // the worker cannot apply them or does not answer in time, the worker is
  // replaced by a fresh one spawned with the full environment, and the
  // waiting calls go to it. A worker that dies meanwhile is left to the next
  // call, which starts one with the full environment (and reports a boot
  // error as usual). Must be called before any call runs:
  // FailedPrecondition if one is in flight or queued. Otherwise OK, even when
  // no worker could be started (the next call tries again and reports why).
  absl::Status ApplyWorkerEnv(const std::vector<std::string>& entries,
                              absl::Duration timeout);
  // Bytes queued in host streams' writers and not yet written; every Calls
  // stream's writer adds to it (BatchingWriter::ShareQueuedBytes).
  std::shared_ptr<std::atomic<int64_t>> unwritten_result_bytes() {
    return unwritten_;
  }
  // The worker's log records and trace events, for RuntimeService.Logs and
  // RuntimeService.Traces.
  LogBuffer& logs() { return *logs_; }
  const SessionOptions& options() const { return options_; }
  TraceBuffer& traces() { return *traces_; }
  // The host streams open on each plugin namespace (RuntimeService.Namespace).
  NamespaceHub& namespaces() { return namespaces_; }
  // Direct calls' records: the frame wire names each handed-over
  // connection's client here (docs/DIRECT-CALLS.md, stage 5).
  DirectSideChannels& direct_side_channels() { return direct_side_; }
  // The daemon's calls-CPU answer changed ("wait" or "off"): the live
  // worker writes it on its direct connections that follow changes
  // (calls_cpu_answer), and is given the call path's CPU the answer placed
  // (WorkerProcess::PublishPlacement). Relayed connections follow it
  // themselves.
  void TellDirectCallsCpu(std::string_view value) ABSL_LOCKS_EXCLUDED(mu_);
  // Forwards one host event of namespace `name` to the worker, starting it
  // if needed. Unavailable if no worker can be started or the daemon is
  // shutting down; ResourceExhausted if it exceeds the worker frame limit.
  absl::Status SendNamespaceEvent(const std::string& name,
                                  const runtime::v1::NamespaceEvent& event);
  // Asks the worker to exit, waits up to `grace`, then kills it. Running
  // calls end with WorkerDied. Idempotent.
  void Shutdown(absl::Duration grace);

  // WorkerProcess::Listener (called on a worker's reader thread).
  void OnWorkerFrames(uint64_t generation,
                      std::vector<ipc::Frame>& frames) override;
  void OnWorkerExit(uint64_t generation, const WorkerExit& exit) override;

  // Direct calls (docs/DIRECT-CALLS.md, eligibility rules 2 and 4): whether
  // the live worker may take a Calls connection of client `client_id`. When
  // it has sent `ready`, no set_env is pending and this daemon holds no call
  // (running, queued or retained) of that client, runs `hand_over` with it
  // under the manager's lock, so that no call of the client and no other
  // worker comes between the check and the hand-over; kHandedOver when it
  // returned true. Not a call path: it walks the calls.
  enum class DirectHandOver { kHandedOver, kNoWorker, kBooting, kNotEligible };
  DirectHandOver HandOverDirect(
      const std::string& client_id,
      absl::FunctionRef<bool(WorkerProcess& worker)> hand_over);

  // Direct Namespace streams (docs/DIRECT-CALLS.md stage 8): runs
  // `hand_over` with the live worker under the manager's lock when it has
  // sent `ready` and no set_env is pending; when it returned true (the
  // direct_conn frame queued), queues `name`'s agentix:host_connected after
  // it, so that the requests the sandbox sends again go to the new stream.
  DirectHandOver HandOverNamespace(
      const std::string& name,
      absl::FunctionRef<bool(WorkerProcess& worker)> hand_over);
  // A relayed stream opened on `name`, which has a handed-over stream: the
  // worker is told to write `name`'s events on the link too (ns_relayed).
  void TellNamespaceRelayed(const std::string& name);

  // Direct calls, stage 4: `client`'s session comes back to the daemon
  // (docs/DIRECT-CALLS.md, "one owner at a time"). When the live worker
  // holds it (a connection of the client was handed over since the last
  // collapse), sends `collapse{client}` unless already sent, and waits up
  // to `timeout` for the worker's last session_state piece; its calls are
  // adopted on the worker's reader thread, before any later output of
  // theirs. OK once the daemon holds the client's state: nothing was held,
  // it was adopted, or the worker exited (the ledger's path). Unavailable
  // when the worker did not answer in time (the collapse stays asked: a
  // late answer is still adopted) or the daemon is shutting down.
  absl::Status CollapseDirect(const std::string& client,
                              absl::Duration timeout);
  // Sends `collapse{client}` without waiting when the worker holds the
  // session, none is asked yet and `still_wanted()` holds — checked under
  // the manager's lock, so no hand-over of the client comes between (the
  // orphan timer). True when it was sent.
  bool AskCollapse(const std::string& client,
                   absl::FunctionRef<bool()> still_wanted);
  // Whether the live worker holds a direct session of `client`.
  bool HoldsDirectSession(const std::string& client);

 private:
  // The daemon's own state of a call, beside the table's (CallTable::Call).
  struct CallState {
    uint64_t generation = 0;  // the worker running it
    // Counted against max_concurrent_calls until terminal.
    bool dispatched = false;
    // Waiting for a slot (max_concurrent_calls): the StartCall without its
    // arguments, and the argument bytes received so far.
    bool queued = false;
    runtime::v1::StartCall start;
    std::string queued_args;
    // The side-channel barrier (CallResult.log_seq / trace_seq): the last
    // seq of the records and trace events tagged with this call, and the
    // seqs of unattributed ones when the call was dispatched (those that
    // appear later, while it runs, count as possibly its own).
    uint64_t log_seq = 0;
    uint64_t trace_seq = 0;
    uint64_t unattributed_log_mark = 0;
    uint64_t unattributed_trace_mark = 0;
  };
  // Ids, at most once, retention, resume, acks (calls/call_table.h): the
  // same code as the worker's direct sessions.
  using Table = calls::CallTable<CallSink, CallState>;
  using Call = Table::Call;
  // An event to hand to a sink once the lock is released.
  using Delivery = Table::Delivery;

  // `args`: the arguments' first bytes (start.arguments(), or the frame
  // wire's view of them); `data` likewise for a chunk.
  void StartCall(const std::shared_ptr<CallSink>& sink,
                 const runtime::v1::StartCall& start, std::string_view args,
                 std::vector<Delivery>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddArgumentChunk(const std::shared_ptr<CallSink>& sink,
                        const runtime::v1::ArgumentChunk& chunk,
                        std::string_view data, std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Any client may cancel a call (as in the original); Ack, AckStreamItems,
  // ArgumentChunk and Resume act only on calls of the sender's client
  // (its CallSink::client_id; clients without one are one anonymous client).
  void Cancel(const std::string& call_id, std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Resume(const std::shared_ptr<CallSink>& sink,
              const runtime::v1::ResumeCalls& resume,
              std::vector<Delivery>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Ack(const CallSink& sink, const std::string& call_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AckStreamItems(const CallSink& sink, const runtime::v1::StreamAck& ack)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Sends a call's frame and the argument bytes received so far to the
  // worker (starting one if needed) and counts it as running.
  void Dispatch(const std::string& id, Call& call,
                const runtime::v1::StartCall& start, std::string_view args,
                std::vector<Delivery>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Dispatches queued calls while slots are free.
  void DispatchQueued(std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `event` for `call_id` (terminal or not) and queues its delivery.
  void Emit(const std::string& call_id, Call& call, SandboxEventPtr event,
            bool terminal, std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies one host event; frames for the worker go to `to_worker_`.
  void ApplyHostEvent(const std::shared_ptr<CallSink>& sink,
                      const runtime::v1::HostEvent& event,
                      const std::optional<std::string_view>& bulk,
                      std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Encodes a frame for the current worker; FlushToWorker sends them all.
  void SendToWorker(const ipc::Frame& frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushToWorker() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends argument bytes to the worker in kChunkBytes pieces, each copied
  // once: into the worker's payload ring, or encoded inline.
  void ForwardArguments(const std::string& call_id, std::string_view bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies a large `piece` into the live worker's payload ring and points
  // `frame` at it; false (frame untouched) when it goes inline. Called only
  // while encoding into to_worker_, so the ring fills in frame order.
  bool PutInRing(std::string_view piece, ipc::Frame& frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns the live worker, starting one if needed.
  absl::StatusOr<WorkerProcess*> EnsureWorker()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `out` to the end of `posted_`. Events are posted under mu_ and
  // handed to the sinks (outside it) by DeliverPosted, so every sink gets
  // them in the order they were produced under the lock, whichever thread
  // produced them: e.g. a resumed stream's replay before the items its
  // worker produces right after the resume.
  void Post(std::vector<Delivery>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands every posted event to its sink, in order; called without mu_
  // after posting. One thread delivers at a time: a caller that finds
  // another delivering returns at once (that thread takes its events too),
  // so it never blocks, even when a sink's Deliver re-enters the manager.
  void DeliverPosted() ABSL_LOCKS_EXCLUDED(mu_);
  // Hands events to their sinks, one batch per sink, preserving order.
  void Deliver(std::vector<Delivery>& out);
  // Sets `event`'s barrier fields from what `call` emitted so far; returns
  // whether any is set.
  bool StampBarrier(const Call& call, runtime::v1::SandboxEvent& event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes the seqs the side channels gave a batch of worker records.
  // The client of each record's call ("" for none, or a call no longer
  // known): where its log record or trace event goes.
  std::vector<IdRun> OwnersOf(const std::vector<IdRun>& call_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records of `call_ids` (log records or trace events, numbered from
  // `first` on) update their calls' `call_seq`, or `unattributed` when they
  // name none.
  void TrackSeqs(const std::vector<IdRun>& call_ids, uint64_t first,
                 uint64_t Call::*call_seq, uint64_t& unattributed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers a direct call's barrier_ask from the seqs its records got.
  void AnswerBarrier(uint64_t generation, const ipc::Frame& ask)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Turns one worker frame into an event of its call (if still open);
  // returns whether that event carries a side-channel barrier.
  bool ApplyWorkerFrame(uint64_t generation, ipc::Frame& frame,
                        std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Broadcasts the worker's namespace events (in order) to the host streams
  // open on their namespaces; reports events nobody received. Not under mu_.
  void RouteNamespaceEvents(const std::vector<const ipc::Frame*>& frames);
  // Destroys workers that have exited (joins their threads). Never called
  // from a worker callback or with mu_ held.
  void ReapDeadWorkers();
  // The upload watchdog's thread: fails calls whose arguments stopped
  // arriving (options_.upload_idle_timeout) until Shutdown.
  void WatchUploads();
  // Back-pressure on the worker (called on its reader thread, without mu_):
  // waits while more than max_retained_bytes of results are unwritten,
  // ending the most backlogged stream when none progresses for
  // stalled_host_timeout.
  void ThrottleResults() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the host stream with the largest unwritten backlog.
  void AbortMostBacklogged() ABSL_LOCKS_EXCLUDED(mu_);
  void ExpireUploads(absl::Time now, std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a running call with `event` and tells its worker to drop it.
  void FailCall(const std::string& id, Call& call, SandboxEventPtr event,
                std::vector<Delivery>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AdoptLedger's work, under the lock.
  size_t AdoptLedgerLocked(const ipc::LedgerContents& ledger,
                           const WorkerExit& exit, std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OnWorkerExit: reads the ledger of the worker of `generation` (the live
  // one or a replaced one) and adopts it; a WARNING counts garbage slots.
  void AdoptDeadWorkersLedger(uint64_t generation, const WorkerExit& exit,
                              std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The wall time of a CLOCK_MONOTONIC instant the worker published
  // (PayloadArea::DirectLastEndNs); InfinitePast for none.
  static absl::Time DirectLastEnd(int64_t monotonic_ns);
  // The table's limits from the session's options.
  static calls::CallTableLimits TableLimits(const SessionOptions& options);

  const SessionOptions options_;
  const std::unique_ptr<LogBuffer> logs_;
  const std::unique_ptr<TraceBuffer> traces_;
  NamespaceHub namespaces_;
  DirectSideChannels direct_side_;
  absl::Mutex mu_;
  Table table_ ABSL_GUARDED_BY(mu_){TableLimits(options_)};
  std::string to_worker_ ABSL_GUARDED_BY(mu_);  // encoded, not yet sent
  std::unique_ptr<WorkerProcess> worker_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<WorkerProcess>> dead_workers_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  // Entries AddWorkerEnv put before options_.worker.env's.
  std::vector<std::string> extra_env_ ABSL_GUARDED_BY(mu_);
  // The last `env_set` answer: the worker generation that sent it and its
  // detail ("" = applied).
  uint64_t env_set_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::string env_set_detail_ ABSL_GUARDED_BY(mu_);
  // A set_env sent to this worker generation is not answered yet (0: none).
  // Calls wait in call_queue_ meanwhile, so none runs in a worker that has
  // not applied the env; the answer, the worker's exit or the deadline
  // (the upload watchdog's thread) ends the wait.
  uint64_t env_pending_generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time env_pending_deadline_ ABSL_GUARDED_BY(mu_);
  // Ends a pending set_env: `detail` non-empty replaces the worker (its
  // env is not what calls must see). Dispatches the waiting calls.
  void EndEnvPending(absl::string_view why_replace, std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces the live worker (if any) with a fresh one started with the
  // full environment; the old one is killed and reaped later.
  void ReplaceWorker(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AddWorkerEnv's merge, under mu_.
  void MergeWorkerEnv(const std::vector<std::string>& entries)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time last_call_end_ ABSL_GUARDED_BY(mu_) = absl::Now();
  uint64_t workers_started_ ABSL_GUARDED_BY(mu_) = 0;
  size_t running_calls_ ABSL_GUARDED_BY(mu_) = 0;  // dispatched, not terminal
  std::deque<std::string> call_queue_ ABSL_GUARDED_BY(mu_);
  // Events produced under mu_ and not yet handed to their sinks, in order
  // (Post / DeliverPosted), and whether a thread is handing them over.
  std::vector<Delivery> posted_ ABSL_GUARDED_BY(mu_);
  bool delivering_now_ ABSL_GUARDED_BY(mu_) = false;
  // The sinks of the batch DeliverPosted is handing over (taken from
  // posted_, not yet delivered): HasOpenCalls counts them, or a half-closed
  // stream could finish before its last result reached it.
  std::vector<const CallSink*> in_hand_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread upload_watch_;
  bool release_memory_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<const CallSink*, std::weak_ptr<CallSink>> sinks_
      ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<std::atomic<int64_t>> unwritten_ =
      std::make_shared<std::atomic<int64_t>>(0);
  // The last seq of a log record / trace event that named no call.
  uint64_t unattributed_log_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unattributed_trace_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // "namespace\0event" pairs already reported as emitted with no listener.
  absl::flat_hash_set<std::string> unrouted_reported_ ABSL_GUARDED_BY(mu_);

  // Direct calls, stage 4: a client's session the worker holds, and the
  // collapse that takes it back.
  struct HeldSession {
    uint64_t generation = 0;  // the worker it was handed to
    bool collapse_asked = false;
    ipc::SessionState received;  // session_state pieces so far
    size_t received_bytes = 0;
  };
  absl::flat_hash_map<std::string, HeldSession> direct_held_
      ABSL_GUARDED_BY(mu_);
  void SendCollapse(const std::string& client, HeldSession& held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One session_state piece; the last adopts the session.
  void ApplySessionState(uint64_t generation, ipc::Frame& frame,
                         std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AdoptDirectSession's body; running calls are the worker of
  // `generation`'s if it is the live one, else WorkerDied.
  size_t AdoptCollapsed(uint64_t generation, const std::string& client,
                        const ipc::SessionState& state,
                        std::vector<Delivery>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

// Builds a CallError event (exposed for the adapter and tests).
using calls::MakeCallError;

}  // namespace agentix::sandbox
