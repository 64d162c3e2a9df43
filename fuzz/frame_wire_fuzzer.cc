// libFuzzer target for the frame wire's codec (wire/frame_codec.h): the
// bytes a host sends on PATH.calls, parsed frame by frame as the daemon's
// connection thread does, each HELLO and STATUS payload decoded.
//
// Asserts: errors are kInvalidArgument; a parsed frame lies within the input
// and re-encodes to exactly its bytes; a frame is never reported whole
// before its header and payload are all there (every prefix of a whole
// frame asks for more); an accepted HELLO re-encodes to its payload; a
// MESSAGE parsed with its bulk fields left in place (frame_splice.h, every
// size spliced) is accepted exactly when protobuf accepts it, and then
// holds the same fields.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/deterministic_bytes.h"
#include "wire/frame_codec.h"
#include "wire/frame_splice.h"

namespace {

using agentix::fuzz::DeterministicBytes;

using namespace agentix::sandbox;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "frame_wire_fuzzer: %s\n", what);
  std::abort();
}

void CheckSpliced(absl::string_view payload) {
  using agentix::runtime::v1::CallsRequest;
  CallsRequest expected;
  const bool ok = expected.ParseFromArray(payload.data(),
                                          static_cast<int>(payload.size()));
  SplicedRequest spliced;
  if (ParseCallsRequestSpliced(payload, spliced, /*min_bytes=*/1) != ok) {
    Fail("spliced parse accepts differently from protobuf");
  }
  if (!ok) return;
  if (spliced.bulk.size() != static_cast<size_t>(spliced.request.events_size())) {
    Fail("one bulk entry per event");
  }
  for (int i = 0; i < spliced.request.events_size(); ++i) {
    const auto& bulk = spliced.bulk[static_cast<size_t>(i)];
    if (!bulk) continue;
    if (bulk->data() < payload.data() ||
        bulk->data() + bulk->size() > payload.data() + payload.size()) {
      Fail("a bulk view outside the message");
    }
    auto* event = spliced.request.mutable_events(i);
    if (event->has_start()) {
      event->mutable_start()->set_arguments(std::string(*bulk));
    } else if (event->has_argument_chunk()) {
      event->mutable_argument_chunk()->set_data(std::string(*bulk));
    } else {
      Fail("a bulk view for an event without a bulk field");
    }
  }
  if (DeterministicBytes(spliced.request) != DeterministicBytes(expected)) {
    Fail("spliced parse differs from protobuf's");
  }
}

// A RING_MESSAGE's pieces are taken from a fixed ring; what
// ParseCallsRequestWithRing accepts must be what protobuf makes of the
// message put back together (it may refuse more: pieces must stand exactly
// for bulk fields).
void CheckRing(absl::string_view payload) {
  using agentix::runtime::v1::CallsRequest;
  static const std::string* const ring = [] {
    auto* bytes = new std::string(1u << 16, '\0');
    for (size_t i = 0; i < bytes->size(); ++i) (*bytes)[i] = static_cast<char>(i * 7);
    return bytes;
  }();
  absl::StatusOr<RingMessage> message = DecodeRingMessage(payload, 1u << 20);
  if (!message.ok()) {
    if (message.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("unexpected RING_MESSAGE status code");
    }
    return;
  }
  if (EncodeRingHead(message->pieces) + std::string(message->bytes) != payload) {
    Fail("RING_MESSAGE re-encoding");
  }
  std::vector<RingPiece> pieces;
  std::string whole;
  size_t done = 0;
  for (const RingPieceRef& ref : message->pieces) {
    if (ref.pos % ring->size() + ref.size > ring->size()) return;
    const std::string_view data =
        std::string_view(*ring).substr(ref.pos % ring->size(), ref.size);
    pieces.push_back({ref.at, data});
    whole += std::string(message->bytes.substr(done, ref.at - done));
    whole += std::string(data);
    done = ref.at;
  }
  whole += std::string(message->bytes.substr(done));
  SplicedRequest parsed;
  if (!ParseCallsRequestWithRing(message->bytes, pieces, parsed).ok()) return;
  CallsRequest expected;
  if (!expected.ParseFromString(whole)) Fail("ring parse accepted what protobuf refuses");
  for (int i = 0; i < parsed.request.events_size(); ++i) {
    const auto& bulk = parsed.bulk[static_cast<size_t>(i)];
    if (!bulk) continue;
    auto* event = parsed.request.mutable_events(i);
    if (event->has_start()) {
      event->mutable_start()->set_arguments(std::string(*bulk));
    } else if (event->has_argument_chunk()) {
      event->mutable_argument_chunk()->set_data(std::string(*bulk));
    } else {
      Fail("a ring piece for an event without a bulk field");
    }
  }
  if (DeterministicBytes(parsed.request) != DeterministicBytes(expected)) {
    Fail("ring parse differs from protobuf's");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view rest(reinterpret_cast<const char*>(data), size);
  while (!rest.empty()) {
    absl::StatusOr<FrameView> frame = ParseFrame(rest);
    if (!frame.ok()) {
      if (frame.status().code() != absl::StatusCode::kInvalidArgument) {
        Fail("unexpected status code");
      }
      return 0;
    }
    if (frame->frame_bytes == 0) return 0;  // needs more bytes
    if (frame->frame_bytes > rest.size() ||
        frame->frame_bytes != kFrameHeaderBytes + frame->payload.size()) {
      Fail("frame outside the input");
    }
    const absl::string_view bytes = rest.substr(0, frame->frame_bytes);
    if (EncodeFrame(frame->kind, frame->payload) != bytes) Fail("re-encoding differs");
    for (size_t cut : {size_t{0}, kFrameHeaderBytes - 1, bytes.size() - 1}) {
      if (cut >= bytes.size()) continue;
      absl::StatusOr<FrameView> partial = ParseFrame(bytes.substr(0, cut));
      if (!partial.ok() || partial->frame_bytes != 0) Fail("a prefix parsed as whole");
    }
    if (frame->kind == FrameKind::kHello) {
      absl::StatusOr<FrameMetadata> hello = DecodeHello(frame->payload);
      if (hello.ok() && EncodeHello(*hello) != frame->payload) Fail("HELLO re-encoding");
      if (!hello.ok() && hello.status().code() != absl::StatusCode::kInvalidArgument) {
        Fail("unexpected HELLO status code");
      }
    } else if (frame->kind == FrameKind::kMessage) {
      CheckSpliced(frame->payload);
    } else if (frame->kind == FrameKind::kRingMessage) {
      CheckRing(frame->payload);
    } else if (frame->kind == FrameKind::kStatus) {
      absl::StatusOr<FrameStatus> status = DecodeStatus(frame->payload);
      if (status.ok() != (frame->payload.size() >= 4)) Fail("STATUS decode");
      if (status.ok() &&
          EncodeStatus(static_cast<absl::StatusCode>(status->code), status->details) !=
              frame->payload) {
        Fail("STATUS re-encoding");
      }
    }
    rest.remove_prefix(frame->frame_bytes);
  }
  return 0;
}
