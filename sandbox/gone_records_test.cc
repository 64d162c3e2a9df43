#include "sandbox/gone_records.h"

#include <catch2/catch.hpp>

namespace agentix::sandbox {
namespace {

GoneRecords::OwnerPtr Client(const std::string& id) {
  return std::make_shared<const std::string>(id);
}

TEST_CASE("Gone records are counted for their client and no call, after a "
          "seq",
          "[logs]") {
  GoneRecords gone(100, 10);
  const auto a = Client("a");
  for (uint64_t seq = 1; seq <= 10; ++seq) {
    // 1-4 a's, 5-6 no call's, 7-8 b's (its own owner object each), 9-10 a's.
    GoneRecords::OwnerPtr owner =
        seq <= 4 ? a : seq <= 6 ? nullptr : seq <= 8 ? Client("b") : Client("a");
    gone.Add(seq, owner, 1, /*broadcast=*/false);
  }
  REQUIRE(gone.runs() == 4);  // equal owners join a run across owner objects
  auto count = gone.CountFor("a", 2, /*no_call=*/true);
  REQUIRE(count.records == 2 + 2 + 2);  // 3, 4; 5, 6; 9, 10
  REQUIRE_FALSE(count.at_most);
  REQUIRE(gone.CountFor("a", 2, /*no_call=*/false).records == 4);
  REQUIRE(gone.CountFor("b", 0, /*no_call=*/false).records == 2);
  REQUIRE(gone.CountFor("c", 0, /*no_call=*/false).records == 0);
  REQUIRE(gone.CountFor("", 5, /*no_call=*/true).records == 1);
  REQUIRE(gone.CountFor("a", 10, /*no_call=*/true).records == 0);
}

TEST_CASE("A broadcast record is not counted; a report counts its weight",
          "[logs]") {
  GoneRecords gone(100, 10);
  gone.Add(1, nullptr, 1, /*broadcast=*/true);
  gone.Add(2, nullptr, 7, /*broadcast=*/false);  // a report of 7 to all
  gone.Add(3, Client("a"), 0, /*broadcast=*/false);  // a report to a
  gone.Add(4, nullptr, 1, /*broadcast=*/false);
  REQUIRE(gone.CountFor("a", 0, /*no_call=*/true).records == 8);
  REQUIRE(gone.CountFor("a", 2, /*no_call=*/true).records == 1);
}

TEST_CASE("Seqs that come out of order (acks in the middle) count once each",
          "[logs]") {
  GoneRecords gone(100, 10);
  for (uint64_t seq : {5, 6, 7, 1, 2, 9}) gone.Add(seq, nullptr, 1, false);
  REQUIRE(gone.CountFor("", 1, true).records == 5);
  REQUIRE(gone.CountFor("", 6, true).records == 2);
}

TEST_CASE("Forgotten runs count as an upper bound, by owner, and only after "
          "their seqs",
          "[logs]") {
  GoneRecords gone(/*max_runs=*/2, /*max_owners=*/2);
  gone.Add(1, Client("a"), 1, false);
  gone.Add(2, Client("b"), 1, false);
  gone.Add(3, Client("a"), 1, false);  // forgets a's 1
  gone.Add(4, Client("c"), 1, false);  // forgets b's 2
  REQUIRE(gone.runs() == 2);
  // a: 3 exact, 1 forgotten (seq unknown now, at most 1).
  auto a = gone.CountFor("a", 0, false);
  REQUIRE(a.records == 2);
  REQUIRE(a.at_most);
  // After the forgotten seqs: exact again.
  a = gone.CountFor("a", 2, false);
  REQUIRE(a.records == 1);
  REQUIRE_FALSE(a.at_most);
  // b's forgotten run is b's alone: not another client's count.
  auto c = gone.CountFor("c", 0, false);
  REQUIRE(c.records == 1);
  REQUIRE_FALSE(c.at_most);
  // A third owner's forgotten run goes to the shared remainder, which any
  // count before its seq includes as an upper bound.
  gone.Add(5, Client("d"), 1, false);  // forgets a's 3
  gone.Add(6, Client("d"), 1, false);  // joins d's run
  gone.Add(7, Client("e"), 1, false);  // forgets c's 4: shared
  auto e = gone.CountFor("e", 0, false);
  REQUIRE(e.records == 2);  // its 7, and c's 4 as "at most"
  REQUIRE(e.at_most);
  REQUIRE(gone.CountFor("e", 4, false).records == 1);
  REQUIRE_FALSE(gone.CountFor("e", 4, false).at_most);
}

}  // namespace
}  // namespace agentix::sandbox
