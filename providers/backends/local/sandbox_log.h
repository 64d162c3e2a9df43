// One sandbox's output (bwrap, its init, the daemon, the worker: one pipe
// providerd drains) kept in <dir>/sandbox.log, at most max_bytes / 2 per
// file: beyond, sandbox.log becomes sandbox.log.1 (replacing the previous
// one) and a new one starts, so at most max_bytes are kept. Offsets count
// the whole output, rotated bytes included.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace agentix::providers::local {

class SandboxLog {
 public:
  // `dir` must exist; nothing is created until the first Append.
  SandboxLog(std::string dir, int64_t max_bytes);
  ~SandboxLog();
  SandboxLog(const SandboxLog&) = delete;
  SandboxLog& operator=(const SandboxLog&) = delete;

  // Keeps `data` (rotating as needed). Bytes that cannot be written (the
  // directory is being removed) are counted and dropped: the pipe is
  // always drained.
  void Append(absl::string_view data);
  // The pipe reached its end: followers stop once they have read it all.
  void Close();

  struct Chunk {
    std::string data;
    int64_t offset = 0;      // of data[0]
    bool truncated = false;  // the asked-for offset was rotated away
    bool end = false;        // closed and nothing after data
  };
  // Up to `max` bytes from `offset` (clamped to the oldest byte kept).
  Chunk Read(int64_t offset, size_t max);
  // Waits until more than `offset` bytes exist, the log is closed, or
  // `deadline`. True when there is something new to read or it closed.
  bool WaitBeyond(int64_t offset, absl::Time deadline);
  // The last `max` bytes kept.
  std::string Tail(size_t max);

  int64_t total() const;
  std::string path() const { return dir_ + "/sandbox.log"; }

 private:
  std::string ReadFile(const std::string& path, int64_t from, size_t max);

  const std::string dir_;
  const int64_t half_;
  mutable absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // stop trying to write
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;    // bytes of output so far
  int64_t current_ ABSL_GUARDED_BY(mu_) = 0;  // of them in sandbox.log
  int64_t previous_ ABSL_GUARDED_BY(mu_) = 0; // in sandbox.log.1
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace agentix::providers::local
