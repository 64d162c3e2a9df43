// The agentix worker process: boots the embedded interpreter, loads the
// driver (the worker/driver/ package, compiled into the binary) and serves
// the daemon's calls
// over the frame channel until shutdown or end of stream.
//
// Start-up failures are reported to the daemon as a `boot_error` frame
// (type "WorkerBootError") before the process exits with kExitBootError.
#pragma once

#include <string>

#include "worker/ipc/frame.h"
#include "worker/python/path_config.h"

namespace agentix::worker {

// Process exit codes. Mirrored as EXIT_* in driver/common.py.
inline constexpr int kExitOk = 0;             // shutdown frame or EOF
inline constexpr int kExitBootError = 3;      // interpreter/driver start-up failed
inline constexpr int kExitProtocolError = 4;  // bad frame: channel desynchronised
inline constexpr int kExitChannelError = 5;   // channel read/write failed
inline constexpr int kExitInternal = 6;       // the driver itself failed

struct WorkerOptions {
  PathOptions paths;
  int channel_fd = ipc::kWorkerChannelFd;
  // The daemon's shared payload area (worker/ipc/payload_area.h), or -1.
  int payload_fd = -1;
  std::string worker_id;
};

// How the worker ended.
struct WorkerExit {
  int code = kExitOk;
  // True when the interpreter is up and no user function is still running
  // on a pool thread, so Py_FinalizeEx is expected to return promptly. False
  // means: skip finalisation and _exit (a stuck user thread would hang it).
  bool finalize = false;
};

// Runs the worker on the calling thread (which becomes the interpreter's main
// thread). Returns once the worker is done; the caller then finalises (or
// not) and exits with the code. Call at most once per process.
WorkerExit RunWorker(const WorkerOptions& options);

// Py_FinalizeEx with a time budget: if finalisation (atexit handlers, joining
// non-daemon threads) takes longer than `budget_ms`, a watchdog thread ends
// the process with `exit_code`. Call after RunWorker with finalize == true.
void FinalizeWorker(int budget_ms, int exit_code);

}  // namespace agentix::worker
