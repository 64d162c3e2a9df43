// Bounds on the daemon's incoming connections that hold without a token.
//
// gRPC 1.51 has no connection cap, no handshake/auth deadline for a peer
// that never sends a valid token, and it drops a listener for good when
// accept4 fails with EMFILE. This library interposes the process's accept4
// (a definition in the executable wins over libc's for libgrpc's PLT call),
// close and recvmsg to:
//  - keep listeners alive when the process is out of file descriptors: a
//    reserved fd is freed to accept and close the pending connection, and
//    gRPC is told EAGAIN, which it treats as "wait for the next one";
//  - refuse (close at once) connections beyond the total cap or beyond the
//    per-peer cap of connections that have not authenticated yet;
//  - shut down (shutdown(SHUT_RDWR); gRPC then closes it) every connection
//    that has made no authenticated RPC within the timeout.
// Until StartConnectionGuard runs, the three functions pass straight through.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace agentix::sandbox {

struct ConnectionLimits {
  // Accepted connections open at once, authenticated or not.
  size_t max_connections = 1024;
  // Connections from one peer address (all Unix-socket peers are one peer)
  // that have not made an authenticated RPC yet.
  size_t max_unauthenticated_per_peer = 64;
  // A connection that has made no authenticated RPC this long after it was
  // accepted is shut down.
  absl::Duration auth_timeout = absl::Seconds(10);
};

// Installs `limits` (replacing earlier ones) and, on the first call, starts
// the thread that enforces the timeout. InvalidArgument for a zero cap or a
// non-positive timeout; Internal if no descriptor can be reserved.
absl::Status StartConnectionGuard(const ConnectionLimits& limits);

// Marks the connection the calling thread last received bytes on as
// authenticated: it no longer counts against the per-peer cap and is not
// timed out. Called by the token check, which gRPC runs on the thread that
// read the call's headers, and by the frame wire for an accepted HELLO.
// Cheap when already marked (no lock).
void MarkCurrentConnectionAuthenticated();

// A listener that ends its own unauthenticated connections before the
// guard's timeout (the frame wire's HELLO deadline, so the peer gets a
// STATUS) counts them here: `timed_out` and the warning then cover both
// wires. Counts `fd` once, only while it is tracked and unauthenticated.
void CountConnectionTimedOut(int fd);

// Direct calls (docs/DIRECT-CALLS.md): the frame wire hands the
// authenticated connection `fd` to the worker and then closes its own
// descriptor. The connection stays counted (open, against max_connections)
// until ReleaseHandedOverConnection; returns whether it was tracked (false:
// nothing to release). Call before closing `fd`.
bool HandOverConnection(int fd);
// A handed-over connection ended (the worker's direct_closed, or its exit).
void ReleaseHandedOverConnection();

struct ConnectionGuardStats {
  size_t open = 0;             // tracked connections now (handed over too)
  size_t handed_over = 0;      // of which held by the worker
  size_t unauthenticated = 0;  // of which not authenticated
  uint64_t refused = 0;        // closed at accept: a cap was reached
  uint64_t dropped_no_fd = 0;  // closed at accept: out of descriptors
  uint64_t timed_out = 0;      // shut down: no authenticated RPC (or frame-
                               // wire HELLO) in time
};
ConnectionGuardStats GetConnectionGuardStats();

}  // namespace agentix::sandbox
