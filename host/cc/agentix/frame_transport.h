// The Calls stream over the daemon's frame wire (docs/FRAME-WIRE.md): a
// plain Unix socket at PATH.calls beside the daemon's unix://PATH, carrying
// the same serialized CallsRequest / CallsResponse messages as gRPC in
// 5-byte-header frames (wire/frame_codec.h). Blocking I/O on the
// caller's thread: a write is one send(), a read one recv() for a small
// message, with no thread of gRPC's in between.
#ifndef AGENTIX_HOST_CC_AGENTIX_FRAME_TRANSPORT_H_
#define AGENTIX_HOST_CC_AGENTIX_FRAME_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agentix/calls_transport.h"

namespace agentix::client_internal {

// "PATH.calls" for a "unix:///PATH", "unix:/PATH" or "unix:PATH" target;
// empty for any other target.
std::string CallsSocketPath(absl::string_view target);

// Called from Read with the value of agentix-calls-cpu in a HELLO the daemon
// sends (only to a host whose HELLO asked: agentix-calls-cpu-follow; "wait"
// or "off", docs/FRAME-WIRE.md "Wake-ups").
using CallsCpuAnswer = std::function<void(absl::string_view)>;

// Connects to the frame wire at `path` and sends HELLO with `metadata`
// (messages may follow at once; a refusal arrives as the stream's STATUS).
// UNAVAILABLE naming the errno when the socket cannot be connected;
// INVALID_ARGUMENT for a bad $AGENTIX_CALLS_SPIN_US.
absl::StatusOr<std::unique_ptr<CallsTransport>> ConnectFrameTransport(
    const std::string& path, const StreamMetadata& metadata,
    CallsCpuAnswer on_calls_cpu = nullptr);

// $AGENTIX_CALLS_SPIN_US: how long the reader polls the socket without
// sleeping before it blocks (adaptive: a wait longer than this halves the
// next window, a shorter one doubles it); unset or 0: no spinning.
// INVALID_ARGUMENT for anything but a number of microseconds <= 1000000.
absl::StatusOr<absl::Duration> CallsSpinFromEnv();

// The HELLO key of a Calls connection that asks to be served by the worker
// (docs/DIRECT-CALLS.md): a daemon run with --direct_calls (its default) may
// hand the socket over after HELLO; the worker is then the peer whose
// frames Read parses (as untrusted as the daemon's: fuzzed by
// //fuzz:client_frame_reader_fuzzer).
inline constexpr absl::string_view kCallsDirectKey = "agentix-direct";

// $AGENTIX_CALLS_DIRECT, as the Python host reads it: "auto" (also unset or
// empty, any case) asks for direct calls (kCallsDirectKey "1"), "off" never.
// INVALID_ARGUMENT naming the variable for anything else.
absl::StatusOr<bool> CallsDirectFromEnv();

// Takes over `fd`, a connected stream socket (tests: a socketpair), and
// sends HELLO with `metadata`; the reader spins up to `spin` (above).
std::unique_ptr<CallsTransport> NewFrameTransport(int fd, const StreamMetadata& metadata,
                                                  absl::Duration spin = absl::ZeroDuration(),
                                                  CallsCpuAnswer on_calls_cpu = nullptr);

}  // namespace agentix::client_internal

#endif  // AGENTIX_HOST_CC_AGENTIX_FRAME_TRANSPORT_H_
