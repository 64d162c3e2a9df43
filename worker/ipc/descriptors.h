// File descriptors on the worker link (SCM_RIGHTS): the daemon's
// `direct_conn` frame carries a host's Calls socket, and its payload ring's
// memfd, to the worker (docs/DIRECT-CALLS.md, docs/WORKER-PROTOCOL.md).
// The descriptors ride on the frame's first byte; the receiver matches each
// batch to the frame that starts in the read that brought it, so a frame
// without its descriptors, a batch with the wrong count, or descriptors no
// frame claims are protocol errors, and every descriptor not handed to the
// caller is closed.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/unique_fd.h"
#include "worker/ipc/frame.h"

namespace agentix::ipc {

// Most descriptors one frame carries (DescriptorsCarried).
inline constexpr size_t kMaxFrameDescriptors = 2;

// Writes one whole encoded frame to `fd` with `fds` attached to its first
// byte (sendmsg), the rest as WriteAll does (waiting in poll while a
// non-blocking fd is full). The descriptors stay the caller's (the kernel
// passes duplicates). kInvalidArgument for an empty frame or a count of
// descriptors outside 1..kMaxFrameDescriptors; kUnavailable if the peer is
// gone.
absl::Status SendWithDescriptors(int fd, std::string_view frame,
                                 absl::Span<const int> fds);

// Hands each descriptor of `msg`'s SCM_RIGHTS control messages (as recvmsg
// filled it) to `take`, which owns it from then on, in the order sent.
void TakeReceivedDescriptors(msghdr& msg,
                             absl::FunctionRef<void(int)> take);

// Reads the link with recvmsg(MSG_CMSG_CLOEXEC) into a FrameReader and
// keeps the descriptors that arrive until the frame carrying them claims
// them. One reader owns it, as it owns the FrameReader; use both for every
// read of the link.
class DescriptorReader {
 public:
  // One recvmsg of at most `max_bytes` into `reader`; returns as
  // FrameReader::ReadFrom (-1 with errno set; EINTR is not retried).
  ssize_t ReadFrom(int fd, FrameReader& reader, size_t max_bytes);

  // Right after reader.Next() returned `frame`: the descriptors it carries
  // (DescriptorsCarried(frame) of them, in the order sent). kInvalidArgument
  // when the frame came without them or with another count, when earlier
  // descriptors were not claimed by the frames they came with, or when a
  // read's control data was truncated (the kernel closed what did not fit);
  // every descriptor held is then closed, and the link must be dropped.
  absl::StatusOr<std::vector<base::UniqueFd>> TakeFor(const Frame& frame,
                                                      const FrameReader& reader);
  // After the frames of a read are taken: kInvalidArgument (descriptors
  // closed) if a read's descriptors came only with frames that carry none.
  absl::Status Settle(const FrameReader& reader);

  // Descriptors received and not yet claimed.
  size_t held() const;

 private:
  struct Batch {
    uint64_t begin = 0;  // the stream offsets of the read that brought them
    uint64_t end = 0;
    std::vector<base::UniqueFd> fds;
  };
  absl::Status Refuse(std::string_view why);

  std::deque<Batch> batches_;
  uint64_t received_ = 0;   // bytes read from the link so far
  bool truncated_ = false;  // a read's control data did not fit
};

}  // namespace agentix::ipc
