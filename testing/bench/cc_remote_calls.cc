// The C++ client's half of //testing/bench:remote_calls: the same workloads
// as workloads.py (noop latency, calls/s at 1/16/64 callers, echo of 1 and
// 16 MiB) against a running agentix-sandboxd whose worker imports
// bench_targets. remote_calls.py starts the daemon and runs this.
//
//   cc_remote_calls --target=unix:///tmp/x/sandboxd.sock [--quick] [--noop-only]
//   cc_remote_calls --target=... --noops=N
//
// Prints progress to stderr and one JSON line (the results) to stdout. Each
// concurrent caller is a thread making blocking calls on the one Client.
// The client's Calls stream takes the frame wire when the daemon has one
// (unless $AGENTIX_CALLS_WIRE=grpc); calls_wire says which. The noop is
// measured in blocks of kNoopBlock calls alternating with the same client
// on the gRPC wire (grpc_wire_noop_p50_us, noop_over_grpc_wire_block_median;
// only when the client is on the frame wire) and a raw
// gRPC noop through the same daemon (RawNoop), so all meet the same load:
// noop_p50_us / raw_daemon_noop_p50_us (all samples),
// noop_over_raw_daemon_block_median (the median over blocks of the ratio
// of their p50s) and the process's CPU per call of each
// (noop_cpu_us_per_call, raw_daemon_noop_cpu_us_per_call: the client's own
// work is the difference). --noop-only stops there. --noops=N measures
// only N sequential noops on the client's own wire after N/5 to warm up,
// nothing interleaved (wake_ab.py): calls_wire, noop_p50_us, noop_p99_us,
// noop_cpu_us_per_call, calls (warm-up included), pin_trial (how the default
// setting's trial of pinned and unpinned waits left them: PinTrial).
// --echo-mib=N [--echoes=R] only echoes N MiB R times (after two to warm
// up): echo_ms_p50, cpu_ms_per_echo, minor_faults_per_echo (the client's).
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
#include <sys/resource.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agentix/calls_cpu.h"
#include "agentix/client.h"
#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "testing/bench/floor/floor_stats.h"

namespace agentix::bench {
namespace {
namespace pb = ::agentix::runtime::v1;

// Calls per block of the interleaved client / raw noop measurement.
constexpr int kNoopBlock = 50;

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

// The least any client can do through the daemon: raw gRPC on one Calls
// stream, one StartCall (carrying the previous call's ack) and one Read per
// call on the calling thread, no library. The floor that includes the
// daemon -> worker hop; the C++ client's own cost is the difference.
class RawNoop {
 public:
  explicit RawNoop(const std::string& target)
      : stub_(pb::RuntimeService::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {
    context_.AddMetadata("agentix-client-id", "cc-bench-raw");
    stream_ = stub_->Calls(&context_);
  }
  ~RawNoop() {
    stream_->WritesDone();
    context_.TryCancel();
    stream_->Finish();
  }

  // Seconds of one noop round trip; the error when the stream ended.
  absl::StatusOr<double> Once() {
    static const std::string kNoArguments("\x92\x90\x80", 3);  // [[], {}]
    const std::string id = absl::StrCat(prefix_, ++count_);
    request_.Clear();
    if (!previous_.empty()) request_.add_events()->mutable_ack()->set_call_id(previous_);
    pb::StartCall* start = request_.add_events()->mutable_start();
    start->set_call_id(id);
    start->set_callable("bench_targets::noop");
    start->set_encoding(pb::ENCODING_MSGPACK);
    start->set_arguments(kNoArguments);
    start->set_arguments_size(kNoArguments.size());
    const double begin = Now();
    if (!stream_->Write(request_)) return absl::UnavailableError("raw noop stream ended");
    bool done = false;
    while (!done && stream_->Read(&response_)) {
      for (const pb::SandboxEvent& event : response_.events()) {
        if ((event.has_result() && event.result().call_id() == id) ||
            (event.has_error() && event.error().call_id() == id)) {
          done = true;
        }
      }
    }
    if (!done) return absl::UnavailableError("raw noop stream ended");
    previous_ = id;
    return Now() - begin;
  }

 private:
  std::unique_ptr<pb::RuntimeService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::CallsRequest, pb::CallsResponse>> stream_;
  pb::CallsRequest request_;
  pb::CallsResponse response_;
  std::string previous_;
  // Call ids are daemon-wide and a finished one is not run again: unique
  // per process, so runs can share a daemon (A/B runs).
  const std::string prefix_ = absl::StrCat("raw-", ::getpid(), "-", absl::ToUnixNanos(absl::Now()), "-");
  int64_t count_ = 0;
};

// This process's CPU seconds (all threads: the caller, the client's reader,
// gRPC's own).
double CpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

// The client's noop, the same client on the gRPC wire (when the client's
// Calls stream is on the frame wire) and the raw noop through the same
// daemon, measured in alternating blocks (the order rotated each block) so
// that all meet the same load: latency samples, CPU per call, and the
// medians over blocks of the block p50 ratios client / raw and client /
// gRPC-wire client.
struct NoopFigures {
  std::vector<double> client, grpc_wire, raw;  // seconds per call
  double client_cpu = 0, grpc_wire_cpu = 0, raw_cpu = 0;  // CPU seconds in total
  std::vector<double> block_ratios;      // client / raw
  std::vector<double> grpc_wire_ratios;  // client / client on gRPC
  absl::Status raw_error;
};

NoopFigures MeasureNoops(Client& client, Client* grpc_client, RawNoop& raw, const Plan& plan) {
  NoopFigures out;
  const int blocks = std::max(1, plan.noop_calls / kNoopBlock);
  for (int i = 0; i < plan.noop_warmup; ++i) {
    Noop(client);
    if (grpc_client != nullptr) Noop(*grpc_client);
    if (out.raw_error.ok()) out.raw_error = raw.Once().status();
  }
  for (int b = 0; b < blocks; ++b) {
    std::vector<double> samples[3];  // client, gRPC-wire client, raw
    double* cpu_totals[3] = {&out.client_cpu, &out.grpc_wire_cpu, &out.raw_cpu};
    for (int k = 0; k < 3; ++k) {
      const int side = (b + k) % 3;
      if (side == 1 && grpc_client == nullptr) continue;
      if (side == 2 && !out.raw_error.ok()) continue;
      const double cpu = CpuSeconds();
      for (int i = 0; i < kNoopBlock; ++i) {
        if (side < 2) {
          const double start = Now();
          Noop(side == 0 ? client : *grpc_client);
          samples[side].push_back(Now() - start);
        } else {
          absl::StatusOr<double> took = raw.Once();
          if (!took.ok()) {
            out.raw_error = took.status();
            break;
          }
          samples[2].push_back(*took);
        }
      }
      *cpu_totals[side] += CpuSeconds() - cpu;
    }
    out.client.insert(out.client.end(), samples[0].begin(), samples[0].end());
    out.grpc_wire.insert(out.grpc_wire.end(), samples[1].begin(), samples[1].end());
    out.raw.insert(out.raw.end(), samples[2].begin(), samples[2].end());
    if (samples[2].size() == static_cast<size_t>(kNoopBlock)) {
      out.block_ratios.push_back(Percentile(samples[0], 0.5) / Percentile(samples[2], 0.5));
    }
    if (!samples[1].empty()) {
      out.grpc_wire_ratios.push_back(Percentile(samples[0], 0.5) / Percentile(samples[1], 0.5));
    }
  }
  return out;
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

std::string Number(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.2f", value) : "null";
}

int Main(int argc, char** argv) {
  std::string target;
  bool quick = false;
  bool noop_only = false;
  int plain_noops = 0;
  int echo_mib = 0;
  int echoes = 9;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--target=", 9) == 0) {
      target = argv[i] + 9;
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--noop-only") == 0) {
      noop_only = true;
    } else if (std::strncmp(argv[i], "--noops=", 8) == 0) {
      plain_noops = std::max(1, std::atoi(argv[i] + 8));
    } else if (std::strncmp(argv[i], "--echo-mib=", 11) == 0) {
      echo_mib = std::max(1, std::atoi(argv[i] + 11));
    } else if (std::strncmp(argv[i], "--echoes=", 9) == 0) {
      echoes = std::max(1, std::atoi(argv[i] + 9));
    } else if (std::strcmp(argv[i], "--no-deadlock-detection") == 0) {
      // Diagnosis: Debian's Abseil is built without NDEBUG, so every
      // absl::Mutex::Lock (the client's and gRPC's) runs deadlock detection.
      absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    } else {
      std::fprintf(stderr, "usage: cc_remote_calls --target=URL [--quick] [--noop-only] [--noops=N] "
                   "[--echo-mib=N [--echoes=R]] [--no-deadlock-detection]\n");
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
  const bool frames = client.calls_wire() == CallsWire::kFrames;
  if (echo_mib > 0) {
    // EchoSeconds warms up with one echo of its own before it times
    // `echoes`; this first echo keeps the client's first (cold) one out of
    // the CPU and page-fault counts, which then cover EchoSeconds' echoes.
    const size_t size = static_cast<size_t>(echo_mib) << 20;
    absl::StatusOr<double> warm = EchoSeconds(client, size, 1);
    if (!warm.ok()) Die("echo", warm.status());
    rusage before{};
    ::getrusage(RUSAGE_SELF, &before);
    const double cpu = CpuSeconds();
    absl::StatusOr<double> median = EchoSeconds(client, size, echoes);
    if (!median.ok()) Die("echo", median.status());
    const double cpu_ms = (CpuSeconds() - cpu) / (echoes + 1) * 1e3;  // (its warm-up echo too)
    rusage after{};
    ::getrusage(RUSAGE_SELF, &after);
    std::printf(
        "{\"calls_wire\": \"%s\", \"echo_mib\": %d, \"echo_ms_p50\": %.2f, "
        "\"cpu_ms_per_echo\": %.2f, \"minor_faults_per_echo\": %.0f}\n",
        frames ? "frames" : "grpc", echo_mib, *median * 1e3, cpu_ms,
        static_cast<double>(after.ru_minflt - before.ru_minflt) / (echoes + 1));
    return 0;
  }
  if (plain_noops > 0) {
    for (int i = 0; i < plain_noops / 5 + 1; ++i) Noop(client);
    std::vector<double> samples;
    samples.reserve(plain_noops);
    const double cpu = CpuSeconds();
    for (int i = 0; i < plain_noops; ++i) {
      const double start = Now();
      Noop(client);
      samples.push_back(Now() - start);
    }
    const double cpu_us = (CpuSeconds() - cpu) / plain_noops * 1e6;
    // How the default setting's trials left this thread's waits (zero
    // medians: no trial ran; a named setting, or too few calls).
    const agentix::client_internal::PinTrial& trial = agentix::client_internal::ThreadPinTrial();
    std::printf(
        "{\"calls_wire\": \"%s\", \"noop_p50_us\": %.2f, \"noop_p99_us\": %.2f, "
        "\"noop_cpu_us_per_call\": %.2f, \"calls\": %d, \"pin_trial\": {\"pin\": %s, "
        "\"pinned_us\": %.2f, \"unpinned_us\": %.2f}}\n",
        frames ? "frames" : "grpc", Percentile(samples, 0.5) * 1e6,
        Percentile(samples, 0.99) * 1e6, cpu_us, plain_noops + plain_noops / 5 + 1,
        trial.pin() ? "true" : "false", absl::ToDoubleMicroseconds(trial.last_pinned()),
        absl::ToDoubleMicroseconds(trial.last_unpinned()));
    return 0;
  }
  std::unique_ptr<Client> grpc_client;  // the A/B partner of a frame-wire client
  if (frames) {
    options.calls_wire = CallsWire::kGrpc;
    absl::StatusOr<std::unique_ptr<Client>> on_grpc = Client::Connect(options);
    if (!on_grpc.ok()) Die("connect (gRPC wire)", on_grpc.status());
    grpc_client = *std::move(on_grpc);
    Noop(*grpc_client);
  }

  const double first = Now();
  Noop(client);
  std::fprintf(stderr, "[cc] first call took %.1f ms\n", (Now() - first) * 1e3);
  NoopFigures noops;
  {
    RawNoop raw(target);
    noops = MeasureNoops(client, grpc_client.get(), raw, plan);
  }
  double total = 0;
  for (double s : noops.client) total += s;
  const double p50 = Percentile(noops.client, 0.5) * 1e6;
  const double p99 = Percentile(noops.client, 0.99) * 1e6;
  const double nan = std::nan("");
  const double raw_p50 = noops.raw.empty() ? nan : Percentile(noops.raw, 0.5) * 1e6;
  const double block_ratio =
      noops.block_ratios.empty() ? nan : Percentile(noops.block_ratios, 0.5);
  const double cpu = noops.client_cpu / noops.client.size() * 1e6;
  const double raw_cpu = noops.raw.empty() ? nan : noops.raw_cpu / noops.raw.size() * 1e6;
  const double grpc_p50 =
      noops.grpc_wire.empty() ? nan : Percentile(noops.grpc_wire, 0.5) * 1e6;
  const double grpc_cpu =
      noops.grpc_wire.empty() ? nan : noops.grpc_wire_cpu / noops.grpc_wire.size() * 1e6;
  const double grpc_ratio =
      noops.grpc_wire_ratios.empty() ? nan : Percentile(noops.grpc_wire_ratios, 0.5);
  std::fprintf(stderr,
               "[cc] noop (%s wire) p50 %.1f us, p99 %.1f us, CPU %.1f us/call; on the gRPC "
               "wire p50 %.1f us, CPU %.1f us/call, block p50 ratio (median) %.3f; raw gRPC "
               "noop through the daemon p50 %.1f us, CPU %.1f us/call; block p50 ratio "
               "(median) %.3f\n",
               frames ? "frame" : "gRPC", p50, p99, cpu, grpc_p50, grpc_cpu, grpc_ratio,
               raw_p50, raw_cpu, block_ratio);
  const std::string noop_json = absl::StrFormat(
      "\"calls_wire\": \"%s\", "
      "\"noop_p50_us\": %.1f, \"noop_p99_us\": %.1f, \"noop_mean_us\": %.1f, "
      "\"noop_cpu_us_per_call\": %s, \"raw_daemon_noop_p50_us\": %s, "
      "\"raw_daemon_noop_cpu_us_per_call\": %s, \"noop_over_raw_daemon_block_median\": %s, "
      "\"grpc_wire_noop_p50_us\": %s, \"grpc_wire_noop_cpu_us_per_call\": %s, "
      "\"noop_over_grpc_wire_block_median\": %s",
      frames ? "frames" : "grpc", p50, p99, total / noops.client.size() * 1e6, Number(cpu),
      Number(raw_p50), Number(raw_cpu), Number(block_ratio), Number(grpc_p50),
      Number(grpc_cpu), Number(grpc_ratio));
  std::string errors;
  auto add_error = [&](const absl::Status& status) {
    if (status.ok()) return;
    std::fprintf(stderr, "[cc] failed: %s\n", status.ToString().c_str());
    errors += (errors.empty() ? "" : ", ") + Quoted(status);
  };
  add_error(noops.raw_error);
  if (noop_only) {
    std::printf("{%s, \"errors\": [%s]}\n", noop_json.c_str(), errors.c_str());
    std::fflush(stdout);
    return 0;
  }
  const double c1 = CallsPerSecond(client, 1, plan);
  const double c16 = CallsPerSecond(client, 16, plan);
  const double c64 = CallsPerSecond(client, 64, plan);
  const size_t mib = 1 << 20;
  const absl::StatusOr<double> e1 = EchoSeconds(client, mib, plan.echo_1mib_reps);
  const absl::StatusOr<double> e16 = EchoSeconds(client, 16 * mib, plan.echo_16mib_reps);
  add_error(e1.status());
  add_error(e16.status());
  std::printf(
      "{%s, \"calls_per_s_c1\": %.1f, \"calls_per_s_c16\": %.1f, \"calls_per_s_c64\": %.1f, "
      "\"mb_per_s_1mib\": %s, \"mb_per_s_16mib\": %s, \"reconnects\": %d, \"errors\": [%s]}\n",
      noop_json.c_str(), c1, c16, c64, Rate(e1, mib).c_str(), Rate(e16, 16 * mib).c_str(),
      client.reconnects(), errors.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace agentix::bench

int main(int argc, char** argv) { return agentix::bench::Main(argc, argv); }
