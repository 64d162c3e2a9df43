// agentix-worker end to end: trace events from agentix.trace.
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

// A worker that can import agentix: the fixtures plus the built wheel (a zip
// on sys.path), whose agentix.utils.trace is what sandbox code uses.
std::unique_ptr<Worker> TracingWorker() {
  std::string wheel;
  for (const auto& entry : fs::directory_iterator(Runfile("host/python"))) {
    if (entry.path().extension() == ".whl") wheel = entry.path().string();
  }
  REQUIRE_FALSE(wheel.empty());
  WorkerArgs options;
  options.python_path = false;
  options.args = {absl::StrCat("--python-path=", FixtureDir(), ":", wheel)};
  return ReadyWorker(options);
}

msgpack::object_handle Unpack(const std::string& bytes) {
  REQUIRE_FALSE(bytes.empty());
  return msgpack::unpack(bytes.data(), bytes.size());
}

const ipc::TraceEntry* FindSpan(const std::vector<ipc::TraceEntry>& traces,
                                int kind, const std::string& name) {
  for (const ipc::TraceEntry& t : traces) {
    if (t.kind == kind && t.name == name) return &t;
  }
  return nullptr;
}

TEST_CASE("agentix.trace traces and spans become trace frames in order",
          "[worker][trace]") {
  auto worker = TracingWorker();
  CHECK(Unpickle(worker->CallOk("worker_fixture::trace_processors",
                                Pickle("((), {})"))) ==
        "['_TraceForwarder']");
  const int64_t before = absl::ToUnixNanos(absl::Now());
  worker->Call("tr", "worker_fixture::traced", Pickle("((), {})"));
  Reply reply = worker->AwaitReply("tr");
  INFO(reply.error.message << reply.error.traceback);
  REQUIRE(reply.ok);
  const int64_t after = absl::ToUnixNanos(absl::Now());
  const std::string trace_id = Unpickle(reply.value, "v[0]");
  const std::string outer_id = Unpickle(reply.value, "v[1]");
  const std::string inner_id = Unpickle(reply.value, "v[2]");
  REQUIRE(worker->AwaitTraces(6));
  const std::vector<ipc::TraceEntry>& t = worker->traces();
  REQUIRE(t.size() == 6);
  const std::vector<std::pair<int, std::string>> want = {
      {1, "t"}, {3, "outer"}, {3, "inner"}, {4, "inner"}, {4, "outer"},
      {2, ""}};
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("event " << i);
    CHECK(t[i].kind == want[i].first);
    CHECK(t[i].name == want[i].second);
    CHECK(t[i].trace_id == trace_id);
    CHECK(t[i].call_id == "tr");
  }
  // trace start: metadata as attributes, started_at in ns.
  CHECK(t[0].span_id.empty());
  CHECK(Extras(t[0].attributes) == std::map<std::string, std::string>{{"k", "1"}});
  CHECK(t[0].start_time_unix_nanos >= before - 1000000);
  CHECK(t[0].start_time_unix_nanos <= after);
  CHECK(t[0].end_time_unix_nanos == 0);
  // span starts: ids and the parent link.
  CHECK(t[1].span_id == outer_id);
  CHECK(t[1].parent_id.empty());
  CHECK(Extras(t[1].attributes) == std::map<std::string, std::string>{{"a", "1"}});
  CHECK(t[1].start_time_unix_nanos >= t[0].start_time_unix_nanos);
  CHECK(t[2].span_id == inner_id);
  CHECK(t[2].parent_id == outer_id);
  CHECK(t[2].attributes.empty());
  // inner end: ok status with its description, one event.
  CHECK(t[3].span_id == inner_id);
  CHECK(t[3].parent_id == outer_id);
  CHECK(t[3].status == 1);
  CHECK(t[3].status_description == "fine");
  CHECK(t[3].error_message.empty());
  CHECK(t[3].start_time_unix_nanos == t[2].start_time_unix_nanos);
  CHECK(t[3].end_time_unix_nanos >= t[3].start_time_unix_nanos);
  {
    msgpack::object_handle events = Unpack(t[3].events);
    const msgpack::object& list = events.get();
    REQUIRE(list.type == msgpack::type::ARRAY);
    REQUIRE(list.via.array.size == 1);
    const msgpack::object& event = list.via.array.ptr[0];
    REQUIRE(event.type == msgpack::type::ARRAY);
    REQUIRE(event.via.array.size == 3);
    CHECK(event.via.array.ptr[0].as<std::string>() == "ev");
    const int64_t when = event.via.array.ptr[1].as<int64_t>();
    CHECK(when >= t[3].start_time_unix_nanos);
    CHECK(when <= t[3].end_time_unix_nanos);
    const auto attrs =
        event.via.array.ptr[2].as<std::map<std::string, int64_t>>();
    CHECK(attrs == std::map<std::string, int64_t>{{"x", 2}});
  }
  // outer end: set_error makes the status error, with message and data.
  CHECK(t[4].span_id == outer_id);
  CHECK(t[4].status == 2);
  CHECK(t[4].status_description == "bad");
  CHECK(t[4].error_message == "bad");
  CHECK(Extras(t[4].error_data) == std::map<std::string, std::string>{{"code", "7"}});
  CHECK(Extras(t[4].attributes) == std::map<std::string, std::string>{{"a", "1"}});
  CHECK(t[4].events.empty());
  // trace end.
  CHECK(t[5].end_time_unix_nanos >= t[4].end_time_unix_nanos);
  CHECK(t[5].end_time_unix_nanos <= after + 1000000);
  CHECK(t[5].start_time_unix_nanos == 0);
  // With a processor registered, agentix.trace does not warn.
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(LogsOf(worker->logs(), "agentix.trace").empty());
}

TEST_CASE("Span attributes are coerced to scalars; others arrive as repr",
          "[worker][trace]") {
  auto worker = TracingWorker();
  const std::string span_id = Unpickle(
      worker->CallOk("worker_fixture::traced_odd_attributes",
                     Pickle("((), {})")),
      "v");
  REQUIRE(worker->AwaitTraces(2));
  const ipc::TraceEntry& end = worker->traces()[1];
  CHECK(end.kind == 4);
  CHECK(end.span_id == span_id);
  CHECK(end.trace_id == "trace_unbound");
  msgpack::object_handle handle = Unpack(end.attributes);
  const msgpack::object& map = handle.get();
  REQUIRE(map.type == msgpack::type::MAP);
  std::map<std::string, msgpack::object> attrs;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    attrs[map.via.map.ptr[i].key.as<std::string>()] = map.via.map.ptr[i].val;
  }
  CHECK(attrs.size() == 6);  // `none` is left out
  CHECK(attrs.count("none") == 0);
  REQUIRE(attrs.count("obj") == 1);
  CHECK(attrs["obj"].type == msgpack::type::STR);
  CHECK(attrs["obj"].as<std::string>() == "<opaque>");
  CHECK(attrs["big"].type == msgpack::type::STR);
  CHECK(attrs["big"].as<std::string>() == "1180591620717411303424");
  CHECK(attrs["s"].as<std::string>() == "x");
  CHECK(attrs["f"].as<double>() == 1.5);
  CHECK(attrs["b"].type == msgpack::type::BOOLEAN);
  CHECK(attrs["b"].as<bool>());
  CHECK(attrs["raw"].type == msgpack::type::BIN);
  CHECK(attrs["raw"].as<std::string>() == std::string("\x00\xff", 2));
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Span stamps become Unix nanoseconds, across seconds",
          "[worker][trace]") {
  auto worker = TracingWorker();
  worker->CallOk("worker_fixture::traced_stamps", Pickle("((), {})"));
  REQUIRE(worker->AwaitTraces(4));
  const auto& t = worker->traces();
  constexpr int64_t k20240102T030405 = 1704164645;  // Unix seconds
  constexpr int64_t kNs = 1000000000;
  CHECK(t[0].start_time_unix_nanos == k20240102T030405 * kNs + 123456000);
  CHECK(t[0].end_time_unix_nanos == k20240102T030405 * kNs + 999999000);
  CHECK(t[1].start_time_unix_nanos == k20240102T030405 * kNs + 1000);
  CHECK(t[1].end_time_unix_nanos == (k20240102T030405 + 1) * kNs);
  // Not agentix's own format: parsed by datetime.
  CHECK(t[2].start_time_unix_nanos == (k20240102T030405 + 1) * kNs + 500000000);
  CHECK(t[2].end_time_unix_nanos == 946684799 * kNs + 2000);
  CHECK(t[3].start_time_unix_nanos == k20240102T030405 * kNs + 7000);
  CHECK(t[3].end_time_unix_nanos == 0);  // unreadable
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Spans from pool threads and tasks carry their call's id",
          "[worker][trace]") {
  auto worker = TracingWorker();
  worker->Call("ps", "worker_fixture::traced_sync", Pickle("(('sync',), {})"));
  worker->Call("pa", "worker_fixture::traced_async",
               Pickle("(('async',), {})"));
  auto replies = worker->AwaitReplies({"ps", "pa"}, absl::Seconds(20));
  REQUIRE(replies["ps"].ok);
  REQUIRE(replies["pa"].ok);
  REQUIRE(worker->AwaitTraces(6));
  const auto& t = worker->traces();
  for (int kind : {3, 4}) {
    const ipc::TraceEntry* sync = FindSpan(t, kind, "sync");
    const ipc::TraceEntry* async = FindSpan(t, kind, "async");
    const ipc::TraceEntry* child = FindSpan(t, kind, "async-child");
    REQUIRE(sync != nullptr);
    REQUIRE(async != nullptr);
    REQUIRE(child != nullptr);
    CHECK(sync->call_id == "ps");
    CHECK(async->call_id == "pa");
    CHECK(child->call_id == "pa");
    CHECK(child->parent_id == async->span_id);
  }
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Without agentix, tracing code fails alone and nothing is sent",
          "[worker][trace]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo error =
      worker->CallError("worker_fixture::traced", Pickle("((), {})"));
  CHECK(error.type == "ModuleNotFoundError");
  CHECK(Unpickle(worker->CallOk("worker_fixture::add", Pickle("((1, 2), {})"))) ==
        "3");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(worker->traces().empty());
}

// worker/driver/deferred.py: agentix is imported after the ready frame, on a
// background thread, and the forwarder and namespace bridge are installed by
// the import itself. The stand-in agentix (testdata/slow_agentix) sleeps
// 5 s in its import; before, the worker imported agentix before ready.
TEST_CASE("A slow agentix import delays neither ready nor calls without it; "
          "its hooks are installed once imported",
          "[worker][trace]") {
  WorkerArgs options;
  options.python_path = false;
  options.args = {absl::StrCat("--python-path=", FixtureDir(), ":",
                               FixtureDir(), "/slow_agentix")};
  const absl::Time start = absl::Now();
  auto worker = ReadyWorker(options);
  CHECK(absl::Now() - start < absl::Seconds(4));
  CHECK(Unpickle(worker->CallOk("worker_fixture::add",
                                Pickle("((1, 2), {})"))) == "3");
  CHECK(absl::Now() - start < absl::Seconds(4.5));
  // Waits for the warm-up's import (the module lock), then sees both hooks.
  CHECK(Unpickle(worker->CallOk("worker_fixture::agentix_hooks",
                                Pickle("((), {})"))) ==
        "(['_TraceForwarder'], '_NamespaceBridge')");
  CHECK(absl::Now() - start >= absl::Seconds(5));
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

// A call's thread is executing agentix's __init__ (which imports
// agentix.utils.trace, which imports agentix) when the warm-up starts: the
// warm-up must wait for the package, not import the submodule beside it,
// else each thread holds a module the other needs (_DeadlockError).
TEST_CASE("The agentix warm-up and a call's import of agentix do not "
          "deadlock",
          "[worker][trace]") {
  WorkerArgs options;
  options.python_path = false;
  options.args = {absl::StrCat("--python-path=", FixtureDir(), ":",
                               FixtureDir(), "/slow_agentix")};
  auto worker = std::make_unique<Worker>(options);
  // Sent before the ready frame is read, so the worker takes it up at once
  // and is busy until the user's thread holds agentix: the warm-up (0.1 s
  // idle) starts only after that, whatever the machine's load.
  worker->Call("start", "worker_fixture::start_agentix_import",
               Pickle("((), {})"));
  worker->AwaitReady();
  Reply started = worker->AwaitReply("start");
  INFO(started.error.message << started.error.traceback);
  REQUIRE(started.ok);
  CHECK(Unpickle(started.value) == "True");
  CHECK(Unpickle(worker->CallOk("worker_fixture::background_agentix_import",
                                Pickle("((), {})"))) == "'ok'");
  CHECK(Unpickle(worker->CallOk("worker_fixture::agentix_hooks",
                                Pickle("((), {})"))) ==
        "(['_TraceForwarder'], '_NamespaceBridge')");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

// os.fork() during the warm-up's import waits for it (at most 10 s): a child
// would otherwise inherit the import's module locks, held by a thread it
// does not have, and hang in its own import of agentix.
TEST_CASE("A fork during the agentix warm-up gives a child that can import "
          "agentix",
          "[worker][trace]") {
  WorkerArgs options;
  options.python_path = false;
  options.args = {absl::StrCat("--python-path=", FixtureDir(), ":",
                               FixtureDir(), "/slow_agentix")};
  auto worker = ReadyWorker(options);
  absl::SleepFor(absl::Milliseconds(500));  // idle: the warm-up has begun
  CHECK(Unpickle(worker->CallOk("worker_fixture::fork_child_importing_agentix",
                                Pickle("((15,), {})"))) == "7");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

}  // namespace
}  // namespace agentix::worker
