// The machine's floor for starting a process: fork + execve of /bin/true and
// waitpid, nothing else (no namespaces, no cgroup). The provider benchmark
// reports it beside a cold sandbox create. See testing/bench/README.md.
//
//   spawn_true [--quick] [--runs=N]
//
// Prints one JSON line: spawn_p50_ms, spawn_p99_ms and spawn_cpu_ms (this
// process and the reaped children, per spawn, from getrusage).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "testing/bench/floor/floor_stats.h"

namespace agentix::bench {
namespace {

double RusageSeconds(int who) {
  rusage usage{};
  ::getrusage(who, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

double SpawnTrue() {
  const double start = Now();
  const pid_t child = ::fork();
  if (child == 0) {
    char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
    ::execve("/bin/true", argv, environ);
    ::_exit(127);
  }
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "spawn_true: /bin/true did not run\n");
    std::exit(1);
  }
  return Now() - start;
}

int Main(int argc, char** argv) {
  int runs = 0;
  const FloorArgs args = ParseFloorArgs(argc, argv, [&](const char* a) {
    if (std::strncmp(a, "--runs=", 7) != 0) return false;
    runs = std::atoi(a + 7);
    return true;
  });
  if (runs <= 0) runs = args.quick ? 20 : 100;
  for (int i = 0; i < 3; ++i) SpawnTrue();  // page cache, dynamic loader
  const double cpu0 = RusageSeconds(RUSAGE_SELF) + RusageSeconds(RUSAGE_CHILDREN);
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) times.push_back(SpawnTrue());
  const double cpu = RusageSeconds(RUSAGE_SELF) + RusageSeconds(RUSAGE_CHILDREN) - cpu0;
  JsonLine json;
  json.Str("kind", "fork_exec_true");
  json.Num("runs", runs);
  json.Num("spawn_p50_ms", Percentile(times, 0.5) * 1e3);
  json.Num("spawn_p99_ms", Percentile(times, 0.99) * 1e3);
  json.Num("spawn_cpu_ms", cpu / runs * 1e3);
  json.Print();
  return 0;
}

}  // namespace
}  // namespace agentix::bench

int main(int argc, char** argv) { return agentix::bench::Main(argc, argv); }
