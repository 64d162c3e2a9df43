// The worker's own diagnostics once fds 1/2 are captured: fd 2 is then a
// pipe into the log stream, so they go to the saved original stderr (the
// daemon reads it) in //base:log's line format.
#pragma once

#include <string>

#include "base/log.h"

namespace agentix::worker {

// One diagnostic line: to the saved stderr once set, else via base::LogLine.
void DiagLine(base::LogSeverity severity, const std::string& message);

// Points diagnostics at `fd` (the saved stderr), tagged
// "agentix-worker[<worker_id>]" (the tag is fixed by the first call); -1
// returns them to fd 2.
void SetDiagnosticFd(int fd, const std::string& worker_id);

// The fd diagnostics go to: the saved stderr, or 2 before capture started.
int DiagnosticFd();

}  // namespace agentix::worker
