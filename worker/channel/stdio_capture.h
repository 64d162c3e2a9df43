// fd-level capture of stdout/stderr: fd 0 -> /dev/null, fds 1/2 -> pipes
// that drainer threads turn into `log` frames (origin 2 / 3) on the log
// queue and into lines for the durable log. The drainers never take the GIL,
// so a full pipe never waits on Python.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "worker/channel/durable_log.h"
#include "worker/channel/writer.h"

namespace agentix::worker {

// Longest captured line; longer output is cut into lines of this size.
inline constexpr size_t kMaxLineBytes = 64 * 1024;

// Appends `data` to `out` as valid UTF-8, each invalid sequence replaced by
// U+FFFD (Python's errors="replace" for captured bytes, without the GIL).
void AppendUtf8Replacing(const char* data, size_t size, std::string& out);

class StdioCapture {
 public:
  StdioCapture(std::shared_ptr<Writer> writer,
               std::shared_ptr<DurableLog> durable);
  StdioCapture(const StdioCapture&) = delete;
  StdioCapture& operator=(const StdioCapture&) = delete;
  ~StdioCapture();  // Stop(1000) unless stopped

  bool started() const { return started_; }

  // What the drainer threads share with the channel (defined in the .cc).
  struct Shared;

  // Redirects fds 0..2 and starts the drainers (and the log sender); the
  // worker's own diagnostics keep the real stderr. `worker_id` and `context`
  // tag every captured line. GIL held. kInternal if a drainer thread could
  // not start (the caller then Stop()s, without the GIL); kUnavailable with
  // the OS error otherwise.
  absl::Status Start(const std::string& worker_id, const std::string& context);

  // Restores fds 0..2 and ends the drainers, waiting at most `timeout_ms`
  // for them (a child still holding a pipe keeps its drainer reading: it is
  // abandoned). Ends the durable log's lines. No GIL: touches no Python.
  void Stop(int timeout_ms);

  // The side-channel barrier's worker half: before a call's result, item or
  // error is written, the lines already written to fds 1 and 2 (by the call,
  // os.write, a child process) are read and queued, so they reach the daemon
  // ahead of it (AcquireCaughtUp: once per write of queued frames, not per
  // frame; a direct call's reply: before DirectConns::Reply counts them).
  // Costs one epoll_wait(0) when the pipes are empty. GIL held on entry
  // and exit; released only to wait for a drainer or to read. True if it
  // let go of the GIL (the caller's view of shared state may be stale).
  bool CatchUp();

  // Queues one stdout (2) / stderr (3) line written through Python's
  // sys.stdout/sys.stderr as a `log` frame, and to the durable log. GIL held.
  // kInvalidArgument if it cannot be encoded. `direct_conn`: the tag of a
  // direct call's line (DirectConns::TagRecord), 0 for none.
  absl::Status SendLine(int origin, uint64_t direct_conn, std::string text,
                        const std::string& call_id);

 private:
  static void Drain(std::shared_ptr<Shared> shared, int index);

  std::shared_ptr<Shared> shared_;
  int saved_stderr_ = -1;
  std::vector<std::thread> drainers_;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace agentix::worker
