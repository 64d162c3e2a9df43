// The CPUs a thread may run on, as a set, for tests that check pinning.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <set>

#include <catch2/catch.hpp>

namespace agentix::testing {

// The CPUs thread `tid` of this process (0: the calling thread) may run on.
inline std::set<int> CpusOf(pid_t tid = 0) {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(tid, sizeof(set), &set) == 0);
  std::set<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
  }
  return cpus;
}

}  // namespace agentix::testing
