#include "worker/direct/direct_conns.h"

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "wire/frame_codec.h"

namespace agentix::worker {
namespace {

using runtime::v1::CallsRequest;
using sandbox::EncodeFrame;
using sandbox::FrameKind;

// A request of `count` StartCalls (ids from `*next`), as a host's frame.
std::string Starts(int count, int* next) {
  CallsRequest request;
  for (int i = 0; i < count; ++i) {
    auto* start = request.add_events()->mutable_start();
    start->set_call_id("call-" + std::to_string((*next)++));
    start->set_callable("mod:fn");
    start->set_arguments("\x80x");  // a pickle's first byte
  }
  return EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
}

void WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    REQUIRE(n > 0);
    done += static_cast<size_t>(n);
  }
}

TEST_CASE("TakeDriverFrames keeps its vectors' capacity across batches",
          "[direct_conns]") {
  // The intake's vector and the sessions' queue swap on each take: a batch
  // after a large one is moved into the large one's buffer, not into a
  // vector grown from empty (the direct path's per-call malloc, stop 40).
  int link[2];
  REQUIRE(::pipe(link) == 0);
  base::UniqueFd link_read(link[0]), link_write(link[1]);
  auto made = DirectConns::Create(link_read.get());
  REQUIRE(made.ok());
  DirectConns& conns = **made;
  int sockets[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) == 0);
  base::UniqueFd host(sockets[0]);
  ipc::Frame handed;
  handed.type = ipc::FrameType::kDirectConn;
  handed.direct_conn.conn = 1;
  handed.direct_conn.client = "client";
  std::vector<base::UniqueFd> fds;
  fds.emplace_back(sockets[1]);
  conns.Accept(handed, std::move(fds));
  REQUIRE(conns.connections() == 1);

  int next = 0;
  auto batch = [&](int calls) -> const std::vector<ipc::Frame>& {
    WriteAll(host.get(), Starts(calls, &next));
    conns.Drive();
    const std::vector<ipc::Frame>& frames = conns.TakeDriverFrames(0);
    REQUIRE(frames.size() == static_cast<size_t>(calls));
    for (const ipc::Frame& f : frames) CHECK(f.type == ipc::FrameType::kCall);
    return frames;
  };
  constexpr int kLarge = 16;
  CHECK(batch(kLarge).back().call_id == "call-15");
  batch(1);  // the queue's buffer was the large one's partner (empty)
  // Both buffers exist now; from here on every take returns one of them,
  // the large one at least every other take.
  size_t largest = 0;
  for (int i = 0; i < 4; ++i) {
    const std::vector<ipc::Frame>& frames = batch(1);
    CHECK(frames.front().call_id == "call-" + std::to_string(kLarge + 1 + i));
    largest = std::max(largest, frames.capacity());
  }
  CHECK(largest >= kLarge);
  conns.FinishAll(absl::StatusCode::kOk, "");
}

}  // namespace
}  // namespace agentix::worker
