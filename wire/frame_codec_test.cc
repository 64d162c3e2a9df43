#include "wire/frame_codec.h"

#include <random>

#include "absl/strings/match.h"

#include <catch2/catch.hpp>

namespace agentix::sandbox {
namespace {

TEST_CASE("A frame round-trips; a partial one asks for more bytes",
          "[frame_codec]") {
  const std::string frame = EncodeFrame(FrameKind::kMessage, "payload");
  REQUIRE(frame.size() == kFrameHeaderBytes + 7);
  REQUIRE(frame.substr(0, 5) == std::string("\x07\x00\x00\x00\x02", 5));
  for (size_t cut = 0; cut < frame.size(); ++cut) {
    auto partial = ParseFrame(absl::string_view(frame).substr(0, cut));
    REQUIRE(partial.ok());
    REQUIRE(partial->frame_bytes == 0);
  }
  const std::string two = frame + "next";
  auto whole = ParseFrame(two);
  REQUIRE(whole.ok());
  REQUIRE(whole->kind == FrameKind::kMessage);
  REQUIRE(whole->payload == "payload");
  REQUIRE(whole->frame_bytes == frame.size());
}

TEST_CASE("Unknown kinds, oversized lengths and a non-empty HALF_CLOSE are "
          "refused from the header alone",
          "[frame_codec]") {
  for (char kind : {'\0', '\x06', '\xff'}) {
    auto parsed = ParseFrame(std::string("\0\0\0\0", 4) + kind);
    REQUIRE(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(absl::StrContains(parsed.status().message(), "unknown frame kind"));
  }
  char header[kFrameHeaderBytes];
  EncodeFrameHeader(FrameKind::kMessage, kMaxFrameMessageBytes + 1, header);
  auto big = ParseFrame(absl::string_view(header, sizeof(header)));
  REQUIRE(big.status().code() == absl::StatusCode::kInvalidArgument);
  EncodeFrameHeader(FrameKind::kMessage, kMaxFrameMessageBytes, header);
  auto at_limit = ParseFrame(absl::string_view(header, sizeof(header)));
  REQUIRE(at_limit.ok());
  REQUIRE(at_limit->frame_bytes == 0);  // waits for its bytes
  EncodeFrameHeader(FrameKind::kHello, kMaxHelloBytes + 1, header);
  REQUIRE(!ParseFrame(absl::string_view(header, sizeof(header))).ok());
  EncodeFrameHeader(FrameKind::kHalfClose, 1, header);
  REQUIRE(!ParseFrame(absl::string_view(header, sizeof(header))).ok());
  EncodeFrameHeader(FrameKind::kMessage, 0xffffffffu, header);
  REQUIRE(!ParseFrame(absl::string_view(header, sizeof(header))).ok());
}

TEST_CASE("HELLO metadata round-trips and bad payloads are refused",
          "[frame_codec]") {
  const FrameMetadata metadata = {{"authorization", "Bearer t0k"},
                                  {"agentix-client-id", "c1"},
                                  {"empty", ""}};
  const std::string hello = EncodeHello(metadata);
  auto decoded = DecodeHello(hello);
  REQUIRE(decoded.ok());
  REQUIRE(*decoded == metadata);
  REQUIRE(*FindMetadata(*decoded, "agentix-client-id") == "c1");
  REQUIRE(FindMetadata(*decoded, "missing") == nullptr);
  REQUIRE(DecodeHello("")->empty());
  // Every truncation of a valid payload is refused (none is valid).
  for (size_t cut = 1; cut < hello.size(); ++cut) {
    const std::string prefix = hello.substr(0, cut);
    auto partial = DecodeHello(prefix);
    // A cut exactly between pairs is itself a valid, shorter HELLO.
    const bool boundary =
        cut == EncodeHello({metadata[0]}).size() ||
        cut == EncodeHello({metadata[0], metadata[1]}).size();
    REQUIRE(partial.ok() == boundary);
  }
  REQUIRE(!DecodeHello(EncodeHello({{"Authorization", "x"}})).ok());
  REQUIRE(!DecodeHello(EncodeHello({{"", "x"}})).ok());
  REQUIRE(!DecodeHello(EncodeHello({{"a b", "x"}})).ok());
}

TEST_CASE("RING_MESSAGE heads round-trip; bad ones are refused",
          "[frame_codec]") {
  const std::vector<RingPieceRef> pieces = {
      {3, 0, 70000}, {3, 70000, 1}, {9, (uint64_t{5} << 32) + 7, 65536}};
  const std::string payload = EncodeRingHead(pieces) + "0123456789";
  auto decoded = DecodeRingMessage(payload, 1 << 20);
  REQUIRE(decoded.ok());
  CHECK(decoded->bytes == "0123456789");
  REQUIRE(decoded->pieces.size() == 3);
  CHECK(decoded->pieces[2].at == 9);
  CHECK(decoded->pieces[2].pos == (uint64_t{5} << 32) + 7);
  CHECK(decoded->pieces[2].size == 65536);
  auto refused = [](const std::string& bad, size_t max = 1 << 20) {
    CHECK(DecodeRingMessage(bad, max).status().code() ==
          absl::StatusCode::kInvalidArgument);
  };
  refused("");
  refused(std::string("\x01\x00", 2) + "short");
  refused(EncodeRingHead(std::vector<RingPieceRef>(kMaxRingPieces + 1, {0, 0, 1})));
  refused(EncodeRingHead({{11, 0, 10}}) + "0123456789");  // past the bytes
  refused(EncodeRingHead({{5, 0, 10}, {4, 10, 10}}) + "0123456789");  // backwards
  refused(EncodeRingHead({{1, 0, 0}}) + "0123456789");  // empty piece
  refused(EncodeRingHead({{1, 0, 1000}}) + "0123456789", 1009);  // too long
  CHECK(DecodeRingMessage(EncodeRingHead({{1, 0, 999}}) + "0123456789", 1009).ok());
  // The daemon's "ring accepted": no pieces, no bytes.
  auto empty = DecodeRingMessage(EncodeRingHead({}), 1 << 20);
  REQUIRE(empty.ok());
  CHECK(empty->pieces.empty());
  CHECK(empty->bytes.empty());
}

TEST_CASE("STATUS round-trips; a short one is refused", "[frame_codec]") {
  auto status =
      DecodeStatus(EncodeStatus(absl::StatusCode::kUnauthenticated, "no"));
  REQUIRE(status.ok());
  REQUIRE(status->code == 16);
  REQUIRE(status->details == "no");
  REQUIRE(!DecodeStatus("\x01\x00\x00").ok());
}

TEST_CASE("Random bytes never crash the decoders; what they accept is "
          "consistent",
          "[frame_codec]") {
  std::mt19937 rng(25);
  for (int round = 0; round < 20000; ++round) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    // Small lengths and valid kinds now and then, so frames do complete.
    if (bytes.size() >= 5 && round % 2 == 0) {
      bytes[1] = bytes[2] = bytes[3] = 0;
      bytes[0] = static_cast<char>(rng() % 40);
      bytes[4] = static_cast<char>(1 + rng() % 4);
    }
    auto frame = ParseFrame(bytes);
    if (frame.ok() && frame->frame_bytes > 0) {
      REQUIRE(frame->frame_bytes <= bytes.size());
      REQUIRE(frame->frame_bytes == kFrameHeaderBytes + frame->payload.size());
      REQUIRE(EncodeFrame(frame->kind, frame->payload) ==
              bytes.substr(0, frame->frame_bytes));
    } else if (!frame.ok()) {
      REQUIRE(frame.status().code() == absl::StatusCode::kInvalidArgument);
    }
    auto hello = DecodeHello(bytes);
    if (hello.ok()) REQUIRE(EncodeHello(*hello) == bytes);
    auto status = DecodeStatus(bytes);
    REQUIRE(status.ok() == (bytes.size() >= 4));
  }
}

}  // namespace
}  // namespace agentix::sandbox
