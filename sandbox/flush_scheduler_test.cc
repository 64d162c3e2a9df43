#include "sandbox/flush_scheduler.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace agentix::sandbox {
namespace {

// Records when and in which order it was flushed.
class Recorder : public Flushable {
 public:
  Recorder(std::string name, absl::Mutex* mu, std::vector<std::string>* order)
      : name_(std::move(name)), mu_(mu), order_(order) {}
  void Flush() override {
    absl::MutexLock lock(mu_);
    order_->push_back(name_);
    flushed_at = FlushScheduler::Clock::now();
  }
  FlushScheduler::Clock::time_point flushed_at;

 private:
  std::string name_;
  absl::Mutex* mu_;
  std::vector<std::string>* order_;
};

// Waits (at most 10 s) until `order` holds at least `n` names; mu held.
bool AwaitFlushes(absl::Mutex& mu, const std::vector<std::string>& order,
                  size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  auto enough = [&order, n] { return order.size() >= n; };
  return mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
}

TEST_CASE("Flushes run at their time, earliest first", "[sandbox]") {
  absl::Mutex mu;
  std::vector<std::string> order;
  auto late = std::make_shared<Recorder>("late", &mu, &order);
  auto early = std::make_shared<Recorder>("early", &mu, &order);
  FlushScheduler scheduler;
  const auto start = FlushScheduler::Clock::now();
  // The later one first: the earlier deadline must still wake the thread.
  scheduler.FlushAt(start + std::chrono::milliseconds(60), late);
  scheduler.FlushAt(start + std::chrono::milliseconds(20), early);
  absl::MutexLock lock(&mu);
  REQUIRE(AwaitFlushes(mu, order, 2));
  REQUIRE(order == std::vector<std::string>{"early", "late"});
  CHECK(early->flushed_at >= start + std::chrono::milliseconds(20));
  CHECK(late->flushed_at >= start + std::chrono::milliseconds(60));
}

TEST_CASE("A flush that is already due runs at once", "[sandbox]") {
  absl::Mutex mu;
  std::vector<std::string> order;
  auto target = std::make_shared<Recorder>("now", &mu, &order);
  FlushScheduler scheduler;
  scheduler.FlushAt(FlushScheduler::Clock::now() - std::chrono::seconds(1),
                    target);
  absl::MutexLock lock(&mu);
  REQUIRE(AwaitFlushes(mu, order, 1));
}

TEST_CASE("A target destroyed before its time is not flushed", "[sandbox]") {
  absl::Mutex mu;
  std::vector<std::string> order;
  auto gone = std::make_shared<Recorder>("gone", &mu, &order);
  auto kept = std::make_shared<Recorder>("kept", &mu, &order);
  FlushScheduler scheduler;
  scheduler.FlushAt(
      FlushScheduler::Clock::now() + std::chrono::milliseconds(20), gone);
  scheduler.FlushAt(
      FlushScheduler::Clock::now() + std::chrono::milliseconds(40), kept);
  gone.reset();
  absl::MutexLock lock(&mu);
  REQUIRE(AwaitFlushes(mu, order, 1));
  REQUIRE(order == std::vector<std::string>{"kept"});
}

TEST_CASE("Destroying the scheduler drops pending flushes and returns",
          "[sandbox]") {
  absl::Mutex mu;
  std::vector<std::string> order;
  auto target = std::make_shared<Recorder>("pending", &mu, &order);
  const auto start = FlushScheduler::Clock::now();
  {
    FlushScheduler scheduler;
    scheduler.FlushAt(start + std::chrono::hours(1), target);
  }
  REQUIRE(FlushScheduler::Clock::now() - start < std::chrono::seconds(30));
  absl::MutexLock lock(&mu);
  REQUIRE(order.empty());
}

}  // namespace
}  // namespace agentix::sandbox
