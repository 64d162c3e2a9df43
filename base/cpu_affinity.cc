#include "base/cpu_affinity.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace agentix::base {

const cpu_set_t& StartCpus() {
  static const cpu_set_t start = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof(set), &set) != 0) CPU_ZERO(&set);
    return set;
  }();
  return start;
}

namespace {
// Reads the start mask during static initialization, not on the first call
// (which may come from a thread already pinned).
[[maybe_unused]] const bool start_cpus_read = (StartCpus(), true);
}  // namespace

ThreadCpusForChild::ThreadCpusForChild() {
  const cpu_set_t& start = StartCpus();
  if (CPU_COUNT(&start) == 0) return;
  if (::sched_getaffinity(0, sizeof(own_), &own_) != 0) return;
  if (CPU_EQUAL(&own_, &start)) return;
  changed_ = ::sched_setaffinity(0, sizeof(start), &start) == 0;
}

ThreadCpusForChild::~ThreadCpusForChild() {
  if (changed_) ::sched_setaffinity(0, sizeof(own_), &own_);
}

absl::StatusOr<int> ParseCpuSetting(absl::string_view setting) {
  setting = absl::StripAsciiWhitespace(setting);
  if (setting.empty() || setting == "off") return kNoCpu;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  if (setting == "auto") {
    for (int cpu = CPU_SETSIZE - 1; cpu >= 0; --cpu) {
      if (CPU_ISSET(cpu, &allowed)) return cpu;
    }
    return absl::InternalError("this thread may run on no CPU");
  }
  int cpu = 0;
  if (!absl::SimpleAtoi(setting, &cpu) || cpu < 0 || cpu >= CPU_SETSIZE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPU setting \"", setting, "\" is not off, auto or a CPU number"));
  }
  if (!CPU_ISSET(cpu, &allowed)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPU ", cpu, " is not one this process may run on (", AllowedCpus(0), ")"));
  }
  return cpu;
}

cpu_set_t CpuSetOf(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  return set;
}

absl::Status SetThreadCpus(pid_t tid, const cpu_set_t& cpus) {
  if (::sched_setaffinity(tid, sizeof(cpus), &cpus) != 0) {
    const int error = errno;
    const std::string message = absl::StrCat("sched_setaffinity(", tid, "): ", std::strerror(error));
    if (error == ESRCH) return absl::NotFoundError(message);
    if (error == EINVAL) return absl::InvalidArgumentError(message);
    return absl::InternalError(message);
  }
  return absl::OkStatus();
}

absl::Status SetProcessCpus(pid_t pid, const cpu_set_t& cpus) {
  // The main thread first: what it starts from now on inherits the mask.
  if (absl::Status status = SetThreadCpus(pid, cpus); !status.ok()) return status;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* tasks = ::opendir(dir.c_str());
  if (tasks == nullptr) return absl::OkStatus();  // exited meanwhile
  while (const dirent* entry = ::readdir(tasks)) {
    pid_t tid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &tid) || tid == pid) continue;
    (void)SetThreadCpus(tid, cpus);  // a thread that ended meanwhile is fine
  }
  ::closedir(tasks);
  return absl::OkStatus();
}

std::string AllowedCpus(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(tid, sizeof(set), &set) != 0) return "?";
  std::string out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    if (!out.empty()) out += ",";
    out += last == cpu ? absl::StrCat(cpu) : absl::StrCat(cpu, "-", last);
    cpu = last;
  }
  return out;
}

}  // namespace agentix::base
