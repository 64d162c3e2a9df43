#include "providers/backends/local/sandbox_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>

namespace agentix::providers::local {

SandboxLog::SandboxLog(std::string dir, int64_t max_bytes)
    : dir_(std::move(dir)), half_(std::max<int64_t>(1, max_bytes / 2)) {}

SandboxLog::~SandboxLog() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
}

void SandboxLog::Append(absl::string_view data) {
  absl::MutexLock lock(&mu_);
  while (!data.empty()) {
    if (current_ >= half_) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      const std::string log = path();
      if (!broken_ && ::rename(log.c_str(), (log + ".1").c_str()) != 0) broken_ = true;
      previous_ = current_;
      current_ = 0;
    }
    if (fd_ < 0 && !broken_) {
      fd_ = ::open(path().c_str(),
                   O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (fd_ < 0) broken_ = true;
    }
    size_t piece = std::min<int64_t>(data.size(), half_ - current_);
    if (!broken_) {
      ssize_t n = ::write(fd_, data.data(), piece);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        broken_ = true;  // the directory is being removed: keep draining
      } else {
        piece = n;
      }
    }
    current_ += piece;
    total_ += piece;
    data.remove_prefix(piece);
  }
}

void SandboxLog::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int64_t SandboxLog::total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

std::string SandboxLog::ReadFile(const std::string& path, int64_t from, size_t max) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return out;
  out.resize(max);
  size_t got = 0;
  while (got < max) {
    ssize_t n = ::pread(fd, out.data() + got, max - got, from + got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
  }
  ::close(fd);
  out.resize(got);
  return out;
}

SandboxLog::Chunk SandboxLog::Read(int64_t offset, size_t max) {
  absl::MutexLock lock(&mu_);
  Chunk chunk;
  const int64_t current_start = total_ - current_;
  const int64_t earliest = current_start - previous_;
  if (offset < earliest) {
    chunk.truncated = true;
    offset = earliest;
  }
  offset = std::min(offset, total_);
  chunk.offset = offset;
  if (offset < current_start) {
    const size_t n = std::min<int64_t>(max, current_start - offset);
    chunk.data = ReadFile(path() + ".1", offset - earliest, n);
  } else if (offset < total_) {
    const size_t n = std::min<int64_t>(max, total_ - offset);
    chunk.data = ReadFile(path(), offset - current_start, n);
  }
  chunk.end = closed_ && offset + static_cast<int64_t>(chunk.data.size()) >= total_;
  return chunk;
}

bool SandboxLog::WaitBeyond(int64_t offset, absl::Time deadline) {
  struct Beyond {
    SandboxLog* log;
    int64_t offset;
    static bool Check(Beyond* b) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return b->log->closed_ || b->log->total_ > b->offset;
    }
  } beyond{this, offset};
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(&Beyond::Check, &beyond), deadline);
}

std::string SandboxLog::Tail(size_t max) {
  const int64_t end = total();
  std::string out;
  int64_t offset = std::max<int64_t>(0, end - static_cast<int64_t>(max));
  while (out.size() < max) {
    Chunk chunk = Read(offset, max - out.size());
    if (chunk.data.empty()) break;
    offset = chunk.offset + chunk.data.size();
    out += chunk.data;
    if (offset >= end) break;
  }
  return out;
}

}  // namespace agentix::providers::local
