#include "worker/ipc/io.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

namespace agentix::ipc {

absl::Status WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, -1);
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("frame channel write failed: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, absl::Span<const std::string_view> pieces) {
  // Pieces per writev; far below IOV_MAX (1024), and a 1 MiB-chunked result
  // needs two per chunk.
  constexpr size_t kMaxIov = 64;
  size_t next = 0;    // first piece not completely written
  size_t offset = 0;  // bytes of pieces[next] already written
  while (true) {
    while (next < pieces.size() && offset == pieces[next].size()) {
      ++next;
      offset = 0;
    }
    if (next == pieces.size()) return absl::OkStatus();
    iovec iov[kMaxIov];
    int count = 0;
    for (size_t i = next; i < pieces.size() && count < static_cast<int>(kMaxIov);
         ++i) {
      const size_t skip = i == next ? offset : 0;
      if (pieces[i].size() == skip) continue;
      iov[count].iov_base = const_cast<char*>(pieces[i].data() + skip);
      iov[count].iov_len = pieces[i].size() - skip;
      ++count;
    }
    ssize_t n = ::writev(fd, iov, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd pfd{fd, POLLOUT, 0};
        ::poll(&pfd, 1, -1);
        continue;
      }
      return absl::UnavailableError(
          absl::StrCat("frame channel write failed: ", strerror(errno)));
    }
    // Advance past what was written.
    size_t written = static_cast<size_t>(n);
    while (written > 0) {
      const size_t left = pieces[next].size() - offset;
      const size_t step = std::min(left, written);
      offset += step;
      written -= step;
      if (offset == pieces[next].size()) {
        ++next;
        offset = 0;
      }
    }
  }
}

absl::StatusOr<size_t> ReadInto(int fd, FrameReader& reader,
                                size_t max_bytes) {
  while (true) {
    ssize_t n = reader.ReadFrom(fd, max_bytes);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::UnavailableError("EAGAIN");
    }
    return absl::UnavailableError(
        absl::StrCat("frame channel read failed: ", strerror(errno)));
  }
}

bool IsWouldBlock(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         status.message() == "EAGAIN";
}

}  // namespace agentix::ipc
