// Same-run A/B of the daemon's remembered call ids (wire/finished_ids.h)
// as one hash set (shard_bits 0, the layout before stop 34) and as sharded
// sets: what one Remember costs while the daemon's first 65,536 calls fill
// it. A set grows by moving all it holds into a new table, under the session
// lock, on the path of the call whose ack it is (issue 25's tail).
//
//   bazel run //testing/bench:finished_ids_ab -- [ROUNDS] [IDS]
//
// Each round runs each layout in a fresh forked process (fresh memory, as a
// new daemon's; the order swapped each round) and prints per layout, in the
// thread's CPU time (the clock's own cost, ~0.3 us, is in every figure; a
// preemption is in none): the slowest Remember, the 99.9th and 50th percentiles, the Remembers over
// 100 us, the mean, and the resident memory it added (after 2,000 ids and
// at the end; the timing vector's own pages are touched before). Then the
// medians over rounds.
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "wire/finished_ids.h"

namespace {

struct Figures {
  double max_us = 0, p999_us = 0, p50_us = 0, mean_us = 0;
  double over_100us = 0;
  double kib_early = 0, kib_full = 0;  // resident growth: 2,000 ids; all
};

// Resident KiB of this process (/proc/self/statm).
double ResidentKib() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) {
    pages_resident = 0;
  }
  std::fclose(f);
  return pages_resident * (sysconf(_SC_PAGESIZE) / 1024.0);
}

// Python hosts' ids: 32 hex chars (uuid4().hex).
std::string IdOf(uint64_t i) {
  return absl::StrCat(absl::Hex(i * 0x9E3779B97F4A7C15ULL, absl::kZeroPad16),
                      absl::Hex(i ^ 0x5bd1e995, absl::kZeroPad16));
}

// This thread's CPU time: a Remember's own cost (its page faults included),
// not the time others' threads held the CPU (the machine is shared).
double ThreadCpuUs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

Figures Measure(int shard_bits, size_t ids) {
  agentix::sandbox::FinishedIds finished(65536, shard_bits);
  std::vector<double> took(ids, 0.0);
  std::string id;
  Figures f;
  const double kib_before = ResidentKib();
  for (size_t i = 0; i < ids; ++i) {
    if (i == 2000) f.kib_early = ResidentKib() - kib_before;
    id = IdOf(i);
    const double start = ThreadCpuUs();
    finished.Remember(id);
    took[i] = ThreadCpuUs() - start;
  }
  f.kib_full = ResidentKib() - kib_before;
  for (double t : took) {
    f.mean_us += t / ids;
    if (t > 100) ++f.over_100us;
  }
  std::sort(took.begin(), took.end());
  f.max_us = took.back();
  f.p999_us = took[ids * 999 / 1000];
  f.p50_us = took[ids / 2];
  return f;
}

Figures InChild(int shard_bits, size_t ids) {
  int fds[2];
  if (pipe(fds) != 0) std::exit(1);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const Figures f = Measure(shard_bits, ids);
    if (write(fds[1], &f, sizeof(f)) != sizeof(f)) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  Figures f;
  const bool got = read(fds[0], &f, sizeof(f)) == sizeof(f);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "finished_ids_ab: the measuring child failed\n");
    std::exit(1);
  }
  return f;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2]
                      : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
  const size_t ids = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 70000;
  if (rounds <= 0 || ids < 1000) {
    std::fprintf(stderr, "usage: finished_ids_ab [ROUNDS>0] [IDS>=1000]\n");
    return 2;
  }
  const int layouts[2] = {0, agentix::sandbox::FinishedIds::kShardBits};
  std::vector<Figures> per[2];
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int which = r % 2 ? 1 - k : k;
      per[which].push_back(InChild(layouts[which], ids));
      const Figures& f = per[which].back();
      std::printf(
          "round %d shard_bits %d: max %.1f us, p99.9 %.2f, p50 %.3f, "
          "over 100 us %.0f, mean %.3f; resident +%.0f KiB at 2,000 ids, "
          "+%.0f at the end\n",
          r + 1, layouts[which], f.max_us, f.p999_us, f.p50_us, f.over_100us,
          f.mean_us, f.kib_early, f.kib_full);
    }
  }
  auto median = [&](int which, double Figures::*field) {
    std::vector<double> v;
    for (const Figures& f : per[which]) v.push_back(f.*field);
    return Median(v);
  };
  for (int which = 0; which < 2; ++which) {
    std::printf(
        "median shard_bits %d: max %.1f us, p99.9 %.2f, p50 %.3f, over 100 us "
        "%.0f, mean %.3f; resident +%.0f KiB at 2,000 ids, +%.0f at the end\n",
        layouts[which], median(which, &Figures::max_us),
        median(which, &Figures::p999_us), median(which, &Figures::p50_us),
        median(which, &Figures::over_100us), median(which, &Figures::mean_us),
        median(which, &Figures::kib_early), median(which, &Figures::kib_full));
  }
  return 0;
}
