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

// The size of `fd`'s content without a trailing run of NUL bytes (what a
// crash leaves: usually less than kChunk, read back 64 KiB at a time).
absl::StatusOr<size_t> ContentLength(int fd, size_t size) {
  constexpr size_t kBlock = 64 * 1024;
  std::vector<char> block(kBlock);
  size_t end = size;
  while (end > 0) {
    const size_t start = end > kBlock ? end - kBlock : 0;
    size_t got = 0;
    while (got < end - start) {
      const ssize_t n = pread(fd, block.data() + got, end - start - got,
                              static_cast<off_t>(start + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, "reading the file's end");
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != end - start) {
      return absl::DataLossError("durable log: the file shrank while read");
    }
    size_t i = got;
    while (i > 0 && block[i - 1] == '\0') --i;
    if (i > 0) return start + i;
    end = start;
  }
  return 0;
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

absl::Status MappedLog::Slide(size_t bytes) {
  // The window starts at the page holding the end of the records and is
  // kChunk long, or up to the chunk boundary past a longer line.
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t offset = length_ / page * page;
  const size_t end = (length_ + bytes + kChunk - 1) / kChunk * kChunk;
  const size_t size = std::max(end - offset, kChunk);
  // Blocks reserved now: a copy into a hole the disk cannot fill would be
  // a SIGBUS. posix_fallocate never shrinks the file.
  const int error = posix_fallocate(fd_, static_cast<off_t>(length_),
                                    static_cast<off_t>(offset + size - length_));
  if (error != 0) return ErrnoStatus(error, "growing the file");
  if (base_ != nullptr) {
    munmap(base_, mapped_);
    base_ = nullptr;
    mapped_ = 0;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                    static_cast<off_t>(offset));
  if (base == MAP_FAILED) return ErrnoStatus(errno, "mapping the file");
  base_ = static_cast<char*>(base);
  offset_ = offset;
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
  if (length_ + data.size() > offset_ + mapped_) {
    if (absl::Status slid = Slide(data.size()); !slid.ok()) return slid;
  }
  std::memcpy(base_ + (length_ - offset_), data.data(), data.size());
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
