// The `_agentix_worker` builtin module: the driver's only door to the frame
// channel (docs/WORKER-PROTOCOL.md) and to the C++ helpers it needs.
//
// Python sees:
//   Channel(fd, payload_fd=-1)  owns no fd; sets it non-blocking. With
//                               payload_fd: maps the daemon's payload area
//                               (worker/ipc/payload_area.h) and closes the
//                               fd; OSError if it is not one
//     .read_frames()            everything readable now, decoded, as a list of
//                               frame records (see below); None at end of stream;
//                               raises ProtocolError on a bad frame (the
//                               channel is then dead) or OSError
//     .send_ready(pid, detail)
//     .send_env_set(detail)     answers a SET_ENV frame ("" = applied)
//     .send_result(call_id, encoding, data)   data: any contiguous buffer,
//                               or a list of them (their concatenation);
//                               over CHUNK_BYTES it is cut into result_chunk
//                               frames plus a final result with total_size.
//                               From 256 KiB on (results and items) the
//                               frames are written at once with writev,
//                               headers around slices of `data`, so the
//                               payload is not copied; with a payload area,
//                               result pieces of 64 KiB or more are copied
//                               into its ring instead while it has room
//     .send_item(call_id, index, encoding, data)   one stream_item frame;
//                               ValueError (nothing queued) if it would
//                               exceed the frame limit
//     .send_error(call_id, code, type, message, traceback, cancelled
//                 [, type_module, type_qualname, state])   state: the
//                               exception's pickled (args, members, dict),
//                               bytes or None; dropped beyond
//                               ipc::kMaxExceptionStateBytes
//     .send_log(**fields)   one `log` frame: an agentix.runtime.v1.LogRecord
//                               by field name (channel/proto_fields.h),
//                               keyword arguments only, each optional, less
//                               the daemon's seq and worker_id; see "Logs"
//     .send_trace(**fields)   one `trace` frame: a TraceEvent the same way,
//                               less seq, worker_id and the OpenTelemetry
//                               byte ids the daemon derives (attributes,
//                               error_data: {str: scalar} dicts; events: a
//                               list of dicts); queued and sent like a log
//                               frame, so it is ordered with the records
//                               around it
//     .send_stdio(origin, text, call_id)   one stdout (2) / stderr (3) line
//                               as a `log` frame (and to the durable log)
//     .start_capture(worker_id, context)   fd 0 -> /dev/null, fds 1/2 ->
//                               pipes drained by C++ threads into log frames;
//                               log() then writes to the saved real stderr
//     .stop_capture(timeout_ms) restores fds 1/2 (/dev/null, real stderr),
//                               waits (bounded) for the drainers and for the
//                               queued log frames to be written
//     .set_durable(enabled) / .wait_stdio_lines()   captured lines for the
//                               durable log thread: a list of StdioLine
//                               records (origin, time_unix_nanos, text),
//                               None once capture ended or the durable log
//                               was disabled
//     .flush()                  writes what the send_* calls queued
//     .pending_bytes()          queued, unwritten bytes
//     .fileno()
//   read_frames records (PyStructSequence: tuples whose items are also
//     attributes, the first always `kind`): CallFrame(kind=CALL, call_id,
//     callable, encoding, data, total_size, context, stream_window),
//     ArgsFrame(kind=ARGS, call_id, data, received), CancelFrame(kind,
//     call_id), StreamAckFrame(kind, call_id, index), ShutdownFrame(kind),
//     NamespaceEventFrame(kind=NS_EVENT, namespace, event, data, request_id,
//     error_type, error_message, status_code), SetEnvFrame(kind=SET_ENV,
//     entries) with entries the bytes b"K=V\0K=V\0..." (answered with
//     .send_env_set(detail)).
//     A call whose first piece is short of total_size has data None: the
//     channel assembles its arg_chunk frames into one bytes object of
//     total_size (allocated once, each chunk copied in straight from the
//     read buffer) and delivers it as ARGS after the last byte; data is None
//     there if received != total_size (over-long) or memory ran out. A
//     cancel drops the assembly; chunks for no assembly are dropped.
//   msgpack_loads(buffer) / msgpack_dumps(obj)   see msgpack_convert.h
//   log(severity, message)      0 debug .. 3 error, to stderr via //base:log
//   set_thread_name(name)       names the calling OS thread (<= 15 bytes)
//   map_file(path)              the file mapped read-only for the process's
//                               life, as a read-only memoryview; None if it
//                               does not exist or is empty; OSError otherwise
//   ProtocolError, ChannelError (write failures), CHUNK_BYTES, the frame
//   kind constants and the record types.
//
// The code behind each entry point lives with its concept under
// worker/channel/ (see worker/README.md); channel_module.cc is the table.
//
// Sends are queued and written in one syscall by flush() (or as soon as the
// queue passes 256 KiB), so results finishing in one event-loop iteration
// share a write. Writes release the GIL. Several threads may use the channel
// (pool threads send their own replies and stream items): a thread entering
// while another's write is in flight waits for it, so frames never
// interleave.
//
// Logs: log frames do not go through the send queue above. They are queued
// on a C++ list and written by a sender thread as soon as the channel is
// free (batching whatever accumulated), so records from any thread reach the
// daemon promptly. The drainer threads read the capture pipes and queue
// their lines without ever taking the GIL, so a full pipe never waits on
// Python. The fd is written by one thread at a time: the holder of the
// writer's `busy` flag, which lives under a leaf mutex that no thread holds
// while waiting for the GIL. A Python-side write sends the queued log frames
// first, so a record logged before a call returned precedes its result.
// No C++ exception
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
