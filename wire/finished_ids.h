// FinishedIds: the ids of calls whose results the daemon no longer holds
// (acknowledged or evicted), so that a reconnecting host re-sending a
// StartCall never runs a call twice. Bounded: the oldest id is forgotten
// first. Remembering an id costs no allocation once full: the oldest id's
// string is reused for the new one (ids are 32 chars from Python hosts, past
// std::string's inline size), and the set keys are views of the queue's
// strings, not copies. Not thread-safe (the session manager's lock guards it).
//
// The views are spread over kShards small sets by their hash: a hash set
// grows by moving everything it holds into a table twice its size, and
// Remember runs under the session lock on a call's path (its ack). One set
// of 65,536 ids stalled the call that crossed 57,344 ids for 11-14 ms (7,168,
// 14,336 and 28,672: 1.6, 3 and 6-11 ms; issue 25's tail, stop 34); a shard
// moves about 1/kShards of that. The memory is the same: the shards' tables
// together are as large as the one table was
// (bazel run //testing/bench:finished_ids_ab).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"

namespace agentix::sandbox {

class FinishedIds {
 public:
  static constexpr int kShardBits = 9;
  static constexpr size_t kShards = size_t{1} << kShardBits;

  // `shard_bits`: 2^shard_bits shards (0: one set, as before stop 34; the
  // benchmark's baseline).
  explicit FinishedIds(size_t capacity, int shard_bits = kShardBits)
      : capacity_(capacity),
        shard_shift_(shard_bits == 0 ? 0 : sizeof(size_t) * 8 - shard_bits),
        shards_(size_t{1} << shard_bits) {}
  FinishedIds(const FinishedIds&) = delete;
  FinishedIds& operator=(const FinishedIds&) = delete;

  bool Contains(std::string_view id) const {
    const Hashed key = HashOf(id);
    return ShardOf(key).contains(key);
  }

  // Remembers `id` (no-op if remembered), forgetting the oldest when full.
  void Remember(std::string_view id) {
    if (capacity_ == 0) return;
    const Hashed key = HashOf(id);
    Shard& shard = ShardOf(key);
    if (shard.contains(key)) return;
    std::string slot;
    if (order_.size() >= capacity_) {
      // The key is a view of this string: out of its set before it moves.
      const Hashed oldest = HashOf(order_.front());
      ShardOf(oldest).erase(oldest);
      slot = std::move(order_.front());
      order_.pop_front();
    }
    slot.assign(id.data(), id.size());
    // A deque never moves its elements on push_back / pop_front, so the
    // view stays valid while the id is remembered.
    order_.push_back(std::move(slot));
    shard.insert(std::string_view(order_.back()));
  }

  size_t size() const { return order_.size(); }

  // Calls `f(id)` for each remembered id, oldest first (a session handed
  // to another owner takes its finished ids along).
  template <typename F>
  void ForEach(F&& f) const {
    for (const std::string& id : order_) f(std::string_view(id));
  }

  // The most ids one shard holds (tests: the ids spread over the shards).
  size_t largest_shard() const {
    size_t most = 0;
    for (const Shard& shard : shards_) most = std::max(most, shard.size());
    return most;
  }

 private:
  // An id and its hash, hashed once: the shard is chosen by the hash's top
  // bits and the shard's own lookup uses the same hash (it places keys by
  // the low bits, so one shard's keys still spread over its table).
  struct Hashed {
    std::string_view id;
    size_t hash;
  };
  struct IdHash {
    using is_transparent = void;
    size_t operator()(std::string_view id) const {
      return absl::Hash<std::string_view>{}(id);
    }
    size_t operator()(const Hashed& key) const { return key.hash; }
  };
  struct IdEq {
    using is_transparent = void;
    bool operator()(std::string_view a, std::string_view b) const {
      return a == b;
    }
    bool operator()(std::string_view a, const Hashed& b) const {
      return a == b.id;
    }
    bool operator()(const Hashed& a, std::string_view b) const {
      return a.id == b;
    }
  };
  using Shard = absl::flat_hash_set<std::string_view, IdHash, IdEq>;

  static Hashed HashOf(std::string_view id) { return {id, IdHash{}(id)}; }
  size_t ShardIndex(const Hashed& key) const {
    return shard_shift_ == 0 ? 0 : key.hash >> shard_shift_;
  }
  Shard& ShardOf(const Hashed& key) { return shards_[ShardIndex(key)]; }
  const Shard& ShardOf(const Hashed& key) const {
    return shards_[ShardIndex(key)];
  }

  const size_t capacity_;
  const int shard_shift_;  // 0: one shard
  std::deque<std::string> order_;  // oldest first
  std::vector<Shard> shards_;  // views of order_'s strings
};

}  // namespace agentix::sandbox
