// Frames from the daemon as the driver sees them: read_frames() reads what
// the socket has now, decodes it and hands Python one tuple per frame.
// Chunked call arguments are reassembled here, in place: the bytes object
// is allocated once with the announced total_size and each arg_chunk is
// copied into it straight from the read buffer; Python sees it only once
// complete, as one ARGS tuple.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string_view>

#include "worker/ipc/frame.h"

namespace agentix::worker {

// Frame kinds as the driver sees them (the first item of each tuple).
enum FrameKind : int {
  kCall = 1,
  kCancel = 3,
  kShutdown = 4,
  kStreamAck = 5,
  kNamespaceEvent = 6,
  kArgs = 7,  // a chunked call's complete arguments
  kSetEnv = 8,
};

struct ModuleState;

// Creates the named frame types (CallFrame, ArgsFrame, CancelFrame,
// StreamAckFrame, ShutdownFrame, NamespaceEventFrame, SetEnvFrame: each a
// tuple whose first item is its kind, its items also attributes) and adds
// them to `module`. -1 with an error set.
int AddFrameTypes(PyObject* module, ModuleState& state);

// read_frames(): everything readable now, decoded, as a list of frame
// records (see channel_module.h); None at end of stream; ProtocolError on a bad frame (the
// channel is then dead) or OSError.
PyObject* ChannelReadFrames(PyObject* self, PyObject* unused);

struct ChannelState;

// DirectConns' ArgumentHome: copies a piece of a direct call's chunked
// arguments into the call's upload (as the link's arg_chunk frames are),
// made by the call's first piece, so the host's ring is copied once. False
// (the frame keeps its own copy, as before) for a call whose first piece is
// all of it, an id that has a relayed upload, or a chunk of no direct
// upload. GIL held (the poll side holds it).
bool LandDirectArgument(ChannelState& st, ipc::Frame& frame,
                        std::string_view bytes);

// Leader/follower intake (intake_baton.h), for the driver's pool threads:
// intake_lead(holding) -> 0 readable (the caller holds the baton), 1 leave,
// 2 stopped, waiting without the GIL; intake_pass() -> bool;
// intake_defer() -> bool (offer the baton, taken after a bound unless
// intake_reclaim() -> bool comes first: true if still the holder);
// intake_to_pool() (OSError if the baton cannot be made); intake_to_loop();
// intake_stop(). Before intake_to_pool(), intake_lead() returns 1 and
// intake_pass() False.
PyObject* ChannelIntakeLead(PyObject* self, PyObject* holding);
PyObject* ChannelIntakePass(PyObject* self, PyObject* unused);
PyObject* ChannelIntakeDefer(PyObject* self, PyObject* unused);
PyObject* ChannelIntakeReclaim(PyObject* self, PyObject* unused);
PyObject* ChannelIntakeToPool(PyObject* self, PyObject* unused);
PyObject* ChannelIntakeToLoop(PyObject* self, PyObject* unused);
PyObject* ChannelIntakeStop(PyObject* self, PyObject* unused);

}  // namespace agentix::worker
