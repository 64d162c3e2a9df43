// GoneRecords: which records left a side channel's buffer (SeqBuffer) before
// every host had them, by owner and seq, so that a host that subscribes
// again after seq N is told exactly how many of the records it would have
// received after N are gone: its own client's and no call's, never another
// client's (before stop 28 it was told the whole gap of seqs).
//
// Compact: runs of consecutive seqs of one owner, at most `max_runs` of
// them. Older runs are folded into a per-owner remainder (count and highest
// seq, at most `max_owners` owners; beyond that into one shared remainder)
// whose seqs are no longer known: a count that needs one says "at most".
// Not thread-safe (SeqBuffer's lock guards it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>

namespace agentix::sandbox {

class GoneRecords {
 public:
  // The client whose call emitted a record; null for no call's.
  using OwnerPtr = std::shared_ptr<const std::string>;

  GoneRecords(size_t max_runs, size_t max_owners)
      : max_runs_(max_runs < 1 ? 1 : max_runs),
        max_owners_(max_owners < 1 ? 1 : max_owners) {}

  // Record `seq` of `owner` left the buffer. `weight`: how many sandbox
  // records it stands for (a drop report: the records it reports, 0 when
  // they are here already; 1 for any other). `broadcast`: no call's record that never reached a host,
  // counted by the buffer's report to every host instead (not counted
  // here). Seqs need not come in order (acks free records in the middle).
  void Add(uint64_t seq, const OwnerPtr& owner, uint64_t weight,
           bool broadcast) {
    if (broadcast || weight == 0) return;
    if (!runs_.empty()) {
      Run& last = runs_.back();
      if (seq == last.last + 1 && weight == 1 && last.weight == 0 &&
          SameOwner(last.owner, owner)) {
        last.last = seq;
        return;
      }
    }
    runs_.push_back({owner, seq, seq, weight == 1 ? 0 : weight});
    if (runs_.size() > max_runs_) Forget();
  }

  struct Count {
    uint64_t records = 0;
    bool at_most = false;  // part of it is an upper bound
  };
  // The records gone with seq > `after_seq` that a subscriber of `client`
  // would have been sent: its client's (`client` not empty) and, with
  // `no_call`, no call's.
  Count CountFor(const std::string& client, uint64_t after_seq,
                 bool no_call) const;

  size_t runs() const { return runs_.size(); }  // (tests)

 private:
  struct Run {
    OwnerPtr owner;
    uint64_t first;
    uint64_t last;
    uint64_t weight;  // a weighted record's (first == last); 0: 1 a seq
  };
  struct Remainder {
    uint64_t records = 0;
    uint64_t max_seq = 0;
  };

  static bool SameOwner(const OwnerPtr& a, const OwnerPtr& b) {
    if (a == b) return true;
    return a != nullptr && b != nullptr && *a == *b;
  }
  // Folds the oldest run into the remainders.
  void Forget();

  const size_t max_runs_;
  const size_t max_owners_;
  std::deque<Run> runs_;
  // Forgotten runs by owner ("" for no call's), and those of owners met
  // once max_owners_ were there (any count below its max_seq includes it).
  std::unordered_map<std::string, Remainder> forgotten_;
  Remainder shared_;
};

}  // namespace agentix::sandbox
