#include "wire/frame_read_buffer.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "wire/frame_codec.h"
#include "worker/ipc/descriptors.h"

namespace agentix::sandbox {

FrameReadBuffer::FrameReadBuffer(absl::string_view pre)
    : data_(new char[std::max(kChunkBytes, pre.size())]),
      capacity_(std::max(kChunkBytes, pre.size())),
      end_(pre.size()) {
  if (!pre.empty()) std::memcpy(data_.get(), pre.data(), pre.size());
}

void FrameReadBuffer::Consume(size_t n) {
  start_ += std::min(n, end_ - start_);
  if (start_ == end_) start_ = end_ = 0;
}

FrameReadBuffer::ReadOutcome FrameReadBuffer::Read(
    int fd, size_t max_message_bytes,
    absl::FunctionRef<void(int)> take_descriptor) {
  if (empty()) start_ = end_ = 0;
  // Room for at least kChunkBytes, or for the whole frame in progress.
  size_t want = kChunkBytes;
  const absl::string_view in = buffered();
  if (in.size() >= kFrameHeaderBytes) {
    const auto* h = reinterpret_cast<const unsigned char*>(in.data());
    const size_t length = size_t{h[0]} | size_t{h[1]} << 8 |
                          size_t{h[2]} << 16 | size_t{h[3]} << 24;
    if (length <= max_message_bytes && kFrameHeaderBytes + length > in.size()) {
      want = std::max(want, kFrameHeaderBytes + length - in.size());
    }
  }
  if (capacity_ - end_ < want && start_ > 0) {
    std::memmove(data_.get(), data_.get() + start_, end_ - start_);
    end_ -= start_;
    start_ = 0;
  }
  if (capacity_ - end_ < want) Resize(end_ + want);
  iovec iov{data_.get() + end_, capacity_ - end_};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for a few descriptors, so that unexpected ones are seen and closed
  // by their taker rather than cut off unseen.
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  // recvmsg (not read): the daemon's connection guard notes the descriptor.
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return {errno == EAGAIN || errno == EWOULDBLOCK, false};
  ReadOutcome outcome{n > 0, (msg.msg_flags & MSG_CTRUNC) != 0};
  ipc::TakeReceivedDescriptors(msg, take_descriptor);
  end_ += static_cast<size_t>(n);
  return outcome;
}

void FrameReadBuffer::Shrink() {
  if (capacity_ > kChunkBytes && end_ - start_ <= kChunkBytes) {
    Resize(kChunkBytes);
  }
}

void FrameReadBuffer::Resize(size_t capacity) {
  std::unique_ptr<char[]> data(new char[capacity]);
  if (end_ > start_) std::memcpy(data.get(), data_.get() + start_, end_ - start_);
  end_ -= start_;
  start_ = 0;
  data_ = std::move(data);
  capacity_ = capacity;
}

}  // namespace agentix::sandbox
