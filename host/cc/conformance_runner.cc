// The conformance cases (testing/conformance/cases.json) for the C++ client
// against the real agentix-sandboxd + agentix-worker, with gRPC's default
// channel settings (4 MiB receive limit). Each case is one Catch2 test case
// named by its id: the value cases are registered from cases.json at start,
// the behaviours below by name, and a behaviour of cases.json without an
// implementation here is registered as a failing test. Run from its
// runfiles directory by testing/e2e/test_conformance_cc.py (junit report),
// once per wire of the Calls stream (AGENTIX_CALLS_WIRE=frames, =grpc).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agentix/client.h"
#include "host/cc/test_daemon.h"
#include "testing/status_matchers.h"

namespace agentix {
namespace {

using testing::ConnectTo;
using testing::CuttingProxy;
using testing::Daemon;
using testing::kSlow;
using testing::Runfile;
using testing::TempDir;

constexpr size_t kMiB = 1 << 20;
constexpr char kTargets[] = "e2e_targets::";

std::string Target(const std::string& name) { return kTargets + name; }

// One daemon and client for the cases that need nothing of their own,
// started by the first case that uses them, ended by main().
std::unique_ptr<Daemon> shared_daemon;
std::unique_ptr<Client> shared_client;
Daemon& SharedDaemon() {
  if (shared_daemon == nullptr) shared_daemon = std::make_unique<Daemon>();
  return *shared_daemon;
}
Client& SharedClient() {
  if (shared_client == nullptr) shared_client = ConnectTo(SharedDaemon().url());
  return *shared_client;
}

// Polls `done` until it holds or `timeout` passes.
template <typename F>
bool WaitFor(F done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout * kSlow;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

// ------------------------------------------------------------ value cases

// A cases.json value as msgpack: JSON integers as msgpack ints, JSON
// fractions as float64, and the tagged forms of the suite's README.
absl::Status PackValue(const nlohmann::json& value,
                       msgpack::packer<agentix::MsgpackBuffer>& packer) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: packer.pack_nil(); return absl::OkStatus();
    case nlohmann::json::value_t::boolean:
      value.get<bool>() ? packer.pack_true() : packer.pack_false();
      return absl::OkStatus();
    case nlohmann::json::value_t::number_integer:
      packer.pack_int64(value.get<int64_t>());
      return absl::OkStatus();
    case nlohmann::json::value_t::number_unsigned:
      packer.pack_uint64(value.get<uint64_t>());
      return absl::OkStatus();
    case nlohmann::json::value_t::number_float:
      packer.pack_double(value.get<double>());
      return absl::OkStatus();
    case nlohmann::json::value_t::string: {
      const std::string& text = value.get_ref<const std::string&>();
      packer.pack_str(static_cast<uint32_t>(text.size()));
      packer.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
      return absl::OkStatus();
    }
    case nlohmann::json::value_t::array:
      packer.pack_array(static_cast<uint32_t>(value.size()));
      for (const nlohmann::json& item : value) {
        absl::Status status = PackValue(item, packer);
        if (!status.ok()) return status;
      }
      return absl::OkStatus();
    case nlohmann::json::value_t::object:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unsupported JSON: ", value.dump()));
  }
  if (value.size() == 1 && value.contains("$int")) {
    const std::string text = value["$int"].get<std::string>();
    int64_t negative;
    uint64_t positive;
    if (!text.empty() && text[0] == '-' && absl::SimpleAtoi(text, &negative)) {
      packer.pack_int64(negative);
    } else if (absl::SimpleAtoi(text, &positive)) {
      packer.pack_uint64(positive);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("$int beyond 64 bits: ", text));
    }
    return absl::OkStatus();
  }
  if (value.size() == 1 && value.contains("$float")) {
    packer.pack_double(value["$float"].get<double>());
    return absl::OkStatus();
  }
  if (value.size() == 1 && value.contains("$bytes")) {
    std::string bytes;
    if (!absl::Base64Unescape(value["$bytes"].get<std::string>(), &bytes)) {
      return absl::InvalidArgumentError("$bytes is not base64");
    }
    packer.pack_bin(static_cast<uint32_t>(bytes.size()));
    packer.pack_bin_body(bytes.data(), static_cast<uint32_t>(bytes.size()));
    return absl::OkStatus();
  }
  if (value.size() == 1 && value.contains("$datetime")) {
    absl::Time when;
    std::string error;
    if (!absl::ParseTime("%Y-%m-%d%ET%H:%M:%E*S%Ez", value["$datetime"].get<std::string>(),
                         &when, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("$datetime: ", error));
    }
    packer.pack(absl::ToTimespec(when));  // msgpack timestamp, extension -1
    return absl::OkStatus();
  }
  packer.pack_map(static_cast<uint32_t>(value.size()));
  for (const auto& [key, item] : value.items()) {
    packer.pack_str(static_cast<uint32_t>(key.size()));
    packer.pack_str_body(key.data(), static_cast<uint32_t>(key.size()));
    absl::Status status = PackValue(item, packer);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// Same value and same msgpack type; timestamps compared as instants (the
// 32/64/96-bit forms of extension -1 say the same).
bool SameValue(const msgpack::object& a, const msgpack::object& b) {
  if (a.type == msgpack::type::EXT && b.type == msgpack::type::EXT &&
      a.via.ext.type() == -1 && b.via.ext.type() == -1) {
    const timespec x = a.as<timespec>();
    const timespec y = b.as<timespec>();
    return x.tv_sec == y.tv_sec && x.tv_nsec == y.tv_nsec;
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case msgpack::type::ARRAY:
      if (a.via.array.size != b.via.array.size) return false;
      for (uint32_t i = 0; i < a.via.array.size; ++i) {
        if (!SameValue(a.via.array.ptr[i], b.via.array.ptr[i])) return false;
      }
      return true;
    case msgpack::type::MAP:
      if (a.via.map.size != b.via.map.size) return false;
      for (uint32_t i = 0; i < a.via.map.size; ++i) {
        if (!SameValue(a.via.map.ptr[i].key, b.via.map.ptr[i].key) ||
            !SameValue(a.via.map.ptr[i].val, b.via.map.ptr[i].val)) {
          return false;
        }
      }
      return true;
    default:
      return a == b;
  }
}

std::string Show(const msgpack::object& object) {
  std::ostringstream out;
  out << object;
  return out.str();
}

// `[[value], {}]` and `[[[value]], {}]`: echo(value) and type_names([value]).
std::string EncodeCall(const nlohmann::json& value, bool wrap_in_list) {
  agentix::MsgpackBuffer buffer;  // doubles as float64
  msgpack::packer<agentix::MsgpackBuffer> packer(buffer);
  packer.pack_array(2);
  packer.pack_array(1);
  if (wrap_in_list) packer.pack_array(1);
  REQUIRE_OK(PackValue(value, packer));
  packer.pack_map(0);
  return std::string(buffer.data(), buffer.size());
}

// A value case: echo gives back the same msgpack value and type, and the
// sandbox decoded it as `python_type`.
class ValueCase final : public Catch::ITestInvoker {
 public:
  explicit ValueCase(nlohmann::json spec) : spec_(std::move(spec)) {}
  void invoke() const override {
    Client& client = SharedClient();
    const std::string sent = EncodeCall(spec_["value"], false);
    absl::StatusOr<Call> echo = client.StartEncoded(Target("echo"), sent);
    REQUIRE_OK(echo.status());
    absl::StatusOr<std::string> back = echo->Wait();
    REQUIRE_OK(back.status());
    msgpack::object_handle expected = msgpack::unpack(sent.data(), sent.size());
    const msgpack::object& value = expected.get().via.array.ptr[0].via.array.ptr[0];
    msgpack::object_handle got = msgpack::unpack(back->data(), back->size());
    INFO("sent " << Show(value) << ", got back " << Show(got.get()));
    CHECK(SameValue(value, got.get()));

    absl::StatusOr<Call> names =
        client.StartEncoded(Target("type_names"), EncodeCall(spec_["value"], true));
    REQUIRE_OK(names.status());
    absl::StatusOr<std::vector<std::string>> types = names->Wait<std::vector<std::string>>();
    REQUIRE_OK(types.status());
    CHECK(*types == std::vector<std::string>{spec_["python_type"].get<std::string>()});
  }

 private:
  nlohmann::json spec_;
};

// A behaviour of cases.json that this runner does not implement.
class Missing final : public Catch::ITestInvoker {
 public:
  void invoke() const override {
    FAIL("cases.json names this case; conformance_runner.cc does not implement it");
  }
};

// ------------------------------------------------------------ behaviours

std::set<std::string>& Behaviours() {
  static auto* ids = new std::set<std::string>();
  return *ids;
}
bool AddBehaviour(const char* id) { return Behaviours().insert(id).second; }

// A behaviour case of cases.json, a Catch2 test case named by its id.
#define BEHAVIOUR(id)                                                    \
  static const bool INTERNAL_CATCH_UNIQUE_NAME(kBehaviour) = AddBehaviour(id); \
  TEST_CASE(id)

BEHAVIOUR("call_plain") {
  Client& client = SharedClient();
  absl::StatusOr<int64_t> sum = client.Remote<int64_t>(Target("add"), 2, 3);
  REQUIRE_OK(sum.status());
  CHECK(*sum == 5);
  absl::StatusOr<std::string> greeting = client.RemoteWith<std::string>(
      Target("greet"), Arguments("x").Kw("punctuation", "?"), CallOptions());
  REQUIRE_OK(greeting.status());
  CHECK(*greeting == "hello x?");
}

BEHAVIOUR("call_error") {
  Client& client = SharedClient();
  absl::StatusOr<int64_t> failed = client.Remote<int64_t>(Target("raise_value_error"), "boom");
  REQUIRE_FALSE(failed.ok());
  std::optional<RemoteError> error = GetRemoteError(failed.status());
  REQUIRE(error.has_value());
  CHECK(error->type == "ValueError");
  CHECK(error->message == "boom");
  CHECK(error->traceback.find("raise_value_error") != std::string::npos);
  absl::StatusOr<int64_t> sum = client.Remote<int64_t>(Target("add"), 1, 1);
  REQUIRE_OK(sum.status());
  CHECK(*sum == 2);
}

BEHAVIOUR("call_unknown_callable") {
  Client& client = SharedClient();
  CallOptions options;
  options.timeout = absl::Seconds(30);  // a hang fails as DEADLINE_EXCEEDED
  absl::StatusOr<int64_t> missing = client.RemoteWith<int64_t>(
      "no_such_module::nothing", Arguments(), options);
  REQUIRE_FALSE(missing.ok());
  std::optional<RemoteError> error = GetRemoteError(missing.status());
  REQUIRE(error.has_value());
  CHECK(error->type == "ModuleNotFoundError");
  CHECK(error->message.find("no_such_module") != std::string::npos);
  absl::StatusOr<int64_t> sum = client.Remote<int64_t>(Target("add"), 1, 1);
  REQUIRE_OK(sum.status());
  CHECK(*sum == 2);
}

BEHAVIOUR("arguments_64mib") {
  std::vector<char> data(64 * kMiB);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 256);
  absl::StatusOr<msgpack::object_handle> back =
      SharedClient().Remote<msgpack::object_handle>(Target("echo"), data);
  REQUIRE_OK(back.status());
  REQUIRE(back->get().type == msgpack::type::BIN);
  REQUIRE(back->get().via.bin.size == data.size());
  CHECK(std::equal(data.begin(), data.end(), back->get().via.bin.ptr));
}

size_t ResultSize(const absl::StatusOr<msgpack::object_handle>& result) {
  REQUIRE_OK(result.status());
  REQUIRE(result->get().type == msgpack::type::BIN);
  return result->get().via.bin.size;
}

BEHAVIOUR("result_64mib") {
  CHECK(ResultSize(SharedClient().Remote<msgpack::object_handle>(
            Target("make_bytes"), 64 * kMiB)) == 64 * kMiB);
}

BEHAVIOUR("results_default_limit") {
  Client& client = SharedClient();
  for (size_t size : {8 * kMiB, 40 * kMiB}) {
    CHECK(ResultSize(client.Remote<msgpack::object_handle>(Target("make_bytes"), size)) == size);
  }
  std::vector<Call> calls;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<Call> call = client.Start(Target("make_bytes"), Arguments(3 * kMiB));
    REQUIRE_OK(call.status());
    calls.push_back(*std::move(call));
  }
  for (Call& call : calls) CHECK(ResultSize(call.Wait<msgpack::object_handle>()) == 3 * kMiB);
}

BEHAVIOUR("concurrency_64") {
  Client& client = SharedClient();
  std::vector<Call> calls;
  for (int i = 0; i < 64; ++i) {
    absl::StatusOr<Call> call = client.Start(Target("add"), Arguments(i, i));
    REQUIRE_OK(call.status());
    calls.push_back(*std::move(call));
  }
  for (int i = 0; i < 64; ++i) {
    absl::StatusOr<int64_t> sum = calls[i].Wait<int64_t>();
    REQUIRE_OK(sum.status());
    CHECK(*sum == 2 * i);
  }
}

BEHAVIOUR("stream_items") {
  CallOptions options;
  options.stream_window = 4;
  absl::StatusOr<Stream> stream =
      SharedClient().StartStream(Target("count_sync"), Arguments(50), options);
  REQUIRE_OK(stream.status());
  std::vector<int64_t> items;
  for (;;) {
    absl::StatusOr<std::optional<int64_t>> item = stream->Next<int64_t>();
    REQUIRE_OK(item.status());
    if (!item->has_value()) break;
    items.push_back(**item);
  }
  std::vector<int64_t> expected;
  for (int i = 0; i < 50; ++i) expected.push_back(i * 10);
  CHECK(items == expected);
}

BEHAVIOUR("stream_early_exit") {
  Client& client = SharedClient();
  {
    absl::StatusOr<Stream> stream = client.StartStream(Target("count_async"), Arguments(1000000));
    REQUIRE_OK(stream.status());
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<std::optional<int64_t>> item = stream->Next<int64_t>();
      REQUIRE_OK(item.status());
      CHECK(item->value() == i);
    }
  }  // leaving the Stream cancels the generator
  absl::StatusOr<int64_t> sum = client.Remote<int64_t>(Target("add"), 2, 2);
  REQUIRE_OK(sum.status());
  CHECK(*sum == 4);
}

BEHAVIOUR("cancel") {
  const absl::Time started = absl::Now();
  absl::StatusOr<Call> call = SharedClient().Start(Target("async_sleep"), Arguments(30.0));
  REQUIRE_OK(call.status());
  absl::SleepFor(absl::Milliseconds(200));
  call->Cancel();
  absl::StatusOr<std::string> outcome = call->Wait();
  CHECK(absl::Now() - started < absl::Seconds(10 * kSlow));
  REQUIRE(outcome.status().code() == absl::StatusCode::kCancelled);
  REQUIRE(GetRemoteError(outcome.status()).has_value());
  CHECK(GetRemoteError(outcome.status())->type == "Cancelled");
}

BEHAVIOUR("deadline") {
  CallOptions options;
  options.timeout = absl::Milliseconds(300);
  const absl::Time started = absl::Now();
  absl::StatusOr<double> slow = SharedClient().RemoteWith<double>(
      Target("async_sleep"), Arguments(30.0), options);
  CHECK(slow.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - started < absl::Seconds(5 * kSlow));
}

BEHAVIOUR("resume_after_cut") {
  Daemon& daemon = SharedDaemon();
  TempDir dir;
  CuttingProxy proxy(dir / "proxy.sock", daemon.socket());
  // The frame wire's socket beside it (the Calls stream runs there unless
  // AGENTIX_CALLS_WIRE=grpc), cut with it.
  CuttingProxy calls_proxy(dir / "proxy.sock.calls", daemon.calls_socket_path());
  constexpr int64_t kBase = 3000000;
  {
    std::unique_ptr<Client> client = ConnectTo(proxy.url());
    std::vector<Call> calls;
    for (int64_t i = 0; i < 20; ++i) {
      absl::StatusOr<Call> call = client->Start(Target("chaos_step"), Arguments(kBase + i, 0.3));
      REQUIRE_OK(call.status());
      calls.push_back(*std::move(call));
    }
    absl::SleepFor(absl::Milliseconds(100));
    proxy.Cut();
    calls_proxy.Cut();
    absl::SleepFor(absl::Milliseconds(150));
    proxy.Cut();
    calls_proxy.Cut();
    for (int64_t i = 0; i < 20; ++i) {
      absl::StatusOr<int64_t> result = calls[i].Wait<int64_t>();
      REQUIRE_OK(result.status());
      CHECK(*result == 2 * (kBase + i));
    }
  }
  auto runs = SharedClient().Remote<std::map<int64_t, int64_t>>(Target("chaos_executions"));
  REQUIRE_OK(runs.status());
  for (int64_t i = 0; i < 20; ++i) {
    INFO("step " << kBase + i);
    CHECK((*runs)[kBase + i] == 1);
  }
}

BEHAVIOUR("logs") {
  Client& client = SharedClient();
  absl::Mutex mu;
  std::vector<LogRecord> records;
  auto logs = client.SubscribeLogs([&](const LogRecord& record) {
    absl::MutexLock lock(&mu);
    records.push_back(record);
  });
  REQUIRE_OK(logs.status());
  const std::string token = absl::StrCat("cc-", absl::ToUnixNanos(absl::Now()));
  absl::StatusOr<Call> call = client.Start(Target("log_things"), Arguments(token));
  REQUIRE_OK(call.status());
  absl::StatusOr<std::string> back = call->Wait<std::string>();
  REQUIRE_OK(back.status());
  CHECK(*back == token);
  std::optional<LogRecord> warned;
  REQUIRE(WaitFor([&] {
    absl::MutexLock lock(&mu);
    for (const LogRecord& record : records) {
      if (record.message == "warned " + token) warned = record;
    }
    return warned.has_value();
  }, absl::Seconds(15)));
  CHECK(warned->level_name == "WARNING");
  CHECK(warned->logger == "e2e.app");
  CHECK(warned->call_id == call->id());
  absl::StatusOr<std::map<std::string, msgpack::object>> extras;
  auto handle = Decode<msgpack::object_handle>(warned->extras);
  REQUIRE_OK(handle.status());
  auto fields = handle->get().as<std::map<std::string, msgpack::object>>();
  REQUIRE(fields.count("token") == 1);
  CHECK(fields["token"].as<std::string>() == token);
}

BEHAVIOUR("log_backlog_6mib") {
  // A client of its own: its records are buffered for it alone.
  std::unique_ptr<Client> client = ConnectTo(SharedDaemon().url());
  constexpr int kRecords = 9000;
  absl::StatusOr<int64_t> logged =
      client->Remote<int64_t>(Target("log_sized"), kRecords, 760);
  REQUIRE_OK(logged.status());
  CHECK(*logged == kRecords);
  absl::Mutex mu;
  std::vector<std::string> messages;
  auto logs = client->SubscribeLogs([&](const LogRecord& record) {
    absl::MutexLock lock(&mu);
    if (record.logger == "e2e.sized") messages.push_back(record.message);
  });
  REQUIRE_OK(logs.status());
  CHECK(WaitFor([&] {
    absl::MutexLock lock(&mu);
    return messages.size() >= kRecords;
  }, absl::Seconds(60)));
  absl::MutexLock lock(&mu);
  REQUIRE(messages.size() == kRecords);
  size_t bytes = 0;
  for (int i = 0; i < kRecords; ++i) {
    int index = -1;
    CHECK(absl::SimpleAtoi(messages[i].substr(0, 10), &index));
    REQUIRE(index == i);
    bytes += messages[i].size();
  }
  CHECK(bytes > 6 * kMiB);
}

BEHAVIOUR("spans") {
  Client& client = SharedClient();
  absl::Mutex mu;
  std::vector<SpanEvent> ended;
  auto spans = client.SubscribeSpans([&](const SpanEvent& event) {
    absl::MutexLock lock(&mu);
    if (event.kind == 4) ended.push_back(event);  // TRACE_EVENT_KIND_SPAN_END
  });
  REQUIRE_OK(spans.status());
  const std::string token = absl::StrCat("cc-span-", absl::ToUnixNanos(absl::Now()));
  absl::StatusOr<std::string> back = client.Remote<std::string>(Target("traced_work"), token);
  REQUIRE_OK(back.status());
  CHECK(*back == token);
  REQUIRE(WaitFor([&] {
    absl::MutexLock lock(&mu);
    for (const SpanEvent& event : ended) {
      if (event.name == "outer") return true;
    }
    return false;
  }, absl::Seconds(15)));
  absl::MutexLock lock(&mu);
  std::vector<std::string> names;
  for (const SpanEvent& event : ended) {
    if (event.name != "inner" && event.name != "failing" && event.name != "outer") continue;
    names.push_back(event.name);
    if (event.name != "outer") continue;
    CHECK(std::count(event.attributes.begin(), event.attributes.end(),
                     std::make_pair(std::string("token"), token)) == 1);
    REQUIRE_FALSE(event.events.empty());
    CHECK(event.events[0].name == "started");
  }
  CHECK(names == std::vector<std::string>{"inner", "failing", "outer"});
}

BEHAVIOUR("call_context") {
  Client& client = SharedClient();
  CallOptions baggage;
  baggage.baggage = {{"run", "r42"}, {"user", "ada"}};
  absl::StatusOr<std::string> run =
      client.RemoteWith<std::string>(Target("read_baggage"), Arguments("run"), baggage);
  REQUIRE_OK(run.status());
  CHECK(*run == "r42");
  absl::StatusOr<std::string> unset = client.Remote<std::string>(Target("read_baggage"), "run");
  REQUIRE_OK(unset.status());
  CHECK(*unset == "<unset>");

  CallOptions traced;
  traced.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  traced.tracestate = "agentix=00f067aa0ba902b7a1b2c3d4";
  const std::map<std::string, std::string> expected = {
      {"trace_id", "trace_4bf92f3577b34da6a3ce929d0e0e4736"},
      {"parent_id", "span_00f067aa0ba902b7a1b2c3d4"}};
  absl::StatusOr<std::map<std::string, std::string>> ids =
      client.RemoteWith<std::map<std::string, std::string>>(Target("open_span"), Arguments(),
                                                            traced);
  REQUIRE_OK(ids.status());
  CHECK(*ids == expected);

  CallOptions both = traced;
  both.baggage = baggage.baggage;
  ids = client.RemoteWith<std::map<std::string, std::string>>(Target("open_span"), Arguments(),
                                                              both);
  REQUIRE_OK(ids.status());
  CHECK(*ids == expected);
  run = client.RemoteWith<std::string>(Target("read_baggage"), Arguments("run"), both);
  REQUIRE_OK(run.status());
  CHECK(*run == "r42");
}

BEHAVIOUR("auth") {
  const std::string token = "conformance-cc-token-0123456789";
  Daemon secured(token);
  ConnectOptions options;
  options.target = secured.url();
  options.connect_timeout = absl::Seconds(5 * kSlow);
  for (const std::string& wrong : {std::string("wrong-token-0123456789"), std::string()}) {
    options.token = wrong;
    auto client = Client::Connect(options);
    CHECK(client.status().code() == absl::StatusCode::kUnauthenticated);
  }
  std::unique_ptr<Client> good = ConnectTo(secured.url(), token);
  absl::StatusOr<int64_t> sum = good->Remote<int64_t>(Target("add"), 1, 2);
  REQUIRE_OK(sum.status());
  CHECK(*sum == 3);
}

// Registers a test per value case and a failing one per behaviour that has
// no TEST_CASE above.
int RegisterCases() {
  std::ifstream in(Runfile("testing/conformance/cases.json"));
  if (!in) {
    std::fprintf(stderr, "no testing/conformance/cases.json under %s\n",
                 std::filesystem::current_path().c_str());
    return 1;
  }
  const nlohmann::json spec = nlohmann::json::parse(in);
  static std::deque<std::string> names;  // outlive the registry
  static std::deque<Catch::AutoReg> registrations;
  auto add = [&](Catch::ITestInvoker* invoker, const std::string& name) {
    names.push_back(name);
    registrations.emplace_back(invoker, CATCH_INTERNAL_LINEINFO, Catch::StringRef(),
                               Catch::NameAndTags{Catch::StringRef(names.back())});
  };
  for (const nlohmann::json& value : spec["values"]) {
    const nlohmann::json not_for = value.value("not_for", nlohmann::json::array());
    if (std::find(not_for.begin(), not_for.end(), "cc") != not_for.end()) continue;
    add(new ValueCase(value), value["id"].get<std::string>());
  }
  for (const nlohmann::json& behaviour : spec["behaviours"]) {
    const std::string id = behaviour["id"].get<std::string>();
    if (Behaviours().count(id) == 0) add(new Missing(), id);
  }
  return 0;
}

}  // namespace
}  // namespace agentix

int main(int argc, char** argv) {
  if (agentix::RegisterCases() != 0) return 2;
  const int failed = Catch::Session().run(argc, argv);
  agentix::shared_client.reset();
  agentix::shared_daemon.reset();  // kills the daemon (it would hold our stdout)
  return failed;
}
