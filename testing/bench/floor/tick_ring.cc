// What the kernel tick costs a chain of processes on one CPU (issue 25's
// noop p99): a token goes round a ring of --procs processes over pipes, all
// pinned to --cpu, each touching memory per hop; every round's start and
// length are kept. Per boundary of the tick period (CLOCK_MONOTONIC
// multiples of --tick-us: the periodic tick's due times) the loss is the
// rounds' excess over the median round from 100 us before it to 150 us
// after, less the same sum over a window half a period later (the
// baseline jitter). See testing/bench/README.md.
//
//   tick_ring [--quick] [--procs=4] [--cpu=1] [--ms=2000] [--tick-us=4000]
//             [--pages=0]
//
// --pages=0: each hop touches 16 KiB of its own memory in order (few
// translations); --pages=N: N cache lines on N random pages of its own
// 64 MiB (N translations). Prints one JSON line.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "testing/bench/floor/floor_stats.h"

namespace {

constexpr size_t kRegion = size_t{64} << 20;
constexpr size_t kSequential = 16 << 10;

struct Args {
  int procs = 4, cpu = 1, ms = 2000, tick_us = 4000, pages = 0;
};

bool Flag(const char* arg, const char* name, int* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  char* end = nullptr;
  *value = static_cast<int>(std::strtol(arg + n + 1, &end, 10));
  return end != arg + n + 1 && *end == '\0';
}

// One hop's work: the same on every process, on its own memory.
class Toucher {
 public:
  explicit Toucher(int pages)
      : pages_(pages), size_(pages > 0 ? kRegion : kSequential), owned_(new char[size_]) {
    std::memset(owned_.get(), 1, size_);  // faulted in before the run
    mem_ = owned_.get();
  }
  void Hop() {
    if (pages_ == 0) {
      for (size_t i = 0; i < size_; i += 64) mem_[i]++;
      return;
    }
    for (int i = 0; i < pages_; ++i) {
      seed_ = seed_ * 6364136223846793005ULL + 1442695040888963407ULL;
      const size_t page = (seed_ >> 33) % (kRegion / 4096);
      mem_[page * 4096 + (i % 64) * 64]++;
    }
  }

 private:
  int pages_;
  size_t size_;
  std::unique_ptr<char[]> owned_;
  volatile char* mem_;
  uint64_t seed_ = 0x9e3779b97f4a7c15ULL;
};

double Loss(const std::vector<double>& starts, const std::vector<double>& lens, double p50,
            double from, double to) {
  double sum = 0;
  // Rounds last microseconds: one that ends in the window started at most 10 ms before.
  const auto first = std::lower_bound(starts.begin(), starts.end(), from - 0.01);
  for (size_t i = first - starts.begin(); i < starts.size() && starts[i] < to; ++i) {
    if (starts[i] + lens[i] >= from && lens[i] > p50) sum += lens[i] - p50;
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  using agentix::bench::JsonLine;
  using agentix::bench::Now;
  using agentix::bench::Percentile;
  Args args;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      args.ms = 300;
    } else if (!Flag(argv[i], "--procs", &args.procs) && !Flag(argv[i], "--cpu", &args.cpu) &&
               !Flag(argv[i], "--ms", &args.ms) && !Flag(argv[i], "--tick-us", &args.tick_us) &&
               !Flag(argv[i], "--pages", &args.pages)) {
      std::fprintf(stderr, "tick_ring: bad flag %s\n", argv[i]);
      return 2;
    }
  }
  if (args.procs < 2 || args.procs > 64 || args.ms <= 0 || args.tick_us <= 0 ||
      args.pages < 0) {
    std::fprintf(stderr, "tick_ring: --procs 2..64, --ms, --tick-us > 0, --pages >= 0\n");
    return 2;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(args.cpu, &one);
  if (::sched_setaffinity(0, sizeof(one), &one) != 0) {
    std::perror("tick_ring: sched_setaffinity");
    return 1;
  }
  // pipes[i]: process i writes the token to process i + 1 (mod procs); 0 measures.
  std::vector<int> pipes(2 * args.procs);
  for (int i = 0; i < args.procs; ++i) {
    if (::pipe(&pipes[2 * i]) != 0) {
      std::perror("tick_ring: pipe");
      return 1;
    }
  }
  for (int i = 1; i < args.procs; ++i) {
    if (::fork() == 0) {
      Toucher toucher(args.pages);
      char token = 0;
      while (::read(pipes[2 * (i - 1)], &token, 1) == 1) {
        toucher.Hop();
        if (::write(pipes[2 * i + 1], &token, 1) != 1 || token == 'q') break;
      }
      ::_exit(0);
    }
  }
  Toucher toucher(args.pages);
  std::vector<double> starts, lens;
  const double end = Now() + args.ms / 1e3;
  for (double t0 = Now(); t0 < end; t0 = Now()) {
    char token = 'x';
    if (::write(pipes[1], &token, 1) != 1 || ::read(pipes[2 * (args.procs - 1)], &token, 1) != 1) {
      std::perror("tick_ring: ring");
      return 1;
    }
    toucher.Hop();
    starts.push_back(t0);
    lens.push_back(Now() - t0);
  }
  char quit = 'q';
  if (::write(pipes[1], &quit, 1) == 1) (void)::read(pipes[2 * (args.procs - 1)], &quit, 1);
  while (::wait(nullptr) > 0) {
  }
  const double p50 = Percentile(lens, 0.5), period = args.tick_us / 1e6;
  std::vector<double> losses;
  for (double b = (static_cast<int64_t>(starts.front() / period) + 1) * period;
       b + period < starts.back(); b += period) {
    losses.push_back(Loss(starts, lens, p50, b - 100e-6, b + 150e-6) -
                     Loss(starts, lens, p50, b + period / 2 - 100e-6, b + period / 2 + 150e-6));
  }
  if (losses.empty()) {
    std::fprintf(stderr, "tick_ring: the run held no tick period; raise --ms\n");
    return 1;
  }
  JsonLine json;
  json.Str("kind", "tick_ring");
  json.Num("procs", args.procs);
  json.Num("pages_per_hop", args.pages);
  json.Num("rounds", lens.size());
  json.Num("round_p50_us", p50 * 1e6);
  json.Num("round_p99_us", Percentile(lens, 0.99) * 1e6);
  json.Num("ticks", losses.size());
  json.Num("tick_loss_p25_us", Percentile(losses, 0.25) * 1e6);
  json.Num("tick_loss_p50_us", Percentile(losses, 0.5) * 1e6);
  json.Num("tick_loss_p75_us", Percentile(losses, 0.75) * 1e6);
  json.Print();
  return 0;
}
