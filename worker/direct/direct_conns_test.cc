#include "worker/direct/direct_conns.h"

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <utility>
#include <string>
#include <thread>
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

// A DirectConns whose link is a pipe, and the host end of the connection
// handed to it (HandOver).
struct DirectFixture {
  base::UniqueFd link_read, link_write, host;
  std::unique_ptr<DirectConns> conns;

  DirectFixture() {
    int link[2];
    REQUIRE(::pipe(link) == 0);
    link_read.Reset(link[0]);
    link_write.Reset(link[1]);
    auto made = DirectConns::Create(link_read.get());
    REQUIRE(made.ok());
    conns = std::move(*made);
  }

  // Accepts a socket as the kDirectConn `handed` describes; `host` is its
  // other end.
  void HandOver(ipc::Frame handed) {
    int sockets[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) == 0);
    host.Reset(sockets[0]);
    handed.type = ipc::FrameType::kDirectConn;
    std::vector<base::UniqueFd> fds;
    fds.emplace_back(sockets[1]);
    conns->Accept(handed, std::move(fds));
  }
};

// Serve() hands over one Calls connection of client "client".
struct OneClient : DirectFixture {
  void Serve() {
    ipc::Frame handed;
    handed.direct_conn.conn = 1;
    handed.direct_conn.client = "client";
    HandOver(std::move(handed));
    REQUIRE(conns->connections() == 1);
  }
};

TEST_CASE("TakeDriverFrames keeps its vectors' capacity across batches",
          "[direct_conns]") {
  // The intake's vector and the sessions' queue swap on each take: a batch
  // after a large one is moved into the large one's buffer, not into a
  // vector grown from empty (the direct path's per-call malloc, stop 40).
  OneClient client;
  client.Serve();
  DirectConns& conns = *client.conns;
  const base::UniqueFd& host = client.host;

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

TEST_CASE("LookReady says whether the link is readable; Drive serves what it saw",
          "[direct_conns]") {
  OneClient client;
  DirectConns& conns = *client.conns;
  // No direct connection yet: the link is read as it always was.
  CHECK(conns.LookReady());
  client.Serve();
  const base::UniqueFd& host = client.host;
  const base::UniqueFd& link_read = client.link_read;
  const base::UniqueFd& link_write = client.link_write;

  int next = 0;
  // A direct call only: the link has nothing, and the Drive after the look
  // reads the call the look saw.
  WriteAll(host.get(), Starts(1, &next));
  CHECK_FALSE(conns.LookReady());
  conns.Drive();
  CHECK(conns.TakeDriverFrames(0).size() == 1);

  // The link readable (with or without a direct call beside it): said so,
  // and the direct call is still served.
  WriteAll(link_write.get(), "x");
  CHECK(conns.LookReady());
  conns.Drive();
  CHECK(conns.TakeDriverFrames(0).empty());
  WriteAll(host.get(), Starts(1, &next));
  CHECK(conns.LookReady());  // level-triggered: the unread byte still counts
  conns.Drive();
  const std::vector<ipc::Frame>& frames = conns.TakeDriverFrames(0);
  REQUIRE(frames.size() == 1);
  CHECK(frames.front().call_id == "call-1");
  char byte;
  REQUIRE(::read(link_read.get(), &byte, 1) == 1);
  CHECK_FALSE(conns.LookReady());
  conns.Drive();

  // A call that comes after a look (kept by no Drive yet) is served by the
  // next look's Drive: nothing is lost between them.
  CHECK_FALSE(conns.LookReady());
  WriteAll(host.get(), Starts(1, &next));
  conns.Drive();  // the kept look saw nothing
  CHECK(conns.TakeDriverFrames(0).empty());
  CHECK_FALSE(conns.LookReady());
  conns.Drive();
  CHECK(conns.TakeDriverFrames(0).size() == 1);
  conns.FinishAll(absl::StatusCode::kOk, "");
}

TEST_CASE("WaitReady blocks until the poll set is ready and its events are the next look's",
          "[direct_conns]") {
  OneClient client;
  client.Serve();
  DirectConns& conns = *client.conns;
  // Nothing ready: a wait with a timeout comes back empty.
  int next = 0;
  CHECK(conns.WaitReady(10) == 0);

  // A direct call wakes a waiting holder; the look after the wait is the
  // wait's (no epoll_wait of its own), and so is the Drive's after it.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    WriteAll(client.host.get(), Starts(1, &next));
  });
  CHECK(conns.WaitReady(-1) == 1);
  writer.join();
  const int64_t looks = conns.own_looks();
  CHECK_FALSE(conns.LookReady());
  conns.Drive();
  CHECK(conns.own_looks() == looks);
  CHECK(conns.TakeDriverFrames(0).size() == 1);
  // The next look is its own again.
  CHECK_FALSE(conns.LookReady());
  CHECK(conns.own_looks() == looks + 1);
  conns.Drive();

  // The link readable: the wait's look says so.
  WriteAll(client.link_write.get(), "x");
  CHECK(conns.WaitReady(-1) == 1);
  CHECK(conns.LookReady());
  CHECK(conns.own_looks() == looks + 1);
  conns.Drive();
  char byte;
  REQUIRE(::read(client.link_read.get(), &byte, 1) == 1);

  // WakeWaiter ends a wait in progress (and the Drive after drains it: the
  // next wait blocks again).
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    conns.WakeWaiter();
  });
  CHECK(conns.WaitReady(5000) == 1);
  waker.join();
  CHECK_FALSE(conns.LookReady());
  conns.Drive();
  CHECK(conns.WaitReady(10) == 0);

  // A call that comes after the wait is not lost: the wait's look missed
  // it, the next look (its own) sees it.
  WriteAll(client.link_write.get(), "x");
  CHECK(conns.WaitReady(-1) == 1);
  WriteAll(client.host.get(), Starts(1, &next));
  CHECK(conns.LookReady());
  conns.Drive();
  CHECK(conns.TakeDriverFrames(0).empty());
  REQUIRE(::read(client.link_read.get(), &byte, 1) == 1);
  CHECK_FALSE(conns.LookReady());
  conns.Drive();
  CHECK(conns.TakeDriverFrames(0).size() == 1);
  conns.FinishAll(absl::StatusCode::kOk, "");
}

// Reads whole frames from `fd` until `count` came (or EOF).
std::vector<std::pair<FrameKind, std::string>> ReadFrames(int fd, size_t count) {
  std::vector<std::pair<FrameKind, std::string>> frames;
  std::string buffer;
  char chunk[4096];
  while (frames.size() < count) {
    absl::StatusOr<sandbox::FrameView> frame = sandbox::ParseFrame(buffer);
    REQUIRE(frame.ok());
    if (frame->frame_bytes != 0) {
      frames.emplace_back(frame->kind, std::string(frame->payload));
      buffer.erase(0, frame->frame_bytes);
      continue;
    }
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
  }
  return frames;
}

std::string HostEvent(const std::string& event, const std::string& request_id) {
  runtime::v1::NamespaceRequest request;
  request.mutable_event()->set_event(event);
  request.mutable_event()->set_data("\xc0");
  request.mutable_event()->set_request_id(request_id);
  return EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
}

struct NamespaceConn : DirectFixture {
  // A Namespace stream of `name` handed over with `pre` read past `open`.
  explicit NamespaceConn(const std::string& name, const std::string& pre = "") {
    ipc::Frame handed;
    handed.direct_conn.conn = 7;
    handed.direct_conn.ns_name = name;
    handed.direct_conn.instance_id = "inst-1";
    handed.data = pre;
    HandOver(std::move(handed));
  }
};

TEST_CASE("A handed-over Namespace stream: opened, host events to the driver, "
          "sandbox events to the host", "[direct_conns][namespace]") {
  // The host pipelined an event behind its `open`: the daemon passes it on.
  NamespaceConn c("/plug", HostEvent("config", ""));
  REQUIRE(c.conns->connections() == 1);
  // `opened` is the worker's, written once the link's host_connected for
  // the name became the sandbox's record: the host starts behind it.
  c.conns->OnHostConnected("/other");  // not this stream's
  ipc::Frame early;
  early.type = ipc::FrameType::kNamespaceEvent;
  early.ns.name = "/plug";
  early.ns.event = "early";
  CHECK(c.conns->SendNamespaceEvent(early));  // dropped: no host yet
  char byte;
  CHECK(::recv(c.host.get(), &byte, 1, MSG_DONTWAIT) < 0);
  c.conns->OnHostConnected("/plug");
  auto frames = ReadFrames(c.host.get(), 1);
  REQUIRE(frames.size() == 1);
  runtime::v1::NamespaceResponse opened;
  REQUIRE(opened.ParseFromString(frames[0].second));
  CHECK(opened.opened());
  CHECK(opened.namespace_() == "/plug");
  CHECK(opened.instance_id() == "inst-1");
  CHECK(opened.events_size() == 0);
  c.conns->OnHostConnected("/plug");  // once

  WriteAll(c.host.get(), HostEvent("answer:result", "r1"));
  c.conns->Drive();
  const std::vector<ipc::Frame>& taken = c.conns->TakeDriverFrames(0);
  REQUIRE(taken.size() == 2);
  CHECK(taken[0].type == ipc::FrameType::kNamespaceEvent);
  CHECK(taken[0].ns.name == "/plug");
  CHECK(taken[0].ns.event == "config");
  CHECK(taken[1].ns.event == "answer:result");
  CHECK(taken[1].ns.request_id == "r1");
  CHECK(taken[1].data == "\xc0");

  ipc::Frame out;
  out.type = ipc::FrameType::kNamespaceEvent;
  out.ns.name = "/plug";
  out.ns.event = "answer";
  out.ns.request_id = "q1";
  out.ns.has_error = true;
  out.ns.error_type = "Busy";
  out.ns.status_code = 503;
  out.data = "\x81";
  CHECK(c.conns->SendNamespaceEvent(out));  // written here, not on the link
  frames = ReadFrames(c.host.get(), 1);
  REQUIRE(frames.size() == 1);
  runtime::v1::NamespaceResponse response;
  REQUIRE(response.ParseFromString(frames[0].second));
  CHECK(response.namespace_() == "/plug");
  CHECK(response.instance_id() == "inst-1");
  REQUIRE(response.events_size() == 1);
  CHECK(response.events(0).event() == "answer");
  CHECK(response.events(0).request_id() == "q1");
  CHECK(response.events(0).data() == "\x81");
  CHECK(response.events(0).error().type() == "Busy");
  CHECK(response.events(0).error().status_code() == 503);

  // Another name's events are the link's; so are this one's, too, once a
  // relayed stream opened on it.
  ipc::Frame other = out;
  other.ns.name = "/other";
  CHECK_FALSE(c.conns->SendNamespaceEvent(other));
  c.conns->OnNamespaceRelayed("/plug");
  CHECK_FALSE(c.conns->SendNamespaceEvent(out));
  CHECK(ReadFrames(c.host.get(), 1).size() == 1);  // and written here

  // The host goes: the daemon is told, and the name has no stream any more.
  c.host.Reset();
  c.conns->Drive();
  auto closed = c.conns->TakeClosed();
  REQUIRE(closed.size() == 1);
  CHECK(closed[0].first == 7);
  CHECK(c.conns->connections() == 0);
  CHECK_FALSE(c.conns->SendNamespaceEvent(out));
}

TEST_CASE("A handed-over Namespace stream refuses what the daemon refuses",
          "[direct_conns][namespace]") {
  struct Case {
    std::string bytes;
    uint32_t code;
    std::string words;
  };
  runtime::v1::NamespaceRequest reopen;
  reopen.mutable_open()->set_namespace_("/plug");
  const std::vector<Case> cases = {
      {EncodeFrame(FrameKind::kMessage, reopen.SerializeAsString()), 9,
       "already carries namespace /plug"},
      {HostEvent("agentix:host_connected", ""), 3, "reserved for the daemon"},
      {HostEvent(std::string(1025, 'e'), ""), 3, "event name of 1025 bytes"},
      {HostEvent("e", std::string(257, 'r')), 3, "request_id of 257 bytes"},
      {EncodeFrame(FrameKind::kMessage, "\xff\xff\xff"), 3,
       "unparseable NamespaceRequest"},
  };
  for (const Case& k : cases) {
    INFO(k.words);
    NamespaceConn c("/plug");
    c.conns->OnHostConnected("/plug");
    REQUIRE(ReadFrames(c.host.get(), 1).size() == 1);  // opened
    WriteAll(c.host.get(), k.bytes);
    c.conns->Drive();
    auto frames = ReadFrames(c.host.get(), 1);
    REQUIRE(frames.size() == 1);
    REQUIRE(frames[0].first == FrameKind::kStatus);
    uint32_t code = 0;
    std::memcpy(&code, frames[0].second.data(), sizeof code);
    CHECK(code == k.code);
    CHECK(frames[0].second.find(k.words) != std::string::npos);
    CHECK(c.conns->TakeDriverFrames(0).empty());
  }
}

}  // namespace
}  // namespace agentix::worker
