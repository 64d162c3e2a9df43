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
//             [--pages=0] [--uring=0|1|2] [--defer=0|1] [--socket=0|1]
//             [--poll=0|1]
//
// --pages=0: each hop touches 16 KiB of its own memory in order (few
// translations); --pages=N: N cache lines on N random pages of its own
// 64 MiB (N translations). --uring=1: each process passes the token on and
// waits for the next one in one io_uring_enter (a write and a POLL_ADD,
// then a plain read; uring_hop.h), --uring=2: a write and a READ, one
// syscall per hop; --defer=1 sets the ring up with DEFER_TASKRUN; --socket=1
// passes the token over Unix stream sockets instead of pipes. Without
// --uring a hop is a write, then a blocking read: the writer is often
// preempted by the reader it woke and runs again later only to block.
// Besides the tick's loss it prints the ring's context switches and CPU per
// round (schedstat of every process), its involuntary switches, and the
// other CPU's function-call interrupts per timer interrupt on --cpu
// (/proc/interrupts CAL / LOC: the nohz idle-balance kicks a tick sends
// while the other CPU idles, and cross-CPU wake-ups; load on the other CPU
// changes it). Prints one JSON line; exits 3 if io_uring is refused.
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "testing/bench/floor/floor_stats.h"
#include "testing/bench/floor/uring_hop.h"

namespace {

constexpr size_t kRegion = size_t{64} << 20;
constexpr size_t kSequential = 16 << 10;

struct Args {
  int procs = 4, cpu = 1, ms = 2000, tick_us = 4000, pages = 0, uring = 0, defer = 0,
      socket = 0, poll = 0;
};

// One hop: passes `token` to `out` and takes the next one from `in`,
// either as a write and a blocking read or in one io_uring_enter
// (`ring` set; mode 1 polls then reads, mode 2 reads in the ring). False at
// end of ring or on an error.
bool Pass(agentix::bench::UringHop* ring, int mode, int out, int in, char* token) {
  const char sent = *token;
  if (ring == nullptr && mode == 1) {  // the daemon's hops: poll before the read
    pollfd p{in, POLLIN, 0};
    return ::write(out, &sent, 1) == 1 && ::poll(&p, 1, -1) == 1 && ::read(in, token, 1) == 1;
  }
  if (ring == nullptr) return ::write(out, &sent, 1) == 1 && ::read(in, token, 1) == 1;
  if (mode == 2) return ring->WriteThenWait(out, &sent, 1, in, token, 1) == 1;
  return ring->WriteThenWait(out, &sent, 1, in) > 0 && ::read(in, token, 1) == 1;
}

// Context switches (schedstat's third field), CPU seconds and involuntary
// switches of one process (single-threaded here).
struct Sched {
  double cpu_s = 0, switches = 0, involuntary = 0;
};

Sched ReadSched(pid_t pid) {
  Sched s;
  const std::string dir = "/proc/" + std::to_string(pid);
  if (FILE* f = std::fopen((dir + "/schedstat").c_str(), "r")) {
    unsigned long long run = 0, wait = 0, slices = 0;
    if (std::fscanf(f, "%llu %llu %llu", &run, &wait, &slices) == 3) {
      s.cpu_s = run * 1e-9;
      s.switches = static_cast<double>(slices);
    }
    std::fclose(f);
  }
  if (FILE* f = std::fopen((dir + "/status").c_str(), "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      unsigned long long n = 0;
      if (std::sscanf(line, "nonvoluntary_ctxt_switches: %llu", &n) == 1) s.involuntary = n;
    }
    std::fclose(f);
  }
  return s;
}

Sched RingSched(const std::vector<pid_t>& pids) {
  Sched sum;
  for (pid_t pid : pids) {
    const Sched one = ReadSched(pid);
    sum.cpu_s += one.cpu_s;
    sum.switches += one.switches;
    sum.involuntary += one.involuntary;
  }
  return sum;
}

// A /proc/interrupts row's count on `cpu` ("LOC", "CAL"); -1 if absent.
double Interrupts(const char* row, int cpu) {
  FILE* f = std::fopen("/proc/interrupts", "r");
  if (f == nullptr) return -1;
  char line[4096];
  double found = -1;
  const size_t n = std::strlen(row);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    const char* p = line;
    while (*p == ' ') ++p;
    if (std::strncmp(p, row, n) != 0 || p[n] != ':') continue;
    p += n + 1;
    for (int i = 0; i <= cpu; ++i) {
      char* end = nullptr;
      const double v = std::strtod(p, &end);
      if (end == p) break;
      if (i == cpu) found = v;
      p = end;
    }
    break;
  }
  std::fclose(f);
  return found;
}

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
               !Flag(argv[i], "--pages", &args.pages) && !Flag(argv[i], "--uring", &args.uring) &&
               !Flag(argv[i], "--defer", &args.defer) && !Flag(argv[i], "--socket", &args.socket) &&
               !Flag(argv[i], "--poll", &args.poll)) {
      std::fprintf(stderr, "tick_ring: bad flag %s\n", argv[i]);
      return 2;
    }
  }
  if (args.procs < 2 || args.procs > 64 || args.ms <= 0 || args.tick_us <= 0 ||
      args.pages < 0 || args.uring < 0 || args.uring > 2) {
    std::fprintf(stderr,
                 "tick_ring: --procs 2..64, --ms, --tick-us > 0, --pages >= 0, --uring 0..2\n");
    return 2;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(args.cpu, &one);
  if (::sched_setaffinity(0, sizeof(one), &one) != 0) {
    std::perror("tick_ring: sched_setaffinity");
    return 1;
  }
  // pipes[i]: process i writes the token to process i + 1 (mod procs); 0
  // measures. --socket: Unix stream socketpairs instead (the stack's hops);
  // [2i + 1] is still the end written, [2i] the end read.
  std::vector<int> pipes(2 * args.procs);
  for (int i = 0; i < args.procs; ++i) {
    if ((args.socket ? ::socketpair(AF_UNIX, SOCK_STREAM, 0, &pipes[2 * i])
                     : ::pipe(&pipes[2 * i])) != 0) {
      std::perror("tick_ring: pipe or socketpair");
      return 1;
    }
  }
  // Each process opens its own ring (DEFER_TASKRUN: only its creator may
  // wait on it); an error is reported by the measuring process.
  auto open_ring = [&](std::unique_ptr<agentix::bench::UringHop>* ring) {
    if (args.uring == 0) return 0;
    *ring = std::make_unique<agentix::bench::UringHop>();
    return (*ring)->Open(args.defer != 0);
  };
  std::vector<pid_t> pids = {::getpid()};
  for (int i = 1; i < args.procs; ++i) {
    const pid_t child = ::fork();
    if (child == 0) {
      std::unique_ptr<agentix::bench::UringHop> ring;
      if (open_ring(&ring) != 0) ::_exit(1);
      Toucher toucher(args.pages);
      char token = 0;
      if (::read(pipes[2 * (i - 1)], &token, 1) != 1) ::_exit(0);
      for (;;) {
        toucher.Hop();
        if (token == 'q') {
          (void)!::write(pipes[2 * i + 1], &token, 1);
          break;
        }
        if (!Pass(ring.get(), ring ? args.uring : args.poll, pipes[2 * i + 1], pipes[2 * (i - 1)],
                  &token)) {
          break;
        }
      }
      ::_exit(0);
    }
    pids.push_back(child);
  }
  std::unique_ptr<agentix::bench::UringHop> ring;
  if (const int error = open_ring(&ring); error != 0) {
    // Exit 3: this kernel or sandbox refuses io_uring (seccomp, or
    // kernel.io_uring_disabled); the children end at the pipes' EOF.
    std::fprintf(stderr, "tick_ring: io_uring unavailable: %s\n", std::strerror(error));
    return 3;
  }
  Toucher toucher(args.pages);
  std::vector<double> starts, lens;
  const int other_cpu = args.cpu == 0 ? 1 : 0;
  Sched sched_before;
  double ticks_before = 0, calls_before = 0;
  const double end = Now() + args.ms / 1e3;
  for (double t0 = Now(); t0 < end; t0 = Now()) {
    if (starts.size() == 1) {  // every process has run once: its ring is open
      sched_before = RingSched(pids);
      ticks_before = Interrupts("LOC", args.cpu);
      calls_before = Interrupts("CAL", other_cpu);
      t0 = Now();
    }
    char token = 'x';
    if (!Pass(ring.get(), ring ? args.uring : args.poll, pipes[1], pipes[2 * (args.procs - 1)],
              &token)) {
      std::perror("tick_ring: ring");
      return 1;
    }
    toucher.Hop();
    starts.push_back(t0);
    lens.push_back(Now() - t0);
  }
  const Sched sched_after = RingSched(pids);
  const double ticks = Interrupts("LOC", args.cpu) - ticks_before;
  const double other_calls = Interrupts("CAL", other_cpu) - calls_before;
  const double measured = static_cast<double>(lens.size() - 1);
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
  json.Num("uring", args.uring);
  json.Num("socket", args.socket);
  json.Num("poll", args.uring == 0 ? args.poll : 0);
  json.Num("switches_per_round", (sched_after.switches - sched_before.switches) / measured);
  json.Num("involuntary_per_round",
           (sched_after.involuntary - sched_before.involuntary) / measured);
  json.Num("cpu_us_per_round", (sched_after.cpu_s - sched_before.cpu_s) / measured * 1e6);
  if (ticks > 0 && ticks_before >= 0 && calls_before >= 0) {
    json.Num("other_cpu_calls_per_tick", other_calls / ticks);
  }
  json.Print();
  return 0;
}
