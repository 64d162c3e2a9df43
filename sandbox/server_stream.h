// ServerStream: one server bidi stream on grpc++'s completion-queue API,
// shaped like grpc::ServerBidiReactor (StartRead / StartWrite / Finish and
// On* reactions), so the daemon's stream logic reads like callback code.
// UnaryCall: the same for a unary method answered at once.
//
// Why not the callback API: grpc 1.51 runs callback-server reactions on two
// process-wide "nexting" threads that hand every event between them. `perf
// sched` counted ~11.5 of their wake-ups in the daemon per namespace request
// (docs/PERFORMANCE.md, "Daemon server on a completion queue"). Here one
// thread of the daemon polls the completion queue every stream shares and
// runs each reaction itself.
//
// Threads. Reactions run on the polling thread, one at a time, so a reaction
// must not block: it would hold up every stream. StartRead, StartWrite and
// Finish may be called from any thread, under the reactor API's rules: at
// most one read and one write in flight, Finish once and with no write in
// flight, nothing after Finish.
//
// Parsing. The stream carries raw bytes (the service registers the method
// with WithRawMethod_X) and parses each message itself: gRPC's own parsing
// reports an unparseable message exactly like a half-close (a failed read),
// so the daemon could not tell the host its message was garbage. Here such a
// message runs OnBadMessage() instead, and the stream may go on reading.
// The work is the same (gRPC would parse and serialize these very buffers).
//
// Lifetime. A stream object is made before its call arrives (AwaitCall);
// OnStart() runs when the call does. OnDone() runs once, last, after Finish
// has completed and every other operation too; it usually deletes the
// stream. A stream whose call never arrives (the server shut down) is
// deleted without any reaction.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/async_stream.h>
#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sandbox/stream_activity.h"

namespace agentix::sandbox {

// What every tag on the daemon's completion queue points at.
class Completion {
 public:
  virtual void Complete(bool ok) = 0;

 protected:
  ~Completion() = default;
};

// A Completion that calls `Method` of its owner.
template <typename Owner, void (Owner::*Method)(bool)>
class MemberCompletion final : public Completion {
 public:
  explicit MemberCompletion(Owner* owner) : owner_(owner) {}
  void Complete(bool ok) override { (owner_->*Method)(ok); }

 private:
  Owner* const owner_;
};

// Runs every completion of `cq` (tags are Completion*) on one thread named
// `name`, until Stop().
//
// Spinning. With `spin` > 0 the thread polls the queue without sleeping for
// up to `spin` after each completion before it blocks: a completion that
// comes within that window (a write's completion, the peer's flow-control
// answer, the next message of a busy stream) then costs no wake-up of this
// thread. Adaptive: a blocking wait that lasted longer than `spin` halves
// the next window (an idle daemon stops spinning within a few waits), one
// that ended within `spin` restores it. Off (0) by default: on a loaded
// machine a spinning thread takes the CPU the peer needs
// (docs/DECISIONS.md, "Daemon call path: hand-offs and spinning").
//
// Stopping. gRPC aborts the process if an operation starts on a queue that
// has been shut down, and a call's last reactions (Finish after the
// cancellation that the server's Shutdown() brings) come after Shutdown()
// returns. So calls count themselves live from their arrival to their last
// completion (AddLive/RemoveLive), and Stop() shuts the queue down only
// once none is live and every completion queued before has run.
class CompletionQueueThread {
 public:
  CompletionQueueThread(grpc::ServerCompletionQueue* cq, const char* name,
                        absl::Duration spin = absl::ZeroDuration());
  ~CompletionQueueThread() { Stop(); }

  CompletionQueueThread(const CompletionQueueThread&) = delete;
  CompletionQueueThread& operator=(const CompletionQueueThread&) = delete;

  grpc::ServerCompletionQueue* cq() const { return cq_; }

  // A call arrived / had its last completion. Any thread.
  void AddLive();
  void RemoveLive();

  // After the server's Shutdown(): waits (at most `grace`) for the live
  // calls to end, shuts the queue down, runs what is left, joins the thread.
  void Stop(absl::Duration grace = absl::Seconds(10));

 private:
  // Whether every completion queued before this call has run.
  bool DrainQueued(absl::Time deadline);
  // The polling loop, spinning as described above.
  void PollSpinning(absl::Duration spin);

  grpc::ServerCompletionQueue* const cq_;
  std::thread thread_;
  absl::Mutex mu_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// Deletes the object of a call that has had its last completion and tells
// `thread` (the counterpart of its AddLive).
template <typename Call>
void RetireCall(Call* call, CompletionQueueThread* thread) {
  delete call;
  thread->RemoveLive();
}

// One unary call on the queue `thread` polls, answered as soon as it
// arrives: `answer` (run on that thread) fills the response, or returns the
// error status to finish with. Each call, once it arrives, awaits the next.
template <typename Request, typename Response>
class UnaryCall final {
 public:
  using Writer = grpc::ServerAsyncResponseWriter<Response>;
  // A bound RequestX method of the generated AsyncService.
  using RequestCall =
      std::function<void(grpc::ServerContext*, Request*, Writer*,
                         grpc::ServerCompletionQueue*, void*)>;
  using Answer = std::function<grpc::Status(const Request&, Response*)>;

  static void AwaitNext(RequestCall request_call, Answer answer,
                        CompletionQueueThread* thread) {
    auto* call =
        new UnaryCall(std::move(request_call), std::move(answer), thread);
    call->request_call_(&call->context_, &call->request_, &call->writer_,
                        thread->cq(), &call->accepted_);
  }

 private:
  UnaryCall(RequestCall request_call, Answer answer,
            CompletionQueueThread* thread)
      : request_call_(std::move(request_call)),
        answer_(std::move(answer)),
        thread_(thread) {}

  void Accepted(bool ok) {
    if (!ok) {  // the server is shutting down
      delete this;
      return;
    }
    thread_->AddLive();
    AwaitNext(request_call_, answer_, thread_);
    const grpc::Status status = answer_(request_, &response_);
    if (status.ok()) {
      writer_.Finish(response_, status, &finished_);
    } else {
      writer_.FinishWithError(status, &finished_);
    }
  }
  void Finished(bool /*ok*/) { RetireCall(this, thread_); }

  const RequestCall request_call_;
  const Answer answer_;
  CompletionQueueThread* const thread_;
  grpc::ServerContext context_;
  Request request_;
  Response response_;
  Writer writer_{&context_};
  MemberCompletion<UnaryCall, &UnaryCall::Accepted> accepted_{this};
  MemberCompletion<UnaryCall, &UnaryCall::Finished> finished_{this};
};

template <typename Request, typename Response>
class ServerStream {
 public:
  using Stream = grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
  // A bound RequestX method of the generated AsyncService.
  using RequestCall = std::function<void(grpc::ServerContext*, Stream*,
                                         grpc::ServerCompletionQueue*, void*)>;

  virtual ~ServerStream() = default;

  ServerStream(const ServerStream&) = delete;
  ServerStream& operator=(const ServerStream&) = delete;

  // Registers this stream for the next call `request_call` receives on
  // the queue `thread` polls; `on_accepted` runs when it arrives, before
  // OnStart() (to await the call after it). Once, right after construction.
  void AwaitCall(const RequestCall& request_call, CompletionQueueThread* thread,
                 std::function<void()> on_accepted) {
    thread_ = thread;
    on_accepted_ = std::move(on_accepted);
    context_.AsyncNotifyWhenDone(&done_);
    request_call(&context_, &stream_, thread->cq(), &accepted_);
  }

  // Counts this stream in `activity` from its arrival to its end (null: not
  // counted). Before AwaitCall.
  void CountIn(StreamActivity* activity) { activity_ = activity; }

  void StartRead(Request* request) {
    ops_.fetch_add(1, std::memory_order_relaxed);
    read_into_ = request;
    stream_.Read(&read_bytes_, &read_done_);
  }
  // The message is serialized before this returns.
  void StartWrite(const Response* response) {
    ops_.fetch_add(1, std::memory_order_relaxed);
    bool own_buffer = false;
    write_bytes_.Clear();  // the last write took its own reference
    const grpc::Status serialized = grpc::SerializationTraits<Response>::Serialize(
        *response, &write_bytes_, &own_buffer);
    if (!serialized.ok()) {
      // Only a message over 2 GiB fails; the batching writers stay far below.
      write_bytes_.Clear();
    }
    stream_.Write(write_bytes_, &write_done_);
  }
  void Finish(grpc::Status status) {
    ops_.fetch_add(1, std::memory_order_relaxed);
    stream_.Finish(status, &finish_done_);
  }

 protected:
  ServerStream() : stream_(&context_) {}

  // The call's context (its metadata is there from OnStart on).
  const grpc::ServerContext& server_context() const { return context_; }

  virtual void OnStart() = 0;
  virtual void OnReadDone(bool ok) = 0;
  // A message arrived that does not parse as a Request (the read is over;
  // `*request` is cleared). `error` says why.
  virtual void OnBadMessage(const std::string& error) = 0;
  virtual void OnWriteDone(bool /*ok*/) {}
  // The call was cancelled (by the host, a deadline or a broken
  // connection); reads and writes in flight fail. Finish is still due.
  virtual void OnCancel() {}
  virtual void OnDone() = 0;

 private:
  void Accepted(bool ok) {
    if (!ok) {  // the server is shutting down: no call, no done tag
      delete this;
      return;
    }
    thread_->AddLive();
    // One count for the done tag, one that Finish's completion releases.
    ops_.store(2, std::memory_order_relaxed);
    if (activity_ != nullptr) activity_->Opened();
    if (on_accepted_) std::exchange(on_accepted_, nullptr)();
    OnStart();
  }
  void ReadDone(bool ok) {
    if (ok) {
      read_into_->Clear();
      const grpc::Status parsed =
          grpc::SerializationTraits<Request>::Deserialize(&read_bytes_,
                                                          read_into_);
      read_bytes_.Clear();
      if (!parsed.ok()) {
        read_into_->Clear();
        OnBadMessage(parsed.error_message());
        Release(1);
        return;
      }
    }
    OnReadDone(ok);
    Release(1);
  }
  void WriteDone(bool ok) {
    OnWriteDone(ok);
    Release(1);
  }
  void FinishDone(bool /*ok*/) { Release(2); }
  void CallDone(bool /*ok*/) {
    if (context_.IsCancelled()) OnCancel();
    Release(1);
  }
  void Release(int n) {
    if (ops_.fetch_sub(n, std::memory_order_acq_rel) != n) return;
    CompletionQueueThread* const thread = thread_;
    StreamActivity* const activity = activity_;
    OnDone();  // may delete this
    if (activity != nullptr) activity->Closed();
    thread->RemoveLive();
  }

  grpc::ServerContext context_;
  Stream stream_;
  grpc::ByteBuffer read_bytes_;
  Request* read_into_ = nullptr;
  grpc::ByteBuffer write_bytes_;
  CompletionQueueThread* thread_ = nullptr;
  StreamActivity* activity_ = nullptr;
  std::function<void()> on_accepted_;
  // Operations in flight, plus one until Finish has completed.
  std::atomic<int> ops_{0};
  MemberCompletion<ServerStream, &ServerStream::Accepted> accepted_{this};
  MemberCompletion<ServerStream, &ServerStream::ReadDone> read_done_{this};
  MemberCompletion<ServerStream, &ServerStream::WriteDone> write_done_{this};
  MemberCompletion<ServerStream, &ServerStream::FinishDone> finish_done_{this};
  MemberCompletion<ServerStream, &ServerStream::CallDone> done_{this};
};

}  // namespace agentix::sandbox
