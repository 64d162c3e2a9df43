// SandboxController: records, state machine, journal, reaper, watch, pools.
// One mutex (mu_) guards all state; blocking backend/daemon calls run on
// the WorkPool without it; callbacks run after it is released.
#include "providers/core/controller.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/util/message_differencer.h"
#include "providers/core/errors.h"
#include "providers/core/ids.h"
#include "providers/core/journal.h"
#include "providers/core/label_selector.h"
#include "providers/core/pool_manager.h"
#include "providers/core/watch_hub.h"
#include "providers/core/work_pool.h"

namespace agentix::providers {
namespace {

using Phase = pb::SandboxStatus::Phase;
using Later = std::vector<std::function<void()>>;

// Starts hold a thread while they poll for readiness (up to ready_timeout),
// so they get their own threads: a burst of slow starts never delays a
// delete, an Activate or an idle check.
constexpr int kLaunchWorkers = 16;
constexpr int kWorkers = 8;
constexpr size_t kLogTailBytes = 64 * 1024;
constexpr absl::Duration kMaxWait = absl::Seconds(55);
// How long a restart waits for its READY sandboxes to prove they are alive.
constexpr absl::Duration kReadoptTimeout = absl::Seconds(3);
// How often GetCapabilities probes again a backend that was down at start.
constexpr absl::Duration kReprobeInterval = absl::Seconds(2);
constexpr char kLabelSandboxId[] = "agentix.dev/sandbox-id";
constexpr char kLabelManagedBy[] = "agentix.dev/managed-by";
constexpr char kLabelPool[] = "agentix.dev/pool";

enum RecordType : uint8_t { kSandboxRecord = 1, kRequestRecord = 2, kPoolRecord = 3 };

google::protobuf::Timestamp ToProto(absl::Time t) {
  google::protobuf::Timestamp ts;
  int64_t us = absl::ToUnixMicros(t);
  ts.set_seconds(us / 1000000);
  ts.set_nanos((us % 1000000) * 1000);
  return ts;
}
absl::Time FromProto(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}
absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}
google::protobuf::Duration DurationProto(absl::Duration d) {
  google::protobuf::Duration out;
  int64_t ns = absl::ToInt64Nanoseconds(d);
  out.set_seconds(ns / 1000000000);
  out.set_nanos(ns % 1000000000);
  return out;
}

bool Terminal(Phase p) { return p == pb::SandboxStatus::TERMINATED; }
bool Live(Phase p) { return p != pb::SandboxStatus::TERMINATED; }

absl::Status Invalid(absl::string_view reason, std::string message) {
  return ProviderError(absl::StatusCode::kInvalidArgument, reason, message);
}
absl::Status NotFound(const std::string& id) {
  return ProviderError(absl::StatusCode::kNotFound, kReasonSandboxNotFound,
                       absl::StrCat("no sandbox '", id, "'"));
}

Histogram NewHistogram() {
  Histogram h;
  h.bounds_seconds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
  h.counts.assign(h.bounds_seconds.size() + 1, 0);
  return h;
}
void Observe(Histogram* h, absl::Duration d) {
  double s = absl::ToDoubleSeconds(d);
  size_t i = std::lower_bound(h->bounds_seconds.begin(), h->bounds_seconds.end(), s) -
             h->bounds_seconds.begin();
  h->counts[i]++;
  h->sum_seconds += s;
  h->count++;
}

// The part of a CreateSandboxRequest that decides "same request".
std::string PayloadHash(const pb::CreateSandboxRequest& request) {
  pb::CreateSandboxRequest copy = request;
  copy.clear_request_id();
  copy.clear_wait();
  copy.clear_ready_timeout();
  return ProtoHash(copy);
}

std::string Truncate(std::string s, size_t max) {
  if (s.size() > max) s.erase(0, s.size() - max);
  return s;
}

class ControllerImpl final : public SandboxController, public EventSink {
 public:
  ControllerImpl(ControllerOptions options, std::vector<std::unique_ptr<Backend>> backends,
                 std::unique_ptr<DaemonAgent> agent)
      : options_(std::move(options)),
        agent_(std::move(agent)),
        hub_(RandomId("", 12), options_.watch_history, options_.bookmark_interval) {
    for (auto& b : backends) {
      std::string name(b->name());
      backends_[name] = std::move(b);
    }
    create_hist_ = acquire_hist_ = delete_hist_ = NewHistogram();
  }

  ~ControllerImpl() override { Shutdown(false); }

  absl::Status Start() override;
  void Shutdown(bool destroy_all) override;
  void CreateSandbox(const pb::CreateSandboxRequest& request, std::string idempotency_key,
                     CreateCallback done) override;
  absl::StatusOr<pb::Sandbox> GetSandbox(const std::string& id) override;
  absl::StatusOr<pb::Credentials> GetCredentials(const std::string& id) override;
  absl::StatusOr<pb::ListSandboxesResponse> ListSandboxes(
      const pb::ListSandboxesRequest& request) override;
  absl::StatusOr<std::unique_ptr<WatchHandle>> Watch(const pb::WatchSandboxesRequest& request,
                                                     WatchObserver* observer) override;
  void WaitSandbox(const pb::WaitSandboxRequest& request, WaitCallback done) override;
  absl::StatusOr<pb::Sandbox> ExtendSandbox(const pb::ExtendSandboxRequest& request) override;
  void DeleteSandbox(const pb::DeleteSandboxRequest& request, DeleteCallback done) override;
  absl::Status StreamLogs(const pb::StreamSandboxLogsRequest& request, LogSink* sink) override;
  absl::StatusOr<pb::WarmPool> CreateWarmPool(const pb::WarmPool& pool) override;
  absl::StatusOr<pb::WarmPool> UpdateWarmPool(const pb::WarmPool& pool) override;
  absl::StatusOr<pb::WarmPool> GetWarmPool(const std::string& name) override;
  std::vector<pb::WarmPool> ListWarmPools() override;
  absl::Status DeleteWarmPool(const std::string& name, bool allow_missing) override;
  pb::Capabilities GetCapabilities() override;
  MetricsSnapshot Metrics() override;

  void OnObserved(const BackendRef& ref, const Observed& observed) override;

 private:
  enum class TaskKind { kExpire, kIdle, kRetention, kRequestExpiry, kWaitTimeout,
                        kPoolTick, kMemberAge, kMemberWaitTimeout };
  struct Task {
    TaskKind kind;
    std::string id;
    uint64_t extra = 0;
  };
  struct WaitWaiter {
    Phase until;
    WaitCallback done;
  };
  struct Entry {
    pb::Sandbox record;  // never holds credentials
    std::string backend;
    BackendRef ref;
    std::string access_token;
    std::string admin_token;
    std::string spec_hash;   // pool key of the spec
    absl::Time expire;
    absl::Time ready_deadline;
    absl::Time started;      // monotonic-ish wall time for histograms
    absl::Time delete_started;
    absl::Duration grace = absl::Seconds(2);
    bool stop_requested = false;  // delete/expiry while PENDING/STARTING
    pb::Exit stop_exit;
    std::optional<Observed> exited;  // backend event while starting
    bool waiting_for_member = false;
    // Backend::Extend in flight for it / the expiry changed again meanwhile
    // (one writer per sandbox, so the backend ends with the latest expiry).
    bool extend_running = false;
    bool extend_again = false;
    std::optional<std::multimap<absl::Time, Task>::iterator> expire_task;
    bool wait_ready = true;
    google::protobuf::Map<std::string, std::string> env;  // not in records
    bool env_journaled = false;  // recovered with its env: can be relaunched
    std::vector<std::pair<bool, CreateCallback>> create_waiters;  // replayed?
    std::map<uint64_t, WaitWaiter> wait_waiters;
    std::vector<DeleteCallback> delete_waiters;
  };
  struct RequestEntry {
    std::string sandbox_id;
    std::string payload_hash;
    absl::Time expiry;
  };
  struct Member {
    std::string id;
    std::string pool;
    int64_t generation = 0;
    std::string key;
    std::string backend;
    BackendRef ref;
    std::string admin_token;
    pb::Endpoint endpoint;
    absl::Time created;
    bool ready = false;
    bool doomed = false;  // destroy once its launch returns
  };
  struct Pool {
    pb::WarmPool spec;  // status filled on read
    std::string key;
    int64_t generation = 1;
    std::deque<std::string> ready;  // member ids, FIFO
    std::set<std::string> creating;
    int failure_streak = 0;
    std::string last_error;
    absl::Time backoff_until = absl::InfinitePast();
    int64_t claimed = 0;
    int64_t cold_fallbacks = 0;
    std::deque<std::string> waiters;  // sandbox ids (WAIT_FOR_MEMBER)
    // Refill hold (ControllerOptions::pool_refill_delay): the first claim
    // of the current hold and the last claim; a tick is pending until then.
    absl::Time hold_since = absl::InfinitePast();
    absl::Time last_claim = absl::InfinitePast();
    absl::Time hold_tick = absl::InfinitePast();
  };

  // --- helpers (mu_ held) ---
  using TaskIt = std::multimap<absl::Time, Task>::iterator;
  TaskIt Schedule(absl::Time when, Task task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool earliest = tasks_.empty() || when < tasks_.begin()->first;
    TaskIt it = tasks_.emplace(when, std::move(task));
    if (earliest) reaper_cv_.Signal();
    return it;
  }
  // At most one pending expiry task per sandbox, however often it is
  // extended.
  void ScheduleExpire(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (e.expire_task) tasks_.erase(*e.expire_task);
    e.expire_task = Schedule(e.expire, Task{TaskKind::kExpire, e.record.id()});
  }
  void Publish(Entry& e, pb::SandboxEvent::Type type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    hub_.Publish(type, &e.record);
  }
  void SetPhase(Entry& e, Phase phase, Later* later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    e.record.mutable_status()->set_phase(phase);
    Publish(e, pb::SandboxEvent::MODIFIED);
    JournalSandbox(e);
    Notify(e, later);
  }
  void JournalSandbox(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status JournalRequest(const std::string& request_id, const RequestEntry& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JournalPool(const Pool& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JournalErase(uint8_t type, const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify(Entry& e, Later* later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<CreateResult> CreateOutcome(const Entry& e, bool replayed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Submit(std::function<void()> task);        // short blocking calls
  // Tells the sandbox's backend its new expiry (Backend::Extend).
  void RunBackendExtend(const std::string& id);
  void SubmitLaunch(std::function<void()> task);  // starts
  void Run(Later& later) {
    for (auto& f : later) f();
    later.clear();
  }
  absl::Status ValidateCreate(const pb::CreateSandboxRequest& request,
                              const std::string& request_id, Backend** backend) const;
  // Ends a start (failure or stop): destroys the ref (no lock), then
  // TERMINATED with `exit`.
  void FinishStart(const std::string& id, pb::Exit exit);
  void MarkTerminated(Entry& e, pb::Exit exit, Later* later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // READY (or TERMINATING) -> destroy -> TERMINATED.
  void BeginTerminate(Entry& e, pb::Exit exit, absl::Duration grace, Later* later)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunLaunch(const std::string& id);
  void RunActivate(const std::string& id);
  // Polls GetStatus until the daemon's prestarted worker (if any) has
  // booted; a pool member is ready only then.
  absl::Status AwaitWorkerBooted(const pb::Endpoint& endpoint, const std::string& admin_token,
                                 absl::Time deadline, const std::function<bool()>& stop);
  // After a backend refused a warm claim (another claimer won, the member
  // is gone): the next member, or a cold launch. False when the sandbox is
  // being stopped anyway.
  bool ReclaimAfterConflict(const std::string& id, const BackendRef& lost);
  void MakeReady(const std::string& id, const pb::Endpoint& endpoint, const std::string& node);
  // Polls the endpoint and the daemon until ready, the deadline, an exit or
  // `stop()`. FAILED_PRECONDITION carries why (exit, token rule).
  absl::StatusOr<pb::Endpoint> AwaitReady(Backend* backend, const BackendRef& ref,
                                          const std::string& admin_token, absl::Time deadline,
                                          const std::function<bool()>& stop);
  std::optional<Observed> TakeEarlyExit(const std::string& ref);
  // Start: the journaled READY sandboxes that are still running and whose
  // daemon passes CheckReady, with their endpoints (no lock held).
  std::map<std::string, pb::Endpoint> Readopt(absl::Time now);
  void ReaperLoop();
  void RunTask(const Task& task, Later* later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IdleCheck(const std::string& id);
  // Pools.
  // Create/UpdateWarmPool's request, status cleared and defaults filled
  // in, once its fields and labels pass and the template's backend accepts
  // the template (INVALID_ARGUMENT otherwise). Without the lock.
  absl::StatusOr<pb::WarmPool> CheckPoolRequest(const pb::WarmPool& request);
  void Replenish(Pool& pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunMemberLaunch(const std::string& member_id);
  void DestroyMember(const std::string& member_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ClaimMember(Pool& pool, Entry& e, Later* later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  pb::WarmPool PoolView(const Pool& pool) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Pool* MatchPool(const pb::SandboxSpec& spec, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ServePoolWaiters(Pool& pool, Later* later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ControllerOptions options_;
  std::map<std::string, std::unique_ptr<Backend>> backends_;
  const std::unique_ptr<DaemonAgent> agent_;
  WatchHub hub_;
  // Starts in AwaitReady now: the endpoint's fast look is kept for a few
  // (the looks of a 16-start burst would cost a tenth of a core).
  std::atomic<int> awaiting_ready_{0};

  absl::Mutex mu_;
  absl::CondVar reaper_cv_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Journal> journal_;
  std::unique_ptr<WorkPool> workers_;
  std::unique_ptr<WorkPool> launch_workers_;
  std::thread reaper_;
  std::map<std::string, Entry> sandboxes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, RequestEntry> requests_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Pool> pools_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
  // Exits seen for refs no sandbox owns yet (a launch in flight, a pool
  // member), by ref, with when they came: entries nobody collects (exits of
  // what we destroyed ourselves) are purged after a minute.
  std::map<std::string, std::pair<Observed, absl::Time>> early_exits_ ABSL_GUARDED_BY(mu_);
  void RememberExit(const std::string& ref, const Observed& observed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Time now = absl::Now();
    if (early_exits_.size() >= 256) {
      for (auto it = early_exits_.begin(); it != early_exits_.end();) {
        it = it->second.second < now - absl::Minutes(1) ? early_exits_.erase(it) : std::next(it);
      }
    }
    early_exits_[ref] = {observed, now};
  }
  // Rewrites the journal with only live state once it holds many more
  // records than that (so it does not grow for ever between restarts).
  void MaybeCompact() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<JournalRecord> LiveRecords() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t appended_since_compaction_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::string> ref_owner_ ABSL_GUARDED_BY(mu_);  // ref -> id
  std::multimap<absl::Time, Task> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, pb::BackendCapabilities> caps_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> unprobed_ ABSL_GUARDED_BY(mu_);  // Probe failed at start
  bool reprobing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_reprobe_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Histogram create_hist_ ABSL_GUARDED_BY(mu_);
  Histogram acquire_hist_ ABSL_GUARDED_BY(mu_);
  Histogram delete_hist_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> counters_ ABSL_GUARDED_BY(mu_);
  int in_flight_tasks_ ABSL_GUARDED_BY(mu_) = 0;
};

// ---------------------------------------------------------------- journal

namespace {
// The env a sandbox is armed with stays out of its record (Get/List/Watch
// never show it) but is journaled beside it, so a create that a restart
// interrupted can be launched again with it.
std::string EnvField(const google::protobuf::Map<std::string, std::string>& env) {
  pb::SandboxSpec holder;
  *holder.mutable_env() = env;
  return holder.SerializeAsString();
}
}  // namespace

void ControllerImpl::JournalSandbox(const Entry& e) {
  if (!journal_) return;
  JournalRecord r;
  r.type = kSandboxRecord;
  r.key = e.record.id();
  r.fields = {e.record.SerializeAsString(), e.ref.value, e.access_token, e.admin_token,
              e.spec_hash, e.backend, EnvField(e.env)};
  if (absl::Status s = journal_->Append(r); !s.ok()) {
    fprintf(stderr, "providerd: journal: %s\n", s.ToString().c_str());
  }
  ++appended_since_compaction_;
  MaybeCompact();
}

std::vector<JournalRecord> ControllerImpl::LiveRecords() {
  std::vector<JournalRecord> live;
  for (auto& [id, e] : sandboxes_) {
    live.push_back({kSandboxRecord, false, id,
                    {e.record.SerializeAsString(), e.ref.value, e.access_token,
                     e.admin_token, e.spec_hash, e.backend, EnvField(e.env)}});
  }
  for (auto& [rid, req] : requests_) {
    live.push_back({kRequestRecord, false, rid,
                    {req.sandbox_id, req.payload_hash,
                     std::to_string(absl::ToUnixMicros(req.expiry))}});
  }
  for (auto& [name, pool] : pools_) {
    pb::WarmPool spec = pool.spec;
    spec.clear_status();
    live.push_back({kPoolRecord, false, name,
                    {spec.SerializeAsString(), std::to_string(pool.generation)}});
  }
  return live;
}

void ControllerImpl::MaybeCompact() {
  int64_t live = sandboxes_.size() + requests_.size() + pools_.size();
  if (appended_since_compaction_ < std::max<int64_t>(10000, 4 * live)) return;
  if (absl::Status s = journal_->Rewrite(LiveRecords()); !s.ok()) {
    fprintf(stderr, "providerd: journal compaction: %s\n", s.ToString().c_str());
  }
  appended_since_compaction_ = 0;
}

absl::Status ControllerImpl::JournalRequest(const std::string& request_id,
                                            const RequestEntry& req) {
  if (!journal_) return absl::OkStatus();
  JournalRecord r;
  r.type = kRequestRecord;
  r.key = request_id;
  r.fields = {req.sandbox_id, req.payload_hash, std::to_string(absl::ToUnixMicros(req.expiry))};
  ++appended_since_compaction_;
  return journal_->Append(r);
}

void ControllerImpl::JournalPool(const Pool& p) {
  if (!journal_) return;
  JournalRecord r;
  r.type = kPoolRecord;
  r.key = p.spec.name();
  pb::WarmPool spec = p.spec;
  spec.clear_status();
  r.fields = {spec.SerializeAsString(), std::to_string(p.generation)};
  if (absl::Status s = journal_->Append(r); !s.ok()) {
    fprintf(stderr, "providerd: journal: %s\n", s.ToString().c_str());
  }
}

void ControllerImpl::JournalErase(uint8_t type, const std::string& key) {
  if (!journal_) return;
  JournalRecord r;
  r.type = type;
  r.erase = true;
  r.key = key;
  if (absl::Status s = journal_->Append(r); !s.ok()) {
    fprintf(stderr, "providerd: journal: %s\n", s.ToString().c_str());
  }
  ++appended_since_compaction_;
  MaybeCompact();
}

// ---------------------------------------------------------------- start/stop

absl::Status ControllerImpl::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("Start() called twice");
  }
  if (backends_.empty()) return absl::InvalidArgumentError("no backends");
  if (!backends_.count(options_.default_backend)) {
    return absl::InvalidArgumentError(
        absl::StrCat("default backend '", options_.default_backend, "' is not configured"));
  }
  Journal::Loaded loaded;
  auto journal = Journal::Open(options_.state_dir, /*fsync=*/false, &loaded);
  if (!journal.ok()) return journal.status();
  if (loaded.dropped_bytes > 0) {
    fprintf(stderr, "providerd: journal: dropped a torn tail of %lld bytes\n",
            static_cast<long long>(loaded.dropped_bytes));
  }
  std::map<std::string, pb::BackendCapabilities> caps;
  std::set<std::string> unprobed;
  for (auto& [name, backend] : backends_) {
    auto probed = backend->Probe();
    if (!probed.ok() && absl::IsUnavailable(probed.status()) &&
        name != options_.default_backend) {
      // A container engine that is down now may come up later: its creates
      // answer UNAVAILABLE until then, and GetCapabilities probes again.
      fprintf(stderr, "providerd: backend %s: %s (probed again later)\n", name.c_str(),
              probed.status().ToString().c_str());
      caps[name].set_name(name);
      caps[name].set_detail(absl::StrCat("unreachable: ", probed.status().message()));
      unprobed.insert(name);
      continue;
    }
    if (!probed.ok()) {
      return absl::Status(probed.status().code(),
                          absl::StrCat("backend ", name, ": ", probed.status().message()));
    }
    caps[name] = *probed;
  }
  workers_ = std::make_unique<WorkPool>(kWorkers);
  launch_workers_ = std::make_unique<WorkPool>(kLaunchWorkers);
  absl::Time now = absl::Now();
  // Everything to destroy: live sandboxes' refs (they died with us) and
  // every owned leftover the journal does not keep.
  std::vector<std::pair<Backend*, BackendRef>> doomed;
  std::set<std::string> doomed_refs;
  std::vector<std::string> resumed;  // creates to launch again
  {
    absl::MutexLock lock(&mu_);
    journal_ = std::move(*journal);
    caps_ = std::move(caps);
    unprobed_ = std::move(unprobed);
    for (JournalRecord& r : Journal::Fold(std::move(loaded.records))) {
      if (r.type == kSandboxRecord && r.fields.size() >= 6) {
        Entry e;
        if (!e.record.ParseFromString(r.fields[0])) continue;
        e.ref.value = r.fields[1];
        e.access_token = r.fields[2];
        e.admin_token = r.fields[3];
        e.spec_hash = r.fields[4];
        e.backend = r.fields[5];
        if (r.fields.size() >= 7) {
          pb::SandboxSpec holder;
          if (holder.ParseFromString(r.fields[6])) e.env = holder.env();
          e.env_journaled = true;
        }
        sandboxes_[r.key] = std::move(e);
      } else if (r.type == kRequestRecord && r.fields.size() >= 3) {
        RequestEntry req{r.fields[0], r.fields[1],
                         absl::FromUnixMicros(std::stoll(r.fields[2]))};
        if (req.expiry > now) requests_[r.key] = std::move(req);
      } else if (r.type == kPoolRecord && r.fields.size() >= 2) {
        Pool pool;
        if (!pool.spec.ParseFromString(r.fields[0])) continue;
        pool.generation = std::stoll(r.fields[1]);
        pool.key = PoolKey(pool.spec.template_(), options_.default_backend);
        pools_[r.key] = std::move(pool);
      }
    }
  }
  // READY sandboxes whose backend kept them alive (containers are not our
  // children) are adopted again when they still answer.
  std::map<std::string, pb::Endpoint> adopted = Readopt(now);
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, e] : sandboxes_) {
      pb::SandboxStatus* st = e.record.mutable_status();
      if (Live(st->phase()) && !st->has_ready_time() &&
          st->phase() != pb::SandboxStatus::TERMINATING && e.env_journaled &&
          backends_.count(e.backend) && FromProto(st->expire_time()) > now) {
        // A create the restart interrupted goes on: what was launched died
        // with us, so launch it again (a new attempt, same id and tokens).
        // Its request id then answers READY, not a lost sandbox.
        if (!e.ref.value.empty() && doomed_refs.insert(e.ref.value).second) {
          doomed.emplace_back(backends_.at(e.backend).get(), e.ref);
        }
        e.ref = BackendRef{};
        st->clear_endpoint();
        st->clear_backend_ref();
        st->set_phase(pb::SandboxStatus::PENDING);
        st->set_launch(pb::SandboxStatus::COLD);
        e.record.set_uid(RandomId("", 26));
        e.expire = FromProto(st->expire_time());
        e.ready_deadline = now + options_.default_ready_timeout;
        e.started = now;
        e.wait_ready = true;
        ScheduleExpire(e);
        Publish(e, pb::SandboxEvent::MODIFIED);
        resumed.push_back(id);
        counters_["creates_resumed"]++;
        continue;
      }
      if (auto a = adopted.find(id); a != adopted.end()) {
        // Same id, tokens and expiry: its clients go on as if nothing
        // happened.
        *st->mutable_endpoint() = a->second;
        e.expire = FromProto(st->expire_time());
        ScheduleExpire(e);
        ref_owner_[e.ref.value] = id;
        doomed_refs.insert(e.ref.value);  // ListOwned below must keep it
        absl::Duration idle = FromProto(e.record.spec().idle_timeout());
        if (idle > absl::ZeroDuration()) {
          Schedule(now + std::clamp(idle / 4, absl::Milliseconds(20), absl::Seconds(1)),
                   Task{TaskKind::kIdle, id});
        }
        Publish(e, pb::SandboxEvent::MODIFIED);
        counters_["readopted"]++;
        continue;
      }
      if (Live(st->phase())) {
        pb::Exit* exit = st->mutable_exit();
        exit->set_reason(pb::Exit::BACKEND_LOST);
        exit->set_message("providerd restarted; the sandbox did not survive it");
        st->set_phase(pb::SandboxStatus::TERMINATED);
        *st->mutable_end_time() = ToProto(now);
        counters_["backend_lost"]++;
        auto b = backends_.find(e.backend);
        if (!e.ref.value.empty() && b != backends_.end() &&
            doomed_refs.insert(e.ref.value).second) {
          doomed.emplace_back(b->second.get(), e.ref);
        }
      }
      Publish(e, pb::SandboxEvent::MODIFIED);  // versions of this epoch
      Schedule(FromProto(st->end_time()) + options_.retention,
               Task{TaskKind::kRetention, id});
    }
    for (auto& [rid, req] : requests_) {
      Schedule(req.expiry, Task{TaskKind::kRequestExpiry, rid});
    }
    // Compact: only live state is kept.
    std::vector<JournalRecord> live = LiveRecords();
    if (absl::Status s = journal_->Rewrite(live); !s.ok()) return s;
  }
  for (auto& [name, backend] : backends_) {
    auto owned = backend->ListOwned(options_.instance);
    if (!owned.ok()) {
      fprintf(stderr, "providerd: %s: ListOwned: %s\n", name.c_str(),
              owned.status().ToString().c_str());
      continue;
    }
    for (BackendRef& ref : *owned) {
      if (doomed_refs.insert(ref.value).second) doomed.emplace_back(backend.get(), ref);
    }
  }
  // Destroy in parallel on the workers; Start returns once all are gone.
  absl::Mutex done_mu;
  size_t done = 0;
  for (auto& [backend, ref] : doomed) {
    Backend* b = backend;
    BackendRef r = ref;
    workers_->Submit([b, r, &done_mu, &done] {
      absl::Status s = b->Destroy(r, absl::ZeroDuration());
      if (!s.ok()) fprintf(stderr, "providerd: destroy %s: %s\n", r.value.c_str(),
                           s.ToString().c_str());
      absl::MutexLock lock(&done_mu);
      ++done;
    });
  }
  {
    std::pair<size_t*, size_t> progress(&done, doomed.size());
    absl::MutexLock lock(&done_mu);
    done_mu.Await(absl::Condition(
        +[](std::pair<size_t*, size_t>* p) { return *p->first == p->second; }, &progress));
  }
  for (auto& [name, backend] : backends_) {
    if (absl::Status s = backend->Watch(this); !s.ok()) {
      fprintf(stderr, "providerd: %s: Watch: %s\n", name.c_str(), s.ToString().c_str());
    }
  }
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
    for (auto& [name, pool] : pools_) Replenish(pool);
  }
  for (const std::string& id : resumed) {
    SubmitLaunch([this, id] { RunLaunch(id); });
  }
  reaper_ = std::thread([this] { ReaperLoop(); });
  return absl::OkStatus();
}

std::map<std::string, pb::Endpoint> ControllerImpl::Readopt(absl::Time now) {
  struct Candidate {
    std::string id;
    Backend* backend;
    BackendRef ref;
    std::string admin_token;
  };
  std::vector<Candidate> candidates;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, e] : sandboxes_) {
      const pb::SandboxStatus& st = e.record.status();
      auto b = backends_.find(e.backend);
      if (st.phase() != pb::SandboxStatus::READY || e.ref.value.empty() ||
          b == backends_.end() || !b->second->SandboxesSurviveRestart() ||
          FromProto(st.expire_time()) <= now) {
        continue;
      }
      candidates.push_back({id, b->second.get(), e.ref, e.admin_token});
    }
  }
  if (candidates.empty()) return {};
  // In parallel, and within kReadoptTimeout however slow a backend is: a
  // check still running then counts as lost (its task owns what it uses).
  struct Shared {
    absl::Mutex mu;
    std::map<std::string, pb::Endpoint> adopted ABSL_GUARDED_BY(mu);
    size_t done ABSL_GUARDED_BY(mu) = 0;
    bool closed ABSL_GUARDED_BY(mu) = false;
  };
  auto shared = std::make_shared<Shared>();
  const absl::Time deadline = absl::Now() + kReadoptTimeout;
  DaemonAgent* agent = agent_.get();
  for (Candidate& c : candidates) {
    workers_->Submit([shared, c, deadline, agent] {
      std::optional<pb::Endpoint> endpoint;
      auto observed = c.backend->Inspect(c.ref);
      if (observed.ok() && observed->state == Observed::State::kRunning) {
        auto resolved = c.backend->ResolveEndpoint(c.ref);
        if (resolved.ok() && agent->CheckReady(*resolved, c.admin_token, deadline).ok()) {
          endpoint = *resolved;
        }
      }
      absl::MutexLock lock(&shared->mu);
      if (endpoint && !shared->closed) shared->adopted[c.id] = *endpoint;
      ++shared->done;
    });
  }
  absl::MutexLock lock(&shared->mu);
  const size_t total = candidates.size();
  std::pair<size_t*, size_t> progress(&shared->done, total);
  shared->mu.AwaitWithDeadline(
      absl::Condition(
          +[](std::pair<size_t*, size_t>* p) { return *p->first == p->second; }, &progress),
      deadline + absl::Milliseconds(500));
  shared->closed = true;
  if (shared->done < total) {
    fprintf(stderr, "providerd: %zu sandbox(es) did not answer within %s of the restart\n",
            total - shared->done, absl::FormatDuration(kReadoptTimeout).c_str());
  }
  return std::move(shared->adopted);
}

void ControllerImpl::Shutdown(bool destroy_all) {
  std::vector<std::pair<Backend*, BackendRef>> doomed;
  Later later;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    if (!started_) {
      stopped_ = true;
      return;
    }
    for (auto& [mid, m] : members_) {
      m.doomed = true;
      if (m.ready) {
        auto b = backends_.find(m.backend);
        if (b != backends_.end()) doomed.emplace_back(b->second.get(), m.ref);
      }
    }
    for (auto& [name, pool] : pools_) pool.ready.clear();
    absl::Time now = absl::Now();
    for (auto& [id, e] : sandboxes_) {
      Phase phase = e.record.status().phase();
      if (!Live(phase)) continue;
      if (phase == pb::SandboxStatus::PENDING || phase == pb::SandboxStatus::STARTING) {
        // The launch task sees shutting_down_ and ends it.
        e.stop_requested = true;
        e.stop_exit.set_reason(pb::Exit::DELETED);
        e.stop_exit.set_message("providerd shut down during the start");
        if (e.waiting_for_member) {
          e.waiting_for_member = false;
          MarkTerminated(e, e.stop_exit, &later);
        }
        continue;
      }
      if (destroy_all && phase == pb::SandboxStatus::READY) {
        auto b = backends_.find(e.backend);
        if (b != backends_.end() && !e.ref.value.empty()) {
          doomed.emplace_back(b->second.get(), e.ref);
        }
        pb::Exit exit;
        exit.set_reason(pb::Exit::DELETED);
        exit.set_message("providerd shut down");
        *e.record.mutable_status()->mutable_end_time() = ToProto(now);
        MarkTerminated(e, exit, &later);
      }
    }
    reaper_cv_.SignalAll();
  }
  Run(later);
  for (auto& [b, ref] : doomed) {
    Backend* backend = b;
    BackendRef r = ref;
    workers_->Submit([backend, r] { (void)backend->Destroy(r, absl::ZeroDuration()); });
  }
  launch_workers_->Stop();  // launches in flight see shutting_down_ and unwind
  workers_->Stop();
  if (reaper_.joinable()) reaper_.join();
  for (auto& [name, backend] : backends_) backend->Shutdown();
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    // Whoever still waits gets an answer.
    for (auto& [id, e] : sandboxes_) {
      for (auto& [replayed, cb] : e.create_waiters) {
        later.push_back([cb = std::move(cb)] {
          cb(ProviderError(absl::StatusCode::kUnavailable, kReasonShuttingDown,
                           "providerd is shutting down"));
        });
      }
      e.create_waiters.clear();
      for (auto& [wid, w] : e.wait_waiters) {
        pb::WaitSandboxResponse resp;
        *resp.mutable_sandbox() = e.record;
        later.push_back([cb = std::move(w.done), resp] { cb(resp); });
      }
      e.wait_waiters.clear();
      for (auto& cb : e.delete_waiters) {
        later.push_back([cb = std::move(cb), rec = e.record] { cb(rec); });
      }
      e.delete_waiters.clear();
    }
  }
  Run(later);
}

void ControllerImpl::Submit(std::function<void()> task) {
  if (!workers_->Submit(std::move(task))) {
    fprintf(stderr, "providerd: a task was refused during shutdown\n");
  }
}

void ControllerImpl::SubmitLaunch(std::function<void()> task) {
  if (!launch_workers_->Submit(std::move(task))) {
    fprintf(stderr, "providerd: a start was refused during shutdown\n");
  }
}

// ---------------------------------------------------------------- create

absl::Status ControllerImpl::ValidateCreate(const pb::CreateSandboxRequest& request,
                                            const std::string& request_id,
                                            Backend** backend) const {
  if (request_id.empty()) {
    return Invalid(kReasonInvalidSpec,
                   "request_id is required (or the x-idempotency-key metadata)");
  }
  if (request_id.size() > 256) return Invalid(kReasonInvalidSpec, "request_id is too long");
  if (!request.sandbox_id().empty() && !IsValidSandboxId(request.sandbox_id())) {
    return Invalid(kReasonInvalidSpec,
                   absl::StrCat("sandbox_id '", request.sandbox_id(),
                                "' must match [a-z0-9][a-z0-9-]{0,62}"));
  }
  const pb::SandboxSpec& spec = request.spec();
  std::string backend_name = spec.backend().empty() ? options_.default_backend : spec.backend();
  auto it = backends_.find(backend_name);
  if (it == backends_.end()) {
    return Invalid(kReasonInvalidSpec, absl::StrCat("unknown backend '", backend_name, "'"));
  }
  *backend = it->second.get();
  if (spec.image().empty() && spec.bundle().ref_case() == pb::BundleRef::REF_NOT_SET) {
    return Invalid(kReasonInvalidSpec, "spec needs an image or a bundle");
  }
  absl::Duration ttl = FromProto(spec.ttl());
  if (ttl < absl::ZeroDuration()) return Invalid(kReasonInvalidSpec, "spec.ttl is negative");
  if (ttl > options_.max_lifetime) {
    return Invalid(kReasonTtlTooLong,
                   absl::StrCat("spec.ttl ", absl::FormatDuration(ttl),
                                " is above the server's max_lifetime ",
                                absl::FormatDuration(options_.max_lifetime)));
  }
  if (FromProto(spec.idle_timeout()) < absl::ZeroDuration()) {
    return Invalid(kReasonInvalidSpec, "spec.idle_timeout is negative");
  }
  if (FromProto(request.ready_timeout()) < absl::ZeroDuration()) {
    return Invalid(kReasonInvalidSpec, "ready_timeout is negative");
  }
  std::map<std::string, std::string> labels(request.labels().begin(), request.labels().end());
  if (absl::Status s = ValidateLabels(labels, /*allow_reserved=*/false); !s.ok()) return s;
  for (const auto& [k, v] : spec.env()) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
      return Invalid(kReasonInvalidSpec, absl::StrCat("env name '", k, "' is invalid"));
    }
  }
  LaunchSpec launch;
  launch.sandbox_id = request.sandbox_id().empty() ? "sbx-validate" : request.sandbox_id();
  launch.spec = spec;
  launch.labels = labels;
  launch.instance = options_.instance;
  return (*backend)->Validate(launch);
}

absl::StatusOr<CreateResult> ControllerImpl::CreateOutcome(const Entry& e, bool replayed) {
  const pb::SandboxStatus& st = e.record.status();
  if (Terminal(st.phase()) && !st.has_ready_time()) {
    const pb::Exit& exit = st.exit();
    std::string message = absl::StrCat("sandbox ", e.record.id(), " did not start: ",
                                       pb::Exit::Reason_Name(exit.reason()), ": ",
                                       exit.message());
    if (!exit.log_tail().empty()) {
      absl::StrAppend(&message, "\n--- output tail ---\n", Truncate(exit.log_tail(), 4096));
    }
    switch (exit.reason()) {
      case pb::Exit::READY_TIMEOUT:
        return ProviderError(absl::StatusCode::kDeadlineExceeded, kReasonReadyTimeout, message);
      case pb::Exit::START_FAILED:
      case pb::Exit::OOM_KILLED:
      case pb::Exit::COMPLETED:
        return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonStartFailed, message);
      default:
        return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonTerminated, message);
    }
  }
  CreateResult result;
  result.sandbox = e.record;
  result.access_token = e.access_token;
  result.replayed = replayed;
  return result;
}

void ControllerImpl::Notify(Entry& e, Later* later) {
  Phase phase = e.record.status().phase();
  bool ready = phase == pb::SandboxStatus::READY;
  if (ready || Terminal(phase)) {
    for (auto& [replayed, cb] : e.create_waiters) {
      later->push_back([cb = std::move(cb), result = CreateOutcome(e, replayed)] {
        cb(result);
      });
    }
    e.create_waiters.clear();
  }
  for (auto it = e.wait_waiters.begin(); it != e.wait_waiters.end();) {
    Phase until = it->second.until;
    bool reached = phase >= until;
    bool impossible = Terminal(phase) && until == pb::SandboxStatus::READY &&
                      !e.record.status().has_ready_time();
    if (reached || Terminal(phase)) {
      pb::WaitSandboxResponse resp;
      *resp.mutable_sandbox() = e.record;
      resp.set_reached(reached && !impossible);
      later->push_back([cb = std::move(it->second.done), resp] { cb(resp); });
      it = e.wait_waiters.erase(it);
    } else {
      ++it;
    }
  }
  if (Terminal(phase)) {
    for (auto& cb : e.delete_waiters) {
      later->push_back([cb = std::move(cb), rec = e.record] { cb(rec); });
    }
    e.delete_waiters.clear();
  }
}

void ControllerImpl::CreateSandbox(const pb::CreateSandboxRequest& request,
                                   std::string idempotency_key, CreateCallback done) {
  std::string request_id = request.request_id().empty() ? idempotency_key : request.request_id();
  Backend* backend = nullptr;
  absl::Status valid = ValidateCreate(request, request_id, &backend);
  std::string payload_hash = PayloadHash(request);
  Later later;
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || shutting_down_) {
      error = ProviderError(absl::StatusCode::kUnavailable, kReasonShuttingDown,
                            started_ ? "providerd is shutting down" : "providerd is not started");
    } else if (auto rit = requests_.find(request_id);
               !request_id.empty() && rit != requests_.end()) {
      // A replay is answered before validation so a changed server config
      // cannot turn a retry into an error; only the payload must match.
      if (rit->second.payload_hash != payload_hash) {
        error = Invalid(kReasonRequestIdReused,
                        absl::StrCat("request_id '", request_id,
                                     "' was used for another request (sandbox ",
                                     rit->second.sandbox_id, ")"));
      } else if (auto sit = sandboxes_.find(rit->second.sandbox_id); sit == sandboxes_.end()) {
        error = ProviderError(absl::StatusCode::kNotFound, kReasonSandboxNotFound,
                              absl::StrCat("the sandbox of request_id '", request_id, "' (",
                                           rit->second.sandbox_id,
                                           ") ended and its record expired"));
      } else {
        Entry& e = sit->second;
        counters_["replays"]++;
        Phase phase = e.record.status().phase();
        if (request.wait() == pb::CreateSandboxRequest::RETURN_PENDING ||
            phase == pb::SandboxStatus::READY || phase == pb::SandboxStatus::TERMINATING ||
            Terminal(phase)) {
          later.push_back([done, result = CreateOutcome(e, true)] { done(result); });
        } else {
          e.create_waiters.emplace_back(true, std::move(done));
        }
      }
    } else if (!valid.ok()) {
      error = valid;
    } else if (!request.sandbox_id().empty() && sandboxes_.count(request.sandbox_id())) {
      error = ProviderError(absl::StatusCode::kAlreadyExists, kReasonSandboxIdTaken,
                            absl::StrCat("sandbox_id '", request.sandbox_id(),
                                         "' is taken by another request"));
    } else {
      const pb::SandboxSpec& spec = request.spec();
      std::string key = PoolKey(spec, options_.default_backend);
      Pool* pool = nullptr;
      if (!spec.warm_pool().empty()) {
        auto pit = pools_.find(spec.warm_pool());
        if (pit == pools_.end()) {
          error = ProviderError(absl::StatusCode::kNotFound, kReasonPoolNotFound,
                                absl::StrCat("no warm pool '", spec.warm_pool(), "'"));
        } else if (std::string diff = PoolKeyDiff(pit->second.spec.template_(), spec,
                                                  options_.default_backend);
                   !diff.empty()) {
          error = ProviderError(absl::StatusCode::kFailedPrecondition, kReasonPoolMismatch,
                                absl::StrCat("spec.", diff, " differs from warm pool '",
                                             spec.warm_pool(), "''s template"));
        } else {
          pool = &pit->second;
        }
      } else {
        pool = MatchPool(spec, key);
      }
      int live = 0;
      if (error.ok() && options_.max_sandboxes > 0) {
        for (auto& [id, e] : sandboxes_) live += Live(e.record.status().phase()) ? 1 : 0;
      }
      bool has_member = pool && !pool->ready.empty();
      bool miss_fail = pool && !has_member &&
                       request.on_pool_miss() == pb::CreateSandboxRequest::FAIL;
      if (!error.ok()) {
      } else if (miss_fail) {
        error = WithRetryAfter(
            ProviderError(absl::StatusCode::kResourceExhausted, kReasonPoolMiss,
                          absl::StrCat("warm pool '", pool->spec.name(),
                                       "' has no ready member")),
            absl::Seconds(1));
      } else if (options_.max_sandboxes > 0 && live >= options_.max_sandboxes) {
        error = WithRetryAfter(
            ProviderError(absl::StatusCode::kResourceExhausted, kReasonQuota,
                          absl::StrCat("max_sandboxes (", options_.max_sandboxes,
                                       ") live sandboxes")),
            absl::Seconds(1));
      } else {
        absl::Time now = absl::Now();
        std::string id = request.sandbox_id();
        while (id.empty() || sandboxes_.count(id)) id = RandomId("sbx-", 10);
        absl::Duration ttl = FromProto(spec.ttl());
        if (ttl == absl::ZeroDuration()) ttl = std::min(options_.default_ttl, options_.max_lifetime);
        absl::Duration ready_timeout = FromProto(request.ready_timeout());
        if (ready_timeout == absl::ZeroDuration()) ready_timeout = options_.default_ready_timeout;
        Entry e;
        e.record.set_id(id);
        e.record.set_uid(RandomId("", 26));
        e.record.set_request_id(request_id);
        e.record.mutable_labels()->insert(request.labels().begin(), request.labels().end());
        (*e.record.mutable_labels())[kLabelSandboxId] = id;
        e.record.mutable_annotations()->insert(request.annotations().begin(),
                                               request.annotations().end());
        *e.record.mutable_spec() = spec;
        e.record.mutable_spec()->set_backend(std::string(backend->name()));
        // env reaches only the sandbox; it is not echoed in records.
        e.record.mutable_spec()->clear_env();
        pb::SandboxStatus* st = e.record.mutable_status();
        st->set_phase(pb::SandboxStatus::PENDING);
        st->set_launch(pb::SandboxStatus::COLD);  // ClaimMember makes it WARM
        *st->mutable_create_time() = ToProto(now);
        e.expire = now + ttl;
        *st->mutable_expire_time() = ToProto(e.expire);
        e.ready_deadline = now + ready_timeout;
        e.started = now;
        e.backend = std::string(backend->name());
        e.access_token = RandomToken();
        e.admin_token = RandomToken();
        e.spec_hash = key;
        e.wait_ready = request.wait() != pb::CreateSandboxRequest::RETURN_PENDING;
        RequestEntry req{id, payload_hash,
                         std::max(now + options_.request_id_retention,
                                  e.expire + options_.request_id_retention)};
        // Journal the request and the record before anything starts.
        absl::Status journaled = JournalRequest(request_id, req);
        if (!journaled.ok()) {
          error = ProviderError(absl::StatusCode::kUnavailable, "",
                                absl::StrCat("cannot journal: ", journaled.message()));
        } else {
          // The full spec (with env) is needed to launch; keep it aside.
          auto [it, inserted] = sandboxes_.emplace(id, std::move(e));
          Entry& entry = it->second;
          requests_[request_id] = req;
          Schedule(req.expiry, Task{TaskKind::kRequestExpiry, request_id});
          ScheduleExpire(entry);
          Publish(entry, pb::SandboxEvent::ADDED);
          entry.env = spec.env();
          JournalSandbox(entry);
          if (entry.wait_ready) {
            entry.create_waiters.emplace_back(false, std::move(done));
          } else {
            later.push_back([done, result = CreateOutcome(entry, false)] { done(result); });
          }
          if (has_member && ClaimMember(*pool, entry, &later)) {
          } else if (pool && request.on_pool_miss() ==
                                 pb::CreateSandboxRequest::WAIT_FOR_MEMBER) {
            entry.waiting_for_member = true;
            pool->waiters.push_back(id);
            Schedule(entry.ready_deadline, Task{TaskKind::kMemberWaitTimeout, id});
            Replenish(*pool);  // a held refill starts now: a claim waits for it
          } else {
            if (pool) {
              pool->cold_fallbacks++;
              counters_["pool_cold_fallbacks"]++;
            }
            std::string sid = id;
            SubmitLaunch([this, sid] { RunLaunch(sid); });
          }
        }
      }
    }
  }
  if (!error.ok()) later.push_back([done, error] { done(error); });
  Run(later);
}

// ---------------------------------------------------------------- launch

std::optional<Observed> ControllerImpl::TakeEarlyExit(const std::string& ref) {
  absl::MutexLock lock(&mu_);
  auto it = early_exits_.find(ref);
  if (it == early_exits_.end()) return std::nullopt;
  Observed o = it->second.first;
  early_exits_.erase(it);
  return o;
}

absl::StatusOr<pb::Endpoint> ControllerImpl::AwaitReady(Backend* backend, const BackendRef& ref,
                                                        const std::string& admin_token,
                                                        absl::Time deadline,
                                                        const std::function<bool()>& stop) {
  // Until the endpoint resolves (for the local backend: until the daemon's
  // socket exists) a look is a stat or a cache read: every kEndpointPoll
  // for the first second (a local daemon listens within ~50 ms), so a
  // create returns within ~2 ms of the daemon listening rather than up to
  // a 20 ms back-off step later (issue 25, cold start). Failed health
  // checks, which are RPCs, slower starts (pods) and starts beyond the
  // first kFastPollStarts at once back off as before.
  constexpr absl::Duration kEndpointPoll = absl::Milliseconds(2);
  constexpr int kFastPollStarts = 4;
  const absl::Time fast_until = absl::Now() + absl::Seconds(1);
  const bool may_poll_fast = awaiting_ready_.fetch_add(1) < kFastPollStarts;
  struct Leave {
    std::atomic<int>& n;
    ~Leave() { n.fetch_sub(1); }
  } leave{awaiting_ready_};
  absl::Duration delay = absl::Milliseconds(2);
  absl::Time next_inspect = absl::Now() + absl::Milliseconds(100);
  absl::Status last = absl::UnavailableError("not started yet");
  for (;;) {
    bool checked = false;
    if (stop()) return absl::CancelledError("stopped");
    if (auto exit = TakeEarlyExit(ref.value)) {
      return absl::FailedPreconditionError(absl::StrCat(
          exit->oom_killed ? "OOM-killed" : "exited",
          exit->exit_code ? absl::StrCat(" with code ", *exit->exit_code) : "",
          " before it was ready", exit->reason.empty() ? "" : ": ", exit->reason));
    }
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("not ready before ready_timeout; last: ", last.ToString()));
    }
    auto endpoint = backend->ResolveEndpoint(ref);
    if (endpoint.ok()) {
      checked = true;
      absl::Status check = agent_->CheckReady(*endpoint, admin_token,
                                              std::min(deadline, now + absl::Seconds(1)));
      if (check.ok()) return *endpoint;
      if (check.code() == absl::StatusCode::kFailedPrecondition) return check;
      last = check;
    } else if (endpoint.status().code() != absl::StatusCode::kUnavailable) {
      return absl::FailedPreconditionError(
          absl::StrCat("endpoint: ", endpoint.status().ToString()));
    } else {
      last = endpoint.status();
    }
    if (now >= next_inspect) {
      next_inspect = now + absl::Milliseconds(100);
      auto observed = backend->Inspect(ref);
      if (observed.ok() && (observed->state == Observed::State::kExited ||
                            observed->state == Observed::State::kMissing)) {
        return absl::FailedPreconditionError(absl::StrCat(
            observed->oom_killed ? "OOM-killed" : "exited",
            observed->exit_code ? absl::StrCat(" with code ", *observed->exit_code) : "",
            " before it was ready", observed->reason.empty() ? "" : ": ", observed->reason));
      }
    }
    const bool fast = may_poll_fast && !checked && absl::Now() < fast_until;
    absl::SleepFor(std::min(fast ? kEndpointPoll : delay,
                            std::max(absl::ZeroDuration(), deadline - absl::Now())));
    if (!fast) delay = std::min(delay * 2, absl::Milliseconds(20));
  }
}

absl::Status ControllerImpl::AwaitWorkerBooted(const pb::Endpoint& endpoint,
                                               const std::string& admin_token,
                                               absl::Time deadline,
                                               const std::function<bool()>& stop) {
  absl::Duration delay = absl::Milliseconds(2);
  absl::Status last = absl::OkStatus();
  for (;;) {
    if (stop()) return absl::CancelledError("stopped");
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the worker did not boot before ready_timeout", last.ok() ? "" : "; last: ",
          last.ok() ? "" : last.ToString()));
    }
    auto status = agent_->GetStatus(endpoint, admin_token,
                                    std::min(deadline, now + absl::Seconds(1)));
    if (status.ok()) {
      if (!status->worker_booting) return absl::OkStatus();
    } else if (status.status().code() == absl::StatusCode::kUnavailable ||
               status.status().code() == absl::StatusCode::kDeadlineExceeded) {
      last = status.status();
    } else {
      return absl::FailedPreconditionError(
          absl::StrCat("status: ", status.status().ToString()));
    }
    absl::SleepFor(std::min(delay, std::max(absl::ZeroDuration(), deadline - absl::Now())));
    delay = std::min(delay * 2, absl::Milliseconds(10));
  }
}

void ControllerImpl::RunLaunch(const std::string& id) {
  LaunchSpec launch;
  Backend* backend = nullptr;
  absl::Time deadline;
  Later later;
  {
    absl::MutexLock lock(&mu_);
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end()) return;
    Entry& e = it->second;
    if (e.stop_requested || shutting_down_) {
      pb::Exit exit = e.stop_exit;
      if (exit.reason() == pb::Exit::REASON_UNSPECIFIED) exit.set_reason(pb::Exit::DELETED);
      MarkTerminated(e, exit, &later);
    } else {
      backend = backends_.at(e.backend).get();
      launch.sandbox_id = id;
      launch.uid = e.record.uid();
      launch.spec = e.record.spec();
      *launch.spec.mutable_env() = e.env;
      launch.labels.insert(e.record.labels().begin(), e.record.labels().end());
      launch.labels[kLabelManagedBy] = options_.instance;
      launch.admin_token = e.admin_token;
      launch.instance = options_.instance;
      launch.request_id = e.record.request_id();  // for adoption after a lost answer (409)
      launch.expire_time = e.expire;
      deadline = e.ready_deadline;
      SetPhase(e, pb::SandboxStatus::STARTING, &later);
    }
  }
  Run(later);
  if (!backend) return;
  auto ref = backend->Launch(launch, deadline);
  if (!ref.ok()) {
    pb::Exit exit;
    bool timeout = ref.status().code() == absl::StatusCode::kDeadlineExceeded;
    exit.set_reason(timeout ? pb::Exit::READY_TIMEOUT : pb::Exit::START_FAILED);
    exit.set_message(absl::StrCat("launch: ", ref.status().message()));
    exit.set_log_tail(Truncate(std::string(ref.status().message()), kLogTailBytes));
    FinishStart(id, exit);
    return;
  }
  std::string admin_token;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = sandboxes_.at(id);
    e.ref = *ref;
    ref_owner_[ref->value] = id;
    e.record.mutable_status()->set_backend_ref(ref->value);
    JournalSandbox(e);
    admin_token = e.admin_token;
  }
  auto stop = [this, &id] {
    absl::MutexLock lock(&mu_);
    return shutting_down_ || sandboxes_.at(id).stop_requested;
  };
  auto endpoint = AwaitReady(backend, *ref, admin_token, deadline, stop);
  if (!endpoint.ok()) {
    pb::Exit exit;
    if (endpoint.status().code() == absl::StatusCode::kCancelled) {
      absl::MutexLock lock(&mu_);
      exit = sandboxes_.at(id).stop_exit;
      if (exit.reason() == pb::Exit::REASON_UNSPECIFIED) {
        exit.set_reason(pb::Exit::DELETED);
        exit.set_message("providerd shut down during the start");
      }
    } else {
      bool timeout = endpoint.status().code() == absl::StatusCode::kDeadlineExceeded;
      bool oom = absl::StrContains(endpoint.status().message(), "OOM-killed");
      exit.set_reason(timeout ? pb::Exit::READY_TIMEOUT
                              : oom ? pb::Exit::OOM_KILLED : pb::Exit::START_FAILED);
      exit.set_message(std::string(endpoint.status().message()));
      exit.set_log_tail(backend->LogTail(*ref, kLogTailBytes));
    }
    FinishStart(id, exit);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    *sandboxes_.at(id).record.mutable_status()->mutable_endpoint() = *endpoint;
  }
  RunActivate(id);
}

// Arms the sandbox with its access token, env and labels; then READY.
void ControllerImpl::RunActivate(const std::string& id) {
  pb::Endpoint endpoint;
  std::string admin_token;
  ActivateParams params;
  absl::Time deadline;
  Backend* backend = nullptr;
  BackendRef ref;
  Later later;
  bool warm = false;
  ClaimInfo claim;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = sandboxes_.at(id);
    if (e.record.status().phase() == pb::SandboxStatus::PENDING) {
      SetPhase(e, pb::SandboxStatus::STARTING, &later);
    }
    warm = e.record.status().launch() == pb::SandboxStatus::WARM;
    claim.sandbox_id = id;
    claim.labels.insert(e.record.labels().begin(), e.record.labels().end());
    endpoint = e.record.status().endpoint();
    admin_token = e.admin_token;
    params.sandbox_id = id;
    params.token = e.access_token;
    params.env.insert(e.env.begin(), e.env.end());
    params.labels.insert(e.record.labels().begin(), e.record.labels().end());
    deadline = std::max(e.ready_deadline, absl::Now() + absl::Seconds(1));
    backend = backends_.at(e.backend).get();
    ref = e.ref;
  }
  Run(later);
  if (warm) {
    // The backend's record of the claim (Kubernetes: one conditional PATCH).
    absl::Status claimed = backend->Claim(ref, claim);
    if (!claimed.ok()) {
      if ((claimed.code() == absl::StatusCode::kAborted ||
           claimed.code() == absl::StatusCode::kNotFound) &&
          ReclaimAfterConflict(id, ref)) {
        return;
      }
      pb::Exit exit;
      exit.set_reason(pb::Exit::START_FAILED);
      exit.set_message(absl::StrCat("claim: ", claimed.ToString()));
      FinishStart(id, exit);
      return;
    }
  }
  absl::Status armed = agent_->Activate(endpoint, admin_token, params, deadline);
  if (!armed.ok()) {
    pb::Exit exit;
    exit.set_reason(pb::Exit::START_FAILED);
    exit.set_message(absl::StrCat("activate: ", armed.ToString()));
    exit.set_log_tail(backend->LogTail(ref, kLogTailBytes));
    FinishStart(id, exit);
    return;
  }
  MakeReady(id, endpoint, "");
}

bool ControllerImpl::ReclaimAfterConflict(const std::string& id, const BackendRef& lost) {
  Later later;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = sandboxes_.at(id);
    if (e.stop_requested || shutting_down_) return false;
    // The lost member is not ours any more: forget it, never destroy it.
    ref_owner_.erase(lost.value);
    early_exits_.erase(lost.value);
    e.ref = BackendRef{};
    pb::SandboxStatus* st = e.record.mutable_status();
    st->clear_endpoint();
    st->clear_backend_ref();
    st->set_launch(pb::SandboxStatus::COLD);
    counters_["pool_claim_conflicts"]++;
    auto pit = pools_.find(e.record.pool());
    if (pit != pools_.end() && ClaimMember(pit->second, e, &later)) {
      // ClaimMember submitted the next member's activation.
    } else {
      if (pit != pools_.end()) {
        pit->second.cold_fallbacks++;
        counters_["pool_cold_fallbacks"]++;
      }
      e.admin_token = RandomToken();
      JournalSandbox(e);
      std::string sid = id;
      SubmitLaunch([this, sid] { RunLaunch(sid); });
    }
  }
  Run(later);
  return true;
}

void ControllerImpl::MakeReady(const std::string& id, const pb::Endpoint& endpoint,
                               const std::string& node) {
  Later later;
  bool stop = false;
  pb::Exit stop_exit;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = sandboxes_.at(id);
    if (e.stop_requested || shutting_down_) {
      stop = true;
      stop_exit = e.stop_exit;
      if (stop_exit.reason() == pb::Exit::REASON_UNSPECIFIED) {
        stop_exit.set_reason(pb::Exit::DELETED);
        stop_exit.set_message("providerd shut down during the start");
      }
    } else if (auto exited = early_exits_.find(e.ref.value); exited != early_exits_.end()) {
      // It died while being armed (a warm member has no readiness poll).
      stop = true;
      const Observed& o = exited->second.first;
      stop_exit.set_reason(o.oom_killed ? pb::Exit::OOM_KILLED : pb::Exit::START_FAILED);
      stop_exit.set_message(absl::StrCat("exited while being activated", o.reason.empty() ? "" : ": ",
                                         o.reason));
      early_exits_.erase(exited);
    } else {
      absl::Time now = absl::Now();
      pb::SandboxStatus* st = e.record.mutable_status();
      *st->mutable_endpoint() = endpoint;
      if (!node.empty()) st->set_node(node);
      *st->mutable_ready_time() = ToProto(now);
      bool warm = st->launch() == pb::SandboxStatus::WARM;
      Observe(warm ? &acquire_hist_ : &create_hist_, now - e.started);
      SetPhase(e, pb::SandboxStatus::READY, &later);
      absl::Duration idle = FromProto(e.record.spec().idle_timeout());
      if (idle > absl::ZeroDuration()) {
        Schedule(now + std::clamp(idle / 4, absl::Milliseconds(20), absl::Seconds(1)),
                 Task{TaskKind::kIdle, id});
      }
    }
  }
  Run(later);
  if (stop) FinishStart(id, stop_exit);
}

void ControllerImpl::FinishStart(const std::string& id, pb::Exit exit) {
  Backend* backend = nullptr;
  BackendRef ref;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = sandboxes_.at(id);
    if (!e.ref.value.empty()) {
      backend = backends_.at(e.backend).get();
      ref = e.ref;
    }
    if (exit.reason() == pb::Exit::START_FAILED || exit.reason() == pb::Exit::READY_TIMEOUT ||
        exit.reason() == pb::Exit::OOM_KILLED) {
      counters_["start_failures"]++;
    }
  }
  if (backend) {
    if (absl::Status s = backend->Destroy(ref, absl::ZeroDuration()); !s.ok()) {
      fprintf(stderr, "providerd: destroy %s: %s\n", ref.value.c_str(), s.ToString().c_str());
    }
  }
  Later later;
  {
    absl::MutexLock lock(&mu_);
    MarkTerminated(sandboxes_.at(id), exit, &later);
  }
  Run(later);
}

void ControllerImpl::MarkTerminated(Entry& e, pb::Exit exit, Later* later) {
  if (Terminal(e.record.status().phase())) return;
  absl::Time now = absl::Now();
  pb::SandboxStatus* st = e.record.mutable_status();
  *st->mutable_exit() = std::move(exit);
  *st->mutable_end_time() = ToProto(now);
  if (e.delete_started != absl::Time()) Observe(&delete_hist_, now - e.delete_started);
  if (!e.ref.value.empty()) ref_owner_.erase(e.ref.value);
  if (e.expire_task) {
    tasks_.erase(*e.expire_task);
    e.expire_task.reset();
  }
  e.env.clear();
  SetPhase(e, pb::SandboxStatus::TERMINATED, later);
  Schedule(now + options_.retention, Task{TaskKind::kRetention, e.record.id()});
}

void ControllerImpl::BeginTerminate(Entry& e, pb::Exit exit, absl::Duration grace,
                                    Later* later) {
  Phase phase = e.record.status().phase();
  if (phase == pb::SandboxStatus::TERMINATING || Terminal(phase)) return;
  if (e.delete_started == absl::Time()) e.delete_started = absl::Now();
  if (phase == pb::SandboxStatus::PENDING || phase == pb::SandboxStatus::STARTING) {
    e.stop_requested = true;
    e.stop_exit = exit;
    if (e.waiting_for_member) {
      e.waiting_for_member = false;
      for (auto& [name, pool] : pools_) {
        auto& w = pool.waiters;
        w.erase(std::remove(w.begin(), w.end(), e.record.id()), w.end());
      }
      MarkTerminated(e, exit, later);
      return;
    }
    SetPhase(e, pb::SandboxStatus::TERMINATING, later);
    return;  // the start task ends it
  }
  SetPhase(e, pb::SandboxStatus::TERMINATING, later);
  std::string id = e.record.id();
  Backend* backend = backends_.at(e.backend).get();
  BackendRef ref = e.ref;
  bool want_tail = exit.reason() == pb::Exit::COMPLETED || exit.reason() == pb::Exit::OOM_KILLED;
  Submit([this, id, backend, ref, exit, grace, want_tail]() mutable {
    if (want_tail) exit.set_log_tail(backend->LogTail(ref, kLogTailBytes));
    if (absl::Status s = backend->Destroy(ref, grace); !s.ok()) {
      fprintf(stderr, "providerd: destroy %s: %s\n", ref.value.c_str(), s.ToString().c_str());
    }
    Later later;
    {
      absl::MutexLock lock(&mu_);
      auto it = sandboxes_.find(id);
      if (it != sandboxes_.end()) MarkTerminated(it->second, exit, &later);
    }
    Run(later);
  });
}

void ControllerImpl::OnObserved(const BackendRef& ref, const Observed& observed) {
  if (observed.state != Observed::State::kExited && observed.state != Observed::State::kMissing) {
    return;
  }
  Later later;
  {
    absl::MutexLock lock(&mu_);
    auto owner = ref_owner_.find(ref.value);
    if (owner == ref_owner_.end()) {
      // A launch still in flight, or a pool member: remember it.
      RememberExit(ref.value, observed);
      for (auto& [mid, m] : members_) {
        if (m.ref.value == ref.value && m.ready) {
          Pool& pool = pools_[m.pool];
          pool.ready.erase(std::remove(pool.ready.begin(), pool.ready.end(), mid),
                           pool.ready.end());
          early_exits_.erase(ref.value);
          DestroyMember(mid);
          Replenish(pool);
          break;
        }
      }
      return;
    }
    auto it = sandboxes_.find(owner->second);
    if (it == sandboxes_.end()) return;
    Entry& e = it->second;
    Phase phase = e.record.status().phase();
    if (phase == pb::SandboxStatus::READY) {
      pb::Exit exit;
      exit.set_reason(observed.oom_killed ? pb::Exit::OOM_KILLED
                      : observed.state == Observed::State::kMissing ? pb::Exit::BACKEND_LOST
                                                                    : pb::Exit::COMPLETED);
      if (observed.exit_code) exit.set_exit_code(*observed.exit_code);
      exit.set_message(observed.reason);
      if (exit.reason() == pb::Exit::BACKEND_LOST) counters_["backend_lost"]++;
      BeginTerminate(e, exit, absl::ZeroDuration(), &later);
    } else if (phase == pb::SandboxStatus::STARTING || phase == pb::SandboxStatus::PENDING) {
      RememberExit(ref.value, observed);
    }
  }
  Run(later);
}

// ---------------------------------------------------------------- reaper

void ControllerImpl::ReaperLoop() {
  absl::MutexLock lock(&mu_);
  while (!shutting_down_) {
    absl::Time now = absl::Now();
    if (tasks_.empty() || tasks_.begin()->first > now) {
      absl::Time until = tasks_.empty() ? now + absl::Seconds(10) : tasks_.begin()->first;
      reaper_cv_.WaitWithDeadline(&mu_, until);
      continue;
    }
    Later later;
    while (!tasks_.empty() && tasks_.begin()->first <= now) {
      Task task = std::move(tasks_.begin()->second);
      tasks_.erase(tasks_.begin());
      RunTask(task, &later);
    }
    mu_.Unlock();
    Run(later);
    mu_.Lock();
  }
}

void ControllerImpl::RunTask(const Task& task, Later* later) {
  absl::Time now = absl::Now();
  switch (task.kind) {
    case TaskKind::kExpire: {
      auto it = sandboxes_.find(task.id);
      if (it == sandboxes_.end()) return;
      Entry& e = it->second;
      e.expire_task.reset();  // this one, already popped
      if (!Live(e.record.status().phase())) return;
      if (e.expire > now) {  // extended meanwhile
        ScheduleExpire(e);
        return;
      }
      counters_["reaped_ttl"]++;
      pb::Exit exit;
      exit.set_reason(pb::Exit::TTL_EXPIRED);
      exit.set_message("the sandbox's ttl ran out");
      BeginTerminate(e, exit, options_.default_delete_grace, later);
      return;
    }
    case TaskKind::kIdle: {
      auto it = sandboxes_.find(task.id);
      if (it == sandboxes_.end() ||
          it->second.record.status().phase() != pb::SandboxStatus::READY) {
        return;
      }
      std::string id = task.id;
      Submit([this, id] { IdleCheck(id); });
      return;
    }
    case TaskKind::kRetention: {
      auto it = sandboxes_.find(task.id);
      if (it == sandboxes_.end() || !Terminal(it->second.record.status().phase())) return;
      if (FromProto(it->second.record.status().end_time()) + options_.retention > now) {
        Schedule(FromProto(it->second.record.status().end_time()) + options_.retention, task);
        return;
      }
      Publish(it->second, pb::SandboxEvent::DELETED);
      JournalErase(kSandboxRecord, task.id);
      sandboxes_.erase(it);
      return;
    }
    case TaskKind::kRequestExpiry: {
      auto it = requests_.find(task.id);
      if (it == requests_.end() || it->second.expiry > now) return;
      requests_.erase(it);
      JournalErase(kRequestRecord, task.id);
      return;
    }
    case TaskKind::kWaitTimeout: {
      auto it = sandboxes_.find(task.id);
      if (it == sandboxes_.end()) return;
      auto w = it->second.wait_waiters.find(task.extra);
      if (w == it->second.wait_waiters.end()) return;
      pb::WaitSandboxResponse resp;
      *resp.mutable_sandbox() = it->second.record;
      resp.set_reached(false);
      later->push_back([cb = std::move(w->second.done), resp] { cb(resp); });
      it->second.wait_waiters.erase(w);
      return;
    }
    case TaskKind::kPoolTick: {
      auto it = pools_.find(task.id);
      if (it != pools_.end()) Replenish(it->second);
      return;
    }
    case TaskKind::kMemberAge: {
      auto it = members_.find(task.id);
      if (it == members_.end() || !it->second.ready || !pools_.count(it->second.pool)) return;
      Pool& pool = pools_[it->second.pool];
      pool.ready.erase(std::remove(pool.ready.begin(), pool.ready.end(), task.id),
                       pool.ready.end());
      counters_["pool_recycled"]++;
      DestroyMember(task.id);
      Replenish(pool);
      return;
    }
    case TaskKind::kMemberWaitTimeout: {
      auto it = sandboxes_.find(task.id);
      if (it == sandboxes_.end() || !it->second.waiting_for_member) return;
      Entry& e = it->second;
      e.waiting_for_member = false;
      for (auto& [name, pool] : pools_) {
        auto& w = pool.waiters;
        w.erase(std::remove(w.begin(), w.end(), task.id), w.end());
      }
      pb::Exit exit;
      exit.set_reason(pb::Exit::READY_TIMEOUT);
      exit.set_message("no warm pool member became ready within ready_timeout");
      MarkTerminated(e, exit, later);
      return;
    }
  }
}

void ControllerImpl::IdleCheck(const std::string& id) {
  pb::Endpoint endpoint;
  std::string admin_token;
  absl::Duration idle_timeout;
  {
    absl::MutexLock lock(&mu_);
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end() ||
        it->second.record.status().phase() != pb::SandboxStatus::READY) {
      return;
    }
    endpoint = it->second.record.status().endpoint();
    admin_token = it->second.admin_token;
    idle_timeout = FromProto(it->second.record.spec().idle_timeout());
  }
  auto status = agent_->GetStatus(endpoint, admin_token, absl::Now() + absl::Seconds(2));
  Later later;
  {
    absl::MutexLock lock(&mu_);
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end() ||
        it->second.record.status().phase() != pb::SandboxStatus::READY) {
      return;
    }
    if (status.ok() && status->calls_in_flight == 0 && status->open_streams == 0 &&
        status->idle >= idle_timeout) {
      counters_["reaped_idle"]++;
      pb::Exit exit;
      exit.set_reason(pb::Exit::IDLE_TIMEOUT);
      exit.set_message(absl::StrCat("idle for ", absl::FormatDuration(status->idle)));
      BeginTerminate(it->second, exit, options_.default_delete_grace, &later);
    } else {
      absl::Duration next = std::clamp(idle_timeout / 4, absl::Milliseconds(20), absl::Seconds(1));
      if (status.ok() && status->calls_in_flight == 0 && status->open_streams == 0) {
        next = std::min(next, std::max(absl::Milliseconds(5), idle_timeout - status->idle));
      }
      Schedule(absl::Now() + next, Task{TaskKind::kIdle, id});
    }
  }
  Run(later);
}

// ---------------------------------------------------------------- reads

absl::StatusOr<pb::Sandbox> ControllerImpl::GetSandbox(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return NotFound(id);
  return it->second.record;
}

absl::StatusOr<pb::Credentials> ControllerImpl::GetCredentials(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return NotFound(id);
  if (Terminal(it->second.record.status().phase())) {
    return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonTerminated,
                         absl::StrCat("sandbox '", id, "' is terminated"));
  }
  pb::Credentials creds;
  creds.set_access_token(it->second.access_token);
  return creds;
}

absl::StatusOr<pb::ListSandboxesResponse> ControllerImpl::ListSandboxes(
    const pb::ListSandboxesRequest& request) {
  auto selector = LabelSelector::Parse(request.label_selector());
  if (!selector.ok()) return selector.status();
  if (request.page_size() < 0) return Invalid(kReasonInvalidSpec, "page_size is negative");
  int page_size = request.page_size() == 0 ? 100 : std::min(request.page_size(), 1000);
  if (!request.page_token().empty() && !IsValidSandboxId(request.page_token())) {
    return Invalid(kReasonInvalidSpec, "page_token is not one this server returned");
  }
  std::set<int> phases(request.phases().begin(), request.phases().end());
  pb::ListSandboxesResponse resp;
  absl::MutexLock lock(&mu_);
  resp.set_resource_version(hub_.current_version());
  resp.set_epoch(hub_.epoch());
  auto it = request.page_token().empty() ? sandboxes_.begin()
                                         : sandboxes_.upper_bound(request.page_token());
  for (; it != sandboxes_.end(); ++it) {
    const pb::Sandbox& rec = it->second.record;
    Phase phase = rec.status().phase();
    if (!phases.empty() ? !phases.count(phase)
                        : (Terminal(phase) && !request.include_terminated())) {
      continue;
    }
    if (!selector->MatchesMap(rec.labels())) continue;
    if (resp.sandboxes_size() == page_size) {
      resp.set_next_page_token(resp.sandboxes(page_size - 1).id());
      break;
    }
    *resp.add_sandboxes() = rec;
  }
  return resp;
}

absl::StatusOr<std::unique_ptr<WatchHandle>> ControllerImpl::Watch(
    const pb::WatchSandboxesRequest& request, WatchObserver* observer) {
  auto selector = LabelSelector::Parse(request.label_selector());
  if (!selector.ok()) return selector.status();
  WatchHub::Subscription sub;
  sub.selector = *selector;
  sub.resource_version = request.resource_version();
  sub.epoch = request.epoch();
  sub.bookmarks = request.bookmarks();
  absl::MutexLock lock(&mu_);  // no state change between snapshot and subscribe
  if (request.send_initial()) {
    for (auto& [id, e] : sandboxes_) {
      if (selector->MatchesMap(e.record.labels())) sub.initial.push_back(e.record);
    }
  }
  auto handle = hub_.Subscribe(std::move(sub), observer);
  if (!handle.ok() && handle.status().code() == absl::StatusCode::kOutOfRange) {
    counters_["watch_relists"]++;
  }
  return handle;
}

void ControllerImpl::WaitSandbox(const pb::WaitSandboxRequest& request, WaitCallback done) {
  absl::Duration timeout = FromProto(request.timeout());
  if (timeout <= absl::ZeroDuration() || timeout > kMaxWait) timeout = kMaxWait;
  Phase until = request.until() == pb::SandboxStatus::PHASE_UNSPECIFIED
                    ? pb::SandboxStatus::READY
                    : request.until();
  Later later;
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    auto it = sandboxes_.find(request.id());
    if (it == sandboxes_.end()) {
      error = NotFound(request.id());
    } else if (!pb::SandboxStatus::Phase_IsValid(until)) {
      error = Invalid(kReasonInvalidSpec, "unknown phase in `until`");
    } else {
      uint64_t wid = next_waiter_++;
      it->second.wait_waiters[wid] = WaitWaiter{until, std::move(done)};
      Notify(it->second, &later);
      if (it->second.wait_waiters.count(wid)) {
        Schedule(absl::Now() + timeout, Task{TaskKind::kWaitTimeout, request.id(), wid});
      }
    }
  }
  if (!error.ok()) {
    done(error);
    return;
  }
  Run(later);
}

absl::StatusOr<pb::Sandbox> ControllerImpl::ExtendSandbox(const pb::ExtendSandboxRequest& request) {
  absl::Duration ttl = FromProto(request.ttl());
  absl::MutexLock lock(&mu_);
  auto it = sandboxes_.find(request.id());
  if (it == sandboxes_.end()) return NotFound(request.id());
  if (ttl <= absl::ZeroDuration()) return Invalid(kReasonInvalidSpec, "ttl must be positive");
  if (ttl > options_.max_lifetime) {
    return Invalid(kReasonTtlTooLong,
                   absl::StrCat("ttl ", absl::FormatDuration(ttl),
                                " is above the server's max_lifetime ",
                                absl::FormatDuration(options_.max_lifetime)));
  }
  Entry& e = it->second;
  Phase phase = e.record.status().phase();
  if (phase == pb::SandboxStatus::TERMINATING || Terminal(phase)) {
    return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonTerminated,
                         absl::StrCat("sandbox '", request.id(), "' is ",
                                      pb::SandboxStatus::Phase_Name(phase)));
  }
  absl::Time cap = FromProto(e.record.status().create_time()) + options_.max_lifetime;
  e.expire = std::min(absl::Now() + ttl, cap);
  *e.record.mutable_status()->mutable_expire_time() = ToProto(e.expire);
  Publish(e, pb::SandboxEvent::MODIFIED);
  JournalSandbox(e);
  ScheduleExpire(e);
  if (e.extend_running) {
    e.extend_again = true;
  } else {
    e.extend_running = true;
    std::string id = e.record.id();
    Submit([this, id] { RunBackendExtend(id); });
  }
  return e.record;
}

void ControllerImpl::RunBackendExtend(const std::string& id) {
  for (;;) {
    Backend* backend = nullptr;
    BackendRef ref;
    absl::Time expire;
    {
      absl::MutexLock lock(&mu_);
      auto it = sandboxes_.find(id);
      if (it == sandboxes_.end()) return;
      Entry& e = it->second;
      e.extend_again = false;
      const Phase phase = e.record.status().phase();
      auto b = backends_.find(e.backend);
      // Not launched yet: Launch writes the expiry it reads then. Ending:
      // nothing to keep alive.
      if (e.ref.value.empty() || b == backends_.end() ||
          phase == pb::SandboxStatus::TERMINATING || Terminal(phase)) {
        e.extend_running = false;
        return;
      }
      backend = b->second.get();
      ref = e.ref;
      expire = e.expire;
    }
    const absl::Status told = backend->Extend(ref, expire);
    if (!told.ok()) {
      fprintf(stderr, "providerd: sandbox %s: backend %s kept its old expiry: %s\n",
              id.c_str(), std::string(backend->name()).c_str(), told.ToString().c_str());
    }
    absl::MutexLock lock(&mu_);
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end()) return;
    if (!it->second.extend_again) {
      it->second.extend_running = false;
      return;
    }
  }
}

void ControllerImpl::DeleteSandbox(const pb::DeleteSandboxRequest& request, DeleteCallback done) {
  absl::Duration grace = request.has_grace() ? FromProto(request.grace())
                                             : options_.default_delete_grace;
  Later later;
  absl::StatusOr<pb::Sandbox> answer;
  bool answered = true;
  {
    absl::MutexLock lock(&mu_);
    auto it = sandboxes_.find(request.id());
    if (grace < absl::ZeroDuration()) {
      answer = Invalid(kReasonInvalidSpec, "grace is negative");
    } else if (it == sandboxes_.end()) {
      if (request.allow_missing()) {
        pb::Sandbox missing;
        missing.set_id(request.id());
        answer = missing;
      } else {
        answer = NotFound(request.id());
      }
    } else {
      Entry& e = it->second;
      pb::Exit exit;
      exit.set_reason(pb::Exit::DELETED);
      exit.set_message("deleted by a client");
      e.grace = grace;
      BeginTerminate(e, exit, grace, &later);
      if (request.wait() && !Terminal(e.record.status().phase())) {
        e.delete_waiters.push_back(std::move(done));
        answered = false;
      } else {
        answer = e.record;
      }
    }
  }
  if (answered) later.push_back([done, answer] { done(answer); });
  Run(later);
}

absl::Status ControllerImpl::StreamLogs(const pb::StreamSandboxLogsRequest& request,
                                        LogSink* sink) {
  Backend* backend = nullptr;
  BackendRef ref;
  {
    absl::MutexLock lock(&mu_);
    auto it = sandboxes_.find(request.id());
    if (it == sandboxes_.end()) return NotFound(request.id());
    if (it->second.ref.value.empty()) {
      return ProviderError(absl::StatusCode::kUnavailable, "",
                           "the sandbox has not been launched yet; retry");
    }
    backend = backends_.at(it->second.backend).get();
    ref = it->second.ref;
  }
  if (request.offset() < 0) return Invalid(kReasonInvalidSpec, "offset is negative");
  return backend->StreamLogs(ref, request.offset(), request.follow(), sink);
}

pb::Capabilities ControllerImpl::GetCapabilities() {
  {
    // A backend down at start is probed again, off this call (a hung engine
    // must not hold it) and at most once per kReprobeInterval.
    absl::MutexLock lock(&mu_);
    absl::Time now = absl::Now();
    if (!unprobed_.empty() && !reprobing_ && started_ && !shutting_down_ &&
        now >= last_reprobe_ + kReprobeInterval) {
      reprobing_ = true;
      last_reprobe_ = now;
      std::set<std::string> names = unprobed_;
      Submit([this, names] {
        for (const std::string& name : names) {
          auto probed = backends_.at(name)->Probe();
          absl::MutexLock lock(&mu_);
          if (probed.ok()) {
            caps_[name] = *probed;
            unprobed_.erase(name);
          } else {
            caps_[name].set_detail(absl::StrCat("unreachable: ", probed.status().message()));
          }
        }
        absl::MutexLock lock(&mu_);
        reprobing_ = false;
      });
    }
  }
  pb::Capabilities caps;
  absl::MutexLock lock(&mu_);
  for (auto& [name, c] : caps_) *caps.add_backends() = c;
  caps.set_default_backend(options_.default_backend);
  *caps.mutable_max_lifetime() = DurationProto(options_.max_lifetime);
  *caps.mutable_default_ttl() = DurationProto(options_.default_ttl);
  caps.set_version(options_.version);
  caps.set_instance(options_.instance);
  return caps;
}

MetricsSnapshot ControllerImpl::Metrics() {
  MetricsSnapshot m;
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : sandboxes_) {
    m.sandboxes[{e.backend, pb::SandboxStatus::Phase_Name(e.record.status().phase())}]++;
  }
  for (auto& [name, pool] : pools_) m.pools[name] = PoolView(pool).status();
  m.create_seconds = create_hist_;
  m.acquire_seconds = acquire_hist_;
  m.delete_seconds = delete_hist_;
  m.counters = counters_;
  return m;
}

// ---------------------------------------------------------------- pools

pb::WarmPool ControllerImpl::PoolView(const Pool& pool) const {
  pb::WarmPool view = pool.spec;
  pb::WarmPoolStatus* st = view.mutable_status();
  st->set_ready(pool.ready.size());
  st->set_creating(pool.creating.size());
  st->set_total(pool.ready.size() + pool.creating.size());
  st->set_claimed(pool.claimed);
  st->set_cold_fallbacks(pool.cold_fallbacks);
  st->set_failure_streak(pool.failure_streak);
  st->set_last_error(pool.last_error);
  st->set_degraded(pool.failure_streak >= kPoolDegradedAfter);
  st->set_observed_generation(pool.generation);
  st->set_key(pool.key);
  return view;
}

ControllerImpl::Pool* ControllerImpl::MatchPool(const pb::SandboxSpec& spec,
                                                const std::string& key) {
  for (auto& [name, pool] : pools_) {
    if (pool.key == key) return &pool;
  }
  return nullptr;
}

void ControllerImpl::Replenish(Pool& pool) {
  if (!started_ || shutting_down_) return;
  absl::Time now = absl::Now();
  if (now < pool.backoff_until) {
    Schedule(pool.backoff_until, Task{TaskKind::kPoolTick, pool.spec.name()});
    return;
  }
  PoolCounts counts;
  counts.ready = pool.ready.size();
  counts.creating = pool.creating.size();
  for (const std::string& mid : pool.ready) {
    if (members_.at(mid).generation != pool.generation) counts.stale++;
  }
  for (const std::string& mid : pool.creating) {
    if (members_.at(mid).generation != pool.generation) counts.stale++;
  }
  // ON_REPLENISH rolls stale members one at a time when the total is full.
  if (counts.stale > 0 && counts.ready + counts.creating >= pool.spec.max_total()) {
    for (auto it = pool.ready.begin(); it != pool.ready.end(); ++it) {
      if (members_.at(*it).generation != pool.generation) {
        std::string mid = *it;
        pool.ready.erase(it);
        DestroyMember(mid);
        counts.ready--;
        counts.stale--;
        break;
      }
    }
  }
  // A lowered max_total trims unclaimed members, oldest first.
  while (counts.ready > 0 && counts.ready + counts.creating > pool.spec.max_total()) {
    std::string mid = pool.ready.front();
    pool.ready.pop_front();
    if (members_.at(mid).generation != pool.generation) counts.stale--;
    DestroyMember(mid);
    counts.ready--;
  }
  int n = MembersToStart(pool.spec, counts);
  if (n > 0 && pool.hold_since != absl::InfinitePast()) {
    // Claims are arriving: their activations run first, the boots after.
    const absl::Duration delay = options_.pool_refill_delay;
    const absl::Time until = std::min(pool.last_claim + delay, pool.hold_since + 5 * delay);
    if (now < until && pool.waiters.empty()) {
      if (pool.hold_tick < now || pool.hold_tick > until) {
        pool.hold_tick = until;
        Schedule(until, Task{TaskKind::kPoolTick, pool.spec.name()});
      }
      return;
    }
    pool.hold_since = absl::InfinitePast();
  }
  for (int i = 0; i < n; ++i) {
    Member m;
    m.id = RandomId("wp-", 10);
    m.pool = pool.spec.name();
    m.generation = pool.generation;
    m.key = pool.key;
    const pb::SandboxSpec& t = pool.spec.template_();
    m.backend = t.backend().empty() ? options_.default_backend : t.backend();
    m.admin_token = RandomToken();
    m.created = now;
    pool.creating.insert(m.id);
    std::string mid = m.id;
    members_[mid] = std::move(m);
    SubmitLaunch([this, mid] { RunMemberLaunch(mid); });
  }
}

void ControllerImpl::RunMemberLaunch(const std::string& member_id) {
  LaunchSpec launch;
  Backend* backend = nullptr;
  absl::Time deadline = absl::Now() + options_.default_ready_timeout;
  {
    absl::MutexLock lock(&mu_);
    Member& m = members_.at(member_id);
    auto b = backends_.find(m.backend);
    auto pit = pools_.find(m.pool);
    if (b != backends_.end() && !m.doomed && !shutting_down_ && pit != pools_.end()) {
      Pool& pool = pit->second;
      backend = b->second.get();
      launch.sandbox_id = member_id;
      launch.uid = RandomId("", 26);
      launch.spec = pool.spec.template_();
      launch.spec.set_backend(m.backend);
      launch.labels.insert(pool.spec.labels().begin(), pool.spec.labels().end());
      launch.labels[kLabelPool] = m.pool;
      launch.labels[kLabelManagedBy] = options_.instance;
      launch.admin_token = m.admin_token;
      launch.instance = options_.instance;
    } else {
      if (pit != pools_.end()) pit->second.creating.erase(member_id);
      members_.erase(member_id);
      return;
    }
  }
  absl::StatusOr<pb::Endpoint> endpoint = absl::UnknownError("");
  auto ref = backend->Launch(launch, deadline);
  if (ref.ok()) {
    {
      absl::MutexLock lock(&mu_);
      members_.at(member_id).ref = *ref;
    }
    auto stop = [this, &member_id] {
      absl::MutexLock lock(&mu_);
      return shutting_down_ || members_.at(member_id).doomed;
    };
    endpoint = AwaitReady(backend, *ref, launch.admin_token, deadline, stop);
    if (endpoint.ok()) {
      // A member is ready once its prestarted worker has booted: a claim
      // then never waits for a boot (nor shares the CPU with it).
      absl::Status booted = AwaitWorkerBooted(*endpoint, launch.admin_token, deadline, stop);
      if (!booted.ok()) endpoint = booted;
    }
  } else {
    endpoint = ref.status();
  }
  bool destroy = !endpoint.ok();
  {
    absl::MutexLock lock(&mu_);
    Member& m = members_.at(member_id);
    auto pit = pools_.find(m.pool);
    if (pit != pools_.end()) pit->second.creating.erase(member_id);
    bool over_total = pit != pools_.end() &&
                      static_cast<int>(pit->second.ready.size() + pit->second.creating.size()) >=
                          pit->second.spec.max_total();
    if (endpoint.ok() && !m.doomed && !shutting_down_ && pit != pools_.end() && !over_total) {
      Pool& pool = pit->second;
      m.ready = true;
      m.endpoint = *endpoint;
      pool.ready.push_back(member_id);
      pool.failure_streak = 0;
      pool.backoff_until = absl::InfinitePast();
      absl::Duration age = FromProto(pool.spec.member_max_age());
      if (age > absl::ZeroDuration()) {
        Schedule(absl::Now() + age, Task{TaskKind::kMemberAge, member_id});
      }
      Later later;
      ServePoolWaiters(pool, &later);
      Replenish(pool);
      mu_.Unlock();
      Run(later);
      mu_.Lock();
      return;
    }
    destroy = true;
    if (!endpoint.ok() && endpoint.status().code() != absl::StatusCode::kCancelled &&
        pit != pools_.end()) {
      Pool& pool = pit->second;
      pool.failure_streak++;
      pool.last_error = endpoint.status().ToString();
      counters_["pool_start_failures"]++;
      absl::Duration backoff = PoolBackoff(pool.failure_streak);
      if (backoff > absl::ZeroDuration()) pool.backoff_until = absl::Now() + backoff;
      Replenish(pool);
    }
    members_.erase(member_id);
  }
  if (destroy && ref.ok()) (void)backend->Destroy(*ref, absl::ZeroDuration());
}

void ControllerImpl::DestroyMember(const std::string& member_id) {
  auto it = members_.find(member_id);
  if (it == members_.end()) return;
  Member& m = it->second;
  if (!m.ready) {  // its launch task destroys it when it returns
    m.doomed = true;
    return;
  }
  auto b = backends_.find(m.backend);
  if (b != backends_.end()) {
    Backend* backend = b->second.get();
    BackendRef ref = m.ref;
    Submit([backend, ref] { (void)backend->Destroy(ref, absl::ZeroDuration()); });
  }
  members_.erase(it);
}

bool ControllerImpl::ClaimMember(Pool& pool, Entry& e, Later* later) {
  for (auto it = pool.ready.begin(); it != pool.ready.end(); ++it) {
    Member& m = members_.at(*it);
    if (m.key != e.spec_hash) continue;  // a stale member of another key
    e.ref = m.ref;
    e.admin_token = m.admin_token;
    *e.record.mutable_status()->mutable_endpoint() = m.endpoint;
    e.record.mutable_status()->set_backend_ref(m.ref.value);
    e.record.mutable_status()->set_launch(pb::SandboxStatus::WARM);
    e.record.set_pool(pool.spec.name());
    (*e.record.mutable_labels())[kLabelPool] = pool.spec.name();
    e.waiting_for_member = false;
    ref_owner_[m.ref.value] = e.record.id();
    members_.erase(*it);
    pool.ready.erase(it);
    pool.claimed++;
    counters_["pool_claims"]++;
    if (options_.pool_refill_delay > absl::ZeroDuration()) {
      pool.last_claim = absl::Now();
      if (pool.hold_since == absl::InfinitePast()) pool.hold_since = pool.last_claim;
    }
    JournalSandbox(e);
    std::string id = e.record.id();
    Submit([this, id] { RunActivate(id); });
    Replenish(pool);
    return true;
  }
  return false;
}

void ControllerImpl::ServePoolWaiters(Pool& pool, Later* later) {
  while (!pool.waiters.empty() && !pool.ready.empty()) {
    std::string id = pool.waiters.front();
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end() || !it->second.waiting_for_member) {
      pool.waiters.pop_front();
      continue;
    }
    if (!ClaimMember(pool, it->second, later)) break;
    pool.waiters.pop_front();
  }
}

absl::StatusOr<pb::WarmPool> ControllerImpl::CheckPoolRequest(const pb::WarmPool& request) {
  pb::WarmPool spec = request;
  spec.clear_status();
  if (absl::Status s = ValidateAndDefaultPool(&spec); !s.ok()) return s;
  std::map<std::string, std::string> labels(spec.labels().begin(), spec.labels().end());
  if (absl::Status s = ValidateLabels(labels, false); !s.ok()) return s;
  const pb::SandboxSpec& t = spec.template_();
  std::string backend_name = t.backend().empty() ? options_.default_backend : t.backend();
  auto b = backends_.find(backend_name);
  if (b == backends_.end()) {
    return Invalid(kReasonInvalidSpec, absl::StrCat("unknown backend '", backend_name, "'"));
  }
  LaunchSpec launch;
  launch.sandbox_id = "wp-validate";
  launch.spec = t;
  launch.instance = options_.instance;
  if (absl::Status s = b->second->Validate(launch); !s.ok()) return s;
  return spec;
}

absl::StatusOr<pb::WarmPool> ControllerImpl::CreateWarmPool(const pb::WarmPool& request) {
  absl::StatusOr<pb::WarmPool> checked = CheckPoolRequest(request);
  if (!checked.ok()) return checked.status();
  const pb::WarmPool& spec = *checked;
  const pb::SandboxSpec& t = spec.template_();
  absl::MutexLock lock(&mu_);
  if (pools_.count(spec.name())) {
    return ProviderError(absl::StatusCode::kAlreadyExists, kReasonPoolExists,
                         absl::StrCat("warm pool '", spec.name(), "' exists"));
  }
  Pool& pool = pools_[spec.name()];
  pool.spec = spec;
  pool.key = PoolKey(t, options_.default_backend);
  JournalPool(pool);
  Replenish(pool);
  return PoolView(pool);
}

absl::StatusOr<pb::WarmPool> ControllerImpl::UpdateWarmPool(const pb::WarmPool& request) {
  absl::StatusOr<pb::WarmPool> checked = CheckPoolRequest(request);
  if (!checked.ok()) return checked.status();
  const pb::WarmPool& spec = *checked;
  const pb::SandboxSpec& t = spec.template_();
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(spec.name());
  if (it == pools_.end()) {
    return ProviderError(absl::StatusCode::kNotFound, kReasonPoolNotFound,
                         absl::StrCat("no warm pool '", spec.name(), "'"));
  }
  Pool& pool = it->second;
  // Members carry the template and the pool's labels; the sizes do not.
  pb::WarmPool before, after;
  *before.mutable_template_() = pool.spec.template_();
  *before.mutable_labels() = pool.spec.labels();
  *after.mutable_template_() = t;
  *after.mutable_labels() = spec.labels();
  bool template_changed = !google::protobuf::util::MessageDifferencer::Equals(before, after);
  pool.spec = spec;
  if (template_changed) {
    pool.generation++;
    pool.key = PoolKey(t, options_.default_backend);
    pool.failure_streak = 0;
    pool.backoff_until = absl::InfinitePast();
    if (spec.update_strategy() != pb::WarmPool::ON_REPLENISH) {
      // RECREATE: stale unclaimed members go now.
      std::deque<std::string> keep;
      for (const std::string& mid : pool.ready) {
        if (members_.at(mid).generation != pool.generation) {
          DestroyMember(mid);
        } else {
          keep.push_back(mid);
        }
      }
      pool.ready = std::move(keep);
      for (const std::string& mid : pool.creating) members_.at(mid).doomed = true;
    }
  }
  JournalPool(pool);
  Replenish(pool);
  return PoolView(pool);
}

absl::StatusOr<pb::WarmPool> ControllerImpl::GetWarmPool(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(name);
  if (it == pools_.end()) {
    return ProviderError(absl::StatusCode::kNotFound, kReasonPoolNotFound,
                         absl::StrCat("no warm pool '", name, "'"));
  }
  return PoolView(it->second);
}

std::vector<pb::WarmPool> ControllerImpl::ListWarmPools() {
  absl::MutexLock lock(&mu_);
  std::vector<pb::WarmPool> out;
  for (auto& [name, pool] : pools_) out.push_back(PoolView(pool));
  return out;
}

absl::Status ControllerImpl::DeleteWarmPool(const std::string& name, bool allow_missing) {
  Later later;
  {
    absl::MutexLock lock(&mu_);
    auto it = pools_.find(name);
    if (it == pools_.end()) {
      if (allow_missing) return absl::OkStatus();
      return ProviderError(absl::StatusCode::kNotFound, kReasonPoolNotFound,
                           absl::StrCat("no warm pool '", name, "'"));
    }
    Pool& pool = it->second;
    for (const std::string& mid : pool.ready) DestroyMember(mid);
    for (const std::string& mid : pool.creating) members_.at(mid).doomed = true;
    for (const std::string& id : pool.waiters) {
      auto s = sandboxes_.find(id);
      if (s == sandboxes_.end() || !s->second.waiting_for_member) continue;
      s->second.waiting_for_member = false;
      pb::Exit exit;
      exit.set_reason(pb::Exit::START_FAILED);
      exit.set_message(absl::StrCat("warm pool '", name, "' was deleted"));
      MarkTerminated(s->second, exit, &later);
    }
    JournalErase(kPoolRecord, name);
    pools_.erase(it);
  }
  Run(later);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SandboxController>> SandboxController::Create(
    ControllerOptions options, std::vector<std::unique_ptr<Backend>> backends,
    std::unique_ptr<DaemonAgent> agent) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("state_dir is required");
  if (!agent) return absl::InvalidArgumentError("a DaemonAgent is required");
  if (options.default_ttl <= absl::ZeroDuration() ||
      options.max_lifetime <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_ttl and max_lifetime must be positive");
  }
  std::set<std::string> names;
  for (auto& b : backends) {
    if (!b || !names.insert(std::string(b->name())).second) {
      return absl::InvalidArgumentError("backends must be non-null with distinct names");
    }
  }
  return std::unique_ptr<SandboxController>(
      new ControllerImpl(std::move(options), std::move(backends), std::move(agent)));
}

}  // namespace agentix::providers
