// agentix-worker end to end: streaming calls.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <msgpack.hpp>
#include <regex>
#include <set>
#include <string>
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

// pickle.dumps(i, protocol=5) for 0 <= i < 256, and of None / True.
std::string PickledSmallInt(int i) {
  return absl::StrCat("\x80\x05K", std::string(1, static_cast<char>(i)), ".");
}

const std::string kPickledNone("\x80\x05N.", 4);

const std::string kPickledTrue("\x80\x05\x88.", 4);

// Whether generator `tag` of worker_fixture ran its `finally`, polled
// (bounded) because a pool thread closes it after Cancelled is sent.
bool GeneratorClosed(Worker& worker, const std::string& tag) {
  const std::string args = Pickle(absl::StrCat("(('", tag, "',), {})"));
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (worker.CallOk("worker_fixture::closed", args) != kPickledTrue) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

TEST_CASE("Streaming calls send every item, then the return value",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable;
  std::string result = kPickledNone;
  SECTION("async generator") { callable = "worker_fixture::agen_count"; }
  SECTION("sync generator") {
    callable = "worker_fixture::gen_count";
    result = Pickle("'done'");
  }
  SECTION("a function returning an iterable") {
    callable = "worker_fixture::list_of";
  }
  SECTION("a coroutine returning an async iterator") {
    callable = "worker_fixture::returns_agen";
  }
  SECTION("a coroutine returning an iterable") {
    callable = "worker_fixture::returns_list";
  }
  SECTION("a function returning an async iterator") {
    callable = "worker_fixture::agen_from_sync";
  }
  CAPTURE(callable);
  worker->Call("st", callable, Pickle("((20,), {})"), 1, /*stream_window=*/4);
  StreamReply stream = worker->AwaitStream("st");
  INFO(stream.end.error.type << ": " << stream.end.error.message << "\n"
                             << stream.end.error.traceback);
  REQUIRE(stream.end.ok);
  REQUIRE(stream.end.value == result);
  REQUIRE(stream.end.total_size == result.size());
  REQUIRE(stream.items.size() == 20);
  for (int i = 0; i < 20; ++i) REQUIRE(stream.items[i] == PickledSmallInt(i));
  // An ack for an unknown or finished call is ignored.
  worker->Ack("st", 30);
  worker->Ack("never-started", 1);
  worker->ExpectSilence(absl::Milliseconds(100));
}

TEST_CASE("Stream items use the call's encoding (msgpack)",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  worker->Call("mp", "worker_fixture::gen_count", Msgpack([](auto& p) {
                 p.pack_array(2);
                 p.pack_array(1);
                 p.pack(3);
                 p.pack_map(0);
               }),
               2, /*stream_window=*/8);
  StreamReply stream = worker->AwaitStream("mp");
  REQUIRE(stream.end.ok);
  REQUIRE(stream.end.value == absl::StrCat("\xa4", "done"));  // fixstr
  REQUIRE(stream.items ==
          std::vector<std::string>{std::string(1, '\0'), "\x01", "\x02"});
}

TEST_CASE("The window bounds the items sent ahead of the acks",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable =
      GENERATE("worker_fixture::agen_count", "worker_fixture::gen_count");
  CAPTURE(callable);
  worker->Call("w", callable, Pickle("((5,), {})"), 1, /*stream_window=*/2);
  REQUIRE(worker->NextItem("w", 0) == PickledSmallInt(0));
  REQUIRE(worker->NextItem("w", 1) == PickledSmallInt(1));
  // Without an ack nothing more comes, and the call does not finish.
  worker->ExpectSilence(absl::Milliseconds(300));
  worker->Ack("w", 1);
  REQUIRE(worker->NextItem("w", 2) == PickledSmallInt(2));
  worker->ExpectSilence(absl::Milliseconds(100));
  // Acks that go backwards change nothing.
  worker->Ack("w", 0);
  worker->ExpectSilence(absl::Milliseconds(100));
  worker->Ack("w", 3);
  REQUIRE(worker->NextItem("w", 3) == PickledSmallInt(3));
  REQUIRE(worker->NextItem("w", 4) == PickledSmallInt(4));
  // Exhaustion is found only by asking for item 5, which needs credit too.
  worker->ExpectSilence(absl::Milliseconds(100));
  worker->Ack("w", 5);
  Reply end = worker->AwaitReply("w", absl::Seconds(5));
  REQUIRE(end.ok);
}

TEST_CASE("An exception ends a stream with an error after its items",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable = GENERATE("worker_fixture::gen_then_fail",
                                  "worker_fixture::agen_then_fail");
  CAPTURE(callable);
  worker->Call("f", callable, Pickle("((3,), {})"), 1, /*stream_window=*/8);
  StreamReply stream = worker->AwaitStream("f");
  REQUIRE(stream.items.size() == 3);
  REQUIRE_FALSE(stream.end.ok);
  REQUIRE(stream.end.error.type == "ValueError");
  REQUIRE(stream.end.error.message == "failed after 3");
  REQUIRE(stream.end.error.code == 2);
  REQUIRE_FALSE(stream.end.error.cancelled);
  REQUIRE(stream.end.error.traceback.find("worker_fixture.py") !=
          std::string::npos);
  REQUIRE(stream.end.error.traceback.find("<agentix-worker driver") == std::string::npos);
}

TEST_CASE("Cancelling a stream answers Cancelled and closes the generator",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable;
  std::string tag;
  std::string args;
  SECTION("async generator waiting for credit") {
    callable = "worker_fixture::agen_forever";
    tag = "cancel-async";
    args = Pickle("(('cancel-async',), {})");
  }
  SECTION("sync generator waiting for credit") {
    callable = "worker_fixture::gen_forever";
    tag = "cancel-sync";
    args = Pickle("(('cancel-sync',), {})");
  }
  SECTION("sync generator blocked in next()") {
    callable = "worker_fixture::gen_forever";
    tag = "cancel-blocked";
    args = Pickle("(('cancel-blocked', 0.3), {})");
  }
  CAPTURE(callable, tag);
  worker->Call("c", callable, args, 1, /*stream_window=*/2);
  worker->NextItem("c", 0);
  if (tag != "cancel-blocked") worker->NextItem("c", 1);
  worker->Cancel("c");
  Reply reply = worker->AwaitReply("c", absl::Seconds(5));
  REQUIRE(reply.error.type == "Cancelled");
  REQUIRE(reply.error.code == 1);
  REQUIRE(reply.error.cancelled);
  // Acks after the cancel wake nothing: no more frames for the call.
  worker->Ack("c", 10);
  worker->ExpectSilence(absl::Milliseconds(500));
  REQUIRE(GeneratorClosed(*worker, tag));
  worker->ExpectSilence(absl::Milliseconds(100));
}

TEST_CASE("An unencodable item fails the stream and closes the generator",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  worker->Call("u", "worker_fixture::gen_unpicklable",
               Pickle("(('unpicklable',), {})"), 1, /*stream_window=*/8);
  StreamReply stream = worker->AwaitStream("u");
  REQUIRE(stream.items == std::vector<std::string>{PickledSmallInt(1)});
  REQUIRE(stream.end.error.type == "ResultEncodeError");
  REQUIRE(stream.end.error.code == 3);
  REQUIRE(stream.end.error.message.rfind("failed to pickle stream item 1: ",
                                         0) == 0);
  REQUIRE(GeneratorClosed(*worker, "unpicklable"));
}

TEST_CASE("A generator from an ordinary call is ResultEncodeError",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable =
      GENERATE("worker_fixture::gen_count", "worker_fixture::agen_count",
               "worker_fixture::returns_agen");
  CAPTURE(callable);
  ipc::ErrorInfo e = worker->CallError(callable, Pickle("((3,), {})"));
  REQUIRE(e.type == "ResultEncodeError");
  REQUIRE(e.code == 3);
  INFO(e.message);
  REQUIRE(e.message.find("remote_stream()") != std::string::npos);
  REQUIRE(e.message.find(callable) != std::string::npos);
}

TEST_CASE("A streaming call of a non-iterator is TypeError",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable;
  std::string args = Pickle("((1, 2), {})");
  std::string type = "int";
  SECTION("sync function") { callable = "worker_fixture::add"; }
  SECTION("coroutine function") { callable = "worker_fixture::async_add"; }
  SECTION("a str is not streamed") {
    callable = "worker_fixture::echo";
    args = Pickle("(('text',), {})");
    type = "str";
  }
  worker->Call("t", callable, args, 1, /*stream_window=*/4);
  Reply reply = worker->AwaitReply("t");
  REQUIRE(reply.error.type == "TypeError");
  REQUIRE(reply.error.code == 3);
  REQUIRE(reply.error.message ==
          absl::StrCat("remote_stream target '", callable, "' returned ", type,
                       ", not an iterator; use remote()"));
  // A bad argument binding is the user's TypeError, as for ordinary calls.
  worker->Call("b", "worker_fixture::gen_count", Pickle("((), {})"), 1, 4);
  reply = worker->AwaitReply("b");
  REQUIRE(reply.error.type == "TypeError");
  REQUIRE(reply.error.code == 2);
}

TEST_CASE("Shutdown cancels streams and exits 0 promptly", "[worker][stream]") {
  auto worker = ReadyWorker();
  worker->Call("sa", "worker_fixture::agen_forever", Pickle("(('sa',), {})"), 1,
               /*stream_window=*/1);
  worker->Call("ss", "worker_fixture::gen_forever", Pickle("(('ss',), {})"), 1,
               /*stream_window=*/1);
  std::set<std::string> first;
  for (int i = 0; i < 2; ++i) {
    REQUIRE_OK_AND_ASSIGN(Frame item, worker->Next(absl::Seconds(10)));
    REQUIRE(item.type == FrameType::kStreamItem);
    first.insert(item.call_id);
  }
  REQUIRE(first == std::set<std::string>{"sa", "ss"});
  const absl::Time start = absl::Now();
  worker->Shutdown();
  auto replies = worker->AwaitReplies({"sa", "ss"}, absl::Seconds(5));
  REQUIRE(replies["sa"].error.type == "Cancelled");
  REQUIRE(replies["ss"].error.type == "Cancelled");
  REQUIRE(worker->AwaitExit().returncode() == 0);
  REQUIRE(absl::Now() - start < absl::Seconds(3));
}

}  // namespace
}  // namespace agentix::worker
