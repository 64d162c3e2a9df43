#include "providers/core/watch_hub.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "providers/core/errors.h"

namespace agentix::providers {

class WatchHub::Handle : public WatchHandle {
 public:
  Handle(WatchHub* hub, uint64_t id) : hub_(hub), id_(id) {}
  ~Handle() override { hub_->Unsubscribe(id_); }

 private:
  WatchHub* const hub_;
  const uint64_t id_;
};

WatchHub::WatchHub(std::string epoch, int history, absl::Duration bookmark_interval)
    : epoch_(std::move(epoch)),
      history_(history > 0 ? history : 1),
      bookmark_interval_(bookmark_interval > absl::ZeroDuration()
                             ? bookmark_interval
                             : absl::Seconds(10)) {
  {
    absl::MutexLock lock(&mu_);
    next_bookmark_ = absl::Now() + bookmark_interval_;
  }
  dispatcher_ = std::thread([this] { Run(); });
  dispatcher_id_ = dispatcher_.get_id();
}

WatchHub::~WatchHub() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  dispatcher_.join();
}

int64_t WatchHub::current_version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

int WatchHub::subscriber_count() const {
  absl::MutexLock lock(&mu_);
  return subscribers_.size();
}

int64_t WatchHub::Publish(pb::SandboxEvent::Type type, pb::Sandbox* sandbox) {
  absl::MutexLock lock(&mu_);
  int64_t version = ++version_;
  sandbox->set_resource_version(version);
  auto event = std::make_shared<pb::SandboxEvent>();
  event->set_type(type);
  *event->mutable_sandbox() = *sandbox;
  event->set_resource_version(version);
  event->set_epoch(epoch_);
  EventPtr shared = std::move(event);
  ring_.push_back(shared);
  while (ring_.size() > history_) ring_.pop_front();
  for (auto& [id, sub] : subscribers_) {
    if (!sub->dropped && sub->selector.MatchesMap(sandbox->labels())) {
      sub->queue.push_back(shared);
    }
  }
  return version;
}

absl::StatusOr<std::unique_ptr<WatchHandle>> WatchHub::Subscribe(
    Subscription subscription, WatchObserver* observer) {
  absl::MutexLock lock(&mu_);
  auto sub = std::make_shared<Subscriber>();
  sub->selector = std::move(subscription.selector);
  sub->bookmarks = subscription.bookmarks;
  sub->observer = observer;
  int64_t from = subscription.resource_version;
  if (from < 0) {
    return ProviderError(absl::StatusCode::kInvalidArgument, kReasonInvalidSpec,
                         "resource_version must not be negative");
  }
  // Version 0 with an epoch resumes from the start of that epoch: it is
  // what List returns before anything changed, and "from now" would drop
  // the changes between that List and this Watch.
  const bool resume = from > 0 || !subscription.epoch.empty();
  if (resume) {
    auto too_old = [&](absl::string_view why) {
      return ProviderError(absl::StatusCode::kOutOfRange, kReasonWatchExpired,
                           absl::StrCat("cannot resume at resource_version ", from,
                                        " of epoch '", subscription.epoch, "': ",
                                        why, "; list again and watch from there"));
    };
    if (subscription.epoch != epoch_) {
      return too_old(absl::StrCat("providerd restarted (epoch is now '", epoch_, "')"));
    }
    if (from > version_) return too_old("it is in the future");
    int64_t oldest = ring_.empty() ? version_ + 1 : ring_.front()->resource_version();
    if (from + 1 < oldest) {
      return too_old(absl::StrCat("the history starts at ", oldest));
    }
  }
  for (auto& sandbox : subscription.initial) {
    auto event = std::make_shared<pb::SandboxEvent>();
    event->set_type(pb::SandboxEvent::ADDED);
    event->set_resource_version(sandbox.resource_version());
    event->set_epoch(epoch_);
    *event->mutable_sandbox() = std::move(sandbox);
    sub->queue.push_back(std::move(event));
  }
  if (resume) {
    for (const EventPtr& event : ring_) {
      if (event->resource_version() > from &&
          sub->selector.MatchesMap(event->sandbox().labels())) {
        sub->queue.push_back(event);
      }
    }
  }
  uint64_t id = next_id_++;
  subscribers_[id] = std::move(sub);
  return std::unique_ptr<WatchHandle>(new Handle(this, id));
}

void WatchHub::Unsubscribe(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(id);
  if (it == subscribers_.end()) return;
  std::shared_ptr<Subscriber> sub = it->second;
  sub->dropped = true;
  subscribers_.erase(it);
  // From inside OnEvent (the dispatcher itself) we cannot wait for ourselves.
  if (std::this_thread::get_id() == dispatcher_id_) return;
  mu_.Await(absl::Condition(
      +[](Subscriber* s) { return !s->delivering; }, sub.get()));
}

bool WatchHub::Pending() const {
  if (stop_) return true;
  for (const auto& [id, sub] : subscribers_) {
    if (!sub->queue.empty() && !sub->dropped) return true;
  }
  return false;
}

void WatchHub::Run() {
  for (;;) {
    std::vector<std::pair<std::shared_ptr<Subscriber>, std::deque<EventPtr>>> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(this, &WatchHub::Pending), next_bookmark_);
      if (stop_) return;
      absl::Time now = absl::Now();
      if (now >= next_bookmark_) {
        next_bookmark_ = now + bookmark_interval_;
        auto bookmark = std::make_shared<pb::SandboxEvent>();
        bookmark->set_type(pb::SandboxEvent::BOOKMARK);
        bookmark->set_resource_version(version_);
        bookmark->set_epoch(epoch_);
        bookmark->mutable_sandbox()->set_resource_version(version_);
        EventPtr shared = std::move(bookmark);
        for (auto& [id, sub] : subscribers_) {
          if (sub->bookmarks) sub->queue.push_back(shared);
        }
      }
      for (auto& [id, sub] : subscribers_) {
        if (sub->queue.empty() || sub->dropped) continue;
        sub->delivering = true;
        work.emplace_back(sub, std::move(sub->queue));
        sub->queue.clear();
      }
    }
    for (auto& [sub, events] : work) {
      bool keep = true;
      for (const EventPtr& event : events) {
        if (!keep) break;
        keep = sub->observer->OnEvent(*event);
      }
      absl::MutexLock lock(&mu_);
      sub->delivering = false;
      if (!keep && !sub->dropped) {
        sub->dropped = true;
        for (auto it = subscribers_.begin(); it != subscribers_.end(); ++it) {
          if (it->second == sub) {
            subscribers_.erase(it);
            break;
          }
        }
      }
    }
  }
}

}  // namespace agentix::providers
