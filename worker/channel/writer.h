// The write side of the frame channel: one thread writes the fd at a time,
// and log frames queued by any thread go out ahead of whatever the next
// writer sends. Shared (shared_ptr) between the Channel and the log sender
// and drainer threads, so a thread abandoned at shutdown never outlives what
// it touches.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace agentix::worker {

// Lock order: `mu` is a leaf. Nobody waits for the GIL while holding it, and
// a thread holding the GIL takes it only briefly or after releasing the GIL
// (AcquireWrite, Enter), so it cannot deadlock against the GIL.
struct Writer {
  int fd = -1;
  std::mutex mu;
  // A write to `fd` is in flight: the channel's fd is written by one thread
  // at a time, whichever holds `busy` (a Python sender with the GIL released,
  // or the log sender thread).
  bool busy = false;
  std::condition_variable idle_cv;  // `busy` cleared
  // Encoded log frames not yet written, in the order they were produced.
  std::string logs;
  // The log sender's state (log_sender.h).
  std::condition_variable logs_cv;  // logs queued, or the sender must stop
  // The sender sleeps on logs_cv. Producers wake it only then (and only
  // once): a futex wake per record cost more than encoding it, and a sender
  // that is busy writing finds what was queued meanwhile by itself.
  bool sender_asleep = false;
  std::condition_variable space_cv;  // `logs` shrank (or logging gave up)
  bool sender_running = false;
  bool sender_stop = false;
  bool failed = false;  // a log write failed: later records are dropped
  // Log records and trace events queued without a call id so far, counted
  // after they are queued: a direct call that saw this grow asks for the
  // daemon's barrier (docs/DIRECT-CALLS.md, stage 5).
  std::atomic<uint64_t> untagged_records{0};
  std::thread sender;
};

// Takes the write lock (`busy`), waiting with the GIL released. GIL held on
// entry and exit.
void AcquireWrite(Writer& w);

// Waits (with the GIL released) until no write is in flight. GIL held on
// entry and exit.
void WaitIdle(Writer& w);

// Ends a write begun with AcquireWrite. Any thread.
void Leave(Writer& w);

// With the write lock held: takes the queued log frames, so they go out
// ahead of what the caller writes next (a record logged before a call
// returned then precedes its result). No GIL needed.
std::string TakeLogs(Writer& w);

// With the write lock held and without the GIL: writes the queued logs and
// then `out` (cleared).
absl::Status WriteQueued(Writer& w, std::string& out);

// True in a child forked by user code: it has no sender thread, may have
// been forked while another thread held a Writer's lock, and shares the
// channel fd with the worker. Its records are dropped (the driver also
// points its sys.stdout/sys.stderr back at the fds, which the worker's
// drainers still read).
bool InForkedChild();
// Installs the pthread_atfork handler that sets InForkedChild(). Once per
// process; later calls do nothing.
void WatchForks();

}  // namespace agentix::worker
