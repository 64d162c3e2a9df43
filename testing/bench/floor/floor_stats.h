// Shared measurement helpers of the floor programs: the same definitions as
// testing/bench/workloads.py (nearest-rank percentiles, MB/s = 2 * payload /
// median round trip), printed as one JSON line.
#ifndef AGENTIX_TESTING_BENCH_FLOOR_FLOOR_STATS_H_
#define AGENTIX_TESTING_BENCH_FLOOR_FLOOR_STATS_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace agentix::bench {

inline double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double Percentile(std::vector<double> samples, double q) {
  std::sort(samples.begin(), samples.end());
  const size_t rank = std::max<size_t>(1, static_cast<size_t>(std::ceil(q * samples.size())));
  return samples[rank - 1];
}

// Flags: --quick, --small-bytes=N (the noop message size), --big-mib=N.
struct FloorArgs {
  bool quick = false;
  size_t small_bytes = 64;
  size_t big_bytes = 16u << 20;
  int warmup() const { return quick ? 50 : 300; }
  int calls() const { return quick ? 200 : 2000; }
  int big_reps() const { return quick ? 3 : 5; }
};

inline FloorArgs ParseFloorArgs(int argc, char** argv) {
  FloorArgs args;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--quick") == 0) {
      args.quick = true;
    } else if (std::strncmp(a, "--small-bytes=", 14) == 0) {
      args.small_bytes = std::strtoull(a + 14, nullptr, 10);
    } else if (std::strncmp(a, "--big-mib=", 10) == 0) {
      args.big_bytes = std::strtoull(a + 10, nullptr, 10) << 20;
    } else {
      std::fprintf(stderr, "unknown flag %s (--quick, --small-bytes=N, --big-mib=N)\n", a);
      std::exit(2);
    }
  }
  return args;
}

// {"noop_p50_us", "noop_p99_us", "calls_per_s_c1", "mb_per_s_16mib", ...}
inline void PrintFloor(const char* kind, const FloorArgs& args,
                       const std::vector<double>& small_rtts,
                       const std::vector<double>& big_rtts) {
  const double p50 = Percentile(small_rtts, 0.5);
  const double p99 = Percentile(small_rtts, 0.99);
  double total = 0;
  for (double s : small_rtts) total += s;
  const double big = Percentile(big_rtts, 0.5);
  std::printf(
      "{\"kind\": \"%s\", \"small_bytes\": %zu, \"big_bytes\": %zu, "
      "\"noop_p50_us\": %.1f, \"noop_p99_us\": %.1f, \"calls_per_s_c1\": %.1f, "
      "\"mb_per_s_16mib\": %.1f, \"echo_ms_16mib\": %.2f}\n",
      kind, args.small_bytes, args.big_bytes, p50 * 1e6, p99 * 1e6,
      small_rtts.size() / total, 2.0 * args.big_bytes / big / 1e6, big * 1e3);
  std::fflush(stdout);
}

}  // namespace agentix::bench

#endif  // AGENTIX_TESTING_BENCH_FLOOR_FLOOR_STATS_H_
