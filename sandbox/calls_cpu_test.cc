#include "sandbox/calls_cpu.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>

#include "base/cpu_affinity.h"

namespace agentix::sandbox {
namespace {

// base_cpu_affinity_test checks "auto" against sched_getaffinity itself.
int HighestAllowed() { return *base::ParseCpuSetting("auto"); }

TEST_CASE("Calls that overlap unpin the call path; a run of one-at-a-time calls pins it again") {
  CallsCpu placement(HighestAllowed());
  CHECK(placement.pinned());  // the start: calls come one at a time
  placement.NoteRead(1);
  placement.NoteRead(0);  // a read with only logs or chunks says nothing
  CHECK(placement.pinned());
  placement.NoteRead(2);  // two results in one read: callers overlap
  CHECK_FALSE(placement.pinned());
  for (int i = 0; i < CallsCpu::kSequentialReads - 1; ++i) placement.NoteRead(1);
  CHECK_FALSE(placement.pinned());
  placement.NoteRead(3);  // the run is broken: it starts over
  for (int i = 0; i < CallsCpu::kSequentialReads - 1; ++i) placement.NoteRead(1);
  CHECK_FALSE(placement.pinned());
  placement.NoteRead(1);
  CHECK(placement.pinned());
}

TEST_CASE("Threads follow the placement when they next look; other threads are untouched") {
  const int cpu = HighestAllowed();
  const std::string all = base::AllowedCpus(0);
  CallsCpu placement(cpu);
  std::string first, unpinned, again;
  std::thread follower([&] {
    uint64_t seen = CallsCpu::kNever;
    placement.Follow(&seen);
    first = base::AllowedCpus(0);
    placement.NoteRead(2);
    placement.Follow(&seen);
    unpinned = base::AllowedCpus(0);
    for (int i = 0; i < CallsCpu::kSequentialReads; ++i) placement.NoteRead(1);
    placement.Follow(&seen);
    again = base::AllowedCpus(0);
  });
  follower.join();
  CHECK(first == std::to_string(cpu));
  CHECK(unpinned == all);
  CHECK(again == std::to_string(cpu));
  CHECK(base::AllowedCpus(0) == all);
}

TEST_CASE("FollowProcess places every thread of another process") {
  const int cpu = HighestAllowed();
  int ready[2], go[2], report[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(go) == 0);
  REQUIRE(::pipe(report) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::thread other([&] {
      char c;
      (void)!::read(go[0], &c, 1);
      const std::string mask = base::AllowedCpus(0) + "\n";
      (void)!::write(report[1], mask.data(), mask.size());
    });
    (void)!::write(ready[1], "r", 1);
    other.join();
    ::_exit(0);
  }
  char c;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  CallsCpu placement(cpu);
  uint64_t seen = CallsCpu::kNever;
  placement.FollowProcess(child, &seen);
  REQUIRE(::write(go[1], "g", 1) == 1);
  std::string out;
  char buf[64];
  while (out.find('\n') == std::string::npos) {
    const ssize_t n = ::read(report[0], buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(out == std::to_string(cpu) + "\n");
}

}  // namespace
}  // namespace agentix::sandbox
