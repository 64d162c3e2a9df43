#include "sandbox/keep_awake.h"

#include <sched.h>
#include <time.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/time/clock.h"
#include "base/cpu_affinity.h"

namespace agentix::sandbox {
namespace {

// CPU time of thread `tid` of this process (CLOCK_THREAD_CPUTIME_ID of
// another thread is not reachable by tid; schedstat is).
absl::Duration ThreadCpu(pid_t tid) {
  FILE* f = std::fopen(("/proc/self/task/" + std::to_string(tid) + "/schedstat").c_str(), "r");
  REQUIRE(f != nullptr);
  unsigned long long ns = 0;
  REQUIRE(std::fscanf(f, "%llu", &ns) == 1);
  std::fclose(f);
  return absl::Nanoseconds(ns);
}

absl::Duration ProcessCpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

// Waits (bounded) until `ready` holds; false on timeout.
template <typename F>
bool WaitFor(F ready, absl::Duration limit = absl::Seconds(10)) {
  const absl::Time until = absl::Now() + limit;
  while (!ready()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST_CASE("Keep-awake spinners are pinned, at SCHED_IDLE, one per CPU, asleep until activity") {
  const std::vector<int> cpus = KeepAwake::AllowedCpus();
  REQUIRE(!cpus.empty());
  CHECK(cpus.size() <= static_cast<size_t>(KeepAwake::kMaxCpus));
  auto awake = KeepAwake::Start(cpus, absl::Milliseconds(2));
  REQUIRE(awake.ok());
  const std::vector<pid_t> tids = (*awake)->thread_ids();
  REQUIRE(tids.size() == cpus.size());
  for (size_t i = 0; i < tids.size(); ++i) {
    CHECK(::sched_getscheduler(tids[i]) == SCHED_IDLE);
    CHECK(base::AllowedCpus(tids[i]) == std::to_string(cpus[i]));
  }
  // Nothing happened yet: every spinner blocks and burns nothing.
  REQUIRE(WaitFor([&] { return (*awake)->sleeping() == static_cast<int>(cpus.size()); }));
  const absl::Duration before = ThreadCpu(tids[0]);
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(ThreadCpu(tids[0]) - before < absl::Milliseconds(2));
}

TEST_CASE("Activity wakes the spinners; after the window they block and the process's CPU stops growing") {
  const std::vector<int> cpus = KeepAwake::AllowedCpus();
  auto awake = KeepAwake::Start(cpus, absl::Milliseconds(20));
  REQUIRE(awake.ok());
  REQUIRE(WaitFor([&] { return (*awake)->sleeping() == static_cast<int>(cpus.size()); }));
  const pid_t spinner = (*awake)->thread_ids()[0];

  // Touches every ms for 100 ms: the spinners run the whole time.
  const absl::Duration spun_before = ThreadCpu(spinner);
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Milliseconds(100)) {
    (*awake)->Touch();
    CHECK((*awake)->sleeping() <= static_cast<int>(cpus.size()));
    absl::SleepFor(absl::Milliseconds(1));
  }
  // The spinner ran (at SCHED_IDLE it yields to every other task, so on a
  // loaded machine it may get little; it is woken and running at least).
  CHECK(ThreadCpu(spinner) > spun_before);

  // The window passes: all block again, and the process burns (almost) nothing.
  REQUIRE(WaitFor([&] { return (*awake)->sleeping() == static_cast<int>(cpus.size()); }));
  const absl::Duration idle_before = ProcessCpu();
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(ProcessCpu() - idle_before < absl::Milliseconds(5));

  // And a new Touch wakes them again.
  (*awake)->Touch();
  CHECK(WaitFor([&] { return (*awake)->sleeping() < static_cast<int>(cpus.size()); }));
}

TEST_CASE("A spinner stays awake within the window of the last Touch") {
  auto awake = KeepAwake::Start({KeepAwake::AllowedCpus()[0]}, absl::Seconds(5));
  REQUIRE(awake.ok());
  REQUIRE(WaitFor([&] { return (*awake)->sleeping() == 1; }));
  (*awake)->Touch();
  REQUIRE(WaitFor([&] { return (*awake)->sleeping() == 0; }));
  absl::SleepFor(absl::Milliseconds(100));
  CHECK((*awake)->sleeping() == 0);  // 100 ms < 5 s: still spinning
  // Destroying it while spinning stops and joins the spinner (no hang).
}

TEST_CASE("Bad keep-awake settings are typed errors") {
  CHECK(KeepAwake::Start({}, absl::Milliseconds(1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(KeepAwake::Start({KeepAwake::AllowedCpus()[0]}, absl::Nanoseconds(10)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A CPU outside the allowed set cannot be pinned to: the start fails and
  // the other spinner is stopped.
  cpu_set_t allowed;
  REQUIRE(::sched_getaffinity(0, sizeof(allowed), &allowed) == 0);
  int outside = 0;
  while (outside < CPU_SETSIZE && CPU_ISSET(outside, &allowed)) ++outside;
  auto failed = KeepAwake::Start({KeepAwake::AllowedCpus()[0], outside}, absl::Milliseconds(1));
  REQUIRE_FALSE(failed.ok());
  CHECK(std::string(failed.status().message()).find("CPU " + std::to_string(outside)) !=
        std::string::npos);
}

}  // namespace
}  // namespace agentix::sandbox
