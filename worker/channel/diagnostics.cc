#include "worker/channel/diagnostics.h"

#include <time.h>
#include <unistd.h>

#include <atomic>

#include <fmt/format.h>

namespace agentix::worker {
namespace {

// -1: fd 2.
std::atomic<int> g_diag_fd{-1};
// Set before g_diag_fd, never changed afterwards.
std::string* g_diag_tag = nullptr;

}  // namespace

void DiagLine(base::LogSeverity severity, const std::string& message) {
  const int fd = g_diag_fd.load();
  if (fd < 0) {
    base::LogLine(severity, message);
    return;
  }
  static constexpr char kLetters[] = "DIWE";
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm tm_utc;
  gmtime_r(&ts.tv_sec, &tm_utc);
  const std::string line = fmt::format(
      "{:02}:{:02}:{:02}.{:03} {} {} {}\n", tm_utc.tm_hour, tm_utc.tm_min,
      tm_utc.tm_sec, ts.tv_nsec / 1000000, *g_diag_tag,
      kLetters[static_cast<int>(severity) & 3], message);
  // One write per line so concurrent lines do not interleave.
  ssize_t ignored = ::write(fd, line.data(), line.size());
  (void)ignored;
}

void SetDiagnosticFd(int fd, const std::string& worker_id) {
  if (fd >= 0 && g_diag_tag == nullptr) {
    g_diag_tag = new std::string("agentix-worker[" + worker_id + "]");
  }
  g_diag_fd.store(fd);
}

int DiagnosticFd() {
  const int fd = g_diag_fd.load();
  return fd < 0 ? 2 : fd;
}

}  // namespace agentix::worker
