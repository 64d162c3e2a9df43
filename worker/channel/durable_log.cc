#include "worker/channel/durable_log.h"

#include <utility>

namespace agentix::worker {

void DurableLog::SetEnabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  enabled_ = enabled;
  if (!enabled_) {
    lines_.clear();
    bytes_ = 0;
  }
  cv_.notify_all();
}

void DurableLog::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = true;
  cv_.notify_all();
}

void DurableLog::Offer(std::vector<StdioLine>& lines) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_ || finished_) return;
  for (StdioLine& line : lines) {
    if (bytes_ + line.text.size() > kMaxBytes) break;
    bytes_ += line.text.size();
    lines_.push_back(std::move(line));
  }
  cv_.notify_one();
}

std::deque<StdioLine> DurableLog::Wait() {
  std::deque<StdioLine> lines;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !lines_.empty() || finished_ || !enabled_; });
  lines.swap(lines_);
  bytes_ = 0;
  return lines;
}

}  // namespace agentix::worker
