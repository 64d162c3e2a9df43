// DirectConnections: the count of handed-over connections, kept until the
// worker reports them closed or exits, whatever the order.
#include "sandbox/direct_connections.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace agentix::sandbox {
namespace {

TEST_CASE("Handed-over connections count until closed, bounded", "[direct]") {
  StreamActivity activity;
  DirectConnections direct(2, &activity);
  activity.Opened();  // the frame wire counts each at HELLO
  activity.Opened();
  auto a = direct.Reserve(1);
  auto b = direct.Reserve(1);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(*a != *b);
  CHECK(!direct.Reserve(1).has_value());  // at the cap
  direct.Commit(*a, false);
  direct.Commit(*b, false);
  CHECK(direct.live() == 2);
  CHECK(activity.open() == 2);
  // Another worker generation cannot close them; an unknown number neither.
  direct.OnDirectClosed(2, *a, "eof");
  direct.OnDirectClosed(1, 999, "eof");
  CHECK(direct.unknown_closes() == 2);
  CHECK(direct.live() == 2);
  direct.OnDirectClosed(1, *a, "eof");
  CHECK(direct.live() == 1);
  CHECK(activity.open() == 1);
  direct.OnDirectWorkerGone(1);
  CHECK(direct.live() == 0);
  CHECK(activity.open() == 0);
}

TEST_CASE("A close before the commit, a cancel and a gone worker's late "
          "reserve leave nothing counted", "[direct]") {
  StreamActivity activity;
  DirectConnections direct(4, &activity);
  activity.Opened();
  auto a = direct.Reserve(1);
  REQUIRE(a.has_value());
  direct.OnDirectClosed(1, *a, "eof");  // the worker was quick
  direct.Commit(*a, false);
  CHECK(activity.open() == 0);
  CHECK(direct.live() == 0);
  auto b = direct.Reserve(1);
  REQUIRE(b.has_value());
  direct.Cancel(*b);
  CHECK(direct.live() == 0);
  direct.OnDirectWorkerGone(1);
  CHECK(!direct.Reserve(1).has_value());  // that worker is gone
  CHECK(direct.Reserve(2).has_value());
}

TEST_CASE("A Namespace stream's end runs its on_end once, and its client "
          "is never an orphan", "[direct]") {
  StreamActivity activity;
  DirectConnections direct(4, &activity);
  int ended = 0;
  activity.Opened();
  auto a = direct.Reserve(1, "", /*calls=*/false);
  REQUIRE(a.has_value());
  direct.Commit(*a, false, [&] { ++ended; });
  CHECK(!direct.HasLive(""));  // the orphan timer watches Calls clients only
  direct.OnDirectClosed(1, *a, "eof");
  CHECK(ended == 1);
  CHECK(activity.open() == 0);
  direct.OnDirectWorkerGone(1);
  CHECK(ended == 1);
  CHECK(direct.TakeOrphans(absl::InfiniteFuture(), absl::ZeroDuration()).empty());
  // A worker's exit runs it; so does a close that came before the commit.
  activity.Opened();
  auto b = direct.Reserve(2, "", false);
  REQUIRE(b.has_value());
  direct.Commit(*b, false, [&] { ++ended; });
  direct.OnDirectWorkerGone(2);
  CHECK(ended == 2);
  activity.Opened();
  auto c = direct.Reserve(3, "", false);
  REQUIRE(c.has_value());
  direct.OnDirectClosed(3, *c, "eof");
  direct.Commit(*c, false, [&] { ++ended; });
  CHECK(ended == 3);
  CHECK(activity.open() == 0);
}

TEST_CASE("A client is an orphan once its last connection is closed for the "
          "timeout, reported once", "[direct]") {
  DirectConnections direct(8, nullptr);
  const absl::Duration after = absl::Seconds(30);
  auto a1 = direct.Reserve(1, "a");
  auto a2 = direct.Reserve(1, "a");
  auto b1 = direct.Reserve(1, "b");
  for (auto conn : {a1, a2, b1}) direct.Commit(*conn, false);
  CHECK(direct.HasLive("a"));
  direct.OnDirectClosed(1, *a1, "eof");
  CHECK(direct.HasLive("a"));  // one left
  const absl::Time far = absl::Now() + absl::Hours(1);
  CHECK(direct.TakeOrphans(far, after).empty());
  direct.OnDirectClosed(1, *a2, "eof");
  CHECK(!direct.HasLive("a"));
  CHECK(direct.TakeOrphans(absl::Now(), after).empty());  // not yet
  // One came back meanwhile: the clock starts again at its close.
  auto a3 = direct.Reserve(1, "a");
  direct.Commit(*a3, false);
  CHECK(direct.TakeOrphans(far, after).empty());
  direct.OnDirectClosed(1, *a3, "status 0 written");
  CHECK(direct.TakeOrphans(far, after) == std::vector<std::string>{"a"});
  CHECK(direct.TakeOrphans(far, after).empty());  // once
  // A worker's exit orphans its clients too (their collapse finds nothing).
  direct.OnDirectWorkerGone(1);
  CHECK(direct.TakeOrphans(far, after) == std::vector<std::string>{"b"});
}

}  // namespace
}  // namespace agentix::sandbox
