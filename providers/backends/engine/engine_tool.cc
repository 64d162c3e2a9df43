// engine_tool: drives one EngineBackend object from JSON lines on stdin, for
// the end-to-end tests (testing/e2e/test_engine_backend.py) until
// agentix-providerd wires the backend in. One request per line:
//   {"op": "probe" | "validate" | "launch" | "resolve" | "inspect" | "destroy" |
//          "list_owned" | "watch" | "logs" | "log_tail", ...}
// or {"op": "parallel", "requests": [...]}: each request on its own thread of
// the same backend object, answers in request order.
// One answer per line, {"ok": true, ...} or {"ok": false, "code", "reason",
// "message", "retry_after_ms"}; after "watch", EventSink calls arrive as
// {"event": {...}} lines at any time. Exits at the end of stdin (Shutdown).
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "providers/backends/engine/engine_backend.h"
#include "providers/core/errors.h"

ABSL_FLAG(std::string, name, "docker", "backend name: docker or podman");
ABSL_FLAG(std::string, socket, "", "the engine's API socket");
ABSL_FLAG(std::string, run_root, "", "host directory of the sandboxes' run dirs");
ABSL_FLAG(std::string, instance, "", "managed-by label the events watch follows");

namespace agentix::providers::engine {
namespace {

using nlohmann::json;

absl::Mutex out_mu;

void Emit(const json& line) {
  absl::MutexLock lock(&out_mu);
  std::cout << line.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
}

json Error(const absl::Status& status) {
  json out = {{"ok", false},
              {"code", absl::StatusCodeToString(status.code())},
              {"reason", ReasonOf(status)},
              {"message", std::string(status.message())}};
  if (auto retry = RetryAfterOf(status)) out["retry_after_ms"] = absl::ToInt64Milliseconds(*retry);
  return out;
}

const char* StateName(Observed::State state) {
  switch (state) {
    case Observed::State::kCreating: return "CREATING";
    case Observed::State::kRunning: return "RUNNING";
    case Observed::State::kExited: return "EXITED";
    case Observed::State::kMissing: return "MISSING";
  }
  return "?";
}

json ObservedJson(const Observed& observed) {
  json out = {{"state", StateName(observed.state)},
              {"oom_killed", observed.oom_killed},
              {"reason", observed.reason}};
  if (observed.exit_code) out["exit_code"] = *observed.exit_code;
  return out;
}

class PrintingSink final : public EventSink {
 public:
  void OnObserved(const BackendRef& ref, const Observed& observed) override {
    json event = ObservedJson(observed);
    event["ref"] = ref.value;
    Emit({{"event", event}});
  }
};

class CollectingLogSink final : public LogSink {
 public:
  explicit CollectingLogSink(int64_t max_bytes) : max_bytes_(max_bytes) {}
  bool OnLogData(int64_t offset, absl::string_view data, bool) override {
    if (first_offset_ < 0) first_offset_ = offset;
    text_.append(data.data(), data.size());
    return max_bytes_ <= 0 || static_cast<int64_t>(text_.size()) < max_bytes_;
  }
  std::string text_;
  int64_t first_offset_ = -1;

 private:
  int64_t max_bytes_;
};

absl::StatusOr<LaunchSpec> SpecFrom(const json& request) {
  LaunchSpec spec;
  spec.sandbox_id = request.value("sandbox_id", "");
  spec.uid = request.value("uid", "");
  spec.instance = request.value("instance", "");
  spec.admin_token = request.value("admin_token", "");
  if (request.contains("labels")) {
    for (const auto& [key, value] : request["labels"].items()) spec.labels[key] = value;
  }
  std::string spec_json = request.contains("spec") ? request["spec"].dump() : "{}";
  auto parsed = google::protobuf::util::JsonStringToMessage(spec_json, &spec.spec);
  if (!parsed.ok()) return absl::InvalidArgumentError(std::string(parsed.message()));
  return spec;
}

json Handle(Backend& backend, PrintingSink& sink, const json& request) {
  std::string op = request.value("op", "");
  BackendRef ref{request.value("ref", "")};
  if (op == "probe") {
    auto caps = backend.Probe();
    if (!caps.ok()) return Error(caps.status());
    std::string text;
    google::protobuf::util::MessageToJsonString(*caps, &text);
    return {{"ok", true}, {"capabilities", json::parse(text)}};
  }
  if (op == "validate" || op == "launch") {
    auto spec = SpecFrom(request);
    if (!spec.ok()) return Error(spec.status());
    if (op == "validate") {
      absl::Status status = backend.Validate(*spec);
      return status.ok() ? json{{"ok", true}} : Error(status);
    }
    absl::Time started = absl::Now();
    auto launched =
        backend.Launch(*spec, started + absl::Seconds(request.value("deadline_s", 60.0)));
    if (!launched.ok()) return Error(launched.status());
    return {{"ok", true},
            {"ref", launched->value},
            {"ms", absl::ToDoubleMilliseconds(absl::Now() - started)}};
  }
  if (op == "resolve") {
    auto endpoint = backend.ResolveEndpoint(ref);
    if (!endpoint.ok()) return Error(endpoint.status());
    return {{"ok", true}, {"target", endpoint->target()}};
  }
  if (op == "inspect") {
    auto observed = backend.Inspect(ref);
    if (!observed.ok()) return Error(observed.status());
    json out = ObservedJson(*observed);
    out["ok"] = true;
    return out;
  }
  if (op == "destroy") {
    absl::Time started = absl::Now();
    absl::Status status =
        backend.Destroy(ref, absl::Milliseconds(request.value("grace_ms", 2000)));
    if (!status.ok()) return Error(status);
    return {{"ok", true}, {"ms", absl::ToDoubleMilliseconds(absl::Now() - started)}};
  }
  if (op == "list_owned") {
    auto owned = backend.ListOwned(request.value("instance", ""));
    if (!owned.ok()) return Error(owned.status());
    json refs = json::array();
    for (const BackendRef& r : *owned) refs.push_back(r.value);
    return {{"ok", true}, {"refs", refs}};
  }
  if (op == "watch") {
    absl::Status status = backend.Watch(&sink);
    return status.ok() ? json{{"ok", true}} : Error(status);
  }
  if (op == "logs") {
    CollectingLogSink logs(request.value("max_bytes", int64_t{0}));
    absl::Status status = backend.StreamLogs(ref, request.value("offset", int64_t{0}),
                                             request.value("follow", false), &logs);
    if (!status.ok()) return Error(status);
    return {{"ok", true}, {"text", logs.text_}, {"first_offset", logs.first_offset_}};
  }
  if (op == "log_tail") {
    return {{"ok", true},
            {"text", backend.LogTail(ref, request.value("max_bytes", size_t{65536}))}};
  }
  if (op == "parallel" && request.contains("requests") && request["requests"].is_array()) {
    const json& requests = request["requests"];
    std::vector<json> answers(requests.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < requests.size(); ++i) {
      threads.emplace_back([&, i] { answers[i] = Handle(backend, sink, requests[i]); });
    }
    for (std::thread& thread : threads) thread.join();
    return {{"ok", true}, {"answers", answers}};
  }
  return Error(absl::InvalidArgumentError("unknown op " + op));
}

int Main() {
  EngineOptions options;
  options.name = absl::GetFlag(FLAGS_name);
  options.socket_path = absl::GetFlag(FLAGS_socket);
  options.run_root = absl::GetFlag(FLAGS_run_root);
  options.instance = absl::GetFlag(FLAGS_instance);
  std::unique_ptr<Backend> backend = NewEngineBackend(options);
  PrintingSink sink;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    json request = json::parse(line, nullptr, false);
    json answer = request.is_object() ? Handle(*backend, sink, request)
                                      : Error(absl::InvalidArgumentError("not a JSON object"));
    if (request.is_object() && request.contains("id")) answer["id"] = request["id"];
    Emit(answer);
  }
  backend->Shutdown();
  return 0;
}

}  // namespace
}  // namespace agentix::providers::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return agentix::providers::engine::Main();
}
