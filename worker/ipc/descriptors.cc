#include "worker/ipc/descriptors.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/ipc/io.h"

namespace agentix::ipc {
namespace {

// Room for more descriptors than any frame carries, so that extra ones are
// seen (and refused) rather than truncated unnoticed.
constexpr size_t kControlDescriptors = kMaxFrameDescriptors + 6;

}  // namespace

void TakeReceivedDescriptors(msghdr& msg,
                             absl::FunctionRef<void(int)> take) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      take(received);
    }
  }
}

absl::Status SendWithDescriptors(int fd, std::string_view frame,
                                 absl::Span<const int> fds) {
  if (frame.empty() || fds.empty() || fds.size() > kMaxFrameDescriptors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a frame carries 1 to ", kMaxFrameDescriptors, " descriptors (got ",
        fds.size(), ", frame of ", frame.size(), " bytes)"));
  }
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFrameDescriptors * sizeof(int))] = {};
  iovec iov{const_cast<char*>(frame.data()), frame.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  while (true) {
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n > 0) {
      // The descriptors went with the first byte; the rest is plain bytes.
      return WriteAll(fd, frame.substr(static_cast<size_t>(n)));
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, -1);
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("frame channel sendmsg failed: ", strerror(errno)));
  }
}

ssize_t DescriptorReader::ReadFrom(int fd, FrameReader& reader,
                                   size_t max_bytes) {
  alignas(cmsghdr) char control[CMSG_SPACE(kControlDescriptors * sizeof(int))];
  msghdr msg{};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = reader.ReceiveFrom(fd, max_bytes, msg, MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  if (msg.msg_flags & MSG_CTRUNC) truncated_ = true;
  Batch batch;
  TakeReceivedDescriptors(
      msg, [&batch](int received) { batch.fds.emplace_back(received); });
  batch.begin = received_;
  received_ += static_cast<uint64_t>(n);
  batch.end = received_;
  if (!batch.fds.empty()) batches_.push_back(std::move(batch));
  return n;
}

absl::StatusOr<std::vector<base::UniqueFd>> DescriptorReader::TakeFor(
    const Frame& frame, const FrameReader& reader) {
  const uint64_t end = received_ - reader.buffered();
  const uint64_t start = end - reader.last_frame_bytes();
  if (truncated_) {
    return Refuse("more descriptors arrived on the link than a read takes");
  }
  // A read that ended before this frame brought descriptors no frame took.
  if (!batches_.empty() && batches_.front().end <= start) {
    return Refuse("descriptors arrived with frames that carry none");
  }
  const size_t want = DescriptorsCarried(frame);
  if (want == 0) return std::vector<base::UniqueFd>();
  // Sent on the frame's first byte: they came with the read holding it.
  if (batches_.empty() || batches_.front().begin > start ||
      batches_.front().end <= start) {
    return Refuse(absl::StrCat("a '", std::string(FrameTypeName(frame.type)),
                               "' frame came without its descriptors"));
  }
  if (batches_.front().fds.size() != want) {
    return Refuse(absl::StrCat("a '", std::string(FrameTypeName(frame.type)),
                               "' frame came with ",
                               batches_.front().fds.size(),
                               " descriptors; it carries ", want));
  }
  std::vector<base::UniqueFd> fds = std::move(batches_.front().fds);
  batches_.pop_front();
  return fds;
}

absl::Status DescriptorReader::Settle(const FrameReader& reader) {
  if (truncated_) {
    return Refuse("more descriptors arrived on the link than a read takes");
  }
  const uint64_t consumed = received_ - reader.buffered();
  if (!batches_.empty() && batches_.front().end <= consumed) {
    return Refuse("descriptors arrived with frames that carry none");
  }
  return absl::OkStatus();
}

size_t DescriptorReader::held() const {
  size_t count = 0;
  for (const Batch& batch : batches_) count += batch.fds.size();
  return count;
}

absl::Status DescriptorReader::Refuse(std::string_view why) {
  batches_.clear();  // closes them
  truncated_ = false;
  return absl::InvalidArgumentError(std::string(why));
}

}  // namespace agentix::ipc
