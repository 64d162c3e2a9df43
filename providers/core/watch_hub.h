// Resource versions and watch fan-out for sandbox records. Versions are a
// counter per epoch (a random id minted at each start); the last `history`
// events are kept so a watcher can resume from (epoch, version) without a
// gap, else OUT_OF_RANGE / RESOURCE_VERSION_TOO_OLD ("relist"). Observers are
// called in version order from one dispatcher thread, never under the
// publisher's lock; an observer whose OnEvent returns false is dropped.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "providers/backend.h"
#include "providers/core/controller.h"
#include "providers/core/label_selector.h"

namespace agentix::providers {

class WatchHub {
 public:
  WatchHub(std::string epoch, int history, absl::Duration bookmark_interval);
  ~WatchHub();  // stops the dispatcher; no OnEvent after it returns

  const std::string& epoch() const { return epoch_; }
  int64_t current_version() const;

  // Assigns the next version to `sandbox` and queues the event. Callers that
  // need events in the order of their own state changes call it under their
  // own lock (the hub's lock nests inside).
  int64_t Publish(pb::SandboxEvent::Type type, pb::Sandbox* sandbox);

  struct Subscription {
    LabelSelector selector;
    int64_t resource_version = 0;  // 0 without an epoch: from now
    std::string epoch;             // required with resource_version > 0;
                                   // with 0: from the epoch's start
    bool bookmarks = false;
    std::vector<pb::Sandbox> initial;  // sent first as ADDED
  };
  // OUT_OF_RANGE / RESOURCE_VERSION_TOO_OLD when the version cannot be
  // resumed (another epoch, older than the history, or in the future).
  absl::StatusOr<std::unique_ptr<WatchHandle>> Subscribe(Subscription subscription,
                                                         WatchObserver* observer);
  int subscriber_count() const;

 private:
  using EventPtr = std::shared_ptr<const pb::SandboxEvent>;
  struct Subscriber {
    LabelSelector selector;
    bool bookmarks = false;
    WatchObserver* observer = nullptr;
    std::deque<EventPtr> queue;
    bool delivering = false;
    bool dropped = false;
  };
  class Handle;

  void Unsubscribe(uint64_t id);
  void Run();
  bool Pending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string epoch_;
  const size_t history_;
  const absl::Duration bookmark_interval_;
  mutable absl::Mutex mu_;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<EventPtr> ring_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Subscriber>> subscribers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time next_bookmark_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id dispatcher_id_;
  std::thread dispatcher_;
};

}  // namespace agentix::providers
