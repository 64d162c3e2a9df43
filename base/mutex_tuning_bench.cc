// bazel run //base:mutex_tuning_bench — what absl::Mutex deadlock detection
// costs with the Abseil this build links (see mutex_tuning.h): nested
// lock/unlock pairs timed with Abseil's default, then after
// DisableMutexDeadlockDetection(), in one process. Prints medians of 7 rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/mutex_tuning.h"

namespace {

constexpr int kPairs = 200000;

// Median ns per nested pair (outer held while an inner one is taken and
// released, as gRPC does with a call's lock under a transport's).
double NestedPairNanos() {
  absl::Mutex outer;
  absl::Mutex inner;
  std::vector<double> rounds;
  for (int round = 0; round < 7; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kPairs; ++i) {
      outer.Lock();
      inner.Lock();
      inner.Unlock();
      outer.Unlock();
    }
    const std::chrono::duration<double, std::nano> took =
        std::chrono::steady_clock::now() - start;
    rounds.push_back(took.count() / kPairs);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

}  // namespace

int main() {
  const double with_detection = NestedPairNanos();
  agentix::base::DisableMutexDeadlockDetection();
  const double without = NestedPairNanos();
  std::printf(
      "nested absl::Mutex lock pair: %.1f ns with Abseil's default, %.1f ns "
      "with detection off (%.2fx)\n",
      with_detection, without, with_detection / without);
  return 0;
}
