// A worker started before the daemon's exec, for the daemon to adopt
// (sandbox/launch_main.cc starts it; WorkerProcess::Adopt takes it over), and
// the --adopt_worker flag value that names it across the exec.
#pragma once

#include <sys/types.h>

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace agentix::sandbox {

struct AdoptedWorker {
  pid_t pid = -1;       // the daemon's child (forked by its image before exec)
  std::string worker_id;
  int channel_fd = -1;  // the socketpair's daemon end
  int stderr_fd = -1;   // the read end of the worker's stderr pipe
  int payload_fd = -1;  // the payload area's memfd, or -1 (none)
};

// "pid=P,id=ID,channel=N,stderr=N[,payload=N]".
std::string FormatAdoptFlag(const AdoptedWorker& worker);
// The inverse. kInvalidArgument naming the bad or missing field.
absl::StatusOr<AdoptedWorker> ParseAdoptFlag(absl::string_view value);

}  // namespace agentix::sandbox
