// libFuzzer target for the C++ client's frame-wire reader
// (host/cc/agentix/frame_transport.h): what `Read` does with the bytes the
// peer of a Calls connection sends — the daemon today, the worker (user
// code) once a connection goes direct (docs/DIRECT-CALLS.md, "Security":
// the client must be fuzzed before it may send agentix-direct).
//
// Input: byte 0's bit 0 gives the transport a calls-CPU callback (a host
// that asked the daemon to steer its waits), bit 1 a spin window; the rest
// is what the peer writes on a socketpair before it shuts its end.
//
// Asserts, against a walk of the same bytes with the codec
// (wire/frame_codec.h): Read returns exactly the MESSAGE frames that are
// CallsResponses, in order, and ends (never waits: the peer's end is shut)
// at the first frame that is not one; Finish then says why, with the code a
// whole STATUS frame carries (codes over 16 are UNKNOWN), INTERNAL for a
// malformed or unexpected frame, UNAVAILABLE for EOF; the callback sees the
// agentix-calls-cpu value of each HELLO before that point and nothing else.
// ASan checks the reader's buffer handling.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agentix/frame_transport.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "fuzz/deterministic_bytes.h"
#include "google/protobuf/stubs/logging.h"
#include "wire/frame_codec.h"

namespace {

using agentix::fuzz::DeterministicBytes;

namespace pb = ::agentix::runtime::v1;
using namespace agentix::sandbox;

// Larger inputs could fill the socket buffer before the reader runs; the
// reader's own bounds (a 4 MiB frame) come from the header, not the bytes.
constexpr size_t kMaxInput = 64 << 10;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "client_frame_reader_fuzzer: %s\n", what);
  std::abort();
}

// What the reader must make of `bytes`: the responses, the calls-CPU values
// told, and the code the stream ends with.
struct Expected {
  std::vector<std::string> responses;  // deterministic serializations
  std::vector<std::string> told;
  absl::StatusCode end = absl::StatusCode::kUnavailable;
};

Expected Walk(absl::string_view rest, bool has_callback) {
  Expected out;
  for (;;) {
    absl::StatusOr<FrameView> frame = ParseFrame(rest);
    if (!frame.ok()) {
      out.end = absl::StatusCode::kInternal;
      return out;
    }
    if (frame->frame_bytes == 0) return out;  // then EOF: UNAVAILABLE
    rest.remove_prefix(frame->frame_bytes);
    switch (frame->kind) {
      case FrameKind::kMessage: {
        pb::CallsResponse response;
        if (!response.ParseFromArray(frame->payload.data(),
                                     static_cast<int>(frame->payload.size()))) {
          out.end = absl::StatusCode::kInternal;
          return out;
        }
        out.responses.push_back(DeterministicBytes(response));
        break;
      }
      case FrameKind::kStatus: {
        absl::StatusOr<FrameStatus> status = DecodeStatus(frame->payload);
        out.end = !status.ok()          ? absl::StatusCode::kInternal
                  : status->code <= 16 ? static_cast<absl::StatusCode>(status->code)
                                        : absl::StatusCode::kUnknown;
        return out;
      }
      case FrameKind::kHello: {
        absl::StatusOr<FrameMetadata> hello = DecodeHello(frame->payload);
        if (!hello.ok() || !has_callback) {
          out.end = absl::StatusCode::kInternal;
          return out;
        }
        if (const std::string* value = FindMetadata(*hello, kFrameCallsCpuKey)) {
          out.told.push_back(*value);
        }
        break;
      }
      default:  // HALF_CLOSE, RING_MESSAGE: a host's, or unasked
        out.end = absl::StatusCode::kInternal;
        return out;
    }
  }
}

}  // namespace

// Protobuf logs each string field that is not UTF-8 (the client's reader
// refuses such a message); at every other input that would flood stderr.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > kMaxInput) return 0;
  const bool has_callback = (data[0] & 1) != 0;
  const absl::Duration spin = (data[0] & 2) != 0 ? absl::Microseconds(5) : absl::ZeroDuration();
  const absl::string_view sent(reinterpret_cast<const char*>(data) + 1, size - 1);

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Fail("socketpair");
  const int peer = fds[1];
  size_t written = 0;
  while (written < sent.size()) {
    const ssize_t n = ::send(peer, sent.data() + written, sent.size() - written,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) Fail("the socket buffer did not take the input");
    written += static_cast<size_t>(n);
  }
  ::shutdown(peer, SHUT_WR);  // then EOF: Read never waits

  std::vector<std::string> told;
  agentix::client_internal::CallsCpuAnswer on_calls_cpu;
  if (has_callback) {
    on_calls_cpu = [&told](absl::string_view value) { told.emplace_back(value); };
  }
  std::unique_ptr<agentix::client_internal::CallsTransport> transport =
      agentix::client_internal::NewFrameTransport(fds[0], {{"agentix-client-id", "fuzz"}},
                                                  spin, on_calls_cpu);
  std::vector<std::string> responses;
  pb::CallsResponse response;
  while (transport->Read(&response)) {
    responses.push_back(DeterministicBytes(response));
    if (responses.size() > sent.size()) Fail("more responses than frames");
  }
  const absl::Status end = transport->Finish();
  transport.reset();
  ::close(peer);

  const Expected expected = Walk(sent, has_callback);
  if (responses != expected.responses) Fail("responses differ from the MESSAGE frames");
  if (told != expected.told) Fail("calls-CPU answers differ from the HELLO frames");
  if (end.code() != expected.end) Fail("the stream ended with another code");
  return 0;
}
