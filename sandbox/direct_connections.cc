#include "sandbox/direct_connections.h"

#include <string>
#include <vector>

#include "base/log.h"
#include "sandbox/connection_guard.h"

namespace agentix::sandbox {

std::optional<uint64_t> DirectConnections::Reserve(uint64_t generation,
                                                   std::string_view client,
                                                   bool calls) {
  absl::MutexLock lock(&mu_);
  // A worker reports its exit before the session manager forgets it: a
  // hand-over in between must not count a connection no one will close.
  if (live_.size() >= max_live_ || gone_.contains(generation)) return std::nullopt;
  const uint64_t conn = next_++;
  live_.emplace(conn, Entry{generation, false, false, std::string(client),
                            calls, nullptr});
  if (!calls) return conn;
  Client& counted = clients_[std::string(client)];
  ++counted.live;
  counted.orphaned_at = absl::InfiniteFuture();
  return conn;
}

void DirectConnections::Unlive(const Entry& entry) {
  if (!entry.calls) return;
  auto it = clients_.find(entry.client);
  if (it == clients_.end() || it->second.live == 0) return;
  if (--it->second.live == 0) it->second.orphaned_at = absl::Now();
}

std::vector<std::string> DirectConnections::TakeOrphans(absl::Time now,
                                                        absl::Duration after) {
  std::vector<std::string> orphans;
  absl::MutexLock lock(&mu_);
  for (auto it = clients_.begin(); it != clients_.end();) {
    auto next = std::next(it);
    if (it->second.live == 0 && now - it->second.orphaned_at >= after) {
      orphans.push_back(it->first);
      clients_.erase(it);
    }
    it = next;
  }
  return orphans;
}

bool DirectConnections::HasLive(std::string_view client) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(std::string(client));
  return it != clients_.end() && it->second.live > 0;
}

void DirectConnections::Commit(uint64_t conn, bool guard_counted,
                               std::function<void()> on_end) {
  bool closed_already = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(conn);
    if (it != live_.end()) {
      it->second.committed = true;
      it->second.guard_counted = guard_counted;
      it->second.on_end = std::move(on_end);
    } else {
      closed_already = true;  // the worker ended (or reported it) first
    }
  }
  // The stream the frame wire counted open at HELLO stays open until the
  // worker's report, unless that came first.
  if (closed_already) {
    Drop(Entry{0, /*committed=*/true, guard_counted, {}, true,
               std::move(on_end)});
  }
}

void DirectConnections::Cancel(uint64_t conn) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(conn);
  if (it == live_.end()) return;
  // A session the worker held before stays timed (a collapse of nothing
  // held does nothing).
  Unlive(it->second);
  live_.erase(it);
}

void DirectConnections::Drop(const Entry& entry) {
  if (!entry.committed) return;  // Commit releases what it would have held
  if (entry.guard_counted) ReleaseHandedOverConnection();
  if (activity_ != nullptr) activity_->Closed();
  if (entry.on_end) entry.on_end();
}

void DirectConnections::OnDirectClosed(uint64_t generation, uint64_t conn,
                                       std::string_view why) {
  Entry entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(conn);
    if (it == live_.end() || it->second.generation != generation) {
      ++unknown_closes_;
      AGX_LOG(Warning, "worker generation {} reported direct connection {} "
              "closed, which it does not hold; ignored", generation, conn);
      return;
    }
    entry = it->second;
    live_.erase(it);
    Unlive(entry);
  }
  AGX_LOG(Debug, "direct connection {} closed: {}", conn, std::string(why));
  Drop(entry);
}

void DirectConnections::OnDirectWorkerGone(uint64_t generation) {
  std::vector<Entry> gone;
  {
    absl::MutexLock lock(&mu_);
    gone_.insert(generation);
    for (auto it = live_.begin(); it != live_.end();) {
      auto next = std::next(it);
      if (it->second.generation == generation) {
        gone.push_back(it->second);
        Unlive(it->second);
        live_.erase(it);
      }
      it = next;
    }
  }
  for (const Entry& entry : gone) Drop(entry);
}

size_t DirectConnections::live() {
  absl::MutexLock lock(&mu_);
  return live_.size();
}

uint64_t DirectConnections::unknown_closes() {
  absl::MutexLock lock(&mu_);
  return unknown_closes_;
}

}  // namespace agentix::sandbox
