// FinishedIds: the ids of calls whose results the daemon no longer holds
// (acknowledged or evicted), so that a reconnecting host re-sending a
// StartCall never runs a call twice. Bounded: the oldest id is forgotten
// first. Not thread-safe (the session manager's lock guards it).
//
// The ids sit in a ring of `capacity` entries (each with its hash), made in
// blocks as it fills and never moved; once full, the oldest entry is reused
// for the new id. The blocks double from 256 entries to 4,096 and stay
// there (BlockOf), so a session that remembers a few ids holds 16 KiB and
// one that fills 65,536 makes 20 blocks, not 256. An id of up to
// kInlineIdBytes (a Python host's 32 hex chars, a UUID's 36) is kept inside
// its entry, so remembering one allocates nothing; a longer one gets a
// buffer of its own.
// The sets hold 4-byte ring positions, not copies or views: forgetting the
// oldest finds it by its stored hash and its position (no string read or
// hashed again), and the tables are a quarter of views' size. (Before stop
// 40: a deque of strings, whose blocks were freed and made again every 16
// ids, and sets of views; the direct worker's profile had Remember at 3.6 %
// of its samples.)
//
// The positions are spread over kShards small sets by their hash: a hash set
// grows by moving everything it holds into a table twice its size, and
// Remember runs under the session lock on a call's path (its ack). One set
// of 65,536 ids stalled the call that crossed 57,344 ids for 11-14 ms (7,168,
// 14,336 and 28,672: 1.6, 3 and 6-11 ms; issue 25's tail, stop 34); a shard
// moves about 1/kShards of that (bazel run //testing/bench:finished_ids_ab).
//
// The ring's blocks and the sets' tables come from a PopulatedPool: memory
// faulted in 16-256 KiB at a time when the pool takes it, not a page at a
// time as the ids arrive. Until it is full the structure grows by ~75 bytes
// an id, which with malloc's fresh pages (and a string buffer an id) made
// one call in ~50 of a client's first 65,536 pay a ~11 µs page fault here,
// and a block's 10 pages at once every 1,024 (the Remembers over 100 µs).
// Stop 49, issue 25's tail. With 16 KiB blocks throughout, the id that
// opened one still paid for its memory (malloc growing its arena, a fault
// on the fresh page, the pool's populate): the calls that did took 2.4-2.5
// x p50 on this VM, one in 256 of a direct noop stream (stop 53).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "base/populated_pool.h"

namespace agentix::sandbox {

class FinishedIds {
 public:
  static constexpr int kShardBits = 9;
  static constexpr size_t kShards = size_t{1} << kShardBits;
  // The ring's first block (16 KiB: a session that remembers a few ids
  // holds little) and its largest (256 KiB: made in one go at most ~16
  // times while 65,536 ids arrive). A block is never moved or freed while
  // the set lives.
  static constexpr int kFirstBlockBits = 8;
  static constexpr int kLargestBlockBits = 12;
  static constexpr size_t kFirstBlockEntries = size_t{1} << kFirstBlockBits;
  static constexpr size_t kLargestBlockEntries = size_t{1} << kLargestBlockBits;
  // Ids up to this long are kept inside their entry.
  static constexpr size_t kInlineIdBytes = 44;

  // `shard_bits`: 2^shard_bits shards (0: one set, as before stop 34; the
  // benchmark's baseline). `capacity` is capped at 2^32 - 1 ids.
  explicit FinishedIds(size_t capacity, int shard_bits = kShardBits)
      : capacity_(std::min<size_t>(capacity,
                                   std::numeric_limits<Position>::max())),
        shard_shift_(shard_bits == 0 ? 0 : sizeof(size_t) * 8 - shard_bits) {
    if (capacity_ > 0) {
      blocks_.reserve(std::min<size_t>(BlockOf(static_cast<Position>(capacity_ - 1)) + 1, 64));
    }
    const size_t shards = size_t{1} << shard_bits;
    shards_.reserve(shards);
    for (size_t i = 0; i < shards; ++i) {
      shards_.emplace_back(0, PositionHash{this}, PositionEq{this},
                           base::PopulatedPoolAllocator<Position>(&pool_));
    }
  }
  ~FinishedIds() {
    shards_.clear();  // their tables are the pool's
    for (size_t at = 0; at < size_; ++at) delete[] EntryAt(static_cast<Position>(at)).spill;
  }
  FinishedIds(const FinishedIds&) = delete;
  FinishedIds& operator=(const FinishedIds&) = delete;

  bool Contains(std::string_view id) const {
    const Probe probe{id, HashOf(id)};
    return ShardOf(probe.hash).contains(probe);
  }

  // Remembers `id` (no-op if remembered), forgetting the oldest when full.
  void Remember(std::string_view id) {
    if (capacity_ == 0) return;
    const Probe probe{id, HashOf(id)};
    Shard& shard = ShardOf(probe.hash);
    if (shard.contains(probe)) return;
    Position at;
    if (size_ == capacity_) {
      at = oldest_;
      // Out of its set (found by its stored hash and position) before its
      // entry takes the new id.
      ShardOf(EntryAt(at).hash).erase(at);
      oldest_ = oldest_ + 1 == capacity_ ? 0 : oldest_ + 1;
    } else {
      at = static_cast<Position>(size_);  // oldest_ is 0 until full
      if (BlockOf(at) == blocks_.size()) {  // the first id of a new block
        blocks_.push_back(base::PopulatedPoolAllocator<Entry>(&pool_).allocate(
            std::min(BlockEntries(blocks_.size()), capacity_ - at)));
      }
      ++size_;
      EntryAt(at).spill = nullptr;  // the block's bytes are not zeroed
    }
    Entry& entry = EntryAt(at);
    entry.Set(id);
    entry.hash = probe.hash;
    shard.insert(at);
  }

  size_t size() const { return size_; }

  // Calls `f(id)` for each remembered id, oldest first (a session handed
  // to another owner takes its finished ids along).
  template <typename F>
  void ForEach(F&& f) const {
    size_t at = oldest_;
    for (size_t i = 0; i < size_; ++i) {
      f(EntryAt(static_cast<Position>(at)).id());
      if (++at == capacity_) at = 0;
    }
  }

  // The most ids one shard holds (tests: the ids spread over the shards).
  size_t largest_shard() const {
    size_t most = 0;
    for (const Shard& shard : shards_) most = std::max(most, shard.size());
    return most;
  }

  // Ring blocks made so far (tests: the ring stops growing once full).
  size_t blocks() const { return blocks_.size(); }
  // Where the ring and the sets' tables live (tests, benchmarks).
  const base::PopulatedPool& pool() const { return pool_; }

 private:
  using Position = uint32_t;
  // One cache line; its bytes are the pool's, so every field is written
  // before it is read (Remember sets spill, then the id and the hash).
  struct Entry {
    size_t hash;
    char* spill;  // new[]'d: the id, when longer than kInlineIdBytes
    uint32_t size;
    char text[kInlineIdBytes];  // the id, when it fits

    std::string_view id() const { return {spill != nullptr ? spill : text, size}; }
    void Set(std::string_view id) {
      if (id.size() <= kInlineIdBytes) {
        delete[] spill;
        spill = nullptr;
        std::memcpy(text, id.data(), id.size());
      } else {
        if (spill == nullptr || size < id.size()) {
          delete[] spill;
          spill = nullptr;  // not left dangling if new throws
          spill = new char[id.size()];
        }
        std::memcpy(spill, id.data(), id.size());
      }
      size = static_cast<uint32_t>(id.size());
    }
  };
  static_assert(sizeof(Entry) == 64, "an entry is one cache line");
  // An id looked up, hashed once: the shard is chosen by the hash's top bits
  // and the shard's own lookup uses the same hash (it places keys by the low
  // bits, so one shard's keys still spread over its table).
  struct Probe {
    std::string_view id;
    size_t hash;
  };
  // A set's key is a ring position; its hash is the entry's stored one.
  struct PositionHash {
    using is_transparent = void;
    const FinishedIds* ids;
    size_t operator()(Position at) const { return ids->EntryAt(at).hash; }
    size_t operator()(const Probe& probe) const { return probe.hash; }
  };
  struct PositionEq {
    using is_transparent = void;
    const FinishedIds* ids;
    bool operator()(Position a, Position b) const { return a == b; }
    bool operator()(Position a, const Probe& b) const {
      return ids->EntryAt(a).id() == b.id;
    }
    bool operator()(const Probe& a, Position b) const {
      return a.id == ids->EntryAt(b).id();
    }
  };
  using Shard = absl::flat_hash_set<Position, PositionHash, PositionEq,
                                    base::PopulatedPoolAllocator<Position>>;

  static size_t HashOf(std::string_view id) {
    return absl::Hash<std::string_view>{}(id);
  }
  Shard& ShardOf(size_t hash) { return shards_[ShardIndex(hash)]; }
  const Shard& ShardOf(size_t hash) const { return shards_[ShardIndex(hash)]; }
  size_t ShardIndex(size_t hash) const {
    return shard_shift_ == 0 ? 0 : hash >> shard_shift_;
  }
  // The ring's blocks: 256 entries, then 256, 512, 1,024 and 2,048 (each
  // as many as all before it), then 4,096 each. So block b >= 1 of the
  // doubling ones starts at 2^(b+7), which is its own size, and position
  // `at` in [2^8, 2^12) is in block bit_width(at) - 8.
  static constexpr size_t kDoublingBlocks = kLargestBlockBits - kFirstBlockBits;
  static size_t BlockOf(Position at) {
    if (at < kFirstBlockEntries) return 0;
    if (at < kLargestBlockEntries) {
      const int bit_width = 32 - __builtin_clz(at);  // at > 0
      return static_cast<size_t>(bit_width - kFirstBlockBits);
    }
    return kDoublingBlocks + (at >> kLargestBlockBits);
  }
  static size_t BlockStart(size_t block) {
    if (block == 0) return 0;
    if (block <= kDoublingBlocks) return size_t{1} << (block + kFirstBlockBits - 1);
    return (block - kDoublingBlocks) << kLargestBlockBits;
  }
  static size_t BlockEntries(size_t block) {
    if (block == 0) return kFirstBlockEntries;
    if (block <= kDoublingBlocks) return BlockStart(block);
    return kLargestBlockEntries;
  }
  Entry& EntryAt(Position at) {
    const size_t block = BlockOf(at);
    return blocks_[block][at - BlockStart(block)];
  }
  const Entry& EntryAt(Position at) const {
    const size_t block = BlockOf(at);
    return blocks_[block][at - BlockStart(block)];
  }

  const size_t capacity_;
  const int shard_shift_;  // 0: one shard
  size_t size_ = 0;
  Position oldest_ = 0;  // the ring position of the oldest id once full
  base::PopulatedPool pool_;  // before what lives in it: destroyed after
  std::vector<Entry*> blocks_;  // the pool's
  std::vector<Shard> shards_;  // positions in the ring
};

}  // namespace agentix::sandbox
