// Running gRPC's default executor inline.
//
// grpc 1.51 hands a transport's queued work to its "default-executor"
// thread when the thread that ran it wants to move on and another thread
// is waiting on the same connection: in the daemon, the worker-reader
// thread writing a result while the reaction thread reads the host's
// flow-control answer. `perf sched` counts ~0.5 such hand-offs per noop
// call, each one more wake-up (reader -> executor -> reaction thread) and
// ~10 % of the daemon's CPU (docs/DECISIONS.md, "Daemon call path:
// hand-offs and spinning"). With the executor inline, the thread that holds
// the connection finishes that work itself.
//
// This uses grpc_core::Executor, which is not public API: it is exported by
// libgrpc (grpc's own fork support toggles it the same way) and its ABI is
// pinned by the Debian package the build links (1.51).
#pragma once

namespace agentix::sandbox {

// Takes a gRPC library reference for the rest of the process (so the
// executor is never set up again) and stops the default executor's
// threads: its work then runs on the thread that schedules it. Call once,
// at startup, before any server, channel or call exists.
void RunGrpcExecutorInline();

}  // namespace agentix::sandbox
