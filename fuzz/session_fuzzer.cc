// libFuzzer target for the daemon's request handling: the input is parsed as
// one agentix.runtime.v1.CallsRequest (the batch of HostEvents one stream
// message carries) and applied to a SessionManager whose worker is
// //testing:fake_worker (a real child process speaking the frame protocol),
// exactly as RuntimeService.Calls does for every message it reads.
//
// Inputs that do not parse as a CallsRequest are rejected by gRPC's
// deserializer before the daemon sees them, so they are skipped here.
//
// After the batch the session is shut down (which fails every open call with
// WorkerDied) and the fuzzer checks the reliability contract:
// - an event with no kind, a StartCall with an empty call_id and an
//   ArgumentChunk with an empty call_id each produce exactly one
//   "BadRequest" CallError with an empty call_id (bad input gets an error,
//   never an abort or silence);
// - every call_id started exactly once, never resumed or acknowledged and
//   sent no chunk before its start, ends with exactly one terminal event (CallResult or CallError).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "sandbox/session_manager.h"

namespace {

using agentix::runtime::v1::CallsRequest;
using agentix::runtime::v1::HostEvent;
using agentix::sandbox::CallSink;
using agentix::sandbox::SandboxEventPtr;
using agentix::sandbox::SessionManager;
using agentix::sandbox::SessionOptions;

// Bounds per input, so one input cannot run for long or use much memory.
constexpr int kMaxEvents = 32;
constexpr uint64_t kMaxPayloadBytes = 64 * 1024;

std::string* fake_worker_path = nullptr;

class RecordingSink : public CallSink {
 public:
  bool Deliver(std::vector<SandboxEventPtr> events) override {
    absl::MutexLock lock(&mu_);
    for (auto& e : events) events_.push_back(std::move(e));
    return true;
  }
  std::vector<SandboxEventPtr> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(events_);
  }

 private:
  absl::Mutex mu_;
  std::vector<SandboxEventPtr> events_ ABSL_GUARDED_BY(mu_);
};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "session_fuzzer: %s\n", what.c_str());
  std::abort();
}

std::string FindFakeWorker(const char* argv0) {
  if (const char* env = std::getenv("AGENTIX_FAKE_WORKER")) return env;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string exe = n > 0 ? std::string(self, n) : std::string(argv0);
  for (const std::string& candidate :
       {exe + ".runfiles/agentix/testing/fake_worker",
        exe.substr(0, exe.rfind('/')) + "/../testing/fake_worker"}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  Fail("cannot find testing/fake_worker next to " + exe +
       " (set AGENTIX_FAKE_WORKER)");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  fake_worker_path = new std::string(FindFakeWorker((*argv)[0]));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CallsRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (request.events_size() > kMaxEvents) return 0;

  // What the contract says the sink must see.
  int expected_bad_requests = 0;
  absl::flat_hash_map<std::string, int> starts;
  // Ids whose terminal count the contract does not pin to one: resumed
  // (events are replayed), acknowledged (the id may be reused), or sent a
  // chunk before their start.
  absl::flat_hash_set<std::string> tainted;
  for (const HostEvent& e : request.events()) {
    switch (e.kind_case()) {
      case HostEvent::KIND_NOT_SET:
        ++expected_bad_requests;
        break;
      case HostEvent::kStart:
        if (e.start().call_id().empty()) {
          ++expected_bad_requests;
        } else {
          ++starts[e.start().call_id()];
        }
        break;
      case HostEvent::kArgumentChunk:
        if (e.argument_chunk().call_id().empty()) {
          ++expected_bad_requests;
        } else if (!starts.contains(e.argument_chunk().call_id())) {
          // A chunk before its start gets its own BadRequest for that id.
          tainted.insert(e.argument_chunk().call_id());
        }
        break;
      case HostEvent::kResume:
        for (const auto& id : e.resume().call_ids()) tainted.insert(id);
        break;
      case HostEvent::kAck:
        tainted.insert(e.ack().call_id());
        break;
      default:
        break;
    }
  }

  auto sink = std::make_shared<RecordingSink>();
  {
    SessionOptions options;
    options.worker.worker_path = *fake_worker_path;
    // The fake worker is built with ASan too; its exit-time leak report is
    // not what this target looks for.
    options.worker.env = {"ASAN_OPTIONS=detect_leaks=0"};
    options.worker.ready_timeout = absl::Seconds(5);
    options.max_payload_bytes = kMaxPayloadBytes;
    SessionManager manager(options);
    manager.HandleHostEvents(sink, request.events());
    // Give the fake worker a moment to answer, so its result, chunk, stream
    // and error frames go through the manager too (fake::hang and long
    // fake::sleep calls stay open and end at shutdown).
    for (int i = 0; i < 20 && manager.Info().calls_in_flight > 0; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    // Ends every call still open (WorkerDied) and joins the worker threads.
    manager.Shutdown(absl::Seconds(2));
  }

  int bad_requests = 0;
  absl::flat_hash_map<std::string, int> terminals;
  for (const SandboxEventPtr& e : sink->Take()) {
    if (e->has_error()) {
      const auto& err = e->error();
      ++terminals[err.call_id()];
      if (err.call_id().empty() && err.error().type() == "BadRequest") {
        ++bad_requests;
      }
      if (err.error().type().empty()) Fail("CallError without a type");
    } else if (e->has_result()) {
      ++terminals[e->result().call_id()];
    }
  }
  if (bad_requests != expected_bad_requests) {
    Fail("expected " + std::to_string(expected_bad_requests) +
         " BadRequest errors without a call_id, got " +
         std::to_string(bad_requests));
  }
  for (const auto& [id, count] : starts) {
    if (count != 1 || tainted.contains(id)) continue;
    const int got = terminals.contains(id) ? terminals[id] : 0;
    if (got != 1) {
      Fail("call '" + id + "' ended with " + std::to_string(got) +
           " terminal events instead of exactly one");
    }
  }
  return 0;
}
