// SeqBuffer: the daemon's store of one side channel's records (log records,
// trace events) between the worker and the hosts subscribed to that
// channel's stream. It numbers records with a daemon-wide seq (surviving
// worker respawns), keeps a bounded backlog until a host acknowledges it,
// broadcasts to every subscriber, and hands overflow to a reporter instead
// of losing records silently.
//
// What counts as lost: a record of no call evicted before any subscriber
// got it (reported to every host), a record evicted while the subscriber it
// was for was paused (see Subscriber::Deliver; reported to that host), or,
// for a host that subscribes (again) after a seq, every record after that
// seq it would have been sent that left the buffer meanwhile: its client's
// and no call's, not other clients' (GoneRecords; reported to that host).
// Evicting a record that was already delivered is not a loss by itself:
// the host normally has it, and acks routinely trail deliveries by
// thousands of records during a burst.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "sandbox/gone_records.h"

namespace agentix::sandbox {

// A random id per buffer, i.e. per daemon process (see LogsResponse).
inline std::string RandomInstanceId() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

// `count` consecutive records that share `id` (a call id, a client id; ""
// for none): a burst from one call is one string, not one per record.
struct IdRun {
  std::string id;
  size_t count;
};
// Appends `count` records of `id` to `runs` (joining the last run when it
// has the same id).
inline void AddToRuns(std::vector<IdRun>& runs, std::string_view id,
                      size_t count = 1) {
  if (!runs.empty() && runs.back().id == id) {
    runs.back().count += count;
  } else {
    runs.push_back({std::string(id), count});
  }
}

// `Record` is a proto message with set_seq()/seq().
template <typename Record>
class SeqBuffer {
 public:
  using RecordPtr = std::shared_ptr<const Record>;

  // Receives records for one stream.
  class Subscriber {
   public:
    virtual ~Subscriber() = default;
    // Queues `records` (in seq order) for the host and returns true; or,
    // when it already holds as much unwritten as it may (a host reading
    // slower than the sandbox writes), takes none of them and returns false.
    // The subscriber is then paused: the buffer sends it nothing more and
    // keeps its records (acks do not free them) until it calls Resume, which
    // sends it what the buffer still holds after its last record and reports
    // what capacity evicted meanwhile. So a lagging host is caught up from
    // the buffer instead of its stream being ended. Thread-safe and
    // non-blocking. Called with the buffer's delivery lock held (so calls
    // come in seq order), never with its state lock.
    virtual bool Deliver(std::vector<RecordPtr> records) = 0;
    // Writes what coalescing holds back without further delay.
    virtual void FlushNow() {}
    // The host client this stream serves ("" when it named none): records
    // of that client's calls go to its streams only.
    virtual const std::string& client_id() const {
      static const std::string kNone;
      return kNone;
    }
  };

  // Called with the buffer's lock held when records were lost to overflow
  // and a subscriber is there to be told: returns a record to store (and
  // deliver) in this buffer, or nullopt after reporting elsewhere. With
  // `at_most`, `dropped` is an upper bound (GoneRecords forgot which seqs
  // some were). `client` is the host client the report is for (a resumed
  // or resubscribing subscriber's; it goes to that client only), "" for
  // every host. Must not call back into this buffer.
  using DropReporter = std::function<std::optional<Record>(
      uint64_t dropped, bool at_most, size_t capacity,
      const std::string& client)>;

  // `reports_into_self`: the reporter returns its report for this buffer
  // (so storing it evicts one more record, which the report then counts).
  SeqBuffer(size_t capacity, std::string what, DropReporter reporter,
            bool reports_into_self)
      : capacity_(std::max<size_t>(1, capacity)),
        what_(std::move(what)),
        reporter_(std::move(reporter)),
        reports_into_self_(reports_into_self),
        instance_id_(RandomInstanceId()),
        gone_(kGoneRuns, kGoneOwners) {}

  // Numbers and stores `records`. A record whose `owners` entry is set (the
  // client whose call emitted it) goes to that client's subscribers only,
  // any other to every subscriber; one nobody received is kept for the
  // next subscriber that may have it (see Subscribe). `owners` is empty or
  // parallel to `records`. Returns the seq of the first record (the others
  // follow it by one each). Thread-safe.
  uint64_t Append(std::vector<Record> records,
                  const std::vector<std::string>& owners = {}) {
    std::vector<IdRun> runs;
    for (const std::string& owner : owners) AddToRuns(runs, owner);
    return AppendRuns(std::move(records), runs);
  }

  // Append with the owners as runs: `owners` covers the first records in
  // order (their counts), records past them have no owner.
  uint64_t AppendRuns(std::vector<Record> records,
                      const std::vector<IdRun>& owners) {
    std::vector<std::pair<std::shared_ptr<Subscriber>,
                          std::vector<RecordPtr>>> deliveries;
    uint64_t first;
    absl::MutexLock ordered(&deliver_mu_);
    {
      absl::MutexLock lock(&mu_);
      first = next_seq_;
      deliveries.reserve(subscribers_.size());
      for (const auto& s : subscribers_) {
        if (!s.paused) deliveries.push_back({s.subscriber, {}});
      }
      // Which subscribers get a run's records: decided once per run.
      std::vector<char> gets(deliveries.size());
      size_t i = 0;
      auto store_run = [&](const std::string& id, size_t count) {
        const OwnerPtr owner =
            id.empty() ? nullptr : std::make_shared<const std::string>(id);
        bool delivered = false;
        for (size_t k = 0; k < deliveries.size(); ++k) {
          gets[k] = !owner || deliveries[k].first->client_id() == *owner;
          delivered |= gets[k] != 0;
        }
        for (const size_t end = i + count; i < end; ++i) {
          RecordPtr ptr = Store(std::move(records[i]), owner, delivered);
          for (size_t k = 0; k < deliveries.size(); ++k) {
            if (gets[k]) deliveries[k].second.push_back(ptr);
          }
        }
      };
      for (const IdRun& run : owners) {
        if (i == records.size()) break;
        store_run(run.id, std::min(run.count, records.size() - i));
      }
      if (i < records.size()) store_run(kNoOwner, records.size() - i);
      if (deliveries.empty()) return first;  // kept in the backlog
      std::vector<RecordPtr> reports;
      ReportDrops(reports);
      for (auto& d : deliveries) {
        d.second.insert(d.second.end(), reports.begin(), reports.end());
      }
    }
    bool refused = false;
    for (auto& d : deliveries) {
      if (d.second.empty()) continue;
      const uint64_t before = d.second.front()->seq() - 1;
      if (!d.first->Deliver(std::move(d.second))) {
        Pause(d.first.get(), before);
        d.first = nullptr;  // took none of them
        refused = true;
      }
    }
    if (refused) Undeliver(first, deliveries);
    return first;
  }

  // Asks every subscriber to write what it holds back now: a call's result
  // waits on the host for its records (the side-channel barrier).
  void FlushSubscribers() {
    std::vector<std::shared_ptr<Subscriber>> subscribers;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& s : subscribers_) subscribers.push_back(s.subscriber);
    }
    for (auto& s : subscribers) s->FlushNow();
  }

  // Adds `subscriber` and delivers the backlog with seq > `after_seq`
  // (followed by the drop report, if records were lost). An `instance_id`
  // that is set and differs from ours means `after_seq` counted in another
  // daemon: the whole backlog is sent. The subscriber is told, alone, how
  // many records after `after_seq` it would have been sent that left the
  // buffer meanwhile: its client's, and no call's when it is resuming (our
  // instance, `after_seq` > 0); never another client's. Thread-safe.
  // ResourceExhausted (nothing delivered) when max_subscribers are there.
  absl::Status Subscribe(const std::shared_ptr<Subscriber>& subscriber,
                         uint64_t after_seq,
                         const std::string& instance_id = "") {
    if (!instance_id.empty() && instance_id != instance_id_) after_seq = 0;
    std::vector<RecordPtr> records;
    // Held until the backlog is handed over: an Append in between would
    // otherwise reach the new subscriber first, and the host, which skips
    // seqs at or below the last one it replayed, would drop the backlog.
    absl::MutexLock ordered(&deliver_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (subscribers_.size() >= max_subscribers_) {
        return absl::ResourceExhaustedError(fmt::format(
            "too many {} subscribers ({}); close some or start the daemon "
            "with a higher --max-log-subscribers",
            what_, max_subscribers_));
      }
      subscribers_.push_back({subscriber});
      const bool resuming = after_seq > 0;
      // No call's records that never reached a host are not in this count:
      // the report to every host (ReportDrops, below or already stored)
      // counts them.
      const GoneRecords::Count gone =
          gone_.CountFor(subscriber->client_id(), after_seq, resuming);
      CatchUp(*subscriber, after_seq, resuming, records,
              /*counted_reports=*/resuming);
      // Taken after the backlog: storing a report may evict its oldest
      // record, which this subscriber then still receives.
      ReportMissed(gone.records, gone.at_most, subscriber->client_id(),
                   after_seq, records);
      ReportDrops(records);
    }
    // A new subscriber holds nothing yet: it takes its backlog (bounded by
    // the capacity) whole.
    if (!records.empty()) subscriber->Deliver(std::move(records));
    return absl::OkStatus();
  }

  // A paused subscriber (see Subscriber::Deliver) may take records again:
  // it is sent the backlog after the last record it took, then the drop
  // report if capacity evicted some of its records meanwhile (counting
  // those records exactly, for its client only), and from then on every
  // new record. Nothing for a subscriber that is not paused.
  void Resume(const std::shared_ptr<Subscriber>& subscriber) {
    std::vector<RecordPtr> records;
    uint64_t after_seq;
    // Held until the backlog is handed over, as in Subscribe.
    absl::MutexLock ordered(&deliver_mu_);
    {
      absl::MutexLock lock(&mu_);
      Subscription* s = Find(subscriber.get());
      if (s == nullptr || !s->paused) return;
      s->paused = false;
      --paused_;
      after_seq = s->paused_after;
      const uint64_t missed = std::exchange(s->missed, 0);
      CatchUp(*subscriber, after_seq, /*resuming=*/true, records);
      ReportMissed(missed, /*at_most=*/false, subscriber->client_id(),
                   after_seq, records);
    }
    if (!records.empty() && !subscriber->Deliver(std::move(records))) {
      Pause(subscriber.get(), after_seq);
    }
  }

  // Whether `subscriber` is paused (tests).
  bool paused(const Subscriber* subscriber) {
    absl::MutexLock lock(&mu_);
    const Subscription* s = Find(subscriber);
    return s != nullptr && s->paused;
  }

  // Subscribers allowed at once (each holds what it has not read yet).
  void SetMaxSubscribers(size_t n) {
    absl::MutexLock lock(&mu_);
    max_subscribers_ = std::max<size_t>(1, n);
  }

  void Unsubscribe(const Subscriber* subscriber) {
    absl::MutexLock lock(&mu_);
    Subscription* s = Find(subscriber);
    if (s == nullptr) return;
    if (s->paused) --paused_;
    subscribers_.erase(subscribers_.begin() + (s - subscribers_.data()));
  }

  // Frees the records with seq <= `seq`, except another client's call
  // records that have not reached it yet: they wait for it (until capacity
  // evicts them, which counts as a drop), and those a paused subscriber has
  // yet to be sent (any host's ack may come here). `client` is the acking
  // host's: what it frees of no call's or another client's is gone for a
  // host that resubscribes before it (GoneRecords).
  void Ack(uint64_t seq, const std::string& client = kNoOwner) {
    absl::MutexLock lock(&mu_);
    if (paused_ > 0) {
      for (const auto& s : subscribers_) {
        if (s.paused) seq = std::min(seq, s.paused_after);
      }
    }
    auto end = backlog_.begin();
    while (end != backlog_.end() && end->record->seq() <= seq) ++end;
    auto kept = std::remove_if(backlog_.begin(), end, [&](const Entry& e) {
      if (!e.delivered && e.owner != nullptr) return false;
      if (e.owner == nullptr || *e.owner != client) {
        gone_.Add(e.record->seq(), e.owner, e.weight, /*broadcast=*/false);
      }
      return true;
    });
    backlog_.erase(kept, end);
  }

  const std::string& instance_id() const { return instance_id_; }
  size_t buffered() {
    absl::MutexLock lock(&mu_);
    return backlog_.size();
  }
  uint64_t dropped_total() {
    absl::MutexLock lock(&mu_);
    return dropped_total_;
  }

 private:
  // The client whose call emitted a record, shared by the records of one
  // run; null for none.
  using OwnerPtr = std::shared_ptr<const std::string>;
  struct Entry {
    RecordPtr record;
    OwnerPtr owner;
    bool delivered;  // handed to at least one subscriber
    // The sandbox records it stands for once gone (GoneRecords): 1; the
    // count of a report to every host (the records it reports are not in
    // GoneRecords); 0 for a report to one host (they are).
    uint64_t weight = 1;
    // A report to one host: the records it counts all have seqs above this.
    uint64_t covers_after = 0;
  };
  struct Subscription {
    std::shared_ptr<Subscriber> subscriber;
    bool paused = false;
    // While paused: the seq before the first record it refused, and how
    // many records after it that it would get capacity evicted.
    uint64_t paused_after = 0;
    uint64_t missed = 0;
  };
  inline static const std::string kNoOwner;
  // GoneRecords' bounds: runs (40 bytes each and a client id a run shares:
  // at most ~160 KiB and 4,096 ids) and owners whose forgotten runs are
  // told apart.
  static constexpr size_t kGoneRuns = 4096;
  static constexpr size_t kGoneOwners = 1024;

  Subscription* Find(const Subscriber* subscriber)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& s : subscribers_) {
      if (s.subscriber.get() == subscriber) return &s;
    }
    return nullptr;
  }

  // `subscriber` refused the records after `after_seq` (Deliver returned
  // false): it gets nothing more until Resume. Called with deliver_mu_ held.
  void Pause(const Subscriber* subscriber, uint64_t after_seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(deliver_mu_) {
    absl::MutexLock lock(&mu_);
    Subscription* s = Find(subscriber);
    if (s == nullptr || s->paused) return;  // unsubscribed meanwhile
    s->paused = true;
    s->paused_after = after_seq;
    ++paused_;
  }

  // Appends to `out` the backlog `subscriber` may have after `after_seq`:
  // its own calls' records, and records of no call that nobody received
  // yet (kept for the next client, delivered once) or, when `resuming` (a
  // host whose stream had records up to `after_seq`), all of them. With
  // `counted_reports`, not a one-host drop report whose records all lie
  // after `after_seq`: Subscribe's own report counts them (GoneRecords), so
  // a host whose stream ended before it replayed that report is not told
  // them twice.
  void CatchUp(const Subscriber& subscriber, uint64_t after_seq, bool resuming,
               std::vector<RecordPtr>& out, bool counted_reports = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string& client = subscriber.client_id();
    for (auto& entry : backlog_) {
      const uint64_t seq = entry.record->seq();
      const bool send =
          seq > after_seq && (entry.owner == nullptr
                                  ? !entry.delivered || resuming
                                  : *entry.owner == client);
      if (!send) continue;
      if (counted_reports && entry.weight == 0 &&
          after_seq <= entry.covers_after) {
        continue;
      }
      entry.delivered = true;
      out.push_back(entry.record);
    }
  }

  // After a refusal in Append: the records it stored (seq >= `first`) that
  // no subscriber left in `deliveries` (those that took theirs) got are
  // undelivered again, so the next client still gets a record of no call
  // once the paused host goes, and its eviction counts as a drop. Called
  // with deliver_mu_ held since the records were stored (nothing else has
  // touched their flags).
  void Undeliver(uint64_t first,
                 const std::vector<std::pair<std::shared_ptr<Subscriber>,
                                             std::vector<RecordPtr>>>& taken)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(deliver_mu_) {
    absl::MutexLock lock(&mu_);
    for (auto it = backlog_.rbegin();
         it != backlog_.rend() && it->record->seq() >= first; ++it) {
      if (!it->delivered) continue;
      bool got = false;
      for (const auto& d : taken) {
        if (d.first != nullptr &&
            (it->owner == nullptr || *it->owner == d.first->client_id())) {
          got = true;
          break;
        }
      }
      it->delivered = got;
    }
  }

  // Whether a paused subscriber would be sent `entry` on Resume; with
  // `count`, adds it to the `missed` of each such subscriber (`entry` is
  // being evicted).
  bool NeededByPaused(const Entry& entry, bool count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (paused_ == 0) return false;
    bool needed = false;
    for (auto& s : subscribers_) {
      if (!s.paused || entry.record->seq() <= s.paused_after) continue;
      if (entry.owner != nullptr && *entry.owner != s.subscriber->client_id()) {
        continue;
      }
      needed = true;
      if (!count) break;
      s.missed += entry.weight;  // as GoneRecords counts it
    }
    return needed;
  }

  // Adds a record to the backlog, evicting the oldest past capacity.
  // `weight`, `covers_after`: see Entry.
  RecordPtr Store(Record record, const OwnerPtr& owner, bool delivered,
                  uint64_t weight = 1, uint64_t covers_after = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    record.set_seq(next_seq_++);
    auto ptr = std::make_shared<const Record>(std::move(record));
    backlog_.push_back({ptr, owner, delivered, weight, covers_after});
    while (backlog_.size() > capacity_) {
      const Entry& oldest = backlog_.front();
      const bool was_delivered = oldest.delivered;
      // A paused subscriber that lacks it is told on Resume, alone.
      const bool missed = NeededByPaused(oldest, /*count=*/true);
      // No call's record that reached nobody is reported to every host;
      // any other, to a host of its client (or any, for no call's) that
      // subscribes after an earlier seq.
      const bool broadcast =
          !was_delivered && !missed && oldest.owner == nullptr;
      gone_.Add(oldest.record->seq(), oldest.owner, oldest.weight,
                broadcast);
      backlog_.pop_front();
      if (was_delivered) continue;  // the host has it (see the top comment)
      if (broadcast) ++unreported_drops_;
      if (dropped_total_++ % 1000 == 0) {
        AGX_LOG(Warning,
                "{} buffer full ({} entries, nobody acknowledging): dropping "
                "the oldest; {} dropped so far",
                what_, capacity_, dropped_total_);
      }
    }
    return ptr;
  }

  // Hands the drops since the last report to the reporter, for every host;
  // a record it returns is stored here and appended to `out`.
  void ReportDrops(std::vector<RecordPtr>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (unreported_drops_ == 0) return;
    // Storing the report in a full backlog evicts one more record: count it
    // if that one never reached a host (nor is a paused one's to report).
    const bool evicts_undelivered =
        reports_into_self_ && backlog_.size() >= capacity_ &&
        !backlog_.front().delivered && backlog_.front().owner == nullptr &&
        !NeededByPaused(backlog_.front(), /*count=*/false);
    const uint64_t dropped = unreported_drops_ + (evicts_undelivered ? 1 : 0);
    std::optional<Record> report =
        reporter_(dropped, /*at_most=*/false, capacity_, kNoOwner);
    if (report.has_value()) {
      // Delivered right after by the caller (Append or Subscribe).
      out.push_back(Store(std::move(*report), nullptr, /*delivered=*/true,
                          dropped));
    }
    unreported_drops_ = 0;
  }

  // Reports to `client`'s hosts only the `missed` records a resumed (or
  // resubscribing) subscriber of it lost (`at_most`: an upper bound), all
  // with seqs above `covers_after`; a record the reporter returns is stored
  // here as that client's (another paused host must not be sent it on its
  // Resume) and appended to `out`. A record that storing it evicts is
  // counted as Store counts it, for the next report.
  void ReportMissed(uint64_t missed, bool at_most, const std::string& client,
                    uint64_t covers_after, std::vector<RecordPtr>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (missed == 0) return;
    std::optional<Record> report =
        reporter_(missed, at_most, capacity_, client);
    if (report.has_value()) {
      // A host that named no client cannot be told from others: its
      // report is stored as a record of no call (delivered), as before.
      OwnerPtr owner = client.empty()
                           ? nullptr
                           : std::make_shared<const std::string>(client);
      out.push_back(
          Store(std::move(*report), owner, /*delivered=*/true, /*weight=*/0,
                covers_after));
    }
  }

  const size_t capacity_;
  const std::string what_;
  const DropReporter reporter_;
  const bool reports_into_self_;
  const std::string instance_id_;
  // Held from numbering records until every subscriber has them (Append,
  // Subscribe), so each subscriber receives seqs in increasing order; taken
  // before `mu_`. The host drops what arrives below its cursor as already
  // seen, so a reordering here would lose records, not only delay them.
  absl::Mutex mu_;
  absl::Mutex deliver_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::deque<Entry> backlog_ ABSL_GUARDED_BY(mu_);
  std::vector<Subscription> subscribers_ ABSL_GUARDED_BY(mu_);
  size_t paused_ ABSL_GUARDED_BY(mu_) = 0;  // subscribers paused
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  size_t max_subscribers_ ABSL_GUARDED_BY(mu_) = SIZE_MAX;
  uint64_t unreported_drops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_total_ ABSL_GUARDED_BY(mu_) = 0;
  GoneRecords gone_ ABSL_GUARDED_BY(mu_);
};

}  // namespace agentix::sandbox
