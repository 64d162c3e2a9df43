// CallsReactor: one bidirectional stream (RuntimeService.Calls, or another
// method such as RuntimeService.Namespace) driven by grpc++'s
// completion-queue API, for the host's native transport (native_calls.cc is
// its Python face). No Python here: messages are opaque bytes both ways.
//
// Coalescing. With `coalesce` (the Calls stream), writes queued while one is
// in flight go out as one message: a concatenation of serialized
// CallsRequests is a CallsRequest. Messages whose concatenation means
// something else (NamespaceRequest is a oneof) need it off; each write is
// then one message.
//
// Threads. The owner calls Write()/WritesDone()/Cancel()/Drain() from one
// thread (the asyncio loop's; a write starts there at once when none is in
// flight). One thread per process polls the completion queue all reactors
// share and handles every completion: the only thread gRPC wakes for them.
// (grpc++'s callback API ran completions on two process-wide threads that
// handed each event between them: ~9 thread wake-ups per call in the host
// instead of ~3; docs/PERFORMANCE.md, "Host transport on a completion
// queue".) Shared state sits behind `mu_`, never held while calling gRPC.
//
// Notifications. Completions queue what the owner must see (received
// messages, the final status, "pending writes fell below the asked
// threshold") and write an eventfd only when that queue goes from empty to
// non-empty; the owner watches the eventfd and Drain() takes everything and
// resets it.
//
// Lifetime. Two owners: the Python object (until Detach()) and the polling
// thread (until the call has finished and its last operation completed).
// The last one deletes the reactor; the eventfd belongs to it, so a late
// completion never writes a closed fd.
//
// Fork. The polling thread does not exist in a child forked after the first
// stream; streams opened there would wait for ever. gRPC itself does not
// support that use without GRPC_ENABLE_FORK_SUPPORT either; clients must be
// made after the fork (as with grpc.aio).
#ifndef AGENTIX_HOST_PYTHON_NATIVE_CALLS_REACTOR_H_
#define AGENTIX_HOST_PYTHON_NATIVE_CALLS_REACTOR_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

namespace agentix::host {

class CallsReactor final {
 public:
  using Metadata = std::vector<std::pair<std::string, std::string>>;

  // Takes ownership of `efd` (an eventfd). `method` is the full method path
  // ("/package.Service/Method"). Delete only through Detach().
  CallsReactor(int efd, std::string method, bool coalesce);

  int fd() const { return efd_; }

  // Starts the call and its polling thread. Called once.
  void Start(std::shared_ptr<grpc::Channel> channel, const Metadata& metadata);

  // Queues one message (or starts writing it at once). Returns the bytes not
  // yet written after it, or -1 when the stream takes no more writes.
  long long Write(grpc::Slice slice);

  // Half-closes the stream after the queued writes.
  void WritesDone();

  void Cancel();

  // Bytes queued or in flight (+1 while a half-close is in flight).
  long long Pending();

  // Asks for a notification once Pending() <= threshold (at once if it is).
  void NotifyBelow(long long threshold);

  struct Drained {
    std::vector<std::vector<grpc::Slice>> messages;  // each message's slices
    bool has_status = false;
    int code = 0;
    std::string message;
    bool below = false;
  };

  // Everything queued for the owner since the last Drain(); resets the eventfd.
  Drained Drain();

  // The owner lets go (cancelling the call); the reactor is deleted once its
  // polling thread is done too. The object must not be used afterwards.
  void Detach();

  // Handles one completion of the shared queue (`tag` from Tag()); called
  // on its polling thread only.
  static void Complete(void* tag, bool ok);

 private:
  enum class Op { kStart, kRead, kWrite, kWritesDone, kFinish };
  static constexpr int kOps = 5;
  // What a completion-queue tag points at.
  struct Completion {
    CallsReactor* reactor;
    Op op;
  };
  void* Tag(Op op) { return &tags_[static_cast<int>(op)]; }

  ~CallsReactor();

  void OnReadDone(bool ok);
  void OnWriteDone(bool ok);
  void OnWritesDoneDone(bool ok);
  void OnFinished();
  // One operation completed; shuts the queue down when it was the last one
  // of a finished call.
  void OpDone();

  long long PendingLocked() const;
  void SignalLocked();
  void CheckNotifyLocked();

  const int efd_;
  const std::string method_;  // outlives the call
  const bool coalesce_;
  grpc::ClientContext context_;
  Completion tags_[kOps];
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>> stub_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream_;
  grpc::ByteBuffer read_buf_;
  grpc::ByteBuffer write_buf_;  // the one write in flight
  grpc::Status status_;

  std::mutex mu_;
  int refs_ = 2;  // the owner, and the polling thread until the last completion
  bool started_ = false;
  int ops_ = 0;  // operations started and not yet completed
  std::deque<grpc::Slice> queue_;
  size_t pending_bytes_ = 0;
  size_t inflight_bytes_ = 0;
  bool writing_ = false;
  bool writes_done_requested_ = false;
  bool writes_done_inflight_ = false;
  bool dead_ = false;
  long long notify_below_ = -1;
  bool below_fired_ = false;
  bool signalled_ = false;
  std::vector<std::vector<grpc::Slice>> received_;
  bool done_ = false;
  bool status_taken_ = false;
  int status_code_ = 0;
  std::string status_message_;
};

}  // namespace agentix::host

#endif  // AGENTIX_HOST_PYTHON_NATIVE_CALLS_REACTOR_H_
