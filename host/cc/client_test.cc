// //host/cc:client against the real agentix-sandboxd + agentix-worker,
// calling testing/fixtures/remote_targets/e2e_targets.py.
#include "agentix/client.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "host/cc/test_daemon.h"
#include "testing/status_matchers.h"

namespace agentix {
namespace {

using testing::ConnectTo;
using testing::CuttingProxy;
using testing::Daemon;
using testing::kSlow;

template <typename T>
T Echo(Client& client, const T& value) {
  absl::StatusOr<T> back = client.Remote<T>("e2e_targets::echo", value);
  REQUIRE_OK(back.status());
  return *back;
}

TEST_CASE("values of every msgpack type round-trip through a Python callable") {
  Daemon daemon;
  auto client = ConnectTo(daemon.url());

  absl::StatusOr<int64_t> sum = client->Remote<int64_t>("e2e_targets::add", 2, 3);
  REQUIRE_OK(sum.status());
  CHECK(*sum == 5);

  // nil
  absl::StatusOr<msgpack::object_handle> none =
      client->Remote<msgpack::object_handle>("e2e_targets::noop");
  REQUIRE_OK(none.status());
  CHECK(none->get().type == msgpack::type::NIL);
  // bool, ints at the edges of int64/uint64, floats that are whole
  CHECK(Echo(*client, true) == true);
  CHECK(Echo<int64_t>(*client, -1) == -1);
  CHECK(Echo<int64_t>(*client, INT64_MIN) == INT64_MIN);
  CHECK(Echo<uint64_t>(*client, UINT64_MAX) == UINT64_MAX);
  CHECK(Echo(*client, 0.5) == 0.5);
  // str vs bin
  CHECK(Echo<std::string>(*client, "héllo") == "héllo");
  const std::vector<char> bytes = {'\0', '\xff', 'a'};
  absl::StatusOr<msgpack::object_handle> bin =
      client->Remote<msgpack::object_handle>("e2e_targets::echo", bytes);
  REQUIRE_OK(bin.status());
  CHECK(bin->get().type == msgpack::type::BIN);
  CHECK(bin->get().as<std::vector<char>>() == bytes);
  // array, map, nested
  const std::vector<int64_t> array = {1, 2, 3};
  CHECK(Echo(*client, array) == array);
  const std::map<std::string, std::vector<std::string>> map = {
      {"a", {"x"}}, {"b", {}}};
  CHECK(Echo(*client, map) == map);
  // keyword arguments
  absl::StatusOr<std::string> greeting = client->RemoteWith<std::string>(
      "e2e_targets::greet", Arguments("bob").Kw("punctuation", "?"), CallOptions());
  REQUIRE_OK(greeting.status());
  CHECK(*greeting == "hello bob?");

  // A result of another type is a typed decode error, not a crash.
  absl::StatusOr<int64_t> wrong = client->Remote<int64_t>("e2e_targets::echo", "text");
  CHECK(wrong.status().code() == absl::StatusCode::kInvalidArgument);
}

// The mapping issue 22 item 1 writes down (proto README): whole floats stay
// floats, timestamps (extension -1) map to datetime and back. Fails against
// a daemon without that item (2.0 comes back as int 2; ext -1 is refused).
TEST_CASE("whole floats and timestamps keep their msgpack type") {
  Daemon daemon;
  auto client = ConnectTo(daemon.url());
  absl::StatusOr<msgpack::object_handle> whole =
      client->Remote<msgpack::object_handle>("e2e_targets::echo", 2.0);
  REQUIRE_OK(whole.status());
  CHECK(whole->get().type == msgpack::type::FLOAT64);
  // msgpack-cxx maps `timespec` to extension -1 (its chrono adaptor needs Boost).
  timespec when{1700000000, 123456000};
  const timespec back = Echo(*client, when);
  CHECK(back.tv_sec == when.tv_sec);
  CHECK(back.tv_nsec == when.tv_nsec);
}

TEST_CASE("a failing call carries the sandbox's error type and message") {
  Daemon daemon;
  auto client = ConnectTo(daemon.url());
  absl::StatusOr<int64_t> failed =
      client->Remote<int64_t>("e2e_targets::raise_value_error", "bad input");
  REQUIRE_FALSE(failed.ok());
  std::optional<RemoteError> error = GetRemoteError(failed.status());
  REQUIRE(error.has_value());
  CHECK(error->type == "ValueError");
  CHECK(error->message == "bad input");
  CHECK(error->traceback.find("raise_value_error") != std::string::npos);
  CHECK(std::string(failed.status().message()).find("ValueError: bad input") !=
        std::string::npos);

  absl::StatusOr<int64_t> missing = client->Remote<int64_t>("e2e_targets::no_such_fn");
  REQUIRE_FALSE(missing.ok());
  REQUIRE(GetRemoteError(missing.status()).has_value());
  CHECK_FALSE(GetRemoteError(missing.status())->type.empty());

  // The client keeps working after failures.
  absl::StatusOr<int64_t> sum = client->Remote<int64_t>("e2e_targets::add", 1, 1);
  REQUIRE_OK(sum.status());
  CHECK(*sum == 2);
}

TEST_CASE("cancel stops a running call and deadline fails a slow one") {
  Daemon daemon;
  auto client = ConnectTo(daemon.url());

  absl::StatusOr<Call> call = client->Start("e2e_targets::async_sleep", Arguments(30.0));
  REQUIRE_OK(call.status());
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time cancelled_at = absl::Now();
  call->Cancel();
  absl::StatusOr<std::string> outcome = call->Wait();
  CHECK(absl::Now() - cancelled_at < absl::Seconds(5 * kSlow));
  REQUIRE(outcome.status().code() == absl::StatusCode::kCancelled);
  REQUIRE(GetRemoteError(outcome.status()).has_value());
  CHECK(GetRemoteError(outcome.status())->cancelled);
  CHECK(GetRemoteError(outcome.status())->type == "Cancelled");

  CallOptions options;
  options.timeout = absl::Milliseconds(300);
  const absl::Time started = absl::Now();
  absl::StatusOr<double> slow =
      client->RemoteWith<double>("e2e_targets::async_sleep", Arguments(30.0), options);
  CHECK(slow.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - started < absl::Seconds(3 * kSlow));
  absl::StatusOr<int64_t> after = client->Remote<int64_t>("e2e_targets::add", 4, 5);
  REQUIRE_OK(after.status());
  CHECK(*after == 9);
}

TEST_CASE("streaming calls deliver items in order with back-pressure") {
  Daemon daemon;
  auto client = ConnectTo(daemon.url());

  CallOptions options;
  options.stream_window = 4;
  absl::StatusOr<Stream> stream =
      client->StartStream("e2e_targets::count_sync", Arguments(50), options);
  REQUIRE_OK(stream.status());
  std::vector<int64_t> items;
  for (;;) {
    absl::StatusOr<std::optional<int64_t>> item = stream->Next<int64_t>();
    REQUIRE_OK(item.status());
    if (!item->has_value()) break;
    items.push_back(**item);
  }
  REQUIRE(items.size() == 50);
  for (int i = 0; i < 50; ++i) CHECK(items[i] == i * 10);
  CHECK(Decode<std::string>(stream->Result()).value() == "sync-done");

  // A generator that fails: the items before the failure, then its error.
  absl::StatusOr<Stream> failing =
      client->StartStream("e2e_targets::fail_after", Arguments(3));
  REQUIRE_OK(failing.status());
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::optional<int64_t>> item = failing->Next<int64_t>();
    REQUIRE_OK(item.status());
    CHECK(item->value() == i);
  }
  absl::StatusOr<std::optional<int64_t>> end = failing->Next<int64_t>();
  REQUIRE_FALSE(end.ok());
  CHECK(GetRemoteError(end.status())->type == "ValueError");

  // An endless generator runs only `stream_window` items ahead of Next().
  absl::StatusOr<Stream> ticker =
      client->StartStream("e2e_targets::ticker", Arguments(), options);
  REQUIRE_OK(ticker.status());
  for (int i = 1; i <= 2; ++i) {
    absl::StatusOr<std::optional<int64_t>> item = ticker->Next<int64_t>();
    REQUIRE_OK(item.status());
    CHECK(item->value() == i);
  }
  absl::SleepFor(absl::Milliseconds(500));
  absl::StatusOr<msgpack::object_handle> state =
      client->Remote<msgpack::object_handle>("e2e_targets::stream_state");
  REQUIRE_OK(state.status());
  auto produced = state->get().as<std::map<std::string, msgpack::object>>()["produced"]
                      .as<int64_t>();
  CHECK(produced >= 2);
  CHECK(produced <= 2 + 4 + 1);  // consumed + window (+ one being produced)
  ticker->Cancel();
  absl::StatusOr<std::optional<int64_t>> rest = ticker->Next<int64_t>();
  while (rest.ok() && rest->has_value()) rest = ticker->Next<int64_t>();
  CHECK(rest.status().code() == absl::StatusCode::kCancelled);
}

TEST_CASE("logs and spans of a call reach the subscriptions before its result") {
  Daemon daemon;
  auto client = ConnectTo(daemon.url());
  absl::Mutex mu;
  std::vector<LogRecord> records;
  std::vector<SpanEvent> spans;
  auto logs = client->SubscribeLogs([&](const LogRecord& record) {
    absl::MutexLock lock(&mu);
    records.push_back(record);
  });
  REQUIRE_OK(logs.status());
  auto traces = client->SubscribeSpans([&](const SpanEvent& event) {
    absl::MutexLock lock(&mu);
    spans.push_back(event);
  });
  REQUIRE_OK(traces.status());

  absl::StatusOr<std::string> token =
      client->Remote<std::string>("e2e_targets::log_things", "tok-1");
  REQUIRE_OK(token.status());
  {
    // No waiting here: the barrier held the result back until they came.
    absl::MutexLock lock(&mu);
    bool warned = false, failed = false;
    uint64_t last = 0;
    for (const LogRecord& record : records) {
      CHECK(record.seq > last);
      last = record.seq;
      if (record.message == "warned tok-1") {
        warned = true;
        CHECK(record.level == 30);
        CHECK(record.logger == "e2e.app");
        CHECK_FALSE(record.call_id.empty());
      }
      if (record.message == "failed tok-1") {
        failed = true;
        CHECK(record.exception_text.find("KeyError") != std::string::npos);
      }
      CHECK(record.message != "invisible tok-1");
    }
    CHECK(warned);
    CHECK(failed);
  }

  absl::StatusOr<std::string> traced =
      client->Remote<std::string>("e2e_targets::traced_work", "tok-2");
  REQUIRE_OK(traced.status());
  {
    absl::MutexLock lock(&mu);
    std::set<std::string> ended;
    std::string failing_error;
    for (const SpanEvent& event : spans) {
      if (event.kind == 4) {  // TRACE_EVENT_KIND_SPAN_END
        ended.insert(event.name);
        if (event.name == "failing") failing_error = event.error_message;
      }
    }
    CHECK(ended.count("outer") == 1);
    CHECK(ended.count("inner") == 1);
    CHECK(ended.count("failing") == 1);
    CHECK(failing_error.find("boom tok-2") != std::string::npos);
  }
  CHECK((*logs)->last_seq() > 0);
}

TEST_CASE("calls in flight survive connection cuts: each runs once, results once") {
  Daemon daemon;
  CuttingProxy proxy(daemon.dir() / "proxy.sock", daemon.socket());
  auto client = ConnectTo(proxy.url());

  constexpr int kCalls = 24;
  std::vector<Call> calls;
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<Call> call =
        client->Start("e2e_targets::chaos_step", Arguments(i, 0.05));
    REQUIRE_OK(call.status());
    calls.push_back(*std::move(call));
  }
  // A window of 8 with a slow consumer: at each cut, received but unacked
  // items are buffered here, and the daemon replays them on the new stream.
  CallOptions options;
  options.stream_window = 8;
  absl::StatusOr<Stream> stream =
      client->StartStream("e2e_targets::count_sync", Arguments(40), options);
  REQUIRE_OK(stream.status());
  // Cuts while the calls run, then three more mid-stream, each while items
  // are buffered unconsumed (unacknowledged) here.
  std::thread cutter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    proxy.Cut();
  });
  std::vector<int64_t> items;
  for (;;) {
    absl::StatusOr<std::optional<int64_t>> item = stream->Next<int64_t>();
    REQUIRE_OK(item.status());
    if (!item->has_value()) break;
    items.push_back(**item);
    if (items.size() == 5 || items.size() == 15 || items.size() == 25) {
      absl::SleepFor(absl::Milliseconds(50));  // let the window fill
      proxy.Cut();
    }
  }
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<int64_t> result = calls[i].Wait<int64_t>();
    REQUIRE_OK(result.status());
    CHECK(*result == 2 * i);
  }
  cutter.join();
  REQUIRE(items.size() == 40);
  for (int i = 0; i < 40; ++i) CHECK(items[i] == i * 10);
  CHECK(client->reconnects() >= 1);

  auto executions = client->Remote<std::map<int64_t, int64_t>>("e2e_targets::chaos_executions");
  REQUIRE_OK(executions.status());
  REQUIRE(executions->size() == kCalls);
  for (const auto& [step, count] : *executions) CHECK(count == 1);
}

TEST_CASE("a daemon with a token refuses clients without it") {
  Daemon daemon("s3cret-token-for-cc-test");
  ConnectOptions options;
  options.target = daemon.url();
  options.connect_timeout = absl::Seconds(5);
  auto anonymous = Client::Connect(options);
  CHECK(anonymous.status().code() == absl::StatusCode::kUnauthenticated);
  options.token = "wrong";
  auto wrong = Client::Connect(options);
  CHECK(wrong.status().code() == absl::StatusCode::kUnauthenticated);

  auto client = ConnectTo(daemon.url(), "s3cret-token-for-cc-test");
  absl::StatusOr<int64_t> sum = client->Remote<int64_t>("e2e_targets::add", 20, 22);
  REQUIRE_OK(sum.status());
  CHECK(*sum == 42);
}

TEST_CASE("large arguments and results pass with the default 4 MiB receive limit") {
  Daemon daemon;
  auto client = ConnectTo(daemon.url());
  // 16 MiB up (ArgumentChunks) and back (ResultChunks).
  std::vector<char> big(16 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  absl::StatusOr<std::vector<char>> back =
      client->Remote<std::vector<char>>("e2e_targets::echo", big);
  REQUIRE_OK(back.status());
  CHECK(*back == big);
  absl::StatusOr<std::vector<char>> made =
      client->Remote<std::vector<char>>("e2e_targets::make_bytes", 8 << 20);
  REQUIRE_OK(made.status());
  CHECK(made->size() == (8u << 20));
}

TEST_CASE("call options carry trace parent, tracestate and baggage to the sandbox") {
  Daemon daemon;
  auto client = ConnectTo(daemon.url());
  using Ids = std::map<std::string, std::string>;
  const std::string trace_hex = "4bf92f3577b34da6a3ce929d0e0e4736";
  const std::string parent_hex = "00f067aa0ba902b7";

  // Baggage reaches sync and async callables, for that call only.
  CallOptions bagged;
  bagged.baggage = {{"run", "r42"}, {"user", "ada"}};
  absl::StatusOr<std::string> run =
      client->RemoteWith<std::string>("e2e_targets::read_baggage", Arguments("run"), bagged);
  REQUIRE_OK(run.status());
  CHECK(*run == "r42");
  absl::StatusOr<std::string> user = client->RemoteWith<std::string>(
      "e2e_targets::read_baggage_async", Arguments("user"), bagged);
  REQUIRE_OK(user.status());
  CHECK(*user == "ada");
  absl::StatusOr<std::string> unset =
      client->Remote<std::string>("e2e_targets::read_baggage", "run");
  REQUIRE_OK(unset.status());
  CHECK(*unset == "<unset>");

  // A span the callable opens joins the caller's trace under its parent.
  CallOptions traced;
  traced.traceparent = "00-" + trace_hex + "-" + parent_hex + "-01";
  absl::StatusOr<Ids> ids =
      client->RemoteWith<Ids>("e2e_targets::open_span", Arguments(), traced);
  REQUIRE_OK(ids.status());
  CHECK(*ids == Ids{{"trace_id", "trace_" + trace_hex}, {"parent_id", "span_" + parent_hex}});
  // tracestate's agentix entry gives the full agentix span id when it
  // extends the parent-id; other entries are ignored.
  traced.tracestate = "vendor=x,agentix=" + parent_hex + "a1b2c3d4";
  ids = client->RemoteWith<Ids>("e2e_targets::open_span", Arguments(), traced);
  REQUIRE_OK(ids.status());
  CHECK(ids->at("parent_id") == "span_" + parent_hex + "a1b2c3d4");
  traced.tracestate = "agentix=ffffffffffffffffa1b2c3d4";
  ids = client->RemoteWith<Ids>("e2e_targets::open_span", Arguments(), traced);
  REQUIRE_OK(ids.status());
  CHECK(ids->at("parent_id") == "span_" + parent_hex);

  // Start() (its result read by the background reader) sends them too.
  CallOptions both = traced;
  both.baggage = {{"run", "r7"}};
  absl::StatusOr<Call> started =
      client->Start("e2e_targets::read_baggage", Arguments("run"), both);
  REQUIRE_OK(started.status());
  absl::StatusOr<std::string> started_run = started->Wait<std::string>();
  REQUIRE_OK(started_run.status());
  CHECK(*started_run == "r7");

  // Without context the next call has no parent (nothing leaks).
  absl::StatusOr<msgpack::object_handle> plain =
      client->Remote<msgpack::object_handle>("e2e_targets::open_span");
  REQUIRE_OK(plain.status());
  auto fields = plain->get().as<std::map<std::string, msgpack::object>>();
  CHECK(fields.at("parent_id").type == msgpack::type::NIL);

  // Malformed context: a typed error naming the field; the call does not run
  // and the client keeps working.
  for (const auto& [field, options] : std::vector<std::pair<std::string, CallOptions>>{
           {"StartCall.traceparent", [] {
              CallOptions o;
              o.traceparent = "00-nope-01";
              return o;
            }()},
           {"StartCall.traceparent", [&] {
              CallOptions o;
              o.traceparent = "00-" + std::string(32, '0') + "-" + parent_hex + "-01";
              return o;
            }()},
           {"StartCall.baggage", [] {
              CallOptions o;
              o.baggage = {{"", "1"}};
              return o;
            }()}}) {
    INFO(field);
    absl::StatusOr<int64_t> refused =
        client->RemoteWith<int64_t>("e2e_targets::add", Arguments(1, 2), options);
    REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
    std::optional<RemoteError> error = GetRemoteError(refused.status());
    REQUIRE(error.has_value());
    CHECK(error->type == "BadRequest");
    CHECK(error->message.find(field) != std::string::npos);
  }
  absl::StatusOr<int64_t> sum = client->Remote<int64_t>("e2e_targets::add", 1, 2);
  REQUIRE_OK(sum.status());
  CHECK(*sum == 3);
}

}  // namespace
}  // namespace agentix
