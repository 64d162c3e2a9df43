// What FrameConnection's read + write path costs a noop call, against a
// plain socketpair ping-pong of the same bytes in the same run:
//
//   bazel run -c opt //wire:frame_connection_bench -- [--calls=N] [--rounds=R]
//
// Per round, alternating which goes first: `connection` — a host thread
// writes a StartCall MESSAGE frame (the bytes a Python host sends for a
// noop) and blocks reading its answer; a serving thread polls a
// FrameConnection, whose consumer answers each request with a CallResult
// through Send at once (parse, protobuf, batching, the write); `plain` — the
// same host thread, the serving thread polls a socketpair, reads the same
// frame's bytes and writes the same answer's bytes, pre-encoded. Prints each
// round's p50 round trip and CPU a call (both threads: getrusage), then the
// medians of the rounds' connection / plain ratios.
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "wire/frame_codec.h"
#include "wire/frame_connection.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::SandboxEvent;

std::string RequestFrame(int i) {
  CallsRequest request;
  auto* start = request.add_events()->mutable_start();
  start->set_call_id(absl::StrCat("0123456789abcdef0123456789ab", 1000 + i % 1000));
  start->set_callable("bench_targets::noop");
  start->set_arguments(std::string("\x92\x90\x80", 3));  // msgpack ([], {})
  start->set_encoding(runtime::v1::ENCODING_MSGPACK);
  return EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
}

SandboxEventPtr ResultFor(const std::string& id) {
  auto event = std::make_shared<SandboxEvent>();
  event->mutable_result()->set_call_id(id);
  event->mutable_result()->set_encoding(runtime::v1::ENCODING_MSGPACK);
  event->mutable_result()->set_value(std::string(1, '\xc0'));  // nil
  return event;
}

// Reads exactly one frame (blocking).
void ReadFrame(int fd, std::string& buffer) {
  buffer.clear();
  size_t want = kFrameHeaderBytes;
  char chunk[4096];
  while (buffer.size() < want) {
    const ssize_t n = ::recv(fd, chunk, std::min(sizeof(chunk), want - buffer.size()), 0);
    if (n <= 0) std::abort();
    buffer.append(chunk, static_cast<size_t>(n));
    if (buffer.size() == kFrameHeaderBytes) {
      const auto* h = reinterpret_cast<const unsigned char*>(buffer.data());
      want += size_t{h[0]} | size_t{h[1]} << 8 | size_t{h[2]} << 16 |
              size_t{h[3]} << 24;
    }
  }
}

void WriteAll(int fd, const std::string& bytes) {
  if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(bytes.size())) {
    std::abort();
  }
}

double CpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

struct Figures {
  double p50_us;
  double cpu_us;
};

// The host side: N sequential calls; p50 round trip and CPU a call.
Figures Host(int fd, const std::vector<std::string>& frames, int calls) {
  std::vector<double> trips;
  trips.reserve(static_cast<size_t>(calls));
  std::string reply;
  const double cpu = CpuSeconds();
  for (int i = 0; i < calls; ++i) {
    const absl::Time start = absl::Now();
    WriteAll(fd, frames[static_cast<size_t>(i) % frames.size()]);
    ReadFrame(fd, reply);
    trips.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  const double cpu_us = (CpuSeconds() - cpu) * 1e6 / calls;
  std::nth_element(trips.begin(), trips.begin() + trips.size() / 2, trips.end());
  return {trips[trips.size() / 2], cpu_us};
}

class Answerer : public FrameConnectionConsumer {
 public:
  void OnRequest(SplicedRequest& request) override {
    for (const auto& event : request.request.events()) {
      if (!connection->Send({ResultFor(event.start().call_id())}).ok()) std::abort();
    }
  }
  void OnHalfClose() override {}
  void OnEnd(absl::Status) override { ended = true; }
  FrameConnection* connection = nullptr;
  bool ended = false;
};

Figures RunConnection(const std::vector<std::string>& frames, int calls) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
  Answerer answerer;
  auto connection = FrameConnection::Create(fds[1], "", -1, &answerer, {});
  if (!connection.ok()) std::abort();
  answerer.connection = connection->get();
  (*connection)->Start();
  std::thread server([&] {
    FrameConnection& c = **connection;
    while (!answerer.ended) {
      pollfd p{c.fd(), c.PollEvents(), 0};
      if (::poll(&p, 1, -1) <= 0) continue;
      if (p.revents & (POLLIN | POLLHUP | POLLERR)) c.ReadReady();
      if (p.revents & POLLOUT) c.WriteReady();
    }
  });
  const Figures figures = Host(fds[0], frames, calls);
  ::close(fds[0]);  // EOF: the server's loop ends
  server.join();
  return figures;
}

Figures RunPlain(const std::vector<std::string>& frames, int calls) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
  runtime::v1::CallsResponse response;
  *response.add_events() = *ResultFor(std::string(32, 'x'));
  const std::string answer = EncodeFrame(FrameKind::kMessage, response.SerializeAsString());
  std::thread server([&] {
    std::vector<char> buffer(64 << 10);
    for (;;) {
      pollfd p{fds[1], POLLIN, 0};
      if (::poll(&p, 1, -1) <= 0) continue;
      const ssize_t n = ::recv(fds[1], buffer.data(), buffer.size(), MSG_DONTWAIT);
      if (n == 0) break;
      if (n < 0) continue;
      WriteAll(fds[1], answer);
    }
  });
  const Figures figures = Host(fds[0], frames, calls);
  ::close(fds[0]);
  server.join();
  ::close(fds[1]);
  return figures;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int Main(int argc, char** argv) {
  int calls = 20000;
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--calls=", 0) == 0 && absl::SimpleAtoi(arg.substr(8), &calls) && calls > 0) continue;
    if (arg.rfind("--rounds=", 0) == 0 && absl::SimpleAtoi(arg.substr(9), &rounds) && rounds > 0) continue;
    std::fprintf(stderr, "usage: frame_connection_bench [--calls=N] [--rounds=R]\n");
    return 2;
  }
  std::vector<std::string> frames;
  for (int i = 0; i < 1000; ++i) frames.push_back(RequestFrame(i));
  std::vector<double> p50_ratios, cpu_ratios;
  for (int round = 0; round < rounds; ++round) {
    Figures connection, plain;
    if (round % 2 == 0) {
      connection = RunConnection(frames, calls);
      plain = RunPlain(frames, calls);
    } else {
      plain = RunPlain(frames, calls);
      connection = RunConnection(frames, calls);
    }
    std::printf("round %d: connection p50 %.1f us, CPU %.1f us/call; plain p50 %.1f us, "
                "CPU %.1f us/call; ratios p50 %.3f, CPU %.3f\n",
                round + 1, connection.p50_us, connection.cpu_us, plain.p50_us,
                plain.cpu_us, connection.p50_us / plain.p50_us,
                connection.cpu_us / plain.cpu_us);
    p50_ratios.push_back(connection.p50_us / plain.p50_us);
    cpu_ratios.push_back(connection.cpu_us / plain.cpu_us);
  }
  std::printf("median of %d rounds (%d calls each), connection / plain: p50 %.3f, "
              "CPU a call %.3f\n",
              rounds, calls, Median(p50_ratios), Median(cpu_ratios));
  return 0;
}

}  // namespace
}  // namespace agentix::sandbox

int main(int argc, char** argv) { return agentix::sandbox::Main(argc, argv); }
