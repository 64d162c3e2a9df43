// Same-run A/B of the Calls stream's two wires through one agentix-sandboxd:
// sequential noop calls (bench_targets::noop, msgpack, one StartCall carrying
// the previous call's ack per call, as RawNoop in cc_remote_calls.cc) over
// the frame wire (PATH.calls, docs/FRAME-WIRE.md) and over gRPC, in
// alternating blocks (the order swapped each block) so both meet the same
// machine load. No client library on either side: the difference is the
// wire and the daemon's handling of it.
//
//   frame_wire_ab --sandboxd=PATH --worker=PATH --python_path=DIR
//                 [--blocks=40] [--block=50] [-- daemon flags...]
//
// Prints per wire: p50 of all samples, CPU per call of the daemon (all its
// threads, /proc schedstat), of the worker and of this client; and the
// medians over blocks of the frames/gRPC ratios (p50 and daemon CPU).
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "wire/frame_codec.h"
#include "testing/bench/floor/floor_stats.h"

extern char** environ;

namespace agentix::bench {
namespace {
namespace pb = ::agentix::runtime::v1;
using sandbox::FrameKind;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "frame_wire_ab: %s\n", what.c_str());
  std::exit(1);
}

// The noop request of call `id`, acknowledging `previous`.
void FillNoop(pb::CallsRequest& request, const std::string& id,
              const std::string& previous) {
  static const std::string kNoArguments("\x92\x90\x80", 3);  // [[], {}]
  request.Clear();
  if (!previous.empty()) request.add_events()->mutable_ack()->set_call_id(previous);
  pb::StartCall* start = request.add_events()->mutable_start();
  start->set_call_id(id);
  start->set_callable("bench_targets::noop");
  start->set_encoding(pb::ENCODING_MSGPACK);
  start->set_arguments(kNoArguments);
  start->set_arguments_size(kNoArguments.size());
}

bool Ends(const pb::CallsResponse& response, const std::string& id) {
  for (const pb::SandboxEvent& event : response.events()) {
    if (event.has_error()) Die("call failed: " + event.error().DebugString());
    if (event.has_result() && event.result().call_id() == id) return true;
  }
  return false;
}

class Wire {
 public:
  virtual ~Wire() = default;
  virtual void Noop() = 0;

 protected:
  std::string NextId() {
    previous_ = id_;
    id_ = absl::StrCat(prefix_, ++count_);
    return id_;
  }
  std::string id_, previous_;
  pb::CallsRequest request_;
  pb::CallsResponse response_;

 private:
  const std::string prefix_ =
      absl::StrCat("ab-", ::getpid(), "-", reinterpret_cast<uintptr_t>(this), "-");
  int64_t count_ = 0;
};

class GrpcWire final : public Wire {
 public:
  explicit GrpcWire(const std::string& target)
      : stub_(pb::RuntimeService::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {
    context_.AddMetadata("agentix-client-id", "ab-grpc");
    stream_ = stub_->Calls(&context_);
  }
  ~GrpcWire() override {
    stream_->WritesDone();
    context_.TryCancel();
    stream_->Finish();
  }
  void Noop() override {
    const std::string id = NextId();
    FillNoop(request_, id, previous_);
    if (!stream_->Write(request_)) Die("gRPC stream ended");
    while (true) {
      if (!stream_->Read(&response_)) Die("gRPC stream ended");
      if (Ends(response_, id)) return;
    }
  }

 private:
  std::unique_ptr<pb::RuntimeService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::CallsRequest, pb::CallsResponse>> stream_;
};

class FrameWire final : public Wire {
 public:
  explicit FrameWire(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      Die("cannot connect to " + path);
    }
    Send(sandbox::EncodeFrame(
        FrameKind::kHello,
        sandbox::EncodeHello({{"agentix-client-id", "ab-frames"}})));
  }
  ~FrameWire() override { ::close(fd_); }
  void Noop() override {
    const std::string id = NextId();
    FillNoop(request_, id, previous_);
    const size_t size = request_.ByteSizeLong();
    out_.resize(sandbox::kFrameHeaderBytes + size);
    sandbox::EncodeFrameHeader(FrameKind::kMessage, static_cast<uint32_t>(size), out_.data());
    request_.SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(out_.data() + sandbox::kFrameHeaderBytes));
    Send(out_);
    while (true) {
      char header[sandbox::kFrameHeaderBytes];
      ReadExactly(header, sizeof(header));
      const auto* h = reinterpret_cast<const unsigned char*>(header);
      const size_t length = size_t{h[0]} | size_t{h[1]} << 8 |
                            size_t{h[2]} << 16 | size_t{h[3]} << 24;
      in_.resize(length);
      ReadExactly(in_.data(), length);
      if (h[4] != static_cast<unsigned char>(FrameKind::kMessage)) {
        Die("frame wire ended: STATUS " + in_);
      }
      if (!response_.ParseFromString(in_)) Die("bad CallsResponse");
      if (Ends(response_, id)) return;
    }
  }

 private:
  void Send(const std::string& bytes) {
    if (::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(bytes.size())) {
      Die("frame wire send failed");
    }
  }
  void ReadExactly(char* out, size_t n) {
    size_t at = 0;
    while (at < n) {
      const ssize_t got = ::recv(fd_, out + at, n - at, 0);
      if (got <= 0) Die("frame wire closed");
      at += static_cast<size_t>(got);
    }
  }
  int fd_ = -1;
  std::string out_, in_;
};

// The worker: the daemon's child process (listed by the thread that
// spawned it, so every thread's list is read).
pid_t ChildOf(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* tasks = ::opendir(dir.c_str());
  if (tasks == nullptr) return 0;
  pid_t child = 0;
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream children(dir + "/" + entry->d_name + "/children");
    if (children >> child) break;
    child = 0;
  }
  ::closedir(tasks);
  return child;
}

struct Side {
  std::vector<double> samples;
  double daemon_cpu = 0, worker_cpu = 0, client_cpu = 0;
  std::vector<double> block_p50, block_daemon_cpu;
};

int Main(int argc, char** argv) {
  std::string sandboxd, worker, python_path;
  int blocks = 40, block = 50;
  std::vector<std::string> daemon_flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return arg.compare(0, n, name) == 0 ? argv[i] + n : nullptr;
    };
    if (arg == "--") {
      for (++i; i < argc; ++i) daemon_flags.push_back(argv[i]);
    } else if (const char* v = value("--sandboxd=")) {
      sandboxd = v;
    } else if (const char* v = value("--worker=")) {
      worker = v;
    } else if (const char* v = value("--python_path=")) {
      python_path = v;
    } else if (const char* v = value("--blocks=")) {
      blocks = std::atoi(v);
    } else if (const char* v = value("--block=")) {
      block = std::atoi(v);
    } else {
      Die("usage: frame_wire_ab --sandboxd=PATH --worker=PATH --python_path=DIR "
          "[--blocks=N] [--block=N] [-- daemon flags]");
    }
  }
  char dir[] = "/tmp/agx-ab-XXXXXX";
  if (::mkdtemp(dir) == nullptr) Die("mkdtemp");
  const std::string socket_path = std::string(dir) + "/d.sock";
  std::vector<std::string> args = {sandboxd, "--listen", "unix://" + socket_path,
                                   "--worker=" + worker, "--python_path=" + python_path,
                                   "--log_level=warning"};
  args.insert(args.end(), daemon_flags.begin(), daemon_flags.end());
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  pid_t daemon = 0;
  if (::posix_spawn(&daemon, sandboxd.c_str(), nullptr, nullptr, cargs.data(), environ) != 0) {
    Die("cannot start " + sandboxd);
  }
  const std::string calls_path = socket_path + ".calls";
  for (int i = 0; i < 1500 && ::access(calls_path.c_str(), F_OK) != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  {
    GrpcWire grpc_wire("unix://" + socket_path);
    FrameWire frame_wire(calls_path);
    Wire* wires[2] = {&frame_wire, &grpc_wire};
    for (int i = 0; i < 200; ++i) {  // the worker starts; both wires warm up
      frame_wire.Noop();
      grpc_wire.Noop();
    }
    const pid_t worker_pid = ChildOf(daemon);
    Side sides[2];
    for (int b = 0; b < blocks; ++b) {
      for (int k = 0; k < 2; ++k) {
        const int s = (k + b) % 2;
        Side& side = sides[s];
        std::vector<double> samples;
        const double d0 = ProcessCpuSeconds(daemon);
        const double w0 = worker_pid ? ProcessCpuSeconds(worker_pid) : 0;
        const double c0 = ProcessCpuSeconds(::getpid());
        for (int i = 0; i < block; ++i) {
          const double start = Now();
          wires[s]->Noop();
          samples.push_back(Now() - start);
        }
        const double daemon_cpu = ProcessCpuSeconds(daemon) - d0;
        side.daemon_cpu += daemon_cpu;
        side.worker_cpu += (worker_pid ? ProcessCpuSeconds(worker_pid) : 0) - w0;
        side.client_cpu += ProcessCpuSeconds(::getpid()) - c0;
        side.block_p50.push_back(Percentile(samples, 0.5));
        side.block_daemon_cpu.push_back(daemon_cpu / block);
        side.samples.insert(side.samples.end(), samples.begin(), samples.end());
      }
    }
    std::vector<double> p50_ratio, cpu_ratio;
    for (int b = 0; b < blocks; ++b) {
      p50_ratio.push_back(sides[0].block_p50[b] / sides[1].block_p50[b]);
      cpu_ratio.push_back(sides[0].block_daemon_cpu[b] / sides[1].block_daemon_cpu[b]);
    }
    const char* names[2] = {"frames", "grpc"};
    for (int s = 0; s < 2; ++s) {
      const double n = static_cast<double>(sides[s].samples.size());
      std::printf("%-6s p50 %7.1f us  p99 %7.1f us  daemon CPU %6.1f us/call  worker CPU "
                  "%6.1f us/call  client CPU %6.1f us/call\n",
                  names[s], Percentile(sides[s].samples, 0.5) * 1e6,
                  Percentile(sides[s].samples, 0.99) * 1e6, sides[s].daemon_cpu / n * 1e6,
                  sides[s].worker_cpu / n * 1e6, sides[s].client_cpu / n * 1e6);
    }
    std::printf("frames/grpc, median over %d blocks of %d calls: p50 %.3f, daemon CPU %.3f\n",
                blocks, block, Percentile(p50_ratio, 0.5), Percentile(cpu_ratio, 0.5));
  }
  ::kill(daemon, SIGTERM);
  int status = 0;
  ::waitpid(daemon, &status, 0);
  ::rmdir(dir);
  return 0;
}

}  // namespace
}  // namespace agentix::bench

int main(int argc, char** argv) { return agentix::bench::Main(argc, argv); }
