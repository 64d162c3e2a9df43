#include "sandbox/direct_side_channels.h"

#include <catch2/catch.hpp>

namespace agentix::sandbox {
namespace {

TEST_CASE("A tagged record of a direct call goes to its connection's client",
          "[direct]") {
  DirectSideChannels side;
  side.NameClient(/*generation=*/1, /*conn=*/7, "alice");
  side.NameClient(1, 8, "bob");
  // Five records: a relayed call's (owner carol), two of alice's direct
  // call, an untagged one while it ran (no call id: every stream), one of
  // bob's.
  const std::vector<IdRun> calls = {{"relayed", 1}, {"a1", 2}, {"", 1}, {"b1", 1}};
  const std::vector<uint64_t> conns = {0, 7, 7, 7, 8};
  const std::vector<IdRun> owners = {{"carol", 1}, {"", 4}};
  const std::vector<IdRun> got = side.Owners(1, calls, conns, owners);
  REQUIRE(got.size() == 4);
  CHECK(got[0].id == "carol");
  CHECK(got[0].count == 1);
  CHECK(got[1].id == "alice");
  CHECK(got[1].count == 2);
  CHECK(got[2].id == "");
  CHECK(got[2].count == 1);
  CHECK(got[3].id == "bob");
  CHECK(got[3].count == 1);
  CHECK(side.unknown_tags() == 0);
}

TEST_CASE("Another worker's connection number is not a client", "[direct]") {
  DirectSideChannels side;
  side.NameClient(1, 7, "alice");
  CHECK(side.ClientOf(1, 7) == "alice");
  CHECK(!side.ClientOf(2, 7).has_value());
  CHECK(!side.ClientOf(1, 9).has_value());
  const std::vector<IdRun> got =
      side.Owners(2, {{"a1", 2}}, {7, 9}, /*owners=*/{});
  REQUIRE(got.size() == 1);
  CHECK(got[0].id == "");  // every stream, as a forgotten relayed call's
  CHECK(got[0].count == 2);
  CHECK(side.unknown_tags() == 2);
  side.ForgetWorker(1);
  CHECK(!side.ClientOf(1, 7).has_value());
}

TEST_CASE("Only the most recent connections' clients are remembered",
          "[direct]") {
  DirectSideChannels side(/*remembered_conns=*/2);
  side.NameClient(1, 1, "a");
  side.NameClient(1, 2, "b");
  side.NameClient(1, 3, "c");
  CHECK(!side.ClientOf(1, 1).has_value());
  CHECK(side.ClientOf(1, 2) == "b");
  CHECK(side.ClientOf(1, 3) == "c");
}

TEST_CASE("A direct call's barrier is the last seq of its tagged records",
          "[direct]") {
  DirectSideChannels side;
  side.NameClient(1, 7, "alice");
  // Log records numbered from 100: a1, a1, relayed r1, a2, untagged.
  const std::vector<IdRun> logs = {{"a1", 2}, {"r1", 1}, {"a2", 1}, {"", 1}};
  side.TrackSeqs(1, logs, {7, 7, 0, 7, 7}, /*first=*/100, /*trace=*/false);
  // Trace events numbered from 40: a1's only.
  side.TrackSeqs(1, {{"a1", 3}}, {7, 7, 7}, 40, /*trace=*/true);
  CHECK(side.calls_waiting() == 2);  // the relayed call's are the manager's

  DirectSideChannels::Seqs a1 = side.Take(1, "a1");
  CHECK(a1.log_seq == 101);
  CHECK(a1.trace_seq == 42);
  DirectSideChannels::Seqs a2 = side.Take(1, "a2");
  CHECK(a2.log_seq == 103);
  CHECK(a2.trace_seq == 0);
  // Asked once: forgotten by the answer; another worker's ask gets nothing.
  CHECK(side.Take(1, "a1").log_seq == 0);
  side.TrackSeqs(1, {{"a3", 1}}, {7}, 200, false);
  CHECK(side.Take(2, "a3").log_seq == 0);
  CHECK(side.Take(1, "a3").log_seq == 200);
  CHECK(side.calls_waiting() == 0);
}

TEST_CASE("Seqs of calls never asked for are bounded and go with the worker",
          "[direct]") {
  DirectSideChannels side(DirectSideChannels::kRememberedConns, /*max_calls=*/3);
  for (int i = 0; i < 3; ++i) {
    side.TrackSeqs(1, {{"c" + std::to_string(i), 1}}, {5}, 10 + i, false);
  }
  CHECK(side.calls_waiting() == 3);
  side.TrackSeqs(1, {{"c3", 1}}, {5}, 20, false);  // over: the rest go
  CHECK(side.calls_waiting() == 1);
  CHECK(side.Take(1, "c3").log_seq == 20);
  side.TrackSeqs(2, {{"d", 1}}, {5}, 30, false);
  side.ForgetWorker(2);
  CHECK(side.calls_waiting() == 0);
}

}  // namespace
}  // namespace agentix::sandbox
