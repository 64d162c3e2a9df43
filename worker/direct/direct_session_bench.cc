// What DirectSession (and the CallTable under it) costs a direct noop call
// on the worker's GIL-held path (stop 42), without sockets or Python:
//
//   bazel run //worker/direct:direct_session_bench -- [--calls=N]
//       [--batch=B] [--rounds=R]
//
// Per round, N calls on one thread: a CallsRequest of B StartCalls (as a
// host with B callers in flight sends them), each call's result frame given
// back as the result sender does (one frame a call), then one request with
// the B acks. The sinks drop what they get. Prints each round's thread CPU
// time a call and the median; build it at two commits for an A/B of the
// session's code (the sinks compile against the vector and the span
// interface alike).
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "worker/direct/direct_session.h"

namespace agentix::worker {
namespace {

using runtime::v1::CallsRequest;
using sandbox::SandboxEventPtr;

class DroppingConn final : public DirectResponseSink {
 public:
  void Send(std::vector<SandboxEventPtr> events) { sent += events.size(); }
  void Send(absl::Span<SandboxEventPtr> events) {
    for (SandboxEventPtr& e : events) e.reset();
    sent += events.size();
  }
  size_t sent = 0;
};

class DroppingDriver final : public DriverSink {
 public:
  void Send(std::vector<ipc::Frame> frames) { sent += frames.size(); }
  void Send(absl::Span<ipc::Frame> frames) {
    for (ipc::Frame& f : frames) f = ipc::Frame();
    sent += frames.size();
  }
  size_t sent = 0;
};

int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::string IdOf(uint64_t n) { return absl::StrFormat("%032x", n); }

// One round: thread CPU ns a call.
double Round(uint64_t calls, uint64_t batch, uint64_t& next_id) {
  DroppingDriver driver;
  DirectSession session("0123456789abcdef0123456789abcdef", DirectLimits{},
                        driver);
  auto conn = std::make_shared<DroppingConn>();
  std::shared_ptr<DirectResponseSink> sink = conn;
  int64_t spent = 0;
  for (uint64_t done = 0; done < calls; done += batch) {
    CallsRequest starts;
    CallsRequest acks;
    std::vector<std::vector<ipc::Frame>> results;
    for (uint64_t i = 0; i < batch; ++i) {
      const std::string id = IdOf(next_id++);
      auto* start = starts.add_events()->mutable_start();
      start->set_call_id(id);
      start->set_callable("bench_targets:noop");
      start->set_encoding(runtime::v1::ENCODING_MSGPACK);
      start->set_arguments(std::string("\x92\x90\x80", 3));
      acks.add_events()->mutable_ack()->set_call_id(id);
      ipc::Frame result;
      result.type = ipc::FrameType::kResult;
      result.call_id = id;
      result.encoding = runtime::v1::ENCODING_MSGPACK;
      result.data = "\xc0";
      result.total_size = 1;
      results.emplace_back().push_back(std::move(result));
    }
    const int64_t t0 = ThreadCpuNs();
    session.HandleRequest(sink, starts);
    for (std::vector<ipc::Frame>& frames : results) {
      (void)session.HandleDriverFrames(frames);
    }
    session.HandleRequest(sink, acks);
    spent += ThreadCpuNs() - t0;
  }
  if (conn->sent != calls || driver.sent != calls) {
    std::fprintf(stderr, "expected %llu results and records, got %zu, %zu\n",
                 static_cast<unsigned long long>(calls), conn->sent,
                 driver.sent);
    std::exit(1);
  }
  return static_cast<double>(spent) / static_cast<double>(calls);
}

uint64_t Flag(int argc, char** argv, const char* name, uint64_t fallback) {
  const std::string prefix = absl::StrFormat("--%s=", name);
  for (int i = 1; i < argc; ++i) {
    const std::string arg(argv[i]);
    if (arg.compare(0, prefix.size(), prefix) != 0) continue;
    const uint64_t value = std::strtoull(arg.c_str() + prefix.size(), nullptr,
                                         10);
    if (value > 0) return value;
  }
  return fallback;
}

}  // namespace
}  // namespace agentix::worker

int main(int argc, char** argv) {
  using agentix::worker::Flag;
  const uint64_t batch = Flag(argc, argv, "batch", 32);
  const uint64_t calls = Flag(argc, argv, "calls", 200'000) / batch * batch;
  const uint64_t rounds = Flag(argc, argv, "rounds", 5);
  std::vector<double> per_call;
  uint64_t next_id = 1;
  for (uint64_t r = 0; r < rounds; ++r) {
    per_call.push_back(agentix::worker::Round(calls, batch, next_id));
    std::printf("round %llu: %.0f ns a call\n",
                static_cast<unsigned long long>(r + 1), per_call.back());
  }
  std::sort(per_call.begin(), per_call.end());
  std::printf("median %.0f ns a call (%llu calls a round, batches of %llu)\n",
              per_call[per_call.size() / 2],
              static_cast<unsigned long long>(calls),
              static_cast<unsigned long long>(batch));
  return 0;
}
