// The C++ client's half of //testing/bench:remote_calls: the same workloads
// as workloads.py (noop latency, calls/s at 1/16/64 callers, echo of 1 and
// 16 MiB) against a running agentix-sandboxd whose worker imports
// bench_targets. remote_calls.py starts the daemon and runs this.
//
//   cc_remote_calls --target=unix:///tmp/x/sandboxd.sock [--quick]
//
// Prints progress to stderr and one JSON line (the results) to stdout. Each
// concurrent caller is a thread making blocking calls on the one Client.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "agentix/client.h"
#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "testing/bench/floor/floor_stats.h"

namespace agentix::bench {
namespace {

struct Plan {
  int noop_warmup, noop_calls;
  double conc_warmup_s, conc_measure_s;
  int echo_1mib_reps, echo_16mib_reps;
};
constexpr Plan kFull{300, 2000, 0.5, 3.0, 9, 5};
constexpr Plan kQuick{50, 200, 0.2, 0.5, 3, 1};

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "cc_remote_calls: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

void Noop(Client& client) {
  absl::StatusOr<msgpack::object_handle> none =
      client.Remote<msgpack::object_handle>("bench_targets::noop");
  if (!none.ok()) Die("noop", none.status());
  if (none->get().type != msgpack::type::NIL) Die("noop", absl::InternalError("not None"));
}

double CallsPerSecond(Client& client, int callers, const Plan& plan) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> completed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < callers; ++i) {
    threads.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        Noop(client);
        completed.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(plan.conc_warmup_s));
  const int64_t c0 = completed.load();
  const double t0 = Now();
  std::this_thread::sleep_for(std::chrono::duration<double>(plan.conc_measure_s));
  const int64_t c1 = completed.load();
  const double t1 = Now();
  stop = true;
  for (std::thread& t : threads) t.join();
  const double rate = (c1 - c0) / (t1 - t0);
  std::fprintf(stderr, "[cc] calls/s with %d concurrent callers: %.0f\n", callers, rate);
  return rate;
}

// Median seconds of an echo of `size` bytes; the error when one failed (the
// benchmark reports the other figures and names it).
absl::StatusOr<double> EchoSeconds(Client& client, size_t size, int reps) {
  std::vector<char> payload(size);
  for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>((i * 2654435761u) >> 13);
  const Arguments args(payload);
  auto once = [&]() -> absl::StatusOr<double> {
    const double start = Now();
    absl::StatusOr<Call> call = client.Start("bench_targets::echo", args);
    if (!call.ok()) return call.status();
    absl::StatusOr<std::vector<char>> back = call->Wait<std::vector<char>>();
    const double took = Now() - start;
    if (!back.ok()) return back.status();
    if (*back != payload) return absl::InternalError("echo returned different bytes");
    return took;
  };
  absl::StatusOr<double> warm = once();
  if (!warm.ok()) return warm.status();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    absl::StatusOr<double> took = once();
    if (!took.ok()) return took.status();
    times.push_back(*took);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Noop p50 of the least any client can do through the daemon: raw gRPC on
// one Calls stream, one StartCall (carrying the previous call's ack) and one
// Read per call on the calling thread, no library. The floor that includes
// the daemon -> worker hop; the C++ client's own cost is the difference.
absl::StatusOr<double> RawDaemonNoopP50(const std::string& target, const Plan& plan) {
  namespace pb = ::agentix::runtime::v1;
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = pb::RuntimeService::NewStub(channel);
  grpc::ClientContext context;
  context.AddMetadata("agentix-client-id", "cc-bench-raw");
  auto stream = stub->Calls(&context);
  static const std::string kNoArguments("\x92\x90\x80", 3);  // [[], {}]
  std::string previous;
  pb::CallsRequest request;
  pb::CallsResponse response;
  std::vector<double> samples;
  for (int i = 0; i < plan.noop_warmup + plan.noop_calls; ++i) {
    const std::string id = absl::StrCat("raw-", i);
    request.Clear();
    if (!previous.empty()) request.add_events()->mutable_ack()->set_call_id(previous);
    pb::StartCall* start = request.add_events()->mutable_start();
    start->set_call_id(id);
    start->set_callable("bench_targets::noop");
    start->set_encoding(pb::ENCODING_MSGPACK);
    start->set_arguments(kNoArguments);
    start->set_arguments_size(kNoArguments.size());
    const double begin = Now();
    if (!stream->Write(request)) break;
    bool done = false;
    while (!done && stream->Read(&response)) {
      for (const pb::SandboxEvent& event : response.events()) {
        if ((event.has_result() && event.result().call_id() == id) ||
            (event.has_error() && event.error().call_id() == id)) {
          done = true;
        }
      }
    }
    if (!done) break;
    if (i >= plan.noop_warmup) samples.push_back(Now() - begin);
    previous = id;
  }
  stream->WritesDone();
  context.TryCancel();
  grpc::Status status = stream->Finish();
  if (samples.size() != static_cast<size_t>(plan.noop_calls)) {
    return absl::UnavailableError(absl::StrCat("raw noop stream ended: ", status.error_message()));
  }
  return Percentile(samples, 0.5) * 1e6;
}

std::string Rate(const absl::StatusOr<double>& seconds, size_t size) {
  if (!seconds.ok()) return "null";
  char out[32];
  std::snprintf(out, sizeof(out), "%.1f", 2.0 * size / *seconds / 1e6);
  return out;
}

std::string Quoted(const absl::Status& status) {
  std::string out = "\"";
  for (char c : status.ToString()) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

int Main(int argc, char** argv) {
  std::string target;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--target=", 9) == 0) {
      target = argv[i] + 9;
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: cc_remote_calls --target=URL [--quick]\n");
      return 2;
    }
  }
  const Plan& plan = quick ? kQuick : kFull;
  ConnectOptions options;
  options.target = target;
  options.connect_timeout = absl::Seconds(60);  // the first call starts the worker
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  if (!connected.ok()) Die("connect", connected.status());
  Client& client = **connected;

  const double first = Now();
  Noop(client);
  std::fprintf(stderr, "[cc] first call took %.1f ms\n", (Now() - first) * 1e3);
  for (int i = 0; i < plan.noop_warmup; ++i) Noop(client);
  std::vector<double> samples;
  for (int i = 0; i < plan.noop_calls; ++i) {
    const double start = Now();
    Noop(client);
    samples.push_back(Now() - start);
  }
  double total = 0;
  for (double s : samples) total += s;
  const double p50 = Percentile(samples, 0.5) * 1e6;
  const double p99 = Percentile(samples, 0.99) * 1e6;
  std::fprintf(stderr, "[cc] noop p50 %.1f us, p99 %.1f us\n", p50, p99);
  const absl::StatusOr<double> raw = RawDaemonNoopP50(target, plan);
  if (raw.ok()) std::fprintf(stderr, "[cc] raw gRPC noop through the daemon p50 %.1f us\n", *raw);
  const double c1 = CallsPerSecond(client, 1, plan);
  const double c16 = CallsPerSecond(client, 16, plan);
  const double c64 = CallsPerSecond(client, 64, plan);
  const size_t mib = 1 << 20;
  const absl::StatusOr<double> e1 = EchoSeconds(client, mib, plan.echo_1mib_reps);
  const absl::StatusOr<double> e16 = EchoSeconds(client, 16 * mib, plan.echo_16mib_reps);
  std::string errors;
  for (const auto* e : {&raw, &e1, &e16}) {
    if (e->ok()) continue;
    std::fprintf(stderr, "[cc] failed: %s\n", e->status().ToString().c_str());
    errors += (errors.empty() ? "" : ", ") + Quoted(e->status());
  }
  std::printf(
      "{\"noop_p50_us\": %.1f, \"noop_p99_us\": %.1f, \"noop_mean_us\": %.1f, "
      "\"calls_per_s_c1\": %.1f, \"calls_per_s_c16\": %.1f, \"calls_per_s_c64\": %.1f, "
      "\"mb_per_s_1mib\": %s, \"mb_per_s_16mib\": %s, \"reconnects\": %d, "
      "\"raw_daemon_noop_p50_us\": %s, \"errors\": [%s]}\n",
      p50, p99, total / samples.size() * 1e6, c1, c16, c64, Rate(e1, mib).c_str(),
      Rate(e16, 16 * mib).c_str(), client.reconnects(),
      raw.ok() ? absl::StrCat(*raw).c_str() : "null", errors.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace agentix::bench

int main(int argc, char** argv) { return agentix::bench::Main(argc, argv); }
