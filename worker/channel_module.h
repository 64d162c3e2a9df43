// The `_agentix_worker` builtin module: the driver's only door to the frame
// channel (docs/WORKER-PROTOCOL.md) and to the C++ helpers it needs.
//
// Python sees:
//   Channel(fd)                 owns no fd; sets it non-blocking
//     .read_frames()            everything readable now, decoded, as a list of
//                               tuples (see below); None at end of stream;
//                               raises ProtocolError on a bad frame (the
//                               channel is then dead) or OSError
//     .send_ready(pid, detail)
//     .send_result(call_id, encoding, data)   data: any contiguous buffer;
//                               over CHUNK_BYTES it is cut into result_chunk
//                               frames plus a final result with total_size
//     .send_item(call_id, index, encoding, data)   one stream_item frame;
//                               ValueError (nothing queued) if it would
//                               exceed the frame limit
//     .send_error(call_id, code, type, message, traceback, cancelled)
//     .flush()                  writes what the send_* calls queued
//     .pending_bytes()          queued, unwritten bytes
//     .fileno()
//   read_frames tuples: (CALL, call_id, callable, encoding, data, total_size,
//     context, stream_window), (ARG_CHUNK, call_id, data), (CANCEL, call_id),
//     (STREAM_ACK, call_id, index), (SHUTDOWN,)
//   msgpack_loads(buffer) / msgpack_dumps(obj)   see msgpack_convert.h
//   log(severity, message)      0 debug .. 3 error, to stderr via //base:log
//   set_thread_name(name)       names the calling OS thread (<= 15 bytes)
//   ProtocolError, ChannelError (write failures), CHUNK_BYTES and the frame
//   kind constants.
//
// Sends are queued and written in one syscall by flush() (or as soon as the
// queue passes 256 KiB), so results finishing in one event-loop iteration
// share a write. Writes release the GIL. Several threads may use the channel
// (pool threads send their own replies and stream items): a thread entering
// while another's write is in flight waits for it, so frames never
// interleave. No C++ exception
// crosses into Python: every function returns a value or NULL with a Python
// exception set.
#pragma once

#include "absl/status/status.h"

namespace agentix::worker {

inline constexpr char kChannelModuleName[] = "_agentix_worker";

// Adds `_agentix_worker` to the interpreter's builtin modules. Must be called
// before the interpreter is initialised (PyImport_AppendInittab), once per
// process. kInternal if CPython refuses.
absl::Status RegisterChannelModule();

}  // namespace agentix::worker
