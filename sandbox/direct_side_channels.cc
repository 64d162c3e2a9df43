#include "sandbox/direct_side_channels.h"

#include <algorithm>
#include <utility>

#include "base/log.h"

namespace agentix::sandbox {

void DirectSideChannels::NameClient(uint64_t generation, uint64_t conn,
                                    std::string client) {
  absl::MutexLock lock(&mu_);
  clients_[conn] = Client{generation, std::move(client)};
  named_.push_back(conn);
  while (named_.size() > remembered_conns_) {
    clients_.erase(named_.front());
    named_.pop_front();
  }
}

std::optional<std::string> DirectSideChannels::ClientOf(uint64_t generation,
                                                        uint64_t conn) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(conn);
  if (it == clients_.end() || it->second.generation != generation) {
    return std::nullopt;
  }
  return it->second.id;
}

void DirectSideChannels::ForgetWorker(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  absl::erase_if(clients_, [generation](const auto& entry) {
    return entry.second.generation == generation;
  });
  named_.erase(std::remove_if(named_.begin(), named_.end(),
                              [this](uint64_t conn) {
                                mu_.AssertHeld();
                                return !clients_.contains(conn);
                              }),
               named_.end());
  absl::erase_if(calls_, [generation](const auto& entry) {
    return entry.second.generation == generation;
  });
}

namespace {

// Walks a batch's runs one record at a time.
class RunCursor {
 public:
  explicit RunCursor(const std::vector<IdRun>& runs) : runs_(runs) { Skip(); }
  // The current record's id ("" past the runs: records without one).
  std::string_view id() const {
    return run_ < runs_.size() ? std::string_view(runs_[run_].id) : "";
  }
  void Next() {
    if (run_ == runs_.size()) return;
    ++used_;
    Skip();
  }

 private:
  void Skip() {
    while (run_ < runs_.size() && used_ >= runs_[run_].count) {
      ++run_;
      used_ = 0;
    }
  }
  const std::vector<IdRun>& runs_;
  size_t run_ = 0;
  size_t used_ = 0;
};

}  // namespace

std::vector<IdRun> DirectSideChannels::Owners(
    uint64_t generation, const std::vector<IdRun>& calls,
    const std::vector<uint64_t>& conns, const std::vector<IdRun>& owners) {
  std::vector<IdRun> out;
  RunCursor call(calls);
  RunCursor owner(owners);
  uint64_t unknown = 0;
  absl::MutexLock lock(&mu_);
  for (const uint64_t conn : conns) {
    std::string_view to = owner.id();
    if (conn != 0 && !call.id().empty()) {
      auto it = clients_.find(conn);
      if (it != clients_.end() && it->second.generation == generation) {
        to = it->second.id;
      } else {
        to = "";
        ++unknown;
      }
    }
    AddToRuns(out, to);
    call.Next();
    owner.Next();
  }
  if (unknown > 0) {
    if (unknown_tags_ == 0) {
      AGX_LOG(Warning, "worker generation {} tagged records with direct "
              "connections it was not given; they go to every stream",
              generation);
    }
    unknown_tags_ += unknown;
  }
  return out;
}

void DirectSideChannels::TrackSeqs(uint64_t generation,
                                   const std::vector<IdRun>& calls,
                                   const std::vector<uint64_t>& conns,
                                   uint64_t first, bool trace) {
  absl::MutexLock lock(&mu_);
  size_t record = 0;
  for (const IdRun& run : calls) {
    const size_t end = std::min(record + run.count, conns.size());
    if (run.id.empty()) {
      record = end;
      continue;
    }
    // The run's last tagged record: its seq is the call's barrier so far.
    size_t last = end;
    for (size_t i = record; i < end; ++i) {
      if (conns[i] != 0) last = i;
    }
    if (last != end) {
      if (calls_.size() >= max_calls_ && !calls_.contains(run.id)) {
        AGX_LOG(Warning, "{} direct calls' record seqs were never asked for; "
                "forgotten", calls_.size());
        calls_.clear();
      }
      CallSeqs& entry = calls_[run.id];
      entry.generation = generation;
      (trace ? entry.seqs.trace_seq : entry.seqs.log_seq) = first + last;
    }
    record = end;
  }
}

DirectSideChannels::Seqs DirectSideChannels::Take(uint64_t generation,
                                                  std::string_view call_id) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(std::string(call_id));
  if (it == calls_.end() || it->second.generation != generation) return {};
  const Seqs seqs = it->second.seqs;
  calls_.erase(it);
  return seqs;
}

uint64_t DirectSideChannels::unknown_tags() {
  absl::MutexLock lock(&mu_);
  return unknown_tags_;
}

size_t DirectSideChannels::calls_waiting() {
  absl::MutexLock lock(&mu_);
  return calls_.size();
}

}  // namespace agentix::sandbox
