#include "worker/channel/mapped_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace agentix::worker {
namespace {

// Counts the forks this process descends from (since the first Open): a
// mapping opened in an earlier generation is the parent's pages, and the
// parent's `length_` is not the child's.
std::atomic<unsigned> fork_generation{0};

void WatchForksOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(nullptr, nullptr, [] { fork_generation.fetch_add(1); });
  });
}

absl::Status ErrnoStatus(int error, const char* what) {
  return absl::ErrnoToStatus(error, absl::StrCat("durable log: ", what));
}

// The size of `fd`'s content without a trailing run of NUL bytes (looked
// for in the last kChunk bytes: the most a crash leaves).
absl::StatusOr<size_t> ContentLength(int fd, size_t size) {
  const size_t window = std::min(size, MappedLog::kChunk);
  std::vector<char> tail(window);
  size_t got = 0;
  while (got < window) {
    const ssize_t n = pread(fd, tail.data() + got, window - got,
                            static_cast<off_t>(size - window + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "reading the file's end");
    if (n == 0) break;  // shrunk meanwhile: the part read decides
    got += static_cast<size_t>(n);
  }
  size_t end = got;
  while (end > 0 && tail[end - 1] == '\0') --end;
  return size - window + end;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedLog>> MappedLog::Open(int fd) {
  WatchForksOnce();
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat");
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        "durable log: only a regular file can be mapped");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  absl::StatusOr<size_t> length = ContentLength(fd, size);
  if (!length.ok()) return length.status();
  if (*length != size && ftruncate(fd, static_cast<off_t>(*length)) != 0) {
    return ErrnoStatus(errno, "trimming a crash's NUL tail");
  }
  return std::unique_ptr<MappedLog>(
      new MappedLog(fd, *length, fork_generation.load()));
}

MappedLog::~MappedLog() {
  if (base_ != nullptr) munmap(base_, mapped_);
}

bool MappedLog::InheritedByFork() const {
  return fork_generation.load(std::memory_order_relaxed) != generation_;
}

absl::Status MappedLog::Grow(size_t needed) {
  const size_t size = (needed + kChunk - 1) / kChunk * kChunk;
  // Blocks reserved now: a copy into a hole the disk cannot fill would be
  // a SIGBUS. posix_fallocate never shrinks the file.
  const int error = posix_fallocate(fd_, static_cast<off_t>(length_),
                                    static_cast<off_t>(size - length_));
  if (error != 0) return ErrnoStatus(error, "growing the file");
  void* base = base_ == nullptr
                   ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED,
                          fd_, 0)
                   : mremap(base_, mapped_, size, MREMAP_MAYMOVE);
  if (base == MAP_FAILED) return ErrnoStatus(errno, "mapping the file");
  base_ = static_cast<char*>(base);
  mapped_ = size;
  return absl::OkStatus();
}

absl::Status MappedLog::Append(std::string_view data) {
  if (closed_) {
    return absl::FailedPreconditionError("durable log: the mapping is closed");
  }
  if (InheritedByFork()) {
    return absl::FailedPreconditionError(
        "durable log: a forked child cannot append to its parent's mapping");
  }
  if (length_ + data.size() > mapped_) {
    if (absl::Status grown = Grow(length_ + data.size()); !grown.ok()) {
      return grown;
    }
  }
  std::memcpy(base_ + length_, data.data(), data.size());
  length_ += data.size();
  return absl::OkStatus();
}

absl::Status MappedLog::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  if (base_ != nullptr) {
    munmap(base_, mapped_);
    base_ = nullptr;
    mapped_ = 0;
  }
  if (InheritedByFork()) return absl::OkStatus();  // the parent's file
  if (ftruncate(fd_, static_cast<off_t>(length_)) != 0) {
    return ErrnoStatus(errno, "truncating the file to its records");
  }
  return absl::OkStatus();
}

}  // namespace agentix::worker
