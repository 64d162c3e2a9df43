// agentix-worker end to end: leader/follower intake (worker/README.md,
// "Leader/follower intake"). Sequential sync calls put the channel in the
// pool threads' hands; these tests check that the thread running a call it
// read never holds up the frames after it.
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "testing/status_matchers.h"
#include "worker/ipc/frame.h"
#include "worker/worker_test_util.h"

namespace agentix::worker {
namespace {

// Sequential sync calls until a pool thread reads the channel: with the
// loop reading, one pool thread runs them all; with leader/follower, the
// leader runs the call it read and a follower reads the next, so they
// alternate between two threads. Returns the distinct threads seen (the
// first test checks it; the others rely on it).
size_t WarmUp(Worker& worker) {
  std::set<std::string> threads;
  for (int i = 0; i < 8; ++i) {
    threads.insert(worker.CallOk("worker_fixture::thread_ident",
                                 Pickle("((), {})")));
  }
  return threads.size();
}

TEST_CASE("Sequential sync calls are read by the pool threads that run them",
          "[worker][intake]") {
  auto worker = ReadyWorker();
  REQUIRE(WarmUp(*worker) >= 2);

  WorkerArgs loop_only;
  loop_only.env.push_back("AGENTIX_WORKER_INTAKE=loop");
  auto loop_worker = ReadyWorker(loop_only);
  REQUIRE(WarmUp(*loop_worker) == 1);
}

TEST_CASE("A long sync call run by its reader does not hold up the next call",
          "[worker][intake][timing]") {
  auto worker = ReadyWorker();
  WarmUp(*worker);
  // Read (and run) by the current leader, after the last call was alone.
  worker->Call("long", "worker_fixture::sleep_sync", Pickle("((3.0,), {})"));
  worker->ExpectSilence(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  worker->Call("quick", "worker_fixture::add", Pickle("((1, 2), {})"));
  REQUIRE_OK_AND_ASSIGN(Frame first, worker->Next(absl::Seconds(10)));
  REQUIRE(first.call_id == "quick");
  REQUIRE(first.type == FrameType::kResult);
  REQUIRE(absl::Now() - start < absl::Seconds(1));
  // And a coroutine meanwhile (the loop reads on from here).
  worker->Call("async", "worker_fixture::async_add", Pickle("((1, 1), {})"));
  REQUIRE_OK_AND_ASSIGN(Frame second, worker->Next(absl::Seconds(10)));
  REQUIRE(second.call_id == "async");
  REQUIRE(absl::Now() - start < absl::Seconds(2));
  REQUIRE(worker->AwaitReply("long", absl::Seconds(10)).ok);
  // Back to leader/follower after the mixed calls.
  WarmUp(*worker);
}

TEST_CASE("Cancelling a sync call its reader runs answers at once",
          "[worker][intake][timing]") {
  auto worker = ReadyWorker();
  WarmUp(*worker);
  worker->Call("s1", "worker_fixture::sleep_sync", Pickle("((2.0,), {})"));
  worker->ExpectSilence(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  worker->Cancel("s1");
  Reply reply = worker->AwaitReply("s1", absl::Seconds(5));
  REQUIRE(absl::Now() - start < absl::Seconds(1));
  REQUIRE(reply.error.type == "Cancelled");
  REQUIRE(reply.error.cancelled);
  // The abandoned function's late result is dropped.
  worker->ExpectSilence(absl::Milliseconds(2500));
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
  WarmUp(*worker);
}

TEST_CASE("Calls read by pool threads still run 64 at once, never more",
          "[worker][intake][timing]") {
  auto worker = ReadyWorker();
  WarmUp(*worker);
  // 80 calls that each wait until 64 have run together: only if the
  // channel keeps being read while the first ones wait do 64 ever meet.
  const std::string args = Pickle("((64, 20.0), {})");
  std::set<std::string> ids;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 80; ++i) {
    ids.insert(absl::StrCat("g", i));
    worker->Call(absl::StrCat("g", i), "worker_fixture::concurrency_gate",
                 args);
  }
  auto replies = worker->AwaitReplies(ids, absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  INFO("80 gated calls took " << absl::FormatDuration(took));
  REQUIRE(took < absl::Seconds(15));
  const std::string peak_64 = Pickle("64");  // the pool's bound, reached
  for (auto& [id, reply] : replies) {
    REQUIRE(reply.ok);
    REQUIRE(reply.value == peak_64);
  }
}

TEST_CASE("End of stream and bad frames reach a pool-thread reader",
          "[worker][intake]") {
  SECTION("end of stream: exit 0") {
    auto worker = ReadyWorker();
    WarmUp(*worker);
    worker->CloseChannel();
    REQUIRE(worker->AwaitExit().returncode() == 0);
  }
  SECTION("a frame of an unknown type: exit 4") {
    auto worker = ReadyWorker();
    WarmUp(*worker);
    Frame ready;
    ready.type = FrameType::kReady;  // the daemon never sends one
    worker->Send(ready);
    REQUIRE(worker->AwaitExit().returncode() == 4);
  }
  SECTION("shutdown: exit 0") {
    auto worker = ReadyWorker();
    WarmUp(*worker);
    worker->Shutdown();
    REQUIRE(worker->AwaitExit().returncode() == 0);
  }
}

}  // namespace
}  // namespace agentix::worker
