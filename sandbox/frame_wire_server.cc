#include "sandbox/frame_wire_server.h"

#include <errno.h>
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

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "sandbox/connection_guard.h"
#include "sandbox/frame_codec.h"
#include "sandbox/frame_splice.h"
#include "sandbox/wire_limits.h"

namespace agentix::sandbox {
namespace {

// The method path HELLO's token is checked for: the stream it replaces.
constexpr char kCallsMethod[] = "/agentix.runtime.v1.RuntimeService/Calls";
// As the gRPC Calls stream: past this many unwritten bytes the stream's
// frames are not read (no new calls) until a quarter of it is left.
constexpr size_t kPauseReadsAboveBytes = 64u << 20;
// What one recvmsg asks for at least.
constexpr size_t kReadChunkBytes = 64u << 10;
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
    // (frame_splice.h): no serialized copy of their bytes.
    std::deque<OutPiece> pieces;
    AppendMessagePieces(events, pieces);
    {
      absl::MutexLock lock(&mu_);
      if (closed_ || ending_ || broken_) return false;
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

  // Queues the stream's STATUS frame (after what is queued, or instead of
  // it with `drop_queued`); later deliveries are refused. Once.
  void End(absl::StatusCode code, absl::string_view details,
           bool drop_queued) {
    {
      absl::MutexLock lock(&mu_);
      if (closed_ || ending_ || broken_) return;
      if (drop_queued) DropQueue(/*keep_partial=*/true);
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
  // The connection ends; the descriptors are closed right after.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    DropQueue(false);
  }

 private:
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
  const std::shared_ptr<std::atomic<int64_t>> shared_;
  std::string client_id_;
  absl::Mutex mu_;
  OutQueue queue_ ABSL_GUARDED_BY(mu_);  // whole frames
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;   // unwritten, all frames
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
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
    for (;;) {
      if (server_->stopping_.load(std::memory_order_acquire)) {
        sink_->End(absl::StatusCode::kUnavailable,
                   "the sandbox daemon is shutting down", false);
      }
      FrameSink::State state = sink_->Get();
      if (!state.ending && !state.broken) {
        ProcessFrames(paused);
        state = sink_->Get();
      }
      if (!state.ending && !state.broken && half_closed_ &&
          state.unwritten == 0 && !manager_->HasOpenCalls(sink_.get())) {
        sink_->End(absl::StatusCode::kOk, "", false);
        state = sink_->Get();
      }
      if (!state.ending && !hello_done_ && absl::Now() >= hello_deadline) {
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
      const bool large_idle = ReadBufferIdleAndLarge();
      if (large_idle) {
        deadline = std::min(deadline, absl::Now() + kKeepReadBufferFor);
      }
      const int ready = ::poll(fds, 2, PollTimeoutMs(deadline));
      if (ready < 0 && errno != EINTR) break;
      if (ready == 0 && large_idle && ReadBufferIdleAndLarge()) {
        // No frame came for a while: a large buffer is not kept idle.
        ResizeReadBuffer(kReadChunkBytes);
      }
      if (ready <= 0) continue;
      if (fds[1].revents & POLLIN) DrainWake(wake_fd_);
      if (fds[0].revents & POLLOUT) sink_->Flush();
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (!ReadSome(state.ending)) break;  // EOF or error: the stream is lost
      }
    }
    Finish();
  }

  // Reads what the socket has; false on EOF or an error. While the
  // stream is ending, what arrives is discarded (only EOF matters).
  bool ReadSome(bool discard) {
    if (discard || read_start_ == read_end_) read_start_ = read_end_ = 0;
    // Room for at least kReadChunkBytes, or for the whole frame in progress.
    size_t want = kReadChunkBytes;
    const absl::string_view buffered = Buffered();
    if (buffered.size() >= kFrameHeaderBytes) {
      const auto* h = reinterpret_cast<const unsigned char*>(buffered.data());
      const size_t length = size_t{h[0]} | size_t{h[1]} << 8 |
                            size_t{h[2]} << 16 | size_t{h[3]} << 24;
      // ParseFrame has refused lengths over the limits already.
      if (length <= kMaxFrameMessageBytes &&
          kFrameHeaderBytes + length > buffered.size()) {
        want = std::max(want, kFrameHeaderBytes + length - buffered.size());
      }
    }
    if (read_capacity_ - read_end_ < want && read_start_ > 0) {
      std::memmove(read_buffer_.get(), read_buffer_.get() + read_start_,
                   read_end_ - read_start_);
      read_end_ -= read_start_;
      read_start_ = 0;
    }
    if (read_capacity_ - read_end_ < want) {
      // Not zero-filled (std::string::resize would write every byte of a
      // megabyte frame once more before recvmsg does).
      ResizeReadBuffer(read_end_ + want);
    }
    iovec iov{read_buffer_.get() + read_end_, read_capacity_ - read_end_};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    // recvmsg (not read): the connection guard notes the descriptor, so a
    // good HELLO marks this connection authenticated.
    ssize_t n;
    do {
      n = ::recvmsg(fd_, &msg, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    read_end_ += static_cast<size_t>(n);
    return n > 0;
  }

  absl::string_view Buffered() const {
    return absl::string_view(read_buffer_.get() + read_start_,
                             read_end_ - read_start_);
  }

  // A buffer of `capacity` bytes holding the unparsed bytes, at its start.
  void ResizeReadBuffer(size_t capacity) {
    std::unique_ptr<char[]> buffer(new char[capacity]);
    if (read_end_ > read_start_) {
      std::memcpy(buffer.get(), read_buffer_.get() + read_start_,
                  read_end_ - read_start_);
    }
    read_end_ -= read_start_;
    read_start_ = 0;
    read_buffer_ = std::move(buffer);
    read_capacity_ = capacity;
  }

  // A buffer grown for large frames, now empty: kept while frames keep
  // coming (an upload's next chunk), given back after kKeepReadBufferFor.
  bool ReadBufferIdleAndLarge() const {
    return read_start_ == read_end_ && read_capacity_ > 4 * kReadChunkBytes;
  }

  // Handles every whole frame buffered (until the stream ends or its reads
  // pause for a write backlog).
  void ProcessFrames(bool& paused) {
    while (!paused) {
      absl::StatusOr<FrameView> frame = ParseFrame(Buffered());
      if (!frame.ok()) {
        sink_->End(absl::StatusCode::kInvalidArgument, frame.status().message(),
                   false);
        return;
      }
      if (frame->frame_bytes == 0) break;
      const size_t consumed = frame->frame_bytes;
      const bool go_on = HandleFrame(*frame);
      read_start_ += consumed;
      if (!go_on) return;
      if (sink_->UnwrittenBytes() > kPauseReadsAboveBytes) paused = true;
    }
    if (read_start_ == read_end_) read_start_ = read_end_ = 0;
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
    switch (frame.kind) {
      case FrameKind::kMessage:
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

  bool Refuse(absl::string_view why) {
    sink_->End(absl::StatusCode::kInvalidArgument, why, false);
    return false;
  }

  bool Hello(absl::string_view payload) {
    absl::StatusOr<FrameMetadata> metadata = DecodeHello(payload);
    if (!metadata.ok()) return Refuse(metadata.status().message());
    if (const auto& gate = server_->options_.gate) {
      const std::string* authorization =
          FindMetadata(*metadata, kAuthorizationKey);
      absl::string_view presented;
      if (authorization != nullptr) presented = *authorization;
      const TokenGate::Verdict verdict = gate->Check(
          kCallsMethod, authorization != nullptr ? &presented : nullptr);
      if (verdict.code != absl::StatusCode::kOk) {
        sink_->End(verdict.code, verdict.message, false);
        return false;
      }
    }
    // The connection read last on this thread is this one (recvmsg).
    MarkCurrentConnectionAuthenticated();
    const std::string* client = FindMetadata(*metadata, "agentix-client-id");
    if (client != nullptr && client->size() <= kMaxCallIdBytes) {
      sink_->SetClientId(*client);
    }
    manager_->RegisterSink(sink_);
    if (server_->options_.activity != nullptr) {
      server_->options_.activity->Opened();
    }
    hello_done_ = true;
    return true;
  }

  void Finish() {
    sink_->Close();
    if (hello_done_) {
      manager_->DetachSink(sink_.get());
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
  // Bytes [read_start_, read_end_) are unparsed.
  std::unique_ptr<char[]> read_buffer_{new char[kReadChunkBytes]};
  size_t read_capacity_ = kReadChunkBytes;
  size_t read_start_ = 0;
  size_t read_end_ = 0;
  bool hello_done_ = false;
  bool half_closed_ = false;
  absl::Time end_deadline_ = absl::InfiniteFuture();
  SplicedRequest request_;
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
