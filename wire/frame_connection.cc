#include "wire/frame_connection.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"

namespace agentix::sandbox {
namespace {

// iovecs per sendmsg.
constexpr size_t kMaxIov = 64;
// How long a read buffer grown for large frames is kept once empty.
constexpr absl::Duration kKeepReadBufferFor = absl::Milliseconds(100);
// AwaitRoom looks at the stalled bound at least this often.
constexpr absl::Duration kAwaitSlice = absl::Milliseconds(100);

int PollTimeoutMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(absl::ToInt64Milliseconds(
      absl::Ceil(std::min(left, kAwaitSlice), absl::Milliseconds(1))));
}

// The BadRequest a MESSAGE protobuf refuses gets, as on gRPC (the daemon's
// MakeCallError("", "BadRequest", …)); the stream goes on.
SandboxEventPtr UnparseableMessageError() {
  auto event = std::make_shared<runtime::v1::SandboxEvent>();
  runtime::v1::RemoteError* error = event->mutable_error()->mutable_error();
  error->set_type("BadRequest");
  error->set_message(
      "unparseable CallsRequest message (not a valid protobuf encoding); it "
      "was ignored");
  error->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
  return event;
}

void WriteStatusBestEffort(int fd, absl::StatusCode code,
                           absl::string_view message) {
  const std::string status =
      EncodeFrame(FrameKind::kStatus, EncodeStatus(code, message));
  (void)::send(fd, status.data(), status.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

absl::StatusOr<std::unique_ptr<FrameConnection>> FrameConnection::Create(
    int fd, std::string pre, int ring_fd, FrameConnectionConsumer* consumer,
    FrameConnectionOptions options) {
  auto fail = [&](absl::string_view why) {
    if (ring_fd >= 0) ::close(ring_fd);
    if (fd >= 0) ::close(fd);
    return absl::InvalidArgumentError(why);
  };
  if (fd < 0) return fail("no socket");
  if (consumer == nullptr) return fail("no consumer");
  if (options.max_message_bytes > kMaxFrameMessageBytes) {
    return fail(absl::StrCat("max_message_bytes ", options.max_message_bytes,
                             " is over the frame wire's ",
                             kMaxFrameMessageBytes));
  }
  std::unique_ptr<ipc::PayloadArea> ring;
  if (ring_fd >= 0) {
    absl::StatusOr<std::unique_ptr<ipc::PayloadArea>> mapped =
        ipc::PayloadArea::MapSealed(ring_fd);
    ::close(ring_fd);  // the mapping stays
    ring_fd = -1;
    if (!mapped.ok()) {
      WriteStatusBestEffort(fd, absl::StatusCode::kInvalidArgument,
                            mapped.status().message());
      return fail(mapped.status().message());
    }
    ring = std::move(*mapped);
  }
  return std::unique_ptr<FrameConnection>(new FrameConnection(
      fd, std::move(pre), std::move(ring), consumer, std::move(options)));
}

FrameConnection::FrameConnection(int fd, std::string pre,
                                 std::unique_ptr<ipc::PayloadArea> ring,
                                 FrameConnectionConsumer* consumer,
                                 FrameConnectionOptions options)
    : fd_(fd),
      consumer_(consumer),
      options_(std::move(options)),
      ring_(std::move(ring)),
      read_(pre) {}

FrameConnection::~FrameConnection() {
  {
    absl::MutexLock lock(&mu_);
    queue_.Drop(false);
  }
  ::close(fd_);
}

// ---- read side (the poll thread) ----

void FrameConnection::Start() {
  ProcessFrames();
  ReportEndIfDone();
}

short FrameConnection::PollEvents() {
  if (end_reported_) return 0;
  bool writable_wanted;
  size_t unwritten;
  {
    absl::MutexLock lock(&mu_);
    unwritten = queue_.bytes();
    writable_wanted = !queue_.empty() && !broken_;
  }
  UpdatePause(unwritten);
  short events = writable_wanted ? POLLOUT : 0;
  if (!eof_ && !paused_) events |= POLLIN;
  return events;
}

absl::Time FrameConnection::NextDeadline() {
  if (end_reported_) return absl::InfiniteFuture();
  absl::Time deadline = shrink_read_buffer_at_;
  size_t unwritten;
  {
    absl::MutexLock lock(&mu_);
    unwritten = queue_.bytes();
    // OnEnd is due.
    if (eof_ || broken_ || (ending_ && queue_.empty())) {
      return absl::InfinitePast();
    }
    if (ending_) {
      deadline = std::min(deadline, end_deadline_);
    } else if (unwritten > options_.max_unwritten_bytes) {
      deadline = std::min(deadline,
                          stalled_since_ + options_.stalled_host_timeout);
    }
  }
  UpdatePause(unwritten);
  return resume_frames_ ? absl::InfinitePast() : deadline;
}

void FrameConnection::ReadReady() {
  if (end_reported_) return;
  if (!eof_) {
    if (closing_.load(std::memory_order_acquire)) {
      // Ending: what arrives is discarded, only EOF matters.
      read_.Clear();
      if (!ReadSome()) eof_ = true;
      read_.Clear();
    } else if (!ReadSome()) {
      eof_ = true;
    } else if (stray_fds_) {
      Refuse("a file descriptor came on the Calls connection (a host sends "
             "none after HELLO)");
    } else {
      ProcessFrames();
    }
  }
  ReportEndIfDone();
}

void FrameConnection::WriteReady() {
  if (end_reported_) return;
  {
    absl::MutexLock lock(&mu_);
    FlushLocked();
    CheckStalledLocked(absl::Now());
  }
  UpdatePause(UnwrittenBytes());
  if (resume_frames_) ProcessFrames();
  ReportEndIfDone();
}

void FrameConnection::OnDeadline() {
  if (end_reported_) return;
  const absl::Time now = absl::Now();
  UpdatePause(UnwrittenBytes());
  if (resume_frames_) ProcessFrames();
  {
    absl::MutexLock lock(&mu_);
    CheckStalledLocked(now);
  }
  if (now >= shrink_read_buffer_at_ && read_.idle_and_large()) read_.Shrink();
  if (!read_.idle_and_large()) shrink_read_buffer_at_ = absl::InfiniteFuture();
  ReportEndIfDone();
}

void FrameConnection::UpdatePause(size_t unwritten) {
  if (paused_ && unwritten < options_.pause_reads_above_bytes / 4) {
    paused_ = false;
    resume_frames_ = !read_.empty();
  } else if (!paused_ && unwritten > options_.pause_reads_above_bytes) {
    paused_ = true;
  }
}

bool FrameConnection::ReadSome() {
  // A host sends no descriptor after HELLO: any that comes is closed and
  // refused.
  const FrameReadBuffer::ReadOutcome outcome =
      read_.Read(fd_, options_.max_message_bytes, [this](int fd) {
        ::close(fd);
        stray_fds_ = true;
      });
  if (outcome.descriptors_truncated) stray_fds_ = true;
  return outcome.open;
}

void FrameConnection::ProcessFrames() {
  resume_frames_ = false;
  while (!paused_ && !closing_.load(std::memory_order_acquire)) {
    absl::StatusOr<FrameView> frame = ParseFrame(read_.buffered());
    if (!frame.ok()) {
      Refuse(frame.status().message());
      return;
    }
    if (frame->frame_bytes == 0) break;
    const size_t consumed = frame->frame_bytes;
    if (frame->payload.size() > options_.max_message_bytes) {
      Refuse(absl::StrCat("frame of kind ", static_cast<int>(frame->kind),
                          " carries ", frame->payload.size(),
                          " bytes; at most ", options_.max_message_bytes,
                          " are allowed"));
      return;
    }
    const bool go_on = HandleFrame(*frame);
    read_.Consume(consumed);
    if (!go_on) return;
    if (UnwrittenBytes() > options_.pause_reads_above_bytes) paused_ = true;
  }
  shrink_read_buffer_at_ = read_.idle_and_large()
                               ? absl::Now() + kKeepReadBufferFor
                               : absl::InfiniteFuture();
}

bool FrameConnection::HandleFrame(const FrameView& frame) {
  if (half_closed_) return Refuse("a frame after HALF_CLOSE");
  switch (frame.kind) {
    case FrameKind::kMessage:
      if (options_.raw_messages) {
        consumer_->OnMessage(frame.payload);
        return true;
      }
      // Large argument bytes stay in the read buffer (frame_splice.h).
      if (!ParseCallsRequestSpliced(frame.payload, request_)) {
        (void)Send({UnparseableMessageError()});
        return true;
      }
      consumer_->OnRequest(request_);
      return true;
    case FrameKind::kRingMessage:
      return HandleRingMessage(frame.payload);
    case FrameKind::kHalfClose:
      half_closed_ = true;
      consumer_->OnHalfClose();
      return true;
    case FrameKind::kHello:
      return Refuse("a second HELLO frame");
    default:
      return Refuse(absl::StrCat("a host may not send frames of kind ",
                                 static_cast<int>(frame.kind)));
  }
}

bool FrameConnection::HandleRingMessage(absl::string_view payload) {
  if (ring_ == nullptr) {
    return Refuse(absl::StrCat(
        "RING_MESSAGE on a connection without a payload ring (HELLO had no ",
        kFramePayloadRingKey, ")"));
  }
  absl::StatusOr<uint64_t> end = ParseRingMessage(
      payload, options_.max_message_bytes, *ring_, ring_pieces_, request_);
  if (!end.ok()) return Refuse(end.status().message());
  consumer_->OnRequest(request_);  // copies what it keeps of the pieces
  ring_pieces_.clear();
  if (*end != 0) ring_->Release(*end);
  return true;
}

bool FrameConnection::Refuse(absl::string_view why) {
  Finish(absl::StatusCode::kInvalidArgument, why);
  return false;
}


void FrameConnection::ReportEndIfDone() {
  // Done needs EOF, a broken socket or a STATUS (both set closing_): the
  // common case takes no lock.
  if (end_reported_ || (!eof_ && !closing_.load(std::memory_order_acquire))) {
    return;
  }
  absl::Status why;
  {
    absl::MutexLock lock(&mu_);
    const bool status_out = ending_ && (queue_.empty() ||
                                        absl::Now() >= end_deadline_);
    if (!eof_ && !broken_ && !status_out) return;
    if (ending_) {
      why = status_;
    } else {
      why = absl::UnavailableError(
          eof_ ? "the host closed the connection without a STATUS"
               : "writing to the host failed");
    }
    done_ = true;
    queue_.Drop(false);
  }
  end_reported_ = true;
  // The host sees EOF now; the descriptor is closed with the connection
  // (so a writer thread still holding it never writes to another's).
  ::shutdown(fd_, SHUT_RDWR);
  consumer_->OnEnd(std::move(why));
}

// ---- write side ----

absl::StatusOr<FrameConnection::Backlog> FrameConnection::Send(
    const std::vector<SandboxEventPtr>& events) {
  // Serialized, and bulk bytes put into the host's ring, outside mu_ (the
  // poll thread takes it for every frame it reads). Ring pieces must be
  // queued in the order they were put: ring_mu_ keeps two senders apart.
  std::deque<OutPiece> pieces;
  if (ring_ != nullptr && HasBulk(events)) {
    absl::MutexLock ring_lock(&ring_mu_);
    AppendMessagePieces(events, pieces, ring_.get());
    absl::MutexLock lock(&mu_);
    return QueueLocked(std::move(pieces));
  }
  if (!events.empty()) AppendMessagePieces(events, pieces);
  absl::MutexLock lock(&mu_);
  return QueueLocked(std::move(pieces));
}

absl::StatusOr<FrameConnection::Backlog> FrameConnection::SendMessages(
    const std::vector<std::string>& messages) {
  std::deque<OutPiece> pieces;
  for (const std::string& message : messages) {
    pieces.emplace_back(EncodeFrame(FrameKind::kMessage, message),
                        /*frame_end=*/true);
  }
  absl::MutexLock lock(&mu_);
  return QueueLocked(std::move(pieces));
}

absl::StatusOr<FrameConnection::Backlog> FrameConnection::SendCallsCpuAnswer(
    absl::string_view value) {
  std::deque<OutPiece> pieces;
  pieces.emplace_back(
      EncodeFrame(FrameKind::kHello,
                  EncodeHello({{kFrameCallsCpuKey, std::string(value)}})),
      /*frame_end=*/true);
  absl::MutexLock lock(&mu_);
  return QueueLocked(std::move(pieces));
}

void FrameConnection::Finish(absl::StatusCode code, absl::string_view message,
                             bool drop_queued) {
  absl::MutexLock lock(&mu_);
  FinishLocked(code, message, drop_queued);
}

absl::Status FrameConnection::AwaitRoom() {
  for (;;) {
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      if (ending_ && status_.code() == absl::StatusCode::kResourceExhausted) {
        return status_;
      }
      if (ending_ || broken_ || done_) {
        return absl::FailedPreconditionError("the connection has ended");
      }
      FlushLocked();
      if (broken_) continue;
      if (queue_.bytes() <= options_.max_unwritten_bytes) {
        return absl::OkStatus();
      }
      if (CheckStalledLocked(absl::Now())) continue;
      deadline = stalled_since_ + options_.stalled_host_timeout;
    }
    pollfd writable{fd_, POLLOUT, 0};
    (void)::poll(&writable, 1, PollTimeoutMs(deadline));
  }
}

size_t FrameConnection::UnwrittenBytes() {
  absl::MutexLock lock(&mu_);
  return queue_.bytes();
}

absl::StatusOr<FrameConnection::Backlog> FrameConnection::QueueLocked(
    std::deque<OutPiece> pieces) {
  if (ending_ || broken_ || done_) {
    return absl::FailedPreconditionError(
        ending_ ? absl::StrCat("the connection is ending (STATUS ",
                               static_cast<int>(status_.code()), ")")
                : std::string("the connection has ended"));
  }
  const bool was_empty = queue_.empty();
  for (OutPiece& piece : pieces) queue_.Push(std::move(piece));
  // Nothing queued before: written now, on this thread. Otherwise the poll
  // thread is waiting for the socket to drain.
  if (was_empty) FlushLocked();
  if (broken_) {
    Wake();
    return absl::FailedPreconditionError("writing to the host failed");
  }
  const absl::Time now = absl::Now();
  if (queue_.bytes() > options_.max_unwritten_bytes &&
      stalled_since_ == absl::InfiniteFuture()) {
    stalled_since_ = now;
    Wake();  // a new deadline
  }
  if (CheckStalledLocked(now)) return status_;
  if (was_empty && !queue_.empty()) Wake();  // POLLOUT
  return BacklogLocked();
}

void FrameConnection::FlushLocked() {
  const size_t before = queue_.bytes();
  while (!queue_.empty() && !broken_) {
    iovec iov[kMaxIov];
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = queue_.Gather(iov, kMaxIov);
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      broken_ = true;  // the host is gone
      closing_.store(true, std::memory_order_release);
      queue_.Drop(false);
      break;
    }
    queue_.Consume(static_cast<size_t>(n));
  }
  const size_t after = queue_.bytes();
  if (after < before) {
    // Progress: the stalled-host timer starts again (if still over).
    stalled_since_ = after > options_.max_unwritten_bytes ? absl::Now()
                                                          : absl::InfiniteFuture();
    // Reads paused for this backlog may go on: the poll thread looks again.
    const size_t resume_below = options_.pause_reads_above_bytes / 4;
    if (before >= resume_below && after < resume_below) Wake();
  }
}

void FrameConnection::FinishLocked(absl::StatusCode code,
                                   absl::string_view message,
                                   bool drop_queued) {
  if (ending_ || broken_ || done_) return;
  if (drop_queued) queue_.Drop(/*keep_partial_frame=*/true);
  ending_ = true;
  closing_.store(true, std::memory_order_release);
  status_ = absl::Status(code, message);
  end_deadline_ = absl::Now() + options_.finish_grace;
  const bool was_empty = queue_.empty();
  queue_.Push(OutPiece(EncodeFrame(FrameKind::kStatus,
                                   EncodeStatus(code, message)),
                       /*frame_end=*/true));
  if (was_empty) FlushLocked();
  Wake();
}

bool FrameConnection::CheckStalledLocked(absl::Time now) {
  if (ending_ || broken_ || done_ ||
      queue_.bytes() <= options_.max_unwritten_bytes ||
      now - stalled_since_ < options_.stalled_host_timeout) {
    return false;
  }
  const size_t unwritten = queue_.bytes();
  FinishLocked(
      absl::StatusCode::kResourceExhausted,
      absl::StrCat("the host did not read its results (", unwritten,
                   " bytes unwritten) for ",
                   absl::FormatDuration(options_.stalled_host_timeout),
                   " while over the connection's bound of ",
                   options_.max_unwritten_bytes,
                   " unwritten bytes; reconnect and resume the calls"),
      /*drop_queued=*/true);
  return true;
}

FrameConnection::Backlog FrameConnection::BacklogLocked() const {
  if (queue_.empty()) return Backlog::kNone;
  return queue_.bytes() > options_.max_unwritten_bytes ? Backlog::kOverBound
                                                       : Backlog::kQueued;
}

void FrameConnection::Wake() {
  if (options_.wake) options_.wake();
}

}  // namespace agentix::sandbox
