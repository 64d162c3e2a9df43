// agentix-worker end to end: leader/follower intake (worker/README.md,
// "Leader/follower intake"). Sequential sync calls put the channel in the
// pool threads' hands; these tests check that the thread running a call it
// read never holds up the frames after it.
#include <dirent.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "testing/status_matchers.h"
#include "worker/ipc/frame.h"
#include "worker/worker_test_util.h"

namespace agentix::worker {
namespace {

// Sequential sync calls until a pool thread reads the channel: with the
// loop reading, one pool thread runs them all, handed each by the loop;
// with leader/follower, the pool thread that reads a short call runs it and
// reads the next one. Returns the distinct threads seen.
size_t WarmUp(Worker& worker) {
  std::set<std::string> threads;
  for (int i = 0; i < 8; ++i) {
    threads.insert(worker.CallOk("worker_fixture::thread_ident",
                                 Pickle("((), {})")));
  }
  return threads.size();
}

// Context switches (voluntary and not) of each thread of process `pid`.
std::map<std::string, long> Switches(pid_t pid) {
  std::map<std::string, long> out;
  const std::string task = absl::StrCat("/proc/", pid, "/task");
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(task.c_str()), ::closedir);
  REQUIRE(dir != nullptr);
  while (dirent* entry = ::readdir(dir.get())) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream status(absl::StrCat(task, "/", entry->d_name, "/status"));
    std::string line;
    long total = 0;
    while (std::getline(status, line)) {
      if (absl::StrContains(line, "ctxt_switches:")) {
        total += std::stol(line.substr(line.find(':') + 1));
      }
    }
    std::ifstream comm(absl::StrCat(task, "/", entry->d_name, "/comm"));
    std::string name;
    std::getline(comm, name);
    out[absl::StrCat(entry->d_name, ":", name)] = total;
  }
  return out;
}

// Switches()'s key for the main thread (the event loop's) of process `pid`.
std::string MainKey(pid_t pid) {
  for (const auto& [key, total] : Switches(pid)) {
    if (absl::StartsWith(key, absl::StrCat(pid, ":"))) return key;
  }
  FAIL("no main thread");
  return "";
}

// Runs `calls` sequential short sync calls; returns how often each thread
// of the worker slept and woke meanwhile, most first.
std::vector<std::pair<long, std::string>> WakesPerThread(Worker& worker,
                                                         int calls) {
  const std::string args = Pickle("((1, 2), {})");
  const std::string three = Pickle("3");
  // Idle first: the loop's start and the agentix warm-up come at the first
  // pause (serve.py), such as the encoding above, and must not run under
  // the calls counted.
  absl::SleepFor(absl::Milliseconds(600));
  const auto before = Switches(worker.pid());
  for (int i = 0; i < calls; ++i) {
    REQUIRE(worker.CallOk("worker_fixture::add", args) == three);
  }
  std::vector<std::pair<long, std::string>> wakes;
  for (const auto& [tid, total] : Switches(worker.pid())) {
    auto it = before.find(tid);
    wakes.emplace_back(total - (it == before.end() ? 0 : it->second), tid);
  }
  std::sort(wakes.rbegin(), wakes.rend());
  return wakes;
}

TEST_CASE("Sequential sync calls are read by the pool thread that runs them",
          "[worker][intake]") {
  auto worker = ReadyWorker();
  WarmUp(*worker);
  // Idle first: the event loop has started and the agentix warm-up is
  // done. Until a first pause the main thread looks every 0.1 s whether
  // calls stopped (serve.py), which is not taking part in them.
  absl::SleepFor(absl::Milliseconds(600));
  const pid_t main_thread = worker->pid();
  auto before = Switches(main_thread);
  for (int i = 0; i < 4; ++i) WarmUp(*worker);
  // The event loop's thread does not take part: taking part costs it at
  // least one wake-up per call (32 here), while a loaded machine may wake it
  // a few times for its own timers (seen: 4 in 8 calls under parallel tests).
  CHECK(Switches(main_thread)[MainKey(main_thread)] -
            before[MainKey(main_thread)] < 8);

  WorkerArgs loop_only;
  loop_only.env.push_back("AGENTIX_WORKER_INTAKE=loop");
  auto loop_worker = ReadyWorker(loop_only);
  REQUIRE(WarmUp(*loop_worker) == 1);
  before = Switches(loop_worker->pid());
  WarmUp(*loop_worker);
  const std::string loop_tid = MainKey(loop_worker->pid());
  CHECK(Switches(loop_worker->pid())[loop_tid] - before[loop_tid] >= 8);
}

TEST_CASE("Sequential short sync calls wake one thread only",
          "[worker][intake]") {
  // The reader runs a short call itself and reads on; the baton is only
  // offered to the follower (taken if the call still ran after 1 ms), so
  // nothing else wakes: one wake-up per call, on one thread.
  auto worker = ReadyWorker();
  WarmUp(*worker);
  const int kCalls = 200;
  auto wakes = WakesPerThread(*worker, kCalls);
  INFO("wake-ups per thread over " << kCalls << " calls: "
       << absl::StrJoin(wakes, ", ", absl::PairFormatter("@")));
  long all = 0;
  for (const auto& [count, thread] : wakes) all += count;
  // About one per call: the reader's, waiting for the next frame (main's
  // leader/follower: two, the follower woke on every call too). A call
  // preempted past 1 ms on a busy machine costs one hand-over more.
  CHECK(all < kCalls * 3 / 2);
  CHECK(wakes[0].first >= kCalls / 2);  // mostly one thread reads
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

TEST_CASE("A call right behind a long one is read within milliseconds",
          "[worker][intake][timing]") {
  // The long call's reader only offered the baton: the follower takes it
  // 1 ms into the call and reads the next frame.
  auto worker = ReadyWorker();
  WarmUp(*worker);
  const std::string sleep_args = Pickle("((3.0,), {})");
  const std::string add_args = Pickle("((1, 2), {})");
  const absl::Time start = absl::Now();
  worker->Call("long", "worker_fixture::sleep_sync", sleep_args);
  worker->Call("quick", "worker_fixture::add", add_args);
  REQUIRE_OK_AND_ASSIGN(Frame first, worker->Next(absl::Seconds(10)));
  REQUIRE(first.call_id == "quick");
  REQUIRE(first.type == FrameType::kResult);
  const absl::Duration took = absl::Now() - start;
  INFO("the quick call's reply came after " << absl::FormatDuration(took));
  CHECK(took < absl::Milliseconds(200));
  REQUIRE(worker->AwaitReply("long", absl::Seconds(10)).ok);
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
