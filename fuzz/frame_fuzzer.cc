// libFuzzer target for the worker frame codec (worker/ipc/frame.h).
//
// The input is a byte stream as it would arrive on the daemon <-> worker
// socketpair. It is fed to a FrameReader in pieces whose sizes come from the
// input itself (so partial length prefixes and bodies split at every point
// are exercised), and every decoded frame must survive a round trip:
// encode(decode(encode(f))) == encode(f). A decode error must be a
// kInvalidArgument or kResourceExhausted status, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "worker/ipc/frame.h"

namespace {

using agentix::ipc::Frame;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "frame_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

void CheckErrorCode(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != absl::StatusCode::kResourceExhausted) {
    Fail("unexpected decode status", status.ToString());
  }
}

// Re-encodes a decoded frame and checks the encoding is a fixed point.
void CheckRoundTrip(const Frame& frame) {
  std::string first;
  absl::Status s = agentix::ipc::AppendFrame(frame, first);
  if (!s.ok()) Fail("re-encoding a decoded frame failed", s.ToString());
  if (first.size() < 4) Fail("encoded frame too short", "");
  auto again = agentix::ipc::DecodeFrameBody(
      std::string_view(first).substr(4));
  if (!again.ok()) Fail("own encoding does not decode", again.status().ToString());
  if (again->type != frame.type) Fail("frame type changed in round trip", "");
  std::string second;
  s = agentix::ipc::AppendFrame(*again, second);
  if (!s.ok()) Fail("second re-encoding failed", s.ToString());
  if (first != second) Fail("round trip is not stable", "");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // 1. The whole input as one frame body.
  auto direct = agentix::ipc::DecodeFrameBody(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (direct.ok()) {
    CheckRoundTrip(*direct);
  } else {
    CheckErrorCode(direct.status());
  }

  // 2. The input as a stream: the first byte seeds the piece sizes, the
  // rest is what the socket delivers.
  if (size == 0) return 0;
  uint32_t seed = data[0];
  const char* stream = reinterpret_cast<const char*>(data + 1);
  size_t remaining = size - 1;
  agentix::ipc::FrameReader reader;
  size_t delivered = 0;
  while (remaining > 0) {
    seed = seed * 1103515245u + 12345u;
    size_t piece = 1 + (seed >> 16) % 64;
    if (piece > remaining) piece = remaining;
    reader.Append(stream, piece);
    stream += piece;
    remaining -= piece;
    delivered += piece;
    while (true) {
      auto next = reader.Next();
      if (!next.ok()) {
        CheckErrorCode(next.status());
        return 0;  // desynchronised: the reader is discarded
      }
      if (!next->has_value()) break;
      CheckRoundTrip(**next);
    }
    if (reader.buffered() > delivered) Fail("reader buffers more than it got", "");
  }
  return 0;
}
