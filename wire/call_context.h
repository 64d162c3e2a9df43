// The language-neutral call context of StartCall (traceparent, tracestate,
// baggage): checked when the call arrives, and handed to the worker inside
// the kCall frame's `context` bytes in a form no pickle can take.
#ifndef AGENTIX_SANDBOX_CALL_CONTEXT_H_
#define AGENTIX_SANDBOX_CALL_CONTEXT_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "agentix/runtime/v1/runtime.pb.h"

namespace agentix::sandbox {

// First bytes of an encoded plain context. A pickle starts with an opcode,
// never with NUL, so the worker tells the two apart by the first byte.
inline constexpr std::string_view kPlainContextMagic{"\0AXC1", 5};

// OK when `traceparent` is a valid W3C traceparent (version 00 exactly, a
// later version at least that long with '-' after the flags).
absl::Status CheckTraceparent(std::string_view traceparent);

// InvalidArgument (message names the field) when the plain fields are
// malformed or set together with the pickled `context`.
absl::Status CheckCallContext(const runtime::v1::StartCall& start);

// The worker's context bytes for `start`: its pickled `context` when set,
// else the plain fields as kPlainContextMagic followed by length-prefixed
// strings (u32 little-endian length, bytes): traceparent, tracestate, then
// baggage key, value pairs. Empty when nothing is set.
std::string WorkerContext(const runtime::v1::StartCall& start);

}  // namespace agentix::sandbox

#endif  // AGENTIX_SANDBOX_CALL_CONTEXT_H_
