#include "sandbox/frame_wire_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "sandbox/connection_guard.h"
#include "wire/frame_codec.h"
#include "sandbox/namespace_stream.h"
#include "wire/frame_read_buffer.h"
#include "wire/frame_splice.h"
#include "wire/wire_limits.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;

// The method paths HELLO's token is checked for: the stream it replaces.
constexpr char kCallsMethod[] = "/agentix.runtime.v1.RuntimeService/Calls";
// How long a Namespace stream that asked for direct waits for a booting
// worker before it is served relayed (docs/DIRECT-CALLS.md stage 8).
constexpr absl::Duration kNamespaceHandOverWait = absl::Seconds(2);
// How long it waits for the name's previous direct stream to be reported
// closed (a reconnect's, a dead worker's) before it is served relayed.
constexpr absl::Duration kNamespaceClaimWait = absl::Milliseconds(250);
constexpr char kNamespaceMethod[] =
    "/agentix.runtime.v1.RuntimeService/Namespace";
// As the gRPC Calls stream: past this many unwritten bytes the stream's
// frames are not read (no new calls) until a quarter of it is left.
constexpr size_t kPauseReadsAboveBytes = 64u << 20;
// iovecs per sendmsg.
constexpr size_t kMaxIov = 64;
// How long a read buffer grown for large frames is kept once empty.
constexpr absl::Duration kKeepReadBufferFor = absl::Milliseconds(100);

void Wake(int event_fd) {
  const uint64_t one = 1;
  ssize_t n;
  do {
    n = ::write(event_fd, &one, sizeof(one));
  } while (n < 0 && errno == EINTR);
}

void DrainWake(int event_fd) {
  uint64_t count;
  ssize_t n;
  do {
    n = ::read(event_fd, &count, sizeof(count));
  } while (n < 0 && errno == EINTR);
}

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
                        60000));
}

// Serializes `events` as MESSAGE frames of at most kMaxBatchBytes each
// (one event bigger than that alone still goes alone), as the gRPC streams
// batch them: each frame is `batch` (the fields every message carries) with
// its events in `field`, batch's repeated field. The message borrows the
// events (no copy of a megabyte chunk into it); serializing only reads them.
template <typename Response, typename Item>
void AppendMessageFrames(Response& batch,
                         google::protobuf::RepeatedPtrField<Item>* field,
                         const std::vector<std::shared_ptr<const Item>>& events,
                         std::deque<std::string>& out) {
  size_t bytes = 0;
  auto flush = [&] {
    if (field->empty()) return;
    const size_t size = batch.ByteSizeLong();
    std::string frame(kFrameHeaderBytes + size, '\0');
    EncodeFrameHeader(FrameKind::kMessage, static_cast<uint32_t>(size),
                      frame.data());
    batch.SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(frame.data() + kFrameHeaderBytes));
    while (!field->empty()) field->UnsafeArenaReleaseLast();
    out.push_back(std::move(frame));
    bytes = 0;
  };
  for (const auto& event : events) {
    const size_t framed = FramedItemBytes(event->ByteSizeLong());
    if (!field->empty() && bytes + framed > kMaxBatchBytes) flush();
    field->UnsafeArenaAddAllocated(const_cast<Item*>(event.get()));
    bytes += framed;
  }
  flush();
}

// The CallSink of one frame-wire stream. Outlives its connection while the
// session manager holds it; once closed it refuses every delivery and
// touches no descriptor.
class FrameSink final : public CallSink {
 public:
  FrameSink(int fd, int wake_fd, std::shared_ptr<std::atomic<int64_t>> shared)
      : fd_(fd), wake_fd_(wake_fd), shared_(std::move(shared)) {}
  ~FrameSink() override {
    absl::MutexLock lock(&mu_);
    DropQueue(false);
  }

  bool Deliver(std::vector<SandboxEventPtr> events) override {
    if (events.empty()) return true;
    // Large values and chunks are written from the events themselves
    // (frame_splice.h): no serialized copy of their bytes. With the host's
    // payload ring they are copied into it instead, by the connection's
    // thread (woken for them), so that this thread's copy out of the
    // worker's ring overlaps with that one. Events after them wait their
    // turn (the ring is filled in the order its frames are queued).
    // (Once this thread has seen for_ring_pending_ at 0, what it put
    // there before is queued: later events may go the direct way.)
    if (has_ring_.load(std::memory_order_acquire) &&
        (for_ring_pending_.load(std::memory_order_acquire) > 0 ||
         HasBulk(events))) {
      absl::MutexLock lock(&mu_);
      if (closed_ || ending_ || broken_) return false;
      for (auto& event : events) {
        const int64_t size = static_cast<int64_t>(event->ByteSizeLong());
        for_ring_bytes_ += size;
        AddQueued(size);
        for_ring_.push_back(std::move(event));
      }
      for_ring_pending_.store(for_ring_.size(), std::memory_order_release);
      Wake(wake_fd_);
      return true;
    }
    // Serialized outside the lock, which the connection's thread takes for
    // every frame it reads.
    std::deque<OutPiece> pieces;
    AppendMessagePieces(events, pieces);
    return WritePieces(std::move(pieces));
  }
  // The host's payload ring (HELLO), written by Deliver; before the sink is
  // registered with the manager.
  void SetRing(std::shared_ptr<ipc::PayloadArea> ring) {
    absl::MutexLock lock(&mu_);
    ring_ = std::move(ring);
    has_ring_.store(ring_ != nullptr, std::memory_order_release);
  }
  // Writes whole serialized `frames` (a Namespace stream's): see WritePieces.
  bool Write(std::deque<std::string> frames) {
    std::deque<OutPiece> pieces;
    for (auto& frame : frames) pieces.emplace_back(std::move(frame), /*frame_end=*/true);
    return WritePieces(std::move(pieces));
  }
  // Writes whole frames' `pieces` (at once when nothing is queued, else
  // after what is); false once the stream is ending or gone.
  bool WritePieces(std::deque<OutPiece> pieces) {
    absl::MutexLock lock(&mu_);
    if (closed_ || ending_ || broken_) return false;
    QueueLocked(std::move(pieces));
    return true;
  }
  // A half-closed stream checks whether its last call has been delivered.
  void OnDelivered() override {
    absl::MutexLock lock(&mu_);
    if (reads_done_ && !closed_) Wake(wake_fd_);
  }
  size_t UnwrittenBytes() override {
    absl::MutexLock lock(&mu_);
    return queued_bytes_;
  }
  void Abort(const std::string& message) override {
    End(absl::StatusCode::kResourceExhausted, message, /*drop_queued=*/true);
  }
  const std::string& client_id() const override { return client_id_; }
  // Once, before the sink is registered with the manager.
  void SetClientId(std::string id) { client_id_ = std::move(id); }
  // Counts the unwritten bytes in `shared` instead (a Namespace stream's
  // are not results). Before anything is queued.
  void CountIn(std::shared_ptr<std::atomic<int64_t>> shared) {
    absl::MutexLock lock(&mu_);
    shared_ = std::move(shared);
  }

  // Queues the stream's STATUS frame (after what is queued, or instead of
  // it with `drop_queued`); later deliveries are refused. Once.
  void End(absl::StatusCode code, absl::string_view details,
           bool drop_queued) {
    {
      absl::MutexLock lock(&mu_);
      if (closed_ || ending_ || broken_) return;
      if (drop_queued) DropQueue(/*keep_partial=*/true);
      if (!for_ring_.empty()) QueueForRingLocked();  // before the STATUS
      ending_ = true;
      std::string status = EncodeFrame(FrameKind::kStatus,
                                       EncodeStatus(code, details));
      AddQueued(static_cast<int64_t>(status.size()));
      const bool was_empty = queue_.empty();
      queue_.Push(OutPiece(std::move(status), /*frame_end=*/true));
      if (was_empty) FlushLocked();
      Wake(wake_fd_);
    }
  }

  // Wakes the connection's thread, unless it has ended.
  void WakeIfOpen() {
    absl::MutexLock lock(&mu_);
    if (!closed_) Wake(wake_fd_);
  }

  // The host half-closed: OnDelivered then wakes the connection's thread to
  // check whether the stream may finish.
  void SetReadsDone() {
    absl::MutexLock lock(&mu_);
    reads_done_ = true;
  }

  struct State {
    size_t unwritten = 0;
    bool ending = false;   // a STATUS is queued or written
    bool broken = false;   // the socket failed
  };
  State Get() {
    absl::MutexLock lock(&mu_);
    return {queued_bytes_, ending_, broken_};
  }
  // The connection's thread: the socket is writable.
  void Flush() {
    absl::MutexLock lock(&mu_);
    if (!closed_) FlushLocked();
  }
  // The connection's thread, woken: puts the events Deliver left for the
  // host's ring into it and queues (and writes) their frames.
  void QueueForRing() {
    if (for_ring_pending_.load(std::memory_order_acquire) == 0) return;
    absl::MutexLock lock(&mu_);
    if (!closed_ && !for_ring_.empty()) QueueForRingLocked();
  }
  // The connection ends; the descriptors are closed right after.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    DropQueue(false);
    ring_.reset();  // the host's ring is unmapped with the connection's
  }

 private:
  // Puts the events waiting for the ring into it and queues their frames.
  void QueueForRingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<SandboxEventPtr> events;
    events.swap(for_ring_);
    AddQueued(-for_ring_bytes_);
    for_ring_bytes_ = 0;
    std::deque<OutPiece> pieces;
    AppendMessagePieces(events, pieces, ring_.get());
    QueueLocked(std::move(pieces));
    for_ring_pending_.store(0, std::memory_order_release);
  }

  void QueueLocked(std::deque<OutPiece> pieces)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool was_empty = queue_.empty();
    for (auto& piece : pieces) {
      AddQueued(static_cast<int64_t>(piece.bytes().size()));
      queue_.Push(std::move(piece));
    }
    // Nothing queued before: write now, on this thread. Otherwise the
    // connection's thread is waiting for the socket to drain.
    if (was_empty) FlushLocked();
    // Under the lock: once closed, the descriptor may be another's.
    if ((was_empty && !queue_.empty()) || broken_) Wake(wake_fd_);
  }

  // Writes queued frames until the socket would block.
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!queue_.empty() && !broken_) {
      iovec iov[kMaxIov];
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = queue_.Gather(iov, kMaxIov);
      const ssize_t n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        broken_ = true;  // the host is gone; its calls stay retained
        DropQueue(false);
        return;
      }
      AddQueued(-static_cast<int64_t>(n));
      queue_.Consume(static_cast<size_t>(n));
    }
  }

  // Frees the queue; with `keep_partial` the rest of a frame partly
  // written stays, so the bytes that follow still start at a frame
  // boundary.
  void DropQueue(bool keep_partial) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for_ring_.clear();
    for_ring_bytes_ = 0;
    for_ring_pending_.store(0, std::memory_order_release);
    queue_.Drop(keep_partial);
    AddQueued(static_cast<int64_t>(queue_.bytes()) -
              static_cast<int64_t>(queued_bytes_));
  }

  void AddQueued(int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queued_bytes_ = static_cast<size_t>(static_cast<int64_t>(queued_bytes_) + delta);
    shared_->fetch_add(delta, std::memory_order_relaxed);
  }

  const int fd_;
  const int wake_fd_;
  std::shared_ptr<std::atomic<int64_t>> shared_ ABSL_GUARDED_BY(mu_);
  std::string client_id_;
  absl::Mutex mu_;
  OutQueue queue_ ABSL_GUARDED_BY(mu_);  // whole frames
  std::shared_ptr<ipc::PayloadArea> ring_ ABSL_GUARDED_BY(mu_);
  // Delivered events the connection's thread puts into the ring next, and
  // their serialized size (counted as queued).
  std::vector<SandboxEventPtr> for_ring_ ABSL_GUARDED_BY(mu_);
  int64_t for_ring_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // for_ring_.size() and whether ring_ is set, for Deliver to read without
  // the lock.
  std::atomic<size_t> for_ring_pending_{0};
  std::atomic<bool> has_ring_{false};
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;   // unwritten, all frames
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// The write side of a Namespace stream on the frame wire: serializes
// NamespaceResponse MESSAGE frames and writes them through the connection's
// FrameSink (used only as a frame writer: it is never registered with the
// manager). Deliver runs on the worker-reader thread and writes at once, as
// for results.
class FrameNamespaceSink final : public NamespaceStreamSink {
 public:
  explicit FrameNamespaceSink(std::shared_ptr<FrameSink> writer)
      : writer_(std::move(writer)) {}

  bool Deliver(std::vector<NamespaceEventPtr> events) override {
    absl::MutexLock lock(&mu_);  // keeps the frames in delivery order
    if (failed_) return false;
    if (holding_) {
      for (auto& event : events) held_.push_back(std::move(event));
      return true;
    }
    return WriteLocked(events);
  }
  void HoldUntilOpened(runtime::v1::NamespaceResponse header) override {
    absl::MutexLock lock(&mu_);
    header_ = std::move(header);
    holding_ = true;
  }
  void WriteOpened(runtime::v1::NamespaceResponse opened) override {
    absl::MutexLock lock(&mu_);
    holding_ = false;
    if (failed_) return;
    std::deque<std::string> frames;
    frames.push_back(EncodeFrame(FrameKind::kMessage, opened.SerializeAsString()));
    if (!writer_->Write(std::move(frames))) return;
    std::vector<NamespaceEventPtr> held;
    held.swap(held_);
    WriteLocked(held);
  }
  void Fail(const absl::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      failed_ = true;
      held_.clear();
    }
    writer_->End(status.code(),
                 base::TruncateMessage(std::string(status.message())),
                 /*drop_queued=*/true);
  }

 private:
  // MESSAGE frames carrying the header's fields, batched as on gRPC.
  bool WriteLocked(const std::vector<NamespaceEventPtr>& events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (events.empty()) return true;
    std::deque<std::string> frames;
    runtime::v1::NamespaceResponse batch = header_;
    AppendMessageFrames(batch, batch.mutable_events(), events, frames);
    return writer_->Write(std::move(frames));
  }

  const std::shared_ptr<FrameSink> writer_;
  absl::Mutex mu_;
  runtime::v1::NamespaceResponse header_ ABSL_GUARDED_BY(mu_);
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<NamespaceEventPtr> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// One accepted connection and its thread.
class FrameWireServer::Connection {
 public:
  Connection(FrameWireServer* server, int fd)
      : server_(server),
        manager_(server->manager_),
        fd_(fd),
        wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        sink_(std::make_shared<FrameSink>(
            fd, wake_fd_, manager_->unwritten_result_bytes())) {}
  ~Connection() {
    if (thread_.joinable()) thread_.join();
  }

  bool ok() const { return wake_fd_ >= 0; }
  void Start() {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "agx-frames");
      Run();
      done_.store(true, std::memory_order_release);
    });
  }
  // The server is stopping: the thread ends the stream (STATUS 14).
  void Wake() { sink_->WakeIfOpen(); }
  bool done() const { return done_.load(std::memory_order_acquire); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    const absl::Time hello_deadline =
        absl::Now() + server_->options_.hello_timeout;
    bool paused = false;
    uint64_t placed = CallsCpu::kNever;
    CallsCpu* const calls_cpu = server_->options_.calls_cpu.get();
    for (;;) {
      if (calls_cpu != nullptr) calls_cpu->Follow(&placed);
      if (follow_ != Follow::kNone) TellHostPlacement(calls_cpu);
      if (server_->stopping_.load(std::memory_order_acquire)) {
        sink_->End(absl::StatusCode::kUnavailable,
                   "the sandbox daemon is shutting down", false);
      }
      FrameSink::State state = sink_->Get();
      if (!state.ending && !state.broken) {
        ProcessFrames(paused);
        if (direct_wanted_ && namespace_ != nullptr) {
          if (TryHandOverNamespace()) return;  // the worker's now
          ProcessFrames(paused);
        } else if (direct_wanted_) {
          if (TryHandOver()) return;  // the worker's now
          // Relayed: what came after HELLO, once the client's state is here.
          if (CollapseHeldSession()) ProcessFrames(paused);
        }
        state = sink_->Get();
      }
      if (!state.ending && !state.broken && half_closed_ &&
          state.unwritten == 0 && !manager_->HasOpenCalls(sink_.get())) {
        sink_->End(absl::StatusCode::kOk, "", false);
        state = sink_->Get();
      }
      if (!state.ending && !hello_done_ && absl::Now() >= hello_deadline) {
        CountConnectionTimedOut(fd_);  // in the guard's totals, as on gRPC
        sink_->End(absl::StatusCode::kDeadlineExceeded,
                   absl::StrCat("no HELLO frame within ",
                                absl::FormatDuration(
                                    server_->options_.hello_timeout)),
                   false);
        state = sink_->Get();
      }
      if (state.broken) break;
      if (state.ending) {
        if (state.unwritten == 0) break;  // the STATUS is written
        if (end_deadline_ == absl::InfiniteFuture()) {
          end_deadline_ = absl::Now() + server_->options_.finish_grace;
        }
        if (absl::Now() >= end_deadline_) break;
      }
      if (paused && state.unwritten < kPauseReadsAboveBytes / 4) paused = false;
      if (!paused && state.unwritten > kPauseReadsAboveBytes) paused = true;

      pollfd fds[2] = {};
      fds[0].fd = fd_;
      fds[0].events = static_cast<short>((paused ? 0 : POLLIN) |
                                         (state.unwritten > 0 ? POLLOUT : 0));
      fds[1].fd = wake_fd_;
      fds[1].events = POLLIN;
      absl::Time deadline = absl::InfiniteFuture();
      if (state.ending) {
        deadline = end_deadline_;
      } else if (!hello_done_) {
        deadline = hello_deadline;
      }
      const bool large_idle = read_.idle_and_large();
      if (large_idle) {
        deadline = std::min(deadline, absl::Now() + kKeepReadBufferFor);
      }
      const int ready = Wait(fds, PollTimeoutMs(deadline),
                             /*spin=*/hello_done_ && !state.ending);
      if (ready < 0 && errno != EINTR) break;
      if (ready == 0 && large_idle && read_.idle_and_large()) {
        // No frame came for a while: a large buffer is not kept idle.
        read_.Shrink();
      }
      if (ready <= 0) continue;
      if (fds[1].revents & POLLIN) {
        DrainWake(wake_fd_);
        sink_->QueueForRing();  // events for the payload ring, if any
      }
      if (fds[0].revents & POLLOUT) sink_->Flush();
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (!ReadSome(state.ending)) break;  // EOF or error: the stream is lost
      }
    }
    Finish();
  }

  // poll(fds, 2, timeout_ms); with options.spin and `spin`, first polls
  // without sleeping for up to the current window, which adapts as the
  // worker reader's (worker_process.cc): the whole wait counts; a short one
  // doubles the window (up to options.spin), a long one halves it, so an
  // idle stream soon stops spinning.
  int Wait(pollfd* fds, int timeout_ms, bool spin) {
    const absl::Duration most = server_->options_.spin;
    if (!spin || most <= absl::ZeroDuration()) return ::poll(fds, 2, timeout_ms);
    const absl::Time since = absl::Now();
    if (spin_window_ >= absl::Microseconds(1)) {
      const absl::Time until = since + spin_window_;
      do {
        const int ready = ::poll(fds, 2, 0);
        if (ready != 0) return ready;
      } while (absl::Now() < until);
    }
    const int ready = ::poll(fds, 2, timeout_ms);
    spin_window_ = absl::Now() - since <= most
                       ? std::min(most, std::max(spin_window_ * 2,
                                                 absl::Microseconds(1)))
                       : spin_window_ / 2;
    return ready;
  }

  // Reads what the socket has; false on EOF or an error. While the
  // stream is ending, what arrives is discarded (only EOF matters).
  bool ReadSome(bool discard) {
    if (discard) read_.Clear();
    // The one descriptor a host may send (its payload ring, with HELLO) is
    // kept for Hello(); any other is closed and makes the stream fail there
    // (before HELLO) or at once.
    const FrameReadBuffer::ReadOutcome outcome =
        read_.Read(fd_, kMaxFrameMessageBytes, [this](int fd) {
          if (!hello_done_ && ring_fd_ < 0) {
            ring_fd_ = fd;
          } else {
            ::close(fd);
            stray_fds_ = true;
          }
        });
    if (outcome.descriptors_truncated) stray_fds_ = true;
    return outcome.open;
  }

  // Handles every whole frame buffered (until the stream ends or its reads
  // pause for a write backlog).
  void ProcessFrames(bool& paused) {
    while (!paused) {
      absl::StatusOr<FrameView> frame = ParseFrame(read_.buffered());
      if (!frame.ok()) {
        sink_->End(absl::StatusCode::kInvalidArgument, frame.status().message(),
                   false);
        return;
      }
      if (frame->frame_bytes == 0) break;
      const size_t consumed = frame->frame_bytes;
      const bool go_on = HandleFrame(*frame);
      read_.Consume(consumed);
      if (!go_on) return;
      if (direct_wanted_) break;  // the rest is the worker's (TryHandOver)
      if (sink_->UnwrittenBytes() > kPauseReadsAboveBytes) paused = true;
    }
  }

  // False once the stream ends.
  bool HandleFrame(const FrameView& frame) {
    if (!hello_done_) {
      if (frame.kind != FrameKind::kHello) {
        return Refuse(absl::StrCat(
            "the first frame must be HELLO (kind 1); got kind ",
            static_cast<int>(frame.kind)));
      }
      return Hello(frame.payload);
    }
    if (half_closed_) return Refuse("a frame after HALF_CLOSE");
    if (stray_fds_) {
      return Refuse(
          "a file descriptor came after HELLO, or more than the payload "
          "ring's one with it");
    }
    switch (frame.kind) {
      case FrameKind::kRingMessage:
        if (namespace_ != nullptr) {
          return Refuse("RING_MESSAGE on a Namespace stream");
        }
        return RingMessage(frame.payload);
      case FrameKind::kMessage:
        if (namespace_ != nullptr) return NamespaceMessage(frame.payload);
        // Large argument bytes stay in the read buffer until they are put
        // in the worker's ring (frame_splice.h).
        if (!ParseCallsRequestSpliced(frame.payload, request_)) {
          // As on gRPC: a BadRequest error, and the stream goes on.
          sink_->Deliver({MakeCallError(
              "", "BadRequest",
              "unparseable CallsRequest message (not a valid protobuf "
              "encoding); it was ignored",
              absl::StatusCode::kInvalidArgument)});
          return true;
        }
        manager_->HandleHostEvents(sink_, request_.request.events(),
                                   request_.bulk);
        return true;
      case FrameKind::kHalfClose:
        half_closed_ = true;
        sink_->SetReadsDone();
        return true;
      case FrameKind::kHello:
        return Refuse("a second HELLO frame");
      default:
        return Refuse(absl::StrCat("a host may not send frames of kind ",
                                   static_cast<int>(frame.kind)));
    }
  }

  // A CallsRequest whose bulk bytes lie in the host's payload ring. Any
  // fault is the host's and ends the stream with STATUS 3 saying what.
  bool RingMessage(absl::string_view payload) {
    if (ring_ == nullptr) {
      return Refuse(absl::StrCat("RING_MESSAGE on a connection without a "
                                 "payload ring (HELLO had no ",
                                 kFramePayloadRingKey, ")"));
    }
    absl::StatusOr<uint64_t> end = ParseRingMessage(
        payload, kMaxFrameMessageBytes, *ring_, ring_pieces_, request_);
    if (!end.ok()) return Refuse(end.status().message());
    // The session manager copies each bulk view (into the worker's ring or
    // a frame) before it returns: the pieces can be handed back after.
    manager_->HandleHostEvents(sink_, request_.request.events(),
                               request_.bulk);
    if (*end != 0) ring_->Release(*end);
    return true;
  }

  // False once the stream ends (as on gRPC, an unparseable message ends it).
  bool NamespaceMessage(absl::string_view payload) {
    ns_request_.Clear();
    if (!ns_request_.ParseFromArray(payload.data(),
                                    static_cast<int>(payload.size()))) {
      namespace_->BadMessage("not a valid protobuf encoding");
      return false;
    }
    const bool opening = namespace_->name().empty();
    if (!namespace_->Handle(ns_request_)) return false;
    // Just opened by a host that asked for a direct stream: Run offers it
    // to the worker before reading on (TryHandOverNamespace).
    if (opening && ns_direct_asked_ && !namespace_->name().empty()) {
      ns_direct_asked_ = false;
      direct_wanted_ = true;
    }
    return true;
  }

  bool Refuse(absl::string_view why) {
    sink_->End(absl::StatusCode::kInvalidArgument, why, false);
    return false;
  }

  // HELLO's agentix-calls-cpu: the latest such host's CPU places the call
  // path (with --calls_cpu auto). A value that is not a CPU the daemon may
  // use is ignored: the host's own pin is its business, not an error.
  void PreferHostCpu(const std::string* value) {
    CallsCpu* const calls_cpu = server_->options_.calls_cpu.get();
    if (value == nullptr || calls_cpu == nullptr) return;
    int cpu = -1;
    if (!absl::SimpleAtoi(*value, &cpu) || !calls_cpu->PreferCpu(cpu)) {
      AGX_LOG(Debug, "ignoring {}: '{}' (not a CPU this daemon may use)",
              kFrameCallsCpuKey, base::TruncateMessage(*value, 32));
    }
  }

  // A host that asked (HELLO's agentix-calls-cpu-follow) is told, once the
  // probe has chosen (--calls_cpu=probe), whether to pin its waits; checked
  // each time this thread wakes until then. A host that asked for changes
  // is told again whenever a re-probe changes the answer, at this thread's
  // next wake-up (its next frame at the latest: the answer matters for its
  // calls only). One atomic load a wake-up.
  void TellHostPlacement(CallsCpu* calls_cpu) {
    const CallsCpu::HostWaits waits = calls_cpu->host_waits();
    if (waits == CallsCpu::HostWaits::kUnknown || waits == CallsCpu::HostWaits::kNone ||
        waits == told_) {
      return;
    }
    if (follow_ == Follow::kFirst) follow_ = Follow::kNone;
    told_ = waits;
    if (waits == CallsCpu::HostWaits::kPin && !follow_cpu_.empty()) {
      PreferHostCpu(&follow_cpu_);
    }
    std::deque<OutPiece> told;
    told.emplace_back(
        EncodeFrame(FrameKind::kHello,
                    EncodeHello({{kFrameCallsCpuKey,
                                  waits == CallsCpu::HostWaits::kOff ? "off" : "wait"}})),
        /*frame_end=*/true);
    sink_->WritePieces(std::move(told));
  }

  // A host that follows the probe's answer and was not told to pin yet:
  // its CPU places the call path once the hosts are (CallsCpu), since this
  // thread, which would apply it when it tells the host, ends at a
  // hand-over. Harmless if the connection stays relayed: the same CPU.
  void LeaveFollowedCpu() {
    CallsCpu* const calls_cpu = server_->options_.calls_cpu.get();
    int cpu = -1;
    if (calls_cpu == nullptr || follow_ == Follow::kNone ||
        told_ == CallsCpu::HostWaits::kPin ||
        !absl::SimpleAtoi(follow_cpu_, &cpu)) {
      return;
    }
    (void)calls_cpu->PreferCpuOncePinned(cpu);
  }

  bool Hello(absl::string_view payload) {
    absl::StatusOr<FrameMetadata> metadata = DecodeHello(payload);
    if (!metadata.ok()) return Refuse(metadata.status().message());
    // Which RuntimeService stream the connection carries; absent: Calls.
    const std::string* stream = FindMetadata(*metadata, kFrameStreamKey);
    const bool calls = stream == nullptr || *stream == kFrameStreamCalls;
    const bool wants_ring =
        FindMetadata(*metadata, kFramePayloadRingKey) != nullptr;
    if (stray_fds_ || (ring_fd_ >= 0 && !wants_ring)) {
      return Refuse(absl::StrCat("file descriptors came with HELLO, which "
                                 "takes only one, with ",
                                 kFramePayloadRingKey));
    }
    if (!calls && *stream != kFrameStreamNamespace) {
      sink_->End(absl::StatusCode::kUnimplemented,
                 absl::StrCat("the frame wire carries no stream named '",
                              base::TruncateMessage(*stream, 64),
                              "' (", kFrameStreamKey, " is '",
                              kFrameStreamCalls, "' or '",
                              kFrameStreamNamespace, "')"),
                 false);
      return false;
    }
    if (const auto& gate = server_->options_.gate) {
      const std::string* authorization =
          FindMetadata(*metadata, kAuthorizationKey);
      absl::string_view presented;
      if (authorization != nullptr) presented = *authorization;
      const TokenGate::Verdict verdict =
          gate->Check(calls ? kCallsMethod : kNamespaceMethod,
                      authorization != nullptr ? &presented : nullptr);
      if (verdict.code != absl::StatusCode::kOk) {
        sink_->End(verdict.code, verdict.message, false);
        return false;
      }
    }
    const std::string* direct_key = FindMetadata(*metadata, kFrameDirectKey);
    const bool direct_key_set = server_->options_.direct != nullptr &&
                                direct_key != nullptr && *direct_key == "1";
    const bool direct_asked = calls && direct_key_set;
    // The key without a memfd: the host reaches us through a relay that
    // passes bytes only. It gets no ring (no answer: it sends everything
    // inline, as to a daemon that does not know the key).
    if (wants_ring && ring_fd_ >= 0) {
      if (!calls) return Refuse("a payload ring is for the Calls stream only");
      absl::StatusOr<std::unique_ptr<ipc::PayloadArea>> ring =
          ipc::PayloadArea::MapSealed(ring_fd_);
      // Kept for a hand-over: the worker maps the host's ring itself.
      if (direct_asked) direct_ring_fd_.Reset(::fcntl(ring_fd_, F_DUPFD_CLOEXEC, 0));
      ::close(ring_fd_);  // the mapping stays
      ring_fd_ = -1;
      if (!ring.ok()) return Refuse(ring.status().message());
      ring_ = std::move(*ring);
      sink_->SetRing(ring_);
      // Tells the host the ring is in use (an older daemon never says so).
      std::deque<OutPiece> accepted;
      accepted.emplace_back(
          EncodeFrame(FrameKind::kRingMessage, EncodeRingHead({})),
          /*frame_end=*/true);
      sink_->WritePieces(std::move(accepted));
    }
    // The connection read last on this thread is this one (recvmsg).
    MarkCurrentConnectionAuthenticated();
    if (!calls) {
      sink_->CountIn(std::make_shared<std::atomic<int64_t>>(0));
      namespace_ = std::make_unique<NamespaceStream>(
          manager_, std::make_shared<FrameNamespaceSink>(sink_));
      // Stage 8: decided once `open` names the namespace (TryHandOverNamespace).
      if (direct_key_set) {
        ns_direct_asked_ = true;
        namespace_->AskedForDirect();
      }
      if (server_->options_.activity != nullptr) {
        server_->options_.activity->Opened();
      }
      hello_done_ = true;
      return true;
    }
    const std::string* follow = FindMetadata(*metadata, kFrameCallsCpuFollowKey);
    if (follow != nullptr && server_->options_.calls_cpu != nullptr &&
        server_->options_.calls_cpu->host_waits() != CallsCpu::HostWaits::kNone) {
      // Any other value is stop 31's: the first answer only.
      follow_ = *follow == kFrameCallsCpuFollowChanges ? Follow::kChanges : Follow::kFirst;
    }
    const std::string* host_cpu = FindMetadata(*metadata, kFrameCallsCpuKey);
    if (follow_ != Follow::kNone) {
      // Its CPU places the call path only if it is told to keep pinning
      // there: a host told not to pin runs anywhere.
      if (host_cpu != nullptr) follow_cpu_ = *host_cpu;
      TellHostPlacement(server_->options_.calls_cpu.get());
    } else {
      PreferHostCpu(host_cpu);
    }
    const std::string* client = FindMetadata(*metadata, "agentix-client-id");
    if (client != nullptr && client->size() <= kMaxCallIdBytes) {
      sink_->SetClientId(*client);
    }
    manager_->RegisterSink(sink_);
    if (server_->options_.activity != nullptr) {
      server_->options_.activity->Opened();
    }
    hello_done_ = true;
    // A ring whose memfd could not be kept cannot go with the socket.
    direct_wanted_ = direct_asked && (ring_ == nullptr || direct_ring_fd_.valid());
    return direct_wanted_ || CollapseHeldSession();
  }

  // A Calls connection served relayed while the worker holds its client's
  // direct session waits until that session is the daemon's (the
  // collapse, docs/DIRECT-CALLS.md): its ResumeCalls then replays as
  // always. False (the stream ended with UNAVAILABLE; the host reconnects)
  // when the worker did not hand it back in time.
  bool CollapseHeldSession() {
    if (server_->options_.direct == nullptr) return true;
    const absl::Status collapsed = manager_->CollapseDirect(
        sink_->client_id(), manager_->options().direct_collapse_timeout);
    if (collapsed.ok()) return true;
    sink_->End(absl::StatusCode::kUnavailable, collapsed.message(), false);
    return false;
  }

  // Direct calls (docs/DIRECT-CALLS.md): hands this Calls connection, the
  // host's ring memfd and the bytes read past HELLO to the worker when the
  // connection is eligible, waiting for a booting worker's `ready`; then
  // the daemon's descriptors are closed and the thread ends. False: the
  // connection stays relayed for its whole life.
  bool TryHandOver() {
    direct_wanted_ = false;
    LeaveFollowedCpu();
    DirectConnections* const direct = server_->options_.direct.get();
    const SessionOptions& session = manager_->options();
    // Rule 3 (the daemon's queue must see every call) and rule 5 (the
    // payload area holds the direct session's ledger).
    if (session.max_concurrent_calls != 0 ||
        session.worker.payload_ring_bytes == 0) {
      return false;
    }
    // HELLO's answers (the ring's acceptance, calls-CPU) precede whatever
    // the worker writes.
    const FrameSink::State state = sink_->Get();
    if (state.ending || state.broken || state.unwritten != 0) return false;
    const absl::Time give_up =
        absl::Now() + session.worker.ready_timeout + absl::Seconds(1);
    uint64_t conn = 0;
    const bool handed = OfferToWorker(give_up, [&] {
      return manager_->HandOverDirect(
          sink_->client_id(), [&](WorkerProcess& worker) {
            return SendToWorker(worker, *direct, conn);
          });
    });
    if (handed) ReleaseHandedOver(*direct, conn);
    return handed;
  }

  // Makes `offer` (one try of SessionManager::HandOverDirect or
  // HandOverNamespace) until the connection is handed over (true) or it
  // is not eligible, the worker cannot be started, the daemon stops or
  // `give_up` passes (false: it stays relayed). A missing worker is started
  // once, as the first call would start it; a worker that then fails its
  // boot leaves the connection relayed (its calls get WorkerBootError
  // there). Between tries the host's pipelined frames wait in the socket.
  bool OfferToWorker(
      absl::Time give_up,
      absl::FunctionRef<SessionManager::DirectHandOver()> offer) {
    bool started = false;
    for (;;) {
      switch (offer()) {
        case SessionManager::DirectHandOver::kHandedOver:
          return true;
        case SessionManager::DirectHandOver::kNotEligible:
          return false;
        case SessionManager::DirectHandOver::kNoWorker:
          if (started || !manager_->StartWorker().ok()) return false;
          started = true;
          break;
        case SessionManager::DirectHandOver::kBooting:
          break;
      }
      if (server_->stopping_.load(std::memory_order_acquire) ||
          absl::Now() >= give_up) {
        return false;
      }
      pollfd wake{wake_fd_, POLLIN, 0};
      if (::poll(&wake, 1, 5) > 0) DrainWake(wake_fd_);
    }
  }

  // Direct Namespace streams (docs/DIRECT-CALLS.md stage 8): after `open`,
  // hands the connection and the bytes read past `open` to the worker when
  // the name has no other stream and the worker can take it, waiting for a
  // booting worker's `ready`; the hub slot stays counted until the
  // worker's direct_closed. False: the stream stays relayed (the worker is
  // told of the host now).
  bool TryHandOverNamespace() {
    direct_wanted_ = false;
    const std::string name = namespace_->name();
    NamespaceHub& hub = manager_->namespaces();
    DirectConnections* const direct = server_->options_.direct.get();
    // Nothing of the daemon's may follow the worker's `opened`.
    const FrameSink::State state = sink_->Get();
    if (state.ending || state.broken || state.unwritten != 0) {
      namespace_->ServeRelayed();
      return false;
    }
    // The name's previous direct stream (this host's, before a reconnect
    // or its worker's death) is about to be reported closed: wait a little.
    const absl::Time claim_until = absl::Now() + kNamespaceClaimWait;
    while (!hub.ClaimDirect(name, namespace_->subscriber())) {
      if (!hub.OthersAreDirect(name, namespace_->subscriber()) ||
          absl::Now() >= claim_until) {
        AGX_LOG(Debug, "namespace {}: another stream has it open; served "
                "relayed", name);
        namespace_->ServeRelayed();
        return false;
      }
      pollfd wake{wake_fd_, POLLIN, 0};
      if (::poll(&wake, 1, 5) > 0) DrainWake(wake_fd_);
    }
    // The host waits for `opened` (its OPEN_TIMEOUT is 10 s): a worker not
    // ready within this leaves the stream relayed, answered at once.
    uint64_t conn = 0;
    const bool handed =
        OfferToWorker(absl::Now() + kNamespaceHandOverWait, [&] {
          return manager_->HandOverNamespace(
              name, [&](WorkerProcess& worker) {
                return SendNamespaceToWorker(worker, *direct, name, conn);
              });
        });
    if (handed) {
      ReleaseNamespaceHandedOver(*direct, conn);
      AGX_LOG(Debug, "namespace {} handed to the worker as direct "
              "connection {}", name, conn);
      return true;
    }
    AGX_LOG(Debug, "namespace {}: the worker cannot take it; served relayed",
            name);
    hub.UnclaimDirect(namespace_->subscriber());
    namespace_->ServeRelayed();
    return false;
  }

  // Under the session manager's lock: queues a Namespace stream's
  // direct_conn frame and socket for `worker`; false if it cannot.
  bool SendNamespaceToWorker(WorkerProcess& worker, DirectConnections& direct,
                             const std::string& name, uint64_t& conn) {
    if (!worker.direct_capable()) return false;
    std::optional<uint64_t> reserved =
        direct.Reserve(worker.generation(), {}, /*calls=*/false);
    if (!reserved) return false;
    conn = *reserved;
    const SessionOptions& session = manager_->options();
    ipc::Frame frame;
    frame.type = ipc::FrameType::kDirectConn;
    ipc::DirectConnInfo& info = frame.direct_conn;
    info.conn = conn;
    info.ns_name = name;
    info.instance_id = manager_->logs().instance_id();
    info.max_retained_bytes = session.max_retained_bytes;
    return SendDirectConn(worker, direct, frame);
  }

  // After a Namespace stream's hand-over: the daemon keeps its hub slot
  // (the cap) and its count until the worker reports the stream closed or
  // exits.
  void ReleaseNamespaceHandedOver(DirectConnections& direct, uint64_t conn) {
    read_.Clear();  // sent as `pre`
    std::shared_ptr<NamespaceSubscriber> slot = namespace_->Release();
    // The slot delivers nothing from now on: events broadcast since the
    // subscription are dropped with it (the worker sent them before it
    // took the stream, i.e. before the sandbox was told of this host).
    sink_->Close();
    const bool guard_counted = HandOverConnection(fd_);
    ::close(fd_);
    ::close(wake_fd_);
    NamespaceHub* const hub = &manager_->namespaces();
    direct.Commit(conn, guard_counted,
                  [hub, slot] { hub->Unsubscribe(slot.get()); });
  }

  // Under the session manager's lock: queues the direct_conn frame and the
  // descriptors for `worker`; false (nothing sent) if it cannot take them.
  bool SendToWorker(WorkerProcess& worker, DirectConnections& direct,
                    uint64_t& conn) {
    if (!worker.direct_capable() || worker.payloads() == nullptr) return false;
    // Rule 5: the client's calls are written in the worker's ledger.
    absl::StatusOr<uint32_t> client_slot =
        worker.LedgerClientSlot(sink_->client_id());
    if (!client_slot.ok()) {
      AGX_LOG(Debug, "serving a connection relayed: {}",
              client_slot.status().ToString());
      return false;
    }
    std::optional<uint64_t> reserved =
        direct.Reserve(worker.generation(), sink_->client_id());
    if (!reserved) {
      AGX_LOG(Debug, "direct connections at their cap: serving one relayed");
      return false;
    }
    conn = *reserved;
    // Its calls' log records and trace events come tagged with `conn`.
    manager_->direct_side_channels().NameClient(worker.generation(), conn,
                                                sink_->client_id());
    const SessionOptions& session = manager_->options();
    ipc::Frame frame;
    frame.type = ipc::FrameType::kDirectConn;
    ipc::DirectConnInfo& info = frame.direct_conn;
    info.conn = conn;
    info.client = sink_->client_id();
    info.client_slot = *client_slot;
    info.ring = direct_ring_fd_.valid();
    info.follow = follow_ == Follow::kChanges ? 2 : follow_ == Follow::kFirst ? 1 : 0;
    info.max_payload = session.max_payload_bytes;
    info.upload_idle_ms = static_cast<uint64_t>(
        absl::ToInt64Milliseconds(session.upload_idle_timeout));
    info.max_retained = session.max_retained_results;
    info.max_retained_bytes = session.max_retained_bytes;
    info.max_stream_window = session.max_stream_window;
    return SendDirectConn(worker, direct, frame);
  }

  // Queues `frame`, a direct_conn with its reservation in
  // frame.direct_conn.conn, for `worker` with a duplicate of this
  // connection's socket (and the payload ring when info.ring): the bytes read
  // past the HELLO travel as its data, and the stalled-host bound with it.
  // False, the reservation cancelled, if the socket or the frame fails.
  bool SendDirectConn(WorkerProcess& worker, DirectConnections& direct,
                      ipc::Frame& frame) {
    ipc::DirectConnInfo& info = frame.direct_conn;
    info.stalled_ms = static_cast<uint64_t>(absl::ToInt64Milliseconds(
        manager_->options().stalled_host_timeout));
    frame.data = std::string(read_.buffered());
    std::string bytes;
    std::vector<base::UniqueFd> fds;
    fds.emplace_back(::fcntl(fd_, F_DUPFD_CLOEXEC, 0));
    if (!fds.back().valid() || !ipc::AppendFrame(frame, bytes).ok()) {
      direct.Cancel(info.conn);
      return false;
    }
    if (info.ring) fds.push_back(std::move(direct_ring_fd_));
    worker.SendWithDescriptors(std::move(bytes), std::move(fds));
    return true;
  }

  // After the hand-over: the daemon forgets the connection but for its
  // count (DirectConnections, the connection guard's HandOverConnection).
  void ReleaseHandedOver(DirectConnections& direct, uint64_t conn) {
    read_.Clear();  // sent as `pre`
    sink_->Close();
    manager_->DetachSink(sink_.get());
    ring_.reset();
    const bool guard_counted = HandOverConnection(fd_);
    ::close(fd_);
    ::close(wake_fd_);
    direct.Commit(conn, guard_counted);
  }

  void Finish() {
    sink_->Close();
    ring_.reset();
    if (ring_fd_ >= 0) ::close(ring_fd_);
    ring_fd_ = -1;
    if (namespace_ != nullptr) namespace_->Close();
    if (hello_done_) {
      if (namespace_ == nullptr) manager_->DetachSink(sink_.get());
      manager_->ReleaseMemorySoon();
      if (server_->options_.activity != nullptr) {
        server_->options_.activity->Closed();
      }
    }
    ::close(fd_);
    ::close(wake_fd_);
  }

  FrameWireServer* const server_;
  SessionManager* const manager_;
  const int fd_;
  const int wake_fd_;
  const std::shared_ptr<FrameSink> sink_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  // Only the connection's thread touches these.
  FrameReadBuffer read_;
  bool hello_done_ = false;
  // The host asked to be told the probe's choice: its first, or every change.
  enum class Follow { kNone, kFirst, kChanges };
  Follow follow_ = Follow::kNone;
  CallsCpu::HostWaits told_ = CallsCpu::HostWaits::kUnknown;  // the latest answer
  std::string follow_cpu_;  // and its agentix-calls-cpu, applied when told to pin
  bool half_closed_ = false;
  absl::Time end_deadline_ = absl::InfiniteFuture();
  absl::Duration spin_window_ = server_->options_.spin;
  SplicedRequest request_;
  // The host's payload ring (HELLO's agentix-payload-ring): its memfd until
  // HELLO maps it; the mapping, shared with the sink, which puts results.
  int ring_fd_ = -1;
  bool stray_fds_ = false;
  std::shared_ptr<ipc::PayloadArea> ring_;
  std::vector<RingPiece> ring_pieces_;
  // HELLO asked for direct calls and the server allows them: Run offers
  // the connection to the worker once HELLO is handled (TryHandOver).
  bool direct_wanted_ = false;
  // The ring's memfd, kept (HELLO closes its own) for the hand-over.
  base::UniqueFd direct_ring_fd_;
  // Set by a HELLO naming the Namespace stream.
  std::unique_ptr<NamespaceStream> namespace_;
  // Its HELLO asked for a direct stream, not yet decided (stage 8).
  bool ns_direct_asked_ = false;
  runtime::v1::NamespaceRequest ns_request_;
};

FrameWireServer::FrameWireServer(SessionManager* manager,
                                 FrameWireOptions options)
    : manager_(manager), options_(std::move(options)) {}

FrameWireServer::~FrameWireServer() { Stop(); }

absl::Status FrameWireServer::Start() {
  sockaddr_un addr{};
  if (options_.path.empty() || options_.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame-wire socket path ", options_.path, " is empty or longer than ",
        sizeof(addr.sun_path) - 1, " bytes"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options_.path.data(), options_.path.size());
  // Non-blocking: the connection guard's accept4 takes the next pending
  // connection when it refuses one, which must not block Stop.
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (listen_fd_ < 0 || stop_fd_ < 0) {
    return absl::InternalError(
        absl::StrCat("frame-wire socket: ", std::strerror(errno)));
  }
  ::unlink(options_.path.c_str());  // a stale socket from a previous run
  // Owner-only, as the gRPC socket: whoever can connect can run code.
  const mode_t old_umask = ::umask(0177);
  const int bound =
      ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (bound != 0 || ::listen(listen_fd_, 128) != 0) {
    return absl::InternalError(absl::StrCat(
        "frame-wire socket ", options_.path, ": ",
        std::strerror(bound != 0 ? bind_errno : errno)));
  }
  acceptor_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "agx-frames-acc");
    AcceptLoop();
  });
  return absl::OkStatus();
}

void FrameWireServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, -1);
    if (ready < 0 && errno != EINTR) return;
    if (stopping_.load(std::memory_order_acquire)) return;
    if (ready <= 0 || !(fds[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        absl::SleepFor(absl::Milliseconds(10));  // do not spin
      }
      continue;
    }
    absl::MutexLock lock(&mu_);
    Reap();
    if (stopped_ || connections_.size() >= options_.max_connections) {
      const std::string status = EncodeFrame(
          FrameKind::kStatus,
          EncodeStatus(stopped_ ? absl::StatusCode::kUnavailable
                                : absl::StatusCode::kResourceExhausted,
                       stopped_ ? "the sandbox daemon is shutting down"
                                : absl::StrCat("too many frame-wire "
                                               "connections (at most ",
                                               options_.max_connections,
                                               "); use gRPC or retry")));
      (void)::send(fd, status.data(), status.size(),
                   MSG_DONTWAIT | MSG_NOSIGNAL);
      ::close(fd);
      continue;
    }
    auto connection = std::make_unique<Connection>(this, fd);
    if (!connection->ok()) {
      ::close(fd);
      continue;
    }
    connection->Start();
    connections_.push_back(std::move(connection));
  }
}

void FrameWireServer::Reap() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->done()) {
      (*it)->Join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t FrameWireServer::connections() {
  absl::MutexLock lock(&mu_);
  Reap();
  return connections_.size();
}

void FrameWireServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_.store(true, std::memory_order_release);
  if (stop_fd_ >= 0) Wake(stop_fd_);
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(options_.path.c_str());
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
  listen_fd_ = stop_fd_ = -1;
  std::list<std::unique_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (auto& connection : connections) connection->Wake();
  for (auto& connection : connections) connection->Join();
}

}  // namespace agentix::sandbox
