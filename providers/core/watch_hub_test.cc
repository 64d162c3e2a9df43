#include "providers/core/watch_hub.h"

#include <catch2/catch.hpp>
#include <thread>

#include "providers/core/errors.h"
#include "testing/status_matchers.h"

namespace agentix::providers {
namespace {

class Recorder : public WatchObserver {
 public:
  explicit Recorder(int stop_after = -1) : stop_after_(stop_after) {}
  bool OnEvent(const pb::SandboxEvent& event) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(event);
    return stop_after_ < 0 || static_cast<int>(events_.size()) < stop_after_;
  }
  std::vector<pb::SandboxEvent> WaitFor(size_t n, absl::Duration timeout = absl::Seconds(5)) {
    std::pair<Recorder*, size_t> want(this, n);
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](std::pair<Recorder*, size_t>* p) {
                               return p->first->events_.size() >= p->second;
                             },
                             &want),
                         timeout);
    return events_;
  }
  std::vector<pb::SandboxEvent> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  absl::Mutex mu_;
  std::vector<pb::SandboxEvent> events_;
  int stop_after_;
};

pb::Sandbox Box(const std::string& id, const std::string& team = "a") {
  pb::Sandbox s;
  s.set_id(id);
  (*s.mutable_labels())["team"] = team;
  return s;
}

TEST_CASE("Watch hub: resume from any version in the history, in order, without gaps",
          "[watch]") {
  WatchHub hub("e1", 100, absl::Seconds(10));
  for (int i = 0; i < 50; ++i) {
    pb::Sandbox s = Box("s" + std::to_string(i));
    CHECK(hub.Publish(pb::SandboxEvent::ADDED, &s) == i + 1);
    CHECK(s.resource_version() == i + 1);
  }
  Recorder rec;
  WatchHub::Subscription sub;
  sub.resource_version = 20;
  sub.epoch = "e1";
  REQUIRE_OK_AND_ASSIGN(auto handle, hub.Subscribe(std::move(sub), &rec));
  for (int i = 50; i < 60; ++i) {
    pb::Sandbox s = Box("s" + std::to_string(i));
    hub.Publish(pb::SandboxEvent::MODIFIED, &s);
  }
  auto events = rec.WaitFor(40);
  REQUIRE(events.size() == 40);
  for (size_t i = 0; i < events.size(); ++i) {
    CHECK(events[i].resource_version() == static_cast<int64_t>(21 + i));
    CHECK(events[i].epoch() == "e1");
  }
}

TEST_CASE("Watch hub: too old, other epoch or future versions are OUT_OF_RANGE", "[watch]") {
  WatchHub hub("e1", 10, absl::Seconds(10));
  for (int i = 0; i < 30; ++i) {
    pb::Sandbox s = Box("s");
    hub.Publish(pb::SandboxEvent::MODIFIED, &s);
  }
  Recorder rec;
  auto subscribe = [&](int64_t rv, std::string epoch) {
    WatchHub::Subscription sub;
    sub.resource_version = rv;
    sub.epoch = std::move(epoch);
    return hub.Subscribe(std::move(sub), &rec);
  };
  for (auto [rv, epoch] : std::vector<std::pair<int64_t, std::string>>{
           {5, "e1"}, {19, "e1"}, {25, "e0"}, {31, "e1"}, {25, ""}}) {
    auto h = subscribe(rv, epoch);
    INFO(rv << " " << epoch);
    REQUIRE_FALSE(h.ok());
    CHECK(h.status().code() == absl::StatusCode::kOutOfRange);
    CHECK(ReasonOf(h.status()) == kReasonWatchExpired);
  }
  CHECK(subscribe(20, "e1").ok());  // the oldest kept is 21: nothing missed
  CHECK(subscribe(30, "e1").ok());
  CHECK(subscribe(0, "").ok());
}

TEST_CASE("Watch hub: version 0 of this epoch (a List before any change) misses nothing",
          "[watch]") {
  WatchHub hub("e1", 100, absl::Seconds(10));
  int64_t listed = hub.current_version();  // what List answers on a fresh hub
  REQUIRE(listed == 0);
  for (int i = 0; i < 3; ++i) {  // changes between the List and the Watch
    pb::Sandbox s = Box("s" + std::to_string(i));
    hub.Publish(pb::SandboxEvent::ADDED, &s);
  }
  Recorder rec;
  WatchHub::Subscription sub;
  sub.resource_version = listed;
  sub.epoch = "e1";
  REQUIRE_OK_AND_ASSIGN(auto handle, hub.Subscribe(std::move(sub), &rec));
  auto events = rec.WaitFor(3);
  REQUIRE(events.size() == 3);
  CHECK(events[0].resource_version() == 1);
  WatchHub::Subscription other;
  other.epoch = "e0";  // version 0 of another epoch: relist
  auto refused = hub.Subscribe(std::move(other), &rec);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("Watch hub: selector filtering, initial state, bookmarks, dropped observers",
          "[watch]") {
  WatchHub hub("e1", 100, absl::Milliseconds(50));
  Recorder filtered;
  WatchHub::Subscription sub;
  REQUIRE_OK_AND_ASSIGN(sub.selector, LabelSelector::Parse("team=b"));
  sub.initial = {Box("old", "b")};
  sub.bookmarks = true;
  REQUIRE_OK_AND_ASSIGN(auto h1, hub.Subscribe(std::move(sub), &filtered));
  Recorder quitter(/*stop_after=*/2);
  REQUIRE_OK_AND_ASSIGN(auto h2, hub.Subscribe({}, &quitter));
  REQUIRE(hub.subscriber_count() == 2);
  for (int i = 0; i < 10; ++i) {
    pb::Sandbox s = Box("s", i % 2 ? "b" : "a");
    hub.Publish(pb::SandboxEvent::MODIFIED, &s);
  }
  auto events = filtered.WaitFor(1 + 5 + 1);  // initial, 5 matching, a bookmark
  REQUIRE(events.size() >= 7);
  CHECK(events[0].type() == pb::SandboxEvent::ADDED);
  CHECK(events[0].sandbox().id() == "old");
  for (int i = 1; i <= 5; ++i) {
    CHECK(events[i].sandbox().labels().at("team") == "b");
    CHECK(events[i].resource_version() == 2 * i);
  }
  CHECK(events[6].type() == pb::SandboxEvent::BOOKMARK);
  CHECK(events[6].resource_version() == 10);
  CHECK(quitter.events().size() == 2);
  CHECK(hub.subscriber_count() == 1);
  h1.reset();  // no OnEvent after the handle is gone
  size_t seen = filtered.events().size();
  pb::Sandbox s = Box("s", "b");
  hub.Publish(pb::SandboxEvent::MODIFIED, &s);
  absl::SleepFor(absl::Milliseconds(120));
  CHECK(filtered.events().size() == seen);
}

}  // namespace
}  // namespace agentix::providers
