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

using runtime::v1::Attribute;
using runtime::v1::AttributeValue;
using Attributes = google::protobuf::RepeatedPtrField<Attribute>;

// Attributes by key.
std::map<std::string, AttributeValue> ByKey(const Attributes& attributes) {
  std::map<std::string, AttributeValue> out;
  for (const Attribute& a : attributes) out[a.key()] = a.value();
  return out;
}

// Attributes as key -> text of their value (int or string).
std::map<std::string, std::string> Texts(const Attributes& attributes) {
  std::map<std::string, std::string> out;
  for (const Attribute& a : attributes) {
    out[a.key()] = a.value().has_int_value()
                       ? std::to_string(a.value().int_value())
                       : a.value().string_value();
  }
  return out;
}

const TraceEvent* FindSpan(const std::vector<TraceEvent>& traces, int kind,
                           const std::string& name) {
  for (const TraceEvent& t : traces) {
    if (t.kind() == kind && t.name() == name) return &t;
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
  const std::vector<TraceEvent>& t = worker->traces();
  REQUIRE(t.size() == 6);
  const std::vector<std::pair<int, std::string>> want = {
      {1, "t"}, {3, "outer"}, {3, "inner"}, {4, "inner"}, {4, "outer"},
      {2, ""}};
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("event " << i);
    CHECK(t[i].kind() == want[i].first);
    CHECK(t[i].name() == want[i].second);
    CHECK(t[i].agentix_trace_id() == trace_id);
    CHECK(t[i].call_id() == "tr");
    // The daemon's fields are left to the daemon.
    CHECK(t[i].seq() == 0);
    CHECK(t[i].trace_id().empty());
    CHECK(t[i].worker_id().empty());
  }
  // trace start: metadata as attributes, started_at in ns.
  CHECK(t[0].agentix_span_id().empty());
  CHECK(Texts(t[0].attributes()) ==
        std::map<std::string, std::string>{{"k", "1"}});
  CHECK(t[0].start_time_unix_nanos() >= before - 1000000);
  CHECK(t[0].start_time_unix_nanos() <= after);
  CHECK(t[0].end_time_unix_nanos() == 0);
  // span starts: ids and the parent link.
  CHECK(t[1].agentix_span_id() == outer_id);
  CHECK(t[1].agentix_parent_id().empty());
  CHECK(Texts(t[1].attributes()) ==
        std::map<std::string, std::string>{{"a", "1"}});
  CHECK(t[1].start_time_unix_nanos() >= t[0].start_time_unix_nanos());
  CHECK(t[2].agentix_span_id() == inner_id);
  CHECK(t[2].agentix_parent_id() == outer_id);
  CHECK(t[2].attributes().empty());
  // inner end: ok status with its description, one event.
  CHECK(t[3].agentix_span_id() == inner_id);
  CHECK(t[3].agentix_parent_id() == outer_id);
  CHECK(t[3].status() == runtime::v1::SPAN_STATUS_CODE_OK);
  CHECK(t[3].status_description() == "fine");
  CHECK(t[3].error_message().empty());
  CHECK(t[3].start_time_unix_nanos() == t[2].start_time_unix_nanos());
  CHECK(t[3].end_time_unix_nanos() >= t[3].start_time_unix_nanos());
  {
    REQUIRE(t[3].events_size() == 1);
    const runtime::v1::SpanEventRecord& event = t[3].events(0);
    CHECK(event.name() == "ev");
    CHECK(event.time_unix_nanos() >= t[3].start_time_unix_nanos());
    CHECK(event.time_unix_nanos() <= t[3].end_time_unix_nanos());
    REQUIRE(event.attributes_size() == 1);
    CHECK(event.attributes(0).key() == "x");
    CHECK(event.attributes(0).value().int_value() == 2);
  }
  // outer end: set_error makes the status error, with message and data.
  CHECK(t[4].agentix_span_id() == outer_id);
  CHECK(t[4].status() == runtime::v1::SPAN_STATUS_CODE_ERROR);
  CHECK(t[4].status_description() == "bad");
  CHECK(t[4].error_message() == "bad");
  CHECK(Texts(t[4].error_data()) ==
        std::map<std::string, std::string>{{"code", "7"}});
  CHECK(Texts(t[4].attributes()) ==
        std::map<std::string, std::string>{{"a", "1"}});
  CHECK(t[4].events().empty());
  // trace end.
  CHECK(t[5].end_time_unix_nanos() >= t[4].end_time_unix_nanos());
  CHECK(t[5].end_time_unix_nanos() <= after + 1000000);
  CHECK(t[5].start_time_unix_nanos() == 0);
  // With a processor registered, agentix.trace does not warn.
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(LogsOf(worker->logs(), "agentix.trace").empty());
}

TEST_CASE("The forwarder's C path and its general path send the same events",
          "[worker][trace]") {
  // Each span's start and end go through send_span, then through the
  // keyword calls of the general path: a field one path sends and the other
  // does not would show here.
  auto worker = TracingWorker();
  CHECK(Unpickle(worker->CallOk("worker_fixture::forwarder_paths_agree",
                                Pickle("((), {})"))) == "2");
  REQUIRE(worker->AwaitTraces(8));
  const std::vector<TraceEvent>& events = worker->traces();
  for (size_t span = 0; span < 2; ++span) {
    for (size_t event = 0; event < 2; ++event) {
      const TraceEvent& fast = events[span * 4 + event];
      const TraceEvent& general = events[span * 4 + 2 + event];
      INFO("span " << span << " event " << event);
      CHECK(fast.name() == absl::StrCat("agree", span));
      CHECK(fast.DebugString() == general.DebugString());
    }
  }
  CHECK(events[1].start_time_unix_nanos() == 1704164645123456000LL);
  CHECK(events[1].end_time_unix_nanos() == 1704164646000001000LL);
  CHECK(events[1].attributes_size() == 5);
  CHECK(events[1].status() == runtime::v1::SPAN_STATUS_CODE_OK);
  CHECK(events[4].agentix_parent_id() == "span_a");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Span attributes are coerced to scalars; others arrive as repr",
          "[worker][trace]") {
  auto worker = TracingWorker();
  const std::string span_id = Unpickle(
      worker->CallOk("worker_fixture::traced_odd_attributes",
                     Pickle("((), {})")),
      "v");
  REQUIRE(worker->AwaitTraces(2));
  const TraceEvent& end = worker->traces()[1];
  CHECK(end.kind() == runtime::v1::TRACE_EVENT_KIND_SPAN_END);
  CHECK(end.agentix_span_id() == span_id);
  CHECK(end.agentix_trace_id() == "trace_unbound");
  std::map<std::string, AttributeValue> attrs = ByKey(end.attributes());
  CHECK(attrs.size() == 6);  // `none` is left out
  CHECK(attrs.count("none") == 0);
  REQUIRE(attrs.count("obj") == 1);
  CHECK(attrs["obj"].string_value() == "<opaque>");
  CHECK(attrs["big"].string_value() == "1180591620717411303424");
  CHECK(attrs["s"].string_value() == "x");
  CHECK(attrs["f"].has_double_value());
  CHECK(attrs["f"].double_value() == 1.5);
  CHECK(attrs["b"].has_bool_value());
  CHECK(attrs["b"].bool_value());
  CHECK(attrs["raw"].bytes_value() == std::string("\x00\xff", 2));
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
  CHECK(t[0].start_time_unix_nanos() == k20240102T030405 * kNs + 123456000);
  CHECK(t[0].end_time_unix_nanos() == k20240102T030405 * kNs + 999999000);
  CHECK(t[1].start_time_unix_nanos() == k20240102T030405 * kNs + 1000);
  CHECK(t[1].end_time_unix_nanos() == (k20240102T030405 + 1) * kNs);
  // Not agentix's own format: parsed by datetime.
  CHECK(t[2].start_time_unix_nanos() ==
        (k20240102T030405 + 1) * kNs + 500000000);
  CHECK(t[2].end_time_unix_nanos() == 946684799 * kNs + 2000);
  CHECK(t[3].start_time_unix_nanos() == k20240102T030405 * kNs + 7000);
  CHECK(t[3].end_time_unix_nanos() == 0);  // unreadable
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
    const TraceEvent* sync = FindSpan(t, kind, "sync");
    const TraceEvent* async = FindSpan(t, kind, "async");
    const TraceEvent* child = FindSpan(t, kind, "async-child");
    REQUIRE(sync != nullptr);
    REQUIRE(async != nullptr);
    REQUIRE(child != nullptr);
    CHECK(sync->call_id() == "ps");
    CHECK(async->call_id() == "pa");
    CHECK(child->call_id() == "pa");
    CHECK(child->agentix_parent_id() == async->agentix_span_id());
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
