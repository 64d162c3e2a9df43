// What the daemon's tests that run calls through testing/fake_worker share,
// whichever wire carries them (gRPC: runtime_service_test; the frame wire:
// frame_wire_server_test), and the session manager's own tests
// (session_manager_test, worker_adoption_test).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "sandbox/session_manager.h"

namespace agentix::sandbox {

// A session whose worker is testing/fake_worker (a test's data dependency).
inline SessionOptions FakeWorkerSessionOptions() {
  SessionOptions options;
  options.worker.worker_path = "testing/fake_worker";
  return options;
}

// The same with `env` for the worker and a 5 s ready timeout (the session
// and adoption tests').
inline SessionOptions FakeWorkerOptions(std::vector<std::string> env = {}) {
  SessionOptions options = FakeWorkerSessionOptions();
  options.worker.env = std::move(env);
  options.worker.ready_timeout = absl::Seconds(5);
  return options;
}

// Appends a call of the fake worker's `callable` (fake::echo, ...) on `args`.
inline void AddStart(runtime::v1::CallsRequest& request, const std::string& id,
                     const std::string& callable, const std::string& args) {
  auto* start = request.add_events()->mutable_start();
  start->set_call_id(id);
  start->set_callable(callable);
  start->set_arguments(args);
  // The fake worker's arguments are raw text, not a pickle.
  start->set_encoding(runtime::v1::ENCODING_PICKLE);
}

}  // namespace agentix::sandbox
