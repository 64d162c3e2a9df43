#include "worker/ipc/session_state.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>

#include "testing/status_matchers.h"

namespace agentix::ipc {
namespace {

SessionState Sample() {
  SessionState s;
  s.calls.push_back({"running-1", true, {"ev-a", "ev-b"}});
  s.calls.push_back({"retained-2", false, {std::string(3000, 'x'), "end"}});
  s.calls.push_back({"no-events", true, {}});
  s.finished = {"done-1", "done-2"};
  return s;
}

SessionState DecodeAll(const std::vector<std::string>& pieces) {
  SessionState got;
  for (const std::string& piece : pieces) {
    REQUIRE_OK(DecodeSessionStatePiece(piece, got));
  }
  return got;
}

void CheckSame(const SessionState& a, const SessionState& b) {
  REQUIRE(a.calls.size() == b.calls.size());
  for (size_t i = 0; i < a.calls.size(); ++i) {
    CHECK(a.calls[i].id == b.calls[i].id);
    CHECK(a.calls[i].running == b.calls[i].running);
    CHECK(a.calls[i].delivered == b.calls[i].delivered);
  }
  CHECK(a.finished == b.finished);
}

TEST_CASE("session_state: one piece round-trips", "[ipc]") {
  const SessionState s = Sample();
  const auto pieces = EncodeSessionState(s);
  REQUIRE(pieces.size() == 1);
  CheckSame(DecodeAll(pieces), s);
}

TEST_CASE("session_state: small pieces split calls and still round-trip",
          "[ipc]") {
  const SessionState s = Sample();
  const auto pieces = EncodeSessionState(s, 64);
  CHECK(pieces.size() == 3);  // a call, the big event alone, the rest
  for (const std::string& piece : pieces) {
    // Only an event larger than the bound makes a larger piece.
    if (piece.find(std::string(3000, 'x')) == std::string::npos) {
      CHECK(piece.size() <= 64);
    }
  }
  CheckSame(DecodeAll(pieces), s);
}

TEST_CASE("session_state: an empty session is one empty piece", "[ipc]") {
  const auto pieces = EncodeSessionState(SessionState{});
  REQUIRE(pieces.size() == 1);
  CHECK(pieces[0].empty());
  const SessionState got = DecodeAll(pieces);
  CHECK(got.calls.empty());
  CHECK(got.finished.empty());
}

TEST_CASE("session_state: garbage is refused and leaves the state unchanged",
          "[ipc]") {
  const std::string good = EncodeSessionState(Sample())[0];
  SessionState into;
  REQUIRE_OK(DecodeSessionStatePiece(good, into));
  const SessionState before = into;
  // Every truncation of a valid piece.
  for (size_t n = 1; n < good.size(); ++n) {
    SessionState copy = into;
    const absl::Status s = DecodeSessionStatePiece(good.substr(0, n), copy);
    if (!s.ok()) {
      CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      CheckSame(copy, before);
    }
  }
  const std::string bad[] = {
      std::string("\x03", 1),                         // unknown kind
      std::string("\x02\x00\x00", 3),                 // empty finished id
      std::string("\x02\x01\x01", 3) + "x",           // id length 257
      std::string("\x01\x02\x01\x00" "a\x00\x00\x00\x00", 9),  // running 2
      std::string("\x01\x01\x01\x00" "a\x01\x00\x00\x00\xff\xff\xff\xff", 13),
  };
  for (const std::string& piece : bad) {
    SessionState copy = into;
    CHECK(DecodeSessionStatePiece(piece, copy).code() ==
          absl::StatusCode::kInvalidArgument);
    CheckSame(copy, before);
  }
  std::mt19937 rng(38);
  for (int i = 0; i < 2000; ++i) {
    std::string piece(rng() % 64, '\0');
    for (char& c : piece) c = static_cast<char>(rng() % 4);
    SessionState copy;
    const absl::Status s = DecodeSessionStatePiece(piece, copy);
    if (s.ok()) {
      for (const CollapsedCall& call : copy.calls) {
        CHECK(!call.id.empty());
        CHECK(call.id.size() <= kSessionStateMaxIdBytes);
      }
    } else {
      CHECK(copy.calls.empty());
    }
  }
}

}  // namespace
}  // namespace agentix::ipc
