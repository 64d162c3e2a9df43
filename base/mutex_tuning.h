// Abseil mutex settings for our processes.
#pragma once

namespace agentix::base {

// Turns off absl::Mutex deadlock detection. Debian builds Abseil without
// NDEBUG, so every absl::Mutex (gRPC core's included) records lock order in a
// process-wide graph on each acquisition: a nested lock/unlock pair costs
// ~175 ns instead of ~59 ns on a quiet machine here (docs/PERFORMANCE.md,
// "Mutex deadlock detection"), on every hop of a call. Upstream Abseil turns it
// on only in debug builds; Debian's default is a build artefact, not a choice.
// Call before threads start (first thing in main, or at module init).
void DisableMutexDeadlockDetection();

}  // namespace agentix::base
