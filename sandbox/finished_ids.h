// FinishedIds: the ids of calls whose results the daemon no longer holds
// (acknowledged or evicted), so that a reconnecting host re-sending a
// StartCall never runs a call twice. Bounded: the oldest id is forgotten
// first. Remembering an id costs no allocation once full: the oldest id's
// string is reused for the new one (ids are 32 chars from Python hosts, past
// std::string's inline size), and the set keys are views of the queue's
// strings, not copies. Not thread-safe (the session manager's lock guards it).
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_set.h"

namespace agentix::sandbox {

class FinishedIds {
 public:
  explicit FinishedIds(size_t capacity) : capacity_(capacity) {}
  FinishedIds(const FinishedIds&) = delete;
  FinishedIds& operator=(const FinishedIds&) = delete;

  bool Contains(std::string_view id) const { return ids_.contains(id); }

  // Remembers `id` (no-op if remembered), forgetting the oldest when full.
  void Remember(std::string_view id) {
    if (capacity_ == 0 || ids_.contains(id)) return;
    std::string slot;
    if (order_.size() >= capacity_) {
      // The key is a view of this string: out of the set before it moves.
      ids_.erase(order_.front());
      slot = std::move(order_.front());
      order_.pop_front();
    }
    slot.assign(id.data(), id.size());
    // A deque never moves its elements on push_back / pop_front, so the
    // view stays valid while the id is remembered.
    order_.push_back(std::move(slot));
    ids_.insert(std::string_view(order_.back()));
  }

  size_t size() const { return order_.size(); }

 private:
  const size_t capacity_;
  std::deque<std::string> order_;  // oldest first
  absl::flat_hash_set<std::string_view> ids_;  // views of order_'s strings
};

}  // namespace agentix::sandbox
