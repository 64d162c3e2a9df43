// Shared measurement helpers of the floor programs: the same definitions as
// testing/bench/workloads.py (nearest-rank percentiles, MB/s = 2 * payload /
// median round trip), CPU per call from /proc, printed as one JSON line.
#ifndef AGENTIX_TESTING_BENCH_FLOOR_FLOOR_STATS_H_
#define AGENTIX_TESTING_BENCH_FLOOR_FLOOR_STATS_H_

#include <dirent.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
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

// On-CPU seconds of every live thread of `pid` (schedstat: ns resolution,
// where /proc/<pid>/stat counts 10 ms ticks). Threads that ended meanwhile are
// not counted; the floor programs' threads live for the whole run.
inline double ProcessCpuSeconds(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* tasks = ::opendir(dir.c_str());
  if (tasks == nullptr) return 0;
  double total = 0;
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    const std::string path = dir + "/" + entry->d_name + "/schedstat";
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      unsigned long long ns = 0;
      if (std::fscanf(f, "%llu", &ns) == 1) total += ns * 1e-9;
      std::fclose(f);
    }
  }
  ::closedir(tasks);
  return total;
}

// CPU of the measuring process and its peer over a stretch of work.
class CpuMeter {
 public:
  explicit CpuMeter(pid_t peer) : CpuMeter(std::vector<pid_t>{peer}) {}
  // Several peers (a relay and its echo): PeerSeconds is their sum.
  explicit CpuMeter(std::vector<pid_t> peers) : peers_(std::move(peers)) { Restart(); }
  void Restart() {
    self_ = ProcessCpuSeconds(::getpid());
    other_ = PeersNow();
  }
  double SelfSeconds() const { return ProcessCpuSeconds(::getpid()) - self_; }
  double PeerSeconds() const { return PeersNow() - other_; }

 private:
  double PeersNow() const {
    double sum = 0;
    for (pid_t peer : peers_) sum += ProcessCpuSeconds(peer);
    return sum;
  }
  std::vector<pid_t> peers_;
  double self_ = 0, other_ = 0;
};

// "1,16,64" -> {1, 16, 64}; "" -> {}.
inline std::vector<size_t> ParseList(const char* text) {
  std::vector<size_t> out;
  while (*text != '\0') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text, &end, 10);
    if (end == text) {
      std::fprintf(stderr, "not a number list: %s\n", text);
      std::exit(2);
    }
    out.push_back(v);
    text = *end == ',' ? end + 1 : end;
  }
  return out;
}

// Flags: --quick, --small-bytes=N (the noop message size), --big-mib=1,16,64
// (echo sizes; empty: none), --concurrency=16,64 (messages in flight at once;
// empty: none), plus per-program flags handled by `extra` (true = taken).
struct FloorArgs {
  bool quick = false;
  size_t small_bytes = 64;
  std::vector<size_t> big_mib = {16};
  std::vector<size_t> concurrency;
  int warmup() const { return quick ? 50 : 300; }
  // As many sequential noops quick or not: the busy-core pass runs quick,
  // and its p99 must compare with ours' over the same count (workloads.py).
  int calls() const { return 2000; }
  int big_reps() const { return quick ? 3 : 5; }
  double window_s() const { return quick ? 0.3 : 1.5; }
  double window_warmup_s() const { return quick ? 0.1 : 0.3; }
};

template <typename Extra>
FloorArgs ParseFloorArgs(int argc, char** argv, Extra extra) {
  FloorArgs args;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--quick") == 0) {
      args.quick = true;
    } else if (std::strncmp(a, "--small-bytes=", 14) == 0) {
      args.small_bytes = std::strtoull(a + 14, nullptr, 10);
    } else if (std::strncmp(a, "--big-mib=", 10) == 0) {
      args.big_mib = ParseList(a + 10);
    } else if (std::strncmp(a, "--concurrency=", 14) == 0) {
      args.concurrency = ParseList(a + 14);
    } else if (!extra(a)) {
      std::fprintf(stderr,
                   "unknown flag %s (--quick, --small-bytes=N, --big-mib=N[,N...], "
                   "--concurrency=N[,N...] and the program's own)\n",
                   a);
      std::exit(2);
    }
  }
  return args;
}

inline FloorArgs ParseFloorArgs(int argc, char** argv) {
  return ParseFloorArgs(argc, argv, [](const char*) { return false; });
}

// One flat JSON object, printed as one line.
class JsonLine {
 public:
  void Str(const char* key, const std::string& value) {
    Key(key);
    out_ += "\"" + value + "\"";
  }
  void Num(const std::string& key, double value) {
    Key(key.c_str());
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.2f", value);
    out_ += buf;
  }
  void Print() {
    std::printf("{%s}\n", out_.c_str());
    std::fflush(stdout);
  }

 private:
  void Key(const char* key) {
    if (!out_.empty()) out_ += ", ";
    out_ += "\"" + std::string(key) + "\": ";
  }
  std::string out_;
};

// The sequential small-message figures: noop_p50_us, noop_p99_us,
// noop_mean_us, calls_per_s_c1 and the CPU both processes spent per round
// trip (noop_cpu_us_per_call = client + server).
inline void AddSmall(JsonLine* json, const std::vector<double>& rtts, double client_cpu_s,
                     double server_cpu_s) {
  double total = 0;
  for (double s : rtts) total += s;
  const double n = static_cast<double>(rtts.size());
  json->Num("noop_p50_us", Percentile(rtts, 0.5) * 1e6);
  json->Num("noop_p99_us", Percentile(rtts, 0.99) * 1e6);
  json->Num("noop_mean_us", total / n * 1e6);
  json->Num("calls_per_s_c1", n / total);
  json->Num("noop_cpu_us_per_call", (client_cpu_s + server_cpu_s) / n * 1e6);
  json->Num("noop_cpu_us_per_call_client", client_cpu_s / n * 1e6);
  json->Num("noop_cpu_us_per_call_server", server_cpu_s / n * 1e6);
}

// One echo size: mb_per_s_<N>mib (2 * bytes / median round trip),
// echo_ms_<N>mib and echo_cpu_ms_<N>mib (both processes, per echo).
inline void AddBig(JsonLine* json, size_t mib, const std::vector<double>& rtts, double cpu_s) {
  const std::string suffix = std::to_string(mib) + "mib";
  const double median = Percentile(rtts, 0.5);
  json->Num("mb_per_s_" + suffix, 2.0 * (mib << 20) / median / 1e6);
  json->Num("echo_ms_" + suffix, median * 1e3);
  json->Num("echo_cpu_ms_" + suffix, cpu_s / rtts.size() * 1e3);
}

}  // namespace agentix::bench

#endif  // AGENTIX_TESTING_BENCH_FLOOR_FLOOR_STATS_H_
