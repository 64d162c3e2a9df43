// The read side of a frame-wire socket (docs/FRAME-WIRE.md): the bytes read
// and not yet parsed, and the non-blocking recvmsg that adds to them. Both
// servers of a host's Calls connection use it: the daemon's
// (sandbox/frame_wire_server.cc) and a handed-over one's (frame_connection.h).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

namespace agentix::sandbox {

// Unparsed bytes in one buffer. A read makes room for at least kChunkBytes,
// or for the rest of the frame whose header is in (so a large frame arrives
// in as few reads as the socket allows), moving the unparsed bytes to the
// front first and growing the buffer only when that is not enough; a grown
// buffer is not zero-filled (the read writes it). Views from buffered() stay
// valid until the next Read, Clear or Shrink. Not thread-safe: the read side's
// thread only.
class FrameReadBuffer {
 public:
  static constexpr size_t kChunkBytes = 64u << 10;

  // Starts with `pre`: bytes read past the HELLO by whoever read it.
  explicit FrameReadBuffer(absl::string_view pre = {});

  absl::string_view buffered() const {
    return absl::string_view(data_.get() + start_, end_ - start_);
  }
  bool empty() const { return start_ == end_; }
  // The first `n` buffered bytes were parsed.
  void Consume(size_t n);
  // Drops every buffered byte.
  void Clear() { start_ = end_ = 0; }

  // What one Read found besides the bytes.
  struct ReadOutcome {
    // False on EOF or a socket error; true when bytes came and when there
    // was nothing to read (EAGAIN).
    bool open = false;
    // The kernel cut descriptors off (MSG_CTRUNC): more came than the
    // control buffer holds (four), and they are closed.
    bool descriptors_truncated = false;
  };
  // One recvmsg(MSG_DONTWAIT | MSG_CMSG_CLOEXEC) from `fd` (EINTR retried).
  // A frame in progress longer than `max_message_bytes` gets no room of its
  // own (ParseFrame refuses its header). Each descriptor that came with the
  // bytes goes to `take_descriptor`, which owns it from then on.
  ReadOutcome Read(int fd, size_t max_message_bytes,
                   absl::FunctionRef<void(int)> take_descriptor);

  // Grown for large frames and empty now: worth giving back (Shrink) once
  // no frame has come for a while (an upload's next chunk would grow it
  // again).
  bool idle_and_large() const {
    return empty() && capacity_ > 4 * kChunkBytes;
  }
  // Back to kChunkBytes, keeping what is buffered (only when it fits).
  void Shrink();

 private:
  void Resize(size_t capacity);

  std::unique_ptr<char[]> data_;
  size_t capacity_ = 0;
  // Bytes [start_, end_) are unparsed.
  size_t start_ = 0;
  size_t end_ = 0;
};

}  // namespace agentix::sandbox
