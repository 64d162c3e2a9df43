// FrameWireServer: the daemon's end of the frame wire (docs/FRAME-WIRE.md),
// the Calls stream over a plain Unix socket, beside gRPC. It feeds the same
// SessionManager as the gRPC Calls stream through a CallSink of its own.
//
// Threads, chosen for the fewest hand-offs per call: one thread per
// connection reads frames and calls SessionManager::HandleHostEvents inline
// (which writes to the worker inline); the sink's Deliver, on the
// worker-reader thread, serializes and writes to the socket at once
// (non-blocking) when nothing is queued, so a small result costs no thread
// hop. Only bytes that do not fit in the socket are queued; the
// connection's thread writes them when the socket becomes writable.
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sandbox/auth.h"
#include "sandbox/calls_cpu.h"
#include "sandbox/direct_connections.h"
#include "sandbox/session_manager.h"
#include "sandbox/stream_activity.h"

namespace agentix::sandbox {

// HELLO's key asking for direct calls (docs/DIRECT-CALLS.md); its value "1".
inline constexpr char kFrameDirectKey[] = "agentix-direct";

struct FrameWireOptions {
  // The socket file to create (the daemon: its unix PATH + ".calls"). A
  // stale file there is replaced; it is made mode 0600 and removed by Stop.
  std::string path;
  // Decides HELLO's `authorization` as for a gRPC Calls stream; null: no
  // token check.
  std::shared_ptr<TokenGate> gate;
  // Frame-wire connections open at once (each holds a thread); one more is
  // answered STATUS 8 RESOURCE_EXHAUSTED and closed.
  size_t max_connections = 256;
  // A connection that has not sent a whole HELLO this long after it was
  // accepted gets STATUS 4 DEADLINE_EXCEEDED: a silent client cannot hold a
  // thread.
  absl::Duration hello_timeout = absl::Seconds(10);
  // Once a stream's STATUS is due, how long its thread still tries to write
  // what precedes it (a host that does not read) before closing anyway.
  absl::Duration finish_grace = absl::Seconds(2);
  // Counts the open streams for SandboxAdmin.GetStatus (may be null; must
  // outlive the server).
  StreamActivity* activity = nullptr;
  // Set (--calls_cpu): each connection's thread follows its placement (the
  // worker and its reader thread do too, so a sequential call's hand-offs
  // stay on one CPU: sandbox/calls_cpu.h). Null: the scheduler places them.
  std::shared_ptr<CallsCpu> calls_cpu;
  // > 0: after handling the host's frames, a connection's thread polls its
  // socket without sleeping for up to this long before it blocks (adaptive
  // as WorkerOptions::read_spin: a long wait halves the next window, a
  // short one restores it). 0: it blocks at once.
  absl::Duration spin = absl::ZeroDuration();
  // Set (--direct_calls): a Calls connection whose HELLO has
  // agentix-direct: 1 is handed to the worker after HELLO when it is
  // eligible (docs/DIRECT-CALLS.md "Eligibility": the worker advertised
  // `direct`, no set_env pending, --max_concurrent_calls 0, a payload area,
  // no call of the client held here); it then counts here (and against the
  // connection guard) until the worker reports it closed. Null: every
  // connection is relayed.
  std::shared_ptr<DirectConnections> direct;
};

class FrameWireServer {
 public:
  // `manager` must outlive the server.
  FrameWireServer(SessionManager* manager, FrameWireOptions options);
  ~FrameWireServer();  // Stop()
  FrameWireServer(const FrameWireServer&) = delete;
  FrameWireServer& operator=(const FrameWireServer&) = delete;

  // Binds and listens on options.path and starts accepting. InvalidArgument
  // for a path too long for a Unix socket address; Internal for a failed
  // socket call.
  absl::Status Start();
  // Stops accepting, ends every stream with STATUS 14 UNAVAILABLE (after
  // what is queued for it, within finish_grace), joins their threads and
  // removes the socket file. Idempotent.
  void Stop();
  // Frame-wire connections open now.
  size_t connections();

 private:
  class Connection;
  void AcceptLoop();
  // Joins the threads of connections that have ended.
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SessionManager* const manager_;
  const FrameWireOptions options_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd: wakes the accept thread for Stop
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace agentix::sandbox
