// CallsReactor: one RuntimeService.Calls stream driven by grpc++'s callback
// API, for the host's native transport (native_calls.cc is its Python face).
// No Python here: messages are opaque bytes in both directions.
//
// Threads. The owner calls Write()/WritesDone()/Cancel()/Drain() from one
// thread (the asyncio loop's); gRPC runs the reactions (OnReadDone,
// OnWriteDone, ...) on its own threads, and possibly inline inside
// StartWrite() & co. on the calling thread. All shared state sits behind
// `mu_`, which is never held while calling into gRPC.
//
// Notifications. Reactions queue what the owner must see (received messages,
// the final status, "pending writes fell below the asked threshold") and write
// an eventfd only when that queue goes from empty to non-empty; the owner
// watches the eventfd and Drain() takes everything and resets it.
//
// Lifetime. The reactor has two owners: the Python object (until Detach())
// and gRPC (until OnDone()). It holds the grpc::Channel, and must never be
// deleted on a gRPC thread. Why: with grpc 1.51 on Linux every channel that
// ran a callback-API call holds a reference to one process-wide callback
// completion queue (CompletionQueue::CallbackAlternativeCQ), and destroying
// the last such channel shuts that queue down and joins its threads — the
// very threads that run reactions. Done from a reaction, that joins the
// calling thread and frees the queue under it: "assertion failed: prior > 0"
// and an abort (host/python/tests/test_native_teardown.py reproduces the
// order). So when OnDone() comes last, the reactor is parked instead, and
// ReapParked() deletes it on the next call from Python (without the GIL). At
// interpreter exit a parked reactor may simply stay; nothing runs it again.
// The eventfd belongs to the reactor, so a late reaction never writes to a
// closed fd.
//
// A hold keeps the call from finishing while the owner may still start a
// write: it is removed once no more writes can start (the stream is dead or
// half-closed) and none is in flight.
#ifndef AGENTIX_HOST_PYTHON_NATIVE_CALLS_REACTOR_H_
#define AGENTIX_HOST_PYTHON_NATIVE_CALLS_REACTOR_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>

namespace agentix::host {

class CallsReactor final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  using Metadata = std::vector<std::pair<std::string, std::string>>;

  // Takes ownership of `efd` (an eventfd). Delete only through Detach().
  explicit CallsReactor(int efd);

  int fd() const { return efd_; }

  // Starts the call; may run reactions inline. Called once.
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

  // The owner lets go (cancelling the call); deletes the reactor if gRPC is
  // done with it. The object must not be used afterwards.
  void Detach();

  // Deletes the reactors whose OnDone came after their Detach (see Lifetime).
  // Must not be called on a gRPC thread.
  static void ReapParked();
  // True when ReapParked() has something to do (cheap).
  static bool AnyParked();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  ~CallsReactor() override;

  long long PendingLocked() const;
  void SignalLocked();
  void CheckNotifyLocked();
  bool ReleaseLocked();

  const int efd_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>> stub_;
  grpc::ByteBuffer read_buf_;
  grpc::ByteBuffer write_buf_;  // the one write in flight

  std::mutex mu_;
  int refs_ = 2;  // the owner and gRPC (until OnDone)
  std::deque<grpc::Slice> queue_;
  size_t pending_bytes_ = 0;
  size_t inflight_bytes_ = 0;
  bool writing_ = false;
  bool writes_done_requested_ = false;
  bool writes_done_inflight_ = false;
  bool half_closed_ = false;
  bool dead_ = false;
  bool hold_released_ = false;
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
