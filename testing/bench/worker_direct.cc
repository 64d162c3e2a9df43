// The worker's own round trip, no daemon: what a sequential noop would cost
// if the caller spoke to agentix-worker directly (docs/DIRECT-CALLS.md, the
// bound of issue 25's "a hop fewer"). Spawns the real agentix-worker as
// agentix-sandboxd does (a socketpair on fd 3), with no payload area, so
// nothing is pinned; waits for `ready`; then sends `calls` sequential `call`
// frames for bench_targets::noop (msgpack arguments [[], {}]) and reads each
// `result`, checking it is that call's msgpack None.
//
//   worker_direct --worker=PATH --python-path=DIR [--calls=N] [--warmup=N]
//                 [--client-work-us=T] [--payload-area]
//
// --payload-area gives the worker a payload area on fd 4 as the daemon does
// (16 MiB rings; nothing publishes a CPU in it, so nothing pins): the
// worker's intake then runs as under a daemon with --calls_cpu=off.
//
// --client-work-us=T spins T µs of this process's CPU before each call (and
// outside its timing), standing in for a slower caller's own per-call work
// (the Python host's is ~40 µs): the worker then waits longer for each call,
// as it would behind a Python host, so its sleep-and-wake share is that
// host's, not a tight C++ loop's.
//
// Prints one JSON line: calls, mean_us, p50_us, p90_us, p99_us, this process's CPU a
// call (client_cpu_us_per_call), the worker's (worker_cpu_us_per_call: every
// thread's schedstat run time, warm-up excluded) and its switches a call.
// Exit 1 with a message on any protocol surprise (an error frame, a wrong
// id or value, the worker's exit).
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/child_process.h"
#include "base/unique_fd.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"

namespace agentix::bench {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "worker_direct: %s\n", what.c_str());
  std::exit(1);
}

// The worker's threads' run time (ns) and switches, summed.
struct TaskTotals {
  uint64_t cpu_ns = 0;
  uint64_t voluntary = 0;
  uint64_t involuntary = 0;
};

TaskTotals ReadTasks(pid_t pid) {
  TaskTotals totals;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* tasks = opendir(dir.c_str());
  if (tasks == nullptr) Die(absl::StrCat("cannot open ", dir));
  while (dirent* entry = readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = absl::StrCat(dir, "/", entry->d_name);
    std::ifstream schedstat(task + "/schedstat");
    uint64_t cpu_ns = 0;
    if (schedstat >> cpu_ns) totals.cpu_ns += cpu_ns;
    std::ifstream status(task + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
        totals.voluntary += std::strtoull(line.c_str() + 24, nullptr, 10);
      } else if (line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
        totals.involuntary += std::strtoull(line.c_str() + 27, nullptr, 10);
      }
    }
  }
  closedir(tasks);
  return totals;
}

double ProcessCpuUs() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec * 1e6 + usage.ru_utime.tv_usec +
         usage.ru_stime.tv_sec * 1e6 + usage.ru_stime.tv_usec;
}

class DirectWorker {
 public:
  DirectWorker(const std::string& worker, const std::string& python_path,
               bool payload_area) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      Die("socketpair failed");
    }
    channel_.Reset(fds[0]);
    base::UniqueFd child_end(fds[1]);
    base::SpawnOptions spawn;
    spawn.path = worker;
    spawn.argv = {worker, absl::StrCat("--channel-fd=", ipc::kWorkerChannelFd),
                  "--worker-id=worker-direct",
                  absl::StrCat("--python-path=", python_path)};
    spawn.env = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8",
                 absl::StrCat("AGENTIX_LOG_DIR=", TempDir(), "/worker-direct-logs-", getpid())};
    if (const char* tunables = std::getenv("GLIBC_TUNABLES")) {
      spawn.env.push_back(absl::StrCat("GLIBC_TUNABLES=", tunables));
    }
    spawn.fd_map = {{child_end.get(), ipc::kWorkerChannelFd}};
    if (payload_area) {
      absl::StatusOr<std::unique_ptr<ipc::PayloadArea>> area =
          ipc::PayloadArea::Create(size_t{16} << 20);
      if (!area.ok()) Die(area.status().ToString());
      area_ = std::move(*area);
      spawn.argv.push_back(absl::StrCat("--payload-fd=", ipc::kWorkerPayloadFd));
      spawn.fd_map.push_back({area_->fd(), ipc::kWorkerPayloadFd});
    }
    absl::StatusOr<base::ChildProcess> child = base::ChildProcess::Spawn(spawn);
    if (!child.ok()) Die(child.status().ToString());
    child_ = std::move(*child);
    const ipc::Frame ready = Next();
    if (ready.type != ipc::FrameType::kReady) {
      Die(absl::StrCat("expected ready, got ", std::string(ipc::FrameTypeName(ready.type)), ": ",
                       ready.error.message));
    }
  }

  pid_t pid() const { return child_.pid(); }

  // One noop round trip; checks the reply.
  void Noop(const std::string& id) {
    ipc::Frame call;
    call.type = ipc::FrameType::kCall;
    call.call_id = id;
    call.callable = "bench_targets::noop";
    call.encoding = 2;  // msgpack
    call.data = kNoArguments;
    call.total_size = call.data.size();
    out_.clear();
    if (absl::Status s = ipc::AppendFrame(call, out_); !s.ok()) Die(s.ToString());
    if (absl::Status s = ipc::WriteAll(channel_.get(), out_); !s.ok()) {
      Die(s.ToString());
    }
    const ipc::Frame reply = Next();
    if (reply.type != ipc::FrameType::kResult) {
      Die(absl::StrCat("call ", id, ": expected result, got ",
                       std::string(ipc::FrameTypeName(reply.type)), " ", reply.error.type, ": ",
                       reply.error.message));
    }
    if (reply.call_id != id || reply.encoding != 2 || reply.data != "\xc0") {
      Die(absl::StrCat("call ", id, ": not its msgpack None (id ", reply.call_id,
                       ", encoding ", reply.encoding, ", ", reply.data.size(),
                       " bytes)"));
    }
  }

  void Shutdown() {
    ipc::Frame shutdown;
    shutdown.type = ipc::FrameType::kShutdown;
    out_.clear();
    if (ipc::AppendFrame(shutdown, out_).ok()) {
      (void)ipc::WriteAll(channel_.get(), out_);
    }
    (void)child_.AwaitExit(absl::Seconds(5));
  }

 private:
  // msgpack [[], {}]: fixarray(2), fixarray(0), fixmap(0).
  static constexpr char kNoArguments[] = "\x92\x90\x80";

  static std::string TempDir() {
    const char* dir = std::getenv("TEST_TMPDIR");
    return dir != nullptr ? dir : "/tmp";
  }

  // The next frame that is not a log or trace record (the worker may log,
  // e.g. at start-up); bounded by the socket: a dead worker gives EOF.
  ipc::Frame Next() {
    for (;;) {
      absl::StatusOr<std::optional<ipc::Frame>> frame = reader_.Next();
      if (!frame.ok()) Die(frame.status().ToString());
      if (frame->has_value()) {
        ipc::Frame next = std::move(**frame);
        if (next.type == ipc::FrameType::kLog || next.type == ipc::FrameType::kTrace) {
          continue;
        }
        return next;
      }
      absl::StatusOr<size_t> got = ipc::ReadInto(channel_.get(), reader_);
      if (!got.ok()) Die(got.status().ToString());
      if (*got == 0) Die("the worker closed its channel");
    }
  }

  base::UniqueFd channel_;
  std::unique_ptr<ipc::PayloadArea> area_;
  base::ChildProcess child_;
  ipc::FrameReader reader_;
  std::string out_;
};

// Burns `us` µs of this thread's CPU (not sleeping: a caller's own work).
void Spin(int us) {
  if (us <= 0) return;
  timespec start{}, now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  const int64_t until = start.tv_sec * 1000000000LL + start.tv_nsec + us * 1000LL;
  do {
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  } while (now.tv_sec * 1000000000LL + now.tv_nsec < until);
}

double Percentile(std::vector<double> sorted, double q) {
  const size_t rank = static_cast<size_t>(q * (sorted.size() - 1) + 0.5);
  return sorted[std::min(rank, sorted.size() - 1)];
}

int Main(int argc, char** argv) {
  std::string worker, python_path;
  int calls = 10000, warmup = -1, client_work_us = 0;
  bool payload_area = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--worker=", 0) == 0) {
      worker = arg.substr(9);
    } else if (arg.rfind("--python-path=", 0) == 0) {
      python_path = arg.substr(14);
    } else if (arg.rfind("--calls=", 0) == 0) {
      calls = std::atoi(arg.c_str() + 8);
    } else if (arg.rfind("--client-work-us=", 0) == 0) {
      client_work_us = std::atoi(arg.c_str() + 17);
    } else if (arg == "--payload-area") {
      payload_area = true;
    } else if (arg.rfind("--warmup=", 0) == 0) {
      warmup = std::atoi(arg.c_str() + 9);
    } else {
      Die(absl::StrCat("unknown argument ", arg));
    }
  }
  if (worker.empty() || python_path.empty() || calls < 1) {
    Die("usage: worker_direct --worker=PATH --python-path=DIR [--calls=N] [--warmup=N]");
  }
  if (warmup < 0) warmup = calls / 5;
  DirectWorker direct(worker, python_path, payload_area);
  int next_id = 0;
  for (int i = 0; i < warmup; ++i) {
    Spin(client_work_us);
    direct.Noop(absl::StrCat("w", next_id++));
  }
  std::vector<double> samples;
  samples.reserve(calls);
  const TaskTotals before = ReadTasks(direct.pid());
  const double client_before = ProcessCpuUs();
  for (int i = 0; i < calls; ++i) {
    const std::string id = absl::StrCat("c", next_id++);
    Spin(client_work_us);
    const absl::Time start = absl::Now();
    direct.Noop(id);
    samples.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  const double client_cpu = ProcessCpuUs() - client_before;
  const TaskTotals after = ReadTasks(direct.pid());
  direct.Shutdown();
  double total_us = 0;
  for (double sample : samples) total_us += sample;
  std::sort(samples.begin(), samples.end());
  std::printf(
      "{\"calls\": %d, \"warmup\": %d, \"client_work_us\": %d, \"payload_area\": %s, \"mean_us\": %.2f, \"p50_us\": %.2f, \"p90_us\": %.2f, "
      "\"p99_us\": %.2f, \"client_cpu_us_per_call\": %.2f, "
      "\"worker_cpu_us_per_call\": %.2f, \"worker_voluntary_per_call\": %.3f, "
      "\"worker_involuntary_per_call\": %.3f}\n",
      calls, warmup, client_work_us, payload_area ? "true" : "false", total_us / calls, Percentile(samples, 0.5), Percentile(samples, 0.9),
      Percentile(samples, 0.99), client_cpu / calls,
      (after.cpu_ns - before.cpu_ns) / 1e3 / calls,
      static_cast<double>(after.voluntary - before.voluntary) / calls,
      static_cast<double>(after.involuntary - before.involuntary) / calls);
  return 0;
}

}  // namespace
}  // namespace agentix::bench

int main(int argc, char** argv) { return agentix::bench::Main(argc, argv); }
