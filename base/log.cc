#include "base/log.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace agentix::base {
namespace {

std::atomic<int> g_min_severity{static_cast<int>(LogSeverity::kInfo)};
// Written once at start-up, before threads exist.
std::string& Tag() {
  static std::string* tag = new std::string("agentix");
  return *tag;
}

char SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kDebug: return 'D';
    case LogSeverity::kInfo: return 'I';
    case LogSeverity::kWarning: return 'W';
    case LogSeverity::kError: return 'E';
  }
  return '?';
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  g_min_severity.store(static_cast<int>(severity));
}

LogSeverity MinLogSeverity() {
  return static_cast<LogSeverity>(g_min_severity.load());
}

LogSeverity ParseLogSeverity(std::string_view name) {
  if (name == "debug") return LogSeverity::kDebug;
  if (name == "warning") return LogSeverity::kWarning;
  if (name == "error") return LogSeverity::kError;
  return LogSeverity::kInfo;
}

void SetLogTag(std::string_view tag) { Tag() = std::string(tag); }

void LogLine(LogSeverity severity, std::string_view message) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm tm_utc;
  gmtime_r(&ts.tv_sec, &tm_utc);
  std::string line = fmt::format(
      "{:02}:{:02}:{:02}.{:03} {} {} {}\n", tm_utc.tm_hour, tm_utc.tm_min,
      tm_utc.tm_sec, ts.tv_nsec / 1000000, Tag(), SeverityLetter(severity),
      message);
  // One write per line so concurrent lines do not interleave.
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

}  // namespace agentix::base
