#include "base/cpu_affinity.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <thread>

namespace agentix::base {
namespace {

int HighestAllowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof(set), &set) == 0);
  for (int cpu = CPU_SETSIZE - 1; cpu >= 0; --cpu) {
    if (CPU_ISSET(cpu, &set)) return cpu;
  }
  return -1;
}

TEST_CASE("CPU settings: off, auto, a number; anything else is refused") {
  CHECK(*ParseCpuSetting("") == kNoCpu);
  CHECK(*ParseCpuSetting("off") == kNoCpu);
  CHECK(*ParseCpuSetting(" auto ") == HighestAllowed());
  CHECK(*ParseCpuSetting(std::to_string(HighestAllowed())) == HighestAllowed());
  for (const char* bad : {"-1", "one", "1.5", "auto1", "99999"}) {
    auto parsed = ParseCpuSetting(bad);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(parsed.status().message().find(bad) != absl::string_view::npos);
  }
  // A CPU that exists in the mask range but not for this process.
  const int outside = CPU_SETSIZE - 1;
  if (HighestAllowed() != outside) {
    auto parsed = ParseCpuSetting(std::to_string(outside));
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("SetThreadCpus pins only the thread it names, and the thread runs there") {
  const int cpu = HighestAllowed();
  const std::string before = AllowedCpus(0);
  std::string inside, seen_cpu;
  std::thread pinned([&] {
    REQUIRE(SetThreadCpus(0, CpuSetOf(cpu)).ok());
    inside = AllowedCpus(0);
    seen_cpu = std::to_string(sched_getcpu());
  });
  pinned.join();
  CHECK(inside == std::to_string(cpu));
  CHECK(seen_cpu == std::to_string(cpu));
  CHECK(AllowedCpus(0) == before);  // the calling thread is untouched
  CHECK(SetThreadCpus(0, CpuSetOf(CPU_SETSIZE)).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("SetProcessCpus pins a child's threads, and threads it starts later inherit it") {
  const int cpu = HighestAllowed();
  int ready[2], go[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(go) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A thread before the pin, one after; report both masks' sizes.
    std::thread early([&] {
      char c;
      (void)!::read(go[0], &c, 1);
      const std::string mask = AllowedCpus(0);
      (void)!::write(ready[1], mask.data(), mask.size());
      (void)!::write(ready[1], "\n", 1);
    });
    (void)!::write(ready[1], "s", 1);
    early.join();
    std::thread late([&] {
      const std::string mask = AllowedCpus(0);
      (void)!::write(ready[1], mask.data(), mask.size());
      (void)!::write(ready[1], "\n", 1);
    });
    late.join();
    ::_exit(0);
  }
  char c;
  REQUIRE(::read(ready[0], &c, 1) == 1);  // the early thread exists
  REQUIRE(SetProcessCpus(child, CpuSetOf(cpu)).ok());
  REQUIRE(::write(go[1], "g", 1) == 1);
  std::string out;
  char buf[64];
  for (ssize_t n; (n = ::read(ready[0], buf, sizeof(buf))) > 0;) {
    out.append(buf, static_cast<size_t>(n));
    if (std::count(out.begin(), out.end(), '\n') == 2) break;
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  const std::string one = std::to_string(cpu);
  CHECK(out == one + "\n" + one + "\n");
  CHECK(SetProcessCpus(child, CpuSetOf(cpu)).code() == absl::StatusCode::kNotFound);  // reaped
}

}  // namespace
}  // namespace agentix::base
