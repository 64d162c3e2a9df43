// The orphan timer of direct calls (docs/DIRECT-CALLS.md, --direct_orphan_s):
// a client whose last handed-over connection closed and none of whose came
// back within the timeout has its session collapsed into the daemon, so the
// daemon's eviction and GetStatus see those calls and the worker does not
// hold them for ever. The daemon's, not the worker's (DECISIONS.md
// "stop-38: ... who times an orphaned session"): hand-overs and collapses
// are serialized under the session manager's lock.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sandbox/direct_connections.h"

namespace agentix::sandbox {

class DirectOrphanTimer {
 public:
  // Every few hundred ms (a quarter of `after`, at most 1 s), calls
  // `collapse(client)` for each client of `connections` without a live
  // connection for `after` (on the timer's thread). `connections` must
  // outlive this; so must what `collapse` uses.
  DirectOrphanTimer(DirectConnections& connections, absl::Duration after,
                    std::function<void(const std::string& client)> collapse);
  // Stops the thread (and waits for a `collapse` in progress).
  ~DirectOrphanTimer();
  DirectOrphanTimer(const DirectOrphanTimer&) = delete;
  DirectOrphanTimer& operator=(const DirectOrphanTimer&) = delete;

 private:
  void Run();

  DirectConnections& connections_;
  const absl::Duration after_;
  const std::function<void(const std::string&)> collapse_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace agentix::sandbox
