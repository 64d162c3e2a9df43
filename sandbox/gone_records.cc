#include "sandbox/gone_records.h"

#include <algorithm>

namespace agentix::sandbox {

GoneRecords::Count GoneRecords::CountFor(const std::string& client,
                                         uint64_t after_seq,
                                         bool no_call) const {
  Count count;
  auto wanted = [&](const std::string* owner) {
    return owner == nullptr ? no_call : !client.empty() && *owner == client;
  };
  for (const Run& run : runs_) {
    if (run.last <= after_seq || !wanted(run.owner.get())) continue;
    count.records += run.weight != 0
                         ? run.weight
                         : run.last - std::max(run.first, after_seq + 1) + 1;
  }
  // A remainder's seqs are gone: if any may lie after `after_seq`, all of
  // it counts, as an upper bound.
  auto add_remainder = [&](const Remainder& r) {
    if (r.records == 0 || r.max_seq <= after_seq) return;
    count.records += r.records;
    count.at_most = true;
  };
  if (no_call) {
    auto it = forgotten_.find("");
    if (it != forgotten_.end()) add_remainder(it->second);
  }
  if (!client.empty()) {
    auto it = forgotten_.find(client);
    if (it != forgotten_.end()) add_remainder(it->second);
  }
  add_remainder(shared_);
  return count;
}

void GoneRecords::Forget() {
  const Run run = std::move(runs_.front());
  runs_.pop_front();
  static const std::string kNoCall;
  const std::string& key = run.owner == nullptr ? kNoCall : *run.owner;
  auto it = forgotten_.find(key);
  Remainder* r;
  if (it != forgotten_.end()) {
    r = &it->second;
  } else if (forgotten_.size() < max_owners_) {
    r = &forgotten_[key];
  } else {
    r = &shared_;
  }
  r->records += run.weight != 0 ? run.weight : run.last - run.first + 1;
  r->max_seq = std::max(r->max_seq, run.last);
}

}  // namespace agentix::sandbox
