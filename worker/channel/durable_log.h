// Captured lines on their way to the durable log file: a bounded queue
// between the capture drainers (and send_stdio) and the driver's durable-log
// thread. Best effort: lines beyond the bound are dropped, so the file never
// slows user output down.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace agentix::worker {

inline constexpr int kOriginStdout = 2;
inline constexpr int kOriginStderr = 3;

// One captured line (text valid UTF-8).
struct StdioLine {
  int origin = kOriginStdout;
  int64_t time_unix_nanos = 0;
  std::string text;
};

class DurableLog {
 public:
  // Lines waiting beyond this are dropped.
  static constexpr size_t kMaxBytes = 16u * 1024 * 1024;

  // Starts (or stops and empties) queueing lines.
  void SetEnabled(bool enabled);
  // No more lines will come: Wait returns what is left, then nothing.
  void Finish();
  // Queues `lines` (moved from) while enabled and not finished, up to the
  // bound. Any thread; never waits for anything but the leaf lock.
  void Offer(std::vector<StdioLine>& lines);
  // Waits until lines are queued, Finish() was called or queueing is
  // disabled; returns the queued lines (empty in the latter two cases).
  std::deque<StdioLine> Wait();

 private:
  std::mutex mu_;  // a leaf
  std::condition_variable cv_;
  bool enabled_ = false;
  bool finished_ = false;
  std::deque<StdioLine> lines_;
  size_t bytes_ = 0;
};

}  // namespace agentix::worker
