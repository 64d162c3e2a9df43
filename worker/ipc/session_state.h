// The body of `session_state` frames (docs/WORKER-PROTOCOL.md): a direct
// client's call state as the worker hands it to the daemon on `collapse`
// (docs/DIRECT-CALLS.md, stage 4). The frame's msgpack carries the client
// and `last`; the state itself is one binary field in this codec, so a
// session of thousands of calls does not meet msgpack's per-array limit the
// frame decoder keeps against hostile frames, and the daemon reads it with
// explicit bounds.
//
// Encoding (little-endian): entries until the end, each
//   u8 kind: 1 a call's piece, 2 a finished id
//   call:     u8 running, u16 id length, id, u32 events, then each event
//             as u32 length + bytes (a serialized SandboxEvent)
//   finished: u16 id length, id
// A call's events may span pieces: the same id again continues it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace agentix::ipc {

// The bound on one piece's body (a session_state frame each).
inline constexpr size_t kSessionStatePieceBytes = 4u << 20;
// Call ids as the Calls API bounds them (wire/wire_limits.h).
inline constexpr size_t kSessionStateMaxIdBytes = 256;

struct CollapsedCall {
  std::string id;
  bool running = false;  // not terminal: its later output becomes the daemon's
  std::vector<std::string> delivered;  // serialized SandboxEvents, in order
};

struct SessionState {
  std::vector<CollapsedCall> calls;
  std::vector<std::string> finished;  // ids remembered as finished
};

// `state` cut into pieces of at most `max_piece_bytes` (an event larger
// than that goes alone in its piece). At least one piece, possibly empty.
std::vector<std::string> EncodeSessionState(
    const SessionState& state, size_t max_piece_bytes = kSessionStatePieceBytes);

// Appends one piece to `into` (a call whose id equals the last call's
// continues it). kInvalidArgument for a truncated or malformed piece: an
// unknown kind, an empty or over-long id, a length past the end; `into` is
// then unchanged.
absl::Status DecodeSessionStatePiece(std::string_view piece,
                                     SessionState& into);

}  // namespace agentix::ipc
