// The scheduling policy of the daemon's call-path threads
// (--calls_sched_batch; docs/FRAME-WIRE.md, "Wake-ups").
//
// A frame-wire connection thread and a worker-reader thread sleep until a
// peer's write wakes them (the host's call, the worker's result). Unix
// sockets wake a reader "synchronously": the scheduler puts it on the
// writer's CPU and, under SCHED_OTHER, preempts the writer at once, before
// the writer reaches its own blocking read; the writer is switched back in
// only to go to sleep. That extra switch pair was a sixth of the worker's
// and the host's CPU per sequential call (perf: exit_to_user_mode_loop
// under the result's write). Under SCHED_BATCH a woken thread never
// preempts; it runs when the writer blocks (microseconds later) or on an
// idle CPU. Only these daemon threads change: the worker and the host keep
// their policy (base/child_process does not pass SCHED_BATCH on).
#pragma once

namespace agentix::sandbox {

// Process-wide, set once at start before any call-path thread runs.
// Default on.
void SetWakeeBatchSched(bool on);
bool WakeeBatchSched();

// Called by a call-path thread as it starts: SCHED_BATCH (nice unchanged)
// when on. Best effort: a refusal (a seccomp filter, say) leaves the thread
// as it was and is logged once at debug level.
void ApplyWakeeSched();

}  // namespace agentix::sandbox
