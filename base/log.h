// Minimal leveled logging to stderr over fmt (absl/log does not exist in our
// Abseil). Never used from the worker's user-output path: stderr there is the
// real fd 2 saved before capture.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace agentix::base {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Sets the lowest severity that is printed (default kInfo). Thread-safe.
void SetMinLogSeverity(LogSeverity severity);
LogSeverity MinLogSeverity();
// Parses "debug", "info", "warning", "error"; unknown names give kInfo.
LogSeverity ParseLogSeverity(std::string_view name);
// Sets the program tag printed in front of each line (e.g. "agentix-sandboxd").
void SetLogTag(std::string_view tag);

// Writes one line "<time> <tag> <S> <message>" to fd 2 with a single write.
void LogLine(LogSeverity severity, std::string_view message);

}  // namespace agentix::base

#define AGX_LOG(severity, ...)                                              \
  do {                                                                      \
    if (::agentix::base::LogSeverity::k##severity >=                        \
        ::agentix::base::MinLogSeverity())                                  \
      ::agentix::base::LogLine(::agentix::base::LogSeverity::k##severity,   \
                               ::fmt::format(__VA_ARGS__));                 \
  } while (false)
