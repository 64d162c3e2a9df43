// The machine's floor for a gRPC C++ bidi stream over a Unix socket: a
// server process (fork) echoes every message of one bidi stream; the client
// ping-pongs the benchmark's message sizes on it. No protobuf: raw
// ByteBuffers on a generic method, a callback server (as agentix-sandboxd
// serves Calls) and a client driving its own completion queue in the
// calling thread -- the least work gRPC can do per round trip.
//
//   grpc_pingpong [--quick] [--small-bytes=64] [--big-mib=1,16,64]
//                 [--concurrency=16,64] [--unary]
//
// The big message goes as 1 MiB messages (as the remote-call wire cuts
// payloads), echoed one by one; default message limits on both sides.
// --concurrency=N runs N client threads, each ping-ponging on its own bidi
// stream of the one channel (calls_per_s_c<N>, as the C++ client's callers).
// --unary adds the small message as unary calls on the same server
// (unary_p50_us, unary_p99_us, unary_cpu_us_per_call): the floor of one
// unary RPC such as CreateSandbox.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "testing/bench/floor/floor_stats.h"

namespace agentix::bench {
namespace {

constexpr char kMethod[] = "/agentix.bench.Floor/PingPong";
constexpr size_t kPiece = 1 << 20;

// Echoes each message of the stream back, one at a time.
class EchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor() { StartRead(&buffer_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&buffer_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer buffer_;
};

class EchoService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* /*context*/) override {
    return new EchoReactor();
  }
};

[[noreturn]] void Serve(const std::string& address) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the measuring parent
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) ::_exit(3);
  server->Wait();
  ::_exit(0);
}

// One bidi stream driven synchronously on its own completion queue.
class Pinger {
 public:
  explicit Pinger(const std::shared_ptr<grpc::Channel>& channel) : stub_(channel) {
    call_ = stub_.PrepareCall(&context_, kMethod, &cq_);
    call_->StartCall(Tag(1));
    Await(1);
  }
  ~Pinger() {
    call_->WritesDone(Tag(2));
    Await(2);
    grpc::Status status;
    call_->Finish(&status, Tag(3));
    Await(3);
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  // Sends `pieces` messages of `piece` bytes and reads as many back, with a
  // write and a read outstanding at once (the echo cannot run ahead of the
  // reader: it writes each message before reading the next).
  double RoundTrip(const grpc::ByteBuffer& message, int pieces, size_t* got) {
    const double start = Now();
    *got = 0;
    int written = 0, read = 0;
    grpc::ByteBuffer back;
    call_->Write(message, Tag(4));
    call_->Read(&back, Tag(5));
    while (read < pieces) {
      void* tag = nullptr;
      bool ok = false;
      if (!cq_.Next(&tag, &ok) || !ok) Fail("stream operation");
      if (tag == Tag(4)) {
        if (++written < pieces) call_->Write(message, Tag(4));
      } else if (tag == Tag(5)) {
        *got += back.Length();
        if (++read < pieces) call_->Read(&back, Tag(5));
      }
    }
    while (written < pieces) {  // a write completion may come after the last read
      Await(4);
      ++written;
    }
    return Now() - start;
  }

 private:
  static void* Tag(intptr_t n) { return reinterpret_cast<void*>(n); }
  [[noreturn]] static void Fail(const char* what) {
    std::fprintf(stderr, "grpc ping-pong: %s failed\n", what);
    std::exit(1);
  }
  void Await(intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq_.Next(&tag, &ok) || !ok || tag != Tag(want)) Fail("operation");
  }

  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
};

// One unary call of `message` on its own completion queue; seconds.
double Unary(grpc::GenericStub* stub, grpc::CompletionQueue* cq, const grpc::ByteBuffer& message) {
  const double start = Now();
  grpc::ClientContext context;
  grpc::ByteBuffer back;
  grpc::Status status;
  auto call = stub->PrepareUnaryCall(&context, kMethod, message, cq);
  call->StartCall();
  call->Finish(&back, &status, reinterpret_cast<void*>(7));
  void* tag = nullptr;
  bool ok = false;
  if (!cq->Next(&tag, &ok) || !ok || !status.ok() || back.Length() != message.Length()) {
    std::fprintf(stderr, "grpc ping-pong: unary call failed: %s\n", status.error_message().c_str());
    std::exit(1);
  }
  return Now() - start;
}

// `threads` callers, each ping-ponging on its own stream: round trips per
// second over the measuring window.
double Concurrent(const std::shared_ptr<grpc::Channel>& channel, const grpc::ByteBuffer& small,
                  size_t threads, const FloorArgs& args) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> done{0};
  std::vector<std::thread> callers;
  for (size_t i = 0; i < threads; ++i) {
    callers.emplace_back([&] {
      Pinger pinger(channel);
      size_t got = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        pinger.RoundTrip(small, 1, &got);
        done.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(args.window_warmup_s()));
  const uint64_t before = done.load();
  const double start = Now();
  std::this_thread::sleep_for(std::chrono::duration<double>(args.window_s()));
  const uint64_t after = done.load();
  const double took = Now() - start;
  stop = true;
  for (auto& t : callers) t.join();
  return (after - before) / took;
}

grpc::ByteBuffer Buffer(size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 131);
  grpc::Slice slice(data);
  return grpc::ByteBuffer(&slice, 1);
}

int Main(int argc, char** argv) {
  bool unary = false;
  const FloorArgs args = ParseFloorArgs(argc, argv, [&](const char* a) {
    if (std::strcmp(a, "--unary") != 0) return false;
    unary = true;
    return true;
  });
  char dir[] = "/tmp/agx-floor-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return 1;
  const std::string path = std::string(dir) + "/floor.sock";
  const std::string address = "unix://" + path;
  const pid_t child = ::fork();  // before gRPC starts any thread
  if (child == 0) Serve(address);

  int code = 0;
  {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20))) {
      std::fprintf(stderr, "grpc ping-pong server did not come up\n");
      code = 1;
    } else {
      JsonLine json;
      json.Str("kind", "grpc_cpp_bidi");
      json.Num("small_bytes", args.small_bytes);
      const grpc::ByteBuffer small = Buffer(args.small_bytes);
      {
        Pinger pinger(channel);
        size_t got = 0;
        for (int i = 0; i < args.warmup(); ++i) pinger.RoundTrip(small, 1, &got);
        CpuMeter cpu(child);
        std::vector<double> small_rtts;
        for (int i = 0; i < args.calls(); ++i) small_rtts.push_back(pinger.RoundTrip(small, 1, &got));
        AddSmall(&json, small_rtts, cpu.SelfSeconds(), cpu.PeerSeconds());
        for (size_t mib : args.big_mib) {
          const size_t bytes = mib << 20;
          const int pieces = static_cast<int>((bytes + kPiece - 1) / kPiece);
          const grpc::ByteBuffer piece = Buffer(std::min(bytes, kPiece));
          pinger.RoundTrip(piece, pieces, &got);  // warm-up
          cpu.Restart();
          std::vector<double> big_rtts;
          for (int i = 0; i < args.big_reps(); ++i) big_rtts.push_back(pinger.RoundTrip(piece, pieces, &got));
          if (got != static_cast<size_t>(pieces) * std::min(bytes, kPiece)) {
            std::fprintf(stderr, "echo returned %zu bytes\n", got);
            code = 1;
          }
          AddBig(&json, mib, big_rtts, cpu.SelfSeconds() + cpu.PeerSeconds());
        }
      }
      for (size_t threads : args.concurrency) {
        json.Num("calls_per_s_c" + std::to_string(threads), Concurrent(channel, small, threads, args));
      }
      if (unary) {
        grpc::GenericStub stub(channel);
        grpc::CompletionQueue cq;
        for (int i = 0; i < args.warmup(); ++i) Unary(&stub, &cq, small);
        CpuMeter cpu(child);
        std::vector<double> rtts;
        for (int i = 0; i < args.calls(); ++i) rtts.push_back(Unary(&stub, &cq, small));
        json.Num("unary_p50_us", Percentile(rtts, 0.5) * 1e6);
        json.Num("unary_p99_us", Percentile(rtts, 0.99) * 1e6);
        json.Num("unary_cpu_us_per_call", (cpu.SelfSeconds() + cpu.PeerSeconds()) / rtts.size() * 1e6);
        cq.Shutdown();
        void* tag;
        bool ok;
        while (cq.Next(&tag, &ok)) {
        }
      }
      if (code == 0) json.Print();
    }
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::unlink(path.c_str());
  ::rmdir(dir);
  return code;
}

}  // namespace
}  // namespace agentix::bench

int main(int argc, char** argv) { return agentix::bench::Main(argc, argv); }
