#include "worker/channel/mapped_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fresh_pages.h"

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

// Faults in the pages of the window it is given, from its start, a group at
// a time, until the window is done or taken back. Reads only: the records
// the writer copies in meanwhile are never written over.
class MappedLog::Prefaulter {
 public:
  Prefaulter() : thread_([this] { Run(); }) {}

  // Stops and joins the thread.
  ~Prefaulter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cancel_.store(true, std::memory_order_relaxed);
    }
    changed_.notify_all();
    thread_.join();
  }

  // Starts on [base, base + size) (after any earlier window is released).
  void Warm(char* base, size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      base_ = base;
      size_ = size;
      cancel_.store(false, std::memory_order_relaxed);
    }
    changed_.notify_all();
  }

  // Returns once the thread no longer touches the window (it stops within
  // one group), so the caller may unmap it.
  void Release() {
    std::unique_lock<std::mutex> lock(mu_);
    cancel_.store(true, std::memory_order_relaxed);
    base_ = nullptr;
    changed_.wait(lock, [this] { return !busy_; });
  }

 private:
  static constexpr size_t kGroup = 64 * 1024;
  static constexpr int kNiceness = 10;

  void Run() {
    pthread_setname_np(pthread_self(), "agx-log-fault");
    // Below the threads it works for: it runs ahead of the writer in spare
    // CPU time instead of preempting the logging thread or the pipeline
    // after it (a failure leaves the inherited priority).
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kNiceness);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      changed_.wait(lock, [this] { return stop_ || base_ != nullptr; });
      if (stop_) return;
      char* const base = base_;
      const size_t size = size_;
      base_ = nullptr;
      busy_ = true;
      lock.unlock();
      for (size_t at = 0; at < size; at += kGroup) {
        if (cancel_.load(std::memory_order_relaxed)) break;
        const size_t n = std::min(kGroup, size - at);
        // The guest's write faults (the file's blocks are reserved, so
        // this cannot fail for room), then a read of each page so the
        // hypervisor maps it too (PopulateForWrite does both); an old
        // kernel leaves the reads.
        if (!agentix::base::PopulateForWrite(base + at, n)) {
          agentix::base::ReadEachPage(base + at, n);
        }
      }
      lock.lock();
      busy_ = false;
      changed_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable changed_;
  char* base_ = nullptr;  // a window to warm, not yet taken
  size_t size_ = 0;
  bool busy_ = false;  // the thread is in a window
  bool stop_ = false;
  std::atomic<bool> cancel_{false};
  std::thread thread_;  // last: starts once the rest is set
};

absl::StatusOr<std::unique_ptr<MappedLog>> MappedLog::Open(int fd,
                                                           bool prefault) {
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
      new MappedLog(fd, *length, fork_generation.load(), prefault));
}

MappedLog::~MappedLog() {
  Unmap();
  // A forked child has the parent's Prefaulter but not its thread (nor,
  // maybe, a usable mutex): it leaks the object instead of joining.
  if (prefaulter_ != nullptr && !InheritedByFork()) delete prefaulter_;
}

void MappedLog::Unmap() {
  if (base_ == nullptr) return;
  if (prefaulter_ != nullptr && !InheritedByFork()) prefaulter_->Release();
  munmap(base_, mapped_);
  base_ = nullptr;
  mapped_ = 0;
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
  Unmap();
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                    static_cast<off_t>(offset));
  if (base == MAP_FAILED) return ErrnoStatus(errno, "mapping the file");
  base_ = static_cast<char*>(base);
  offset_ = offset;
  mapped_ = size;
  if (prefaulter_ != nullptr) prefaulter_->Warm(base_, mapped_);
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
  if (prefault_ && prefaulter_ == nullptr &&
      (appended_ += data.size()) >= kPrefaultAfter) {
    StartPrefaulting();
  }
  return absl::OkStatus();
}

void MappedLog::StartPrefaulting() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t at = (length_ - offset_) / page * page;
  try {
    prefaulter_ = new Prefaulter();
  } catch (const std::exception&) {
    // No thread (std::system_error) or no memory: the writer keeps taking
    // its own faults, as without prefaulting.
    prefault_ = false;
    return;
  }
  prefaulter_->Warm(base_ + at, mapped_ - at);
}

absl::Status MappedLog::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  Unmap();
  if (InheritedByFork()) return absl::OkStatus();  // the parent's file
  if (ftruncate(fd_, static_cast<off_t>(length_)) != 0) {
    return ErrnoStatus(errno, "truncating the file to its records");
  }
  return absl::OkStatus();
}

}  // namespace agentix::worker
