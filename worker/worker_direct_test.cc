// The real agentix-worker serving handed-over Calls connections
// (docs/DIRECT-CALLS.md, stage 3): the test plays the daemon on the link
// (direct_conn with the socket passed by SCM_RIGHTS, as the daemon does) and
// the host on the other end of a socketpair, speaking raw frame-wire bytes.
#include <sys/socket.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "wire/frame_codec.h"
#include "worker/ipc/descriptors.h"
#include "worker/ipc/ledger.h"
#include "worker/ipc/payload_area.h"
#include "worker/ipc/session_state.h"
#include "worker/worker_test_util.h"

namespace agentix::worker {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;
using runtime::v1::SandboxEvent;
using sandbox::EncodeFrame;
using sandbox::FrameKind;

// msgpack [[value], {}]: the arguments of f(value).
std::string OneArg(const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& value) {
  return Msgpack([&](auto& p) {
    p.pack_array(2);
    p.pack_array(1);
    value(p);
    p.pack_map(0);
  });
}

std::string NoArgs() {
  return Msgpack([](auto& p) {
    p.pack_array(2);
    p.pack_array(0);
    p.pack_map(0);
  });
}

// The host's end of one handed-over connection.
class Host {
 public:
  // Hands the other end to `worker` as connection `conn` of `client`.
  // `follow`: the calls-CPU answers the host asked for (0, 1, 2).
  Host(Worker& worker, uint64_t conn, const std::string& client,
       const std::string& pre = "", uint32_t client_slot = 0,
       uint32_t follow = 0) {
    int fds[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    fd_.Reset(fds[0]);
    base::UniqueFd theirs(fds[1]);
    Frame direct;
    direct.type = FrameType::kDirectConn;
    direct.direct_conn.conn = conn;
    direct.direct_conn.client = client;
    direct.direct_conn.client_slot = client_slot;
    direct.direct_conn.max_payload = uint64_t{64} << 20;
    direct.direct_conn.upload_idle_ms = 60000;
    direct.direct_conn.max_retained = 4096;
    direct.direct_conn.max_retained_bytes = uint64_t{512} << 20;
    direct.direct_conn.max_stream_window = 1024;
    direct.direct_conn.stalled_ms = 20000;
    direct.direct_conn.follow = follow;
    direct.data = pre;
    std::string bytes;
    REQUIRE_OK(ipc::AppendFrame(direct, bytes));
    const int pass[] = {theirs.get()};
    REQUIRE_OK(ipc::SendWithDescriptors(worker.fd(), bytes, pass));
  }

  void Write(const std::string& bytes) {
    REQUIRE_OK(ipc::WriteAll(fd_.get(), bytes));
  }
  void Send(const CallsRequest& request) {
    Write(EncodeFrame(FrameKind::kMessage, request.SerializeAsString()));
  }
  static std::string StartFrame(const std::string& id,
                                const std::string& callable,
                                const std::string& args,
                                uint32_t window = 0) {
    CallsRequest request;
    auto* start = request.add_events()->mutable_start();
    start->set_call_id(id);
    start->set_callable(callable);
    start->set_encoding(runtime::v1::ENCODING_MSGPACK);
    start->set_arguments(args);
    start->set_stream_window(window);
    return EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
  }
  void Start(const std::string& id, const std::string& callable,
             const std::string& args, uint32_t window = 0) {
    Write(StartFrame(id, callable, args, window));
  }
  void Cancel(const std::string& id) {
    CallsRequest request;
    request.add_events()->mutable_cancel()->set_call_id(id);
    Send(request);
  }
  void Resume(const std::string& id) {
    CallsRequest request;
    request.add_events()->mutable_resume()->add_call_ids(id);
    Send(request);
  }
  void Ack(const std::string& id) {
    CallsRequest request;
    request.add_events()->mutable_ack()->set_call_id(id);
    Send(request);
  }
  void StreamAck(const std::string& id, uint64_t next) {
    CallsRequest request;
    auto* ack = request.add_events()->mutable_stream_ack();
    ack->set_call_id(id);
    ack->set_next_index(next);
    Send(request);
  }
  void HalfClose() { Write(EncodeFrame(FrameKind::kHalfClose, "")); }

  // The next frame from the worker (MESSAGE, STATUS or HELLO); kind 0 at
  // EOF. Bounded by `timeout`.
  std::pair<FrameKind, std::string> NextFrame(
      absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      absl::StatusOr<sandbox::FrameView> frame = sandbox::ParseFrame(buffer_);
      if (frame.ok() && frame->frame_bytes > 0) {
        std::pair<FrameKind, std::string> out{frame->kind,
                                              std::string(frame->payload)};
        buffer_.erase(0, frame->frame_bytes);
        return out;
      }
      REQUIRE(absl::Now() < deadline);
      pollfd pfd{fd_.get(), POLLIN, 0};
      ::poll(&pfd, 1, 100);
      char chunk[1 << 16];
      const ssize_t n = ::recv(fd_.get(), chunk, sizeof chunk, MSG_DONTWAIT);
      if (n == 0) return {FrameKind{0}, ""};
      if (n > 0) buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  // The next CallsResponse event (STATUS frames are a failure here).
  SandboxEvent NextEvent() {
    while (pending_.empty()) {
      auto [kind, payload] = NextFrame();
      INFO("frame kind " << static_cast<int>(kind) << ": " << payload);
      REQUIRE(kind == FrameKind::kMessage);
      CallsResponse response;
      REQUIRE(response.ParseFromString(payload));
      for (const SandboxEvent& event : response.events()) {
        pending_.push_back(event);
      }
    }
    SandboxEvent event = pending_.front();
    pending_.pop_front();
    return event;
  }

  // The terminal event of the next call to end; result chunks joined.
  SandboxEvent Terminal(std::string* value = nullptr) {
    std::string joined;
    while (true) {
      SandboxEvent event = NextEvent();
      if (event.has_result_chunk()) {
        joined += event.result_chunk().data();
        continue;
      }
      if (event.has_stream_item()) continue;
      if (event.has_result()) joined += event.result().value();
      if (value != nullptr) *value = joined;
      return event;
    }
  }

  // The STATUS the worker ended the stream with, then EOF.
  int Status() {
    auto [kind, payload] = NextFrame();
    REQUIRE(kind == FrameKind::kStatus);
    REQUIRE_OK_AND_ASSIGN(sandbox::FrameStatus status,
                          sandbox::DecodeStatus(payload));
    REQUIRE(NextFrame().first == FrameKind{0});
    return static_cast<int>(status.code);
  }

  void Close() { fd_.Reset(); }

 private:
  base::UniqueFd fd_;
  std::string buffer_;
  std::deque<SandboxEvent> pending_;
};

// msgpack of a value as the worker encodes the result of echo(value).
std::string Packed(const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& value) {
  return Msgpack(value);
}

// The link's direct_closed for `conn` (other frames set aside or skipped).
Frame AwaitClosed(Worker& worker, uint64_t conn) {
  while (true) {
    REQUIRE_OK_AND_ASSIGN(Frame frame, worker.Next(absl::Seconds(30)));
    if (frame.type == FrameType::kDirectClosed &&
        frame.direct_conn.conn == conn) {
      return frame;
    }
  }
}

// A worker told to serve handed-over connections, as the daemon's
// --direct_calls starts it.
WorkerArgs DirectWorker() {
  WorkerArgs args;
  args.args = {"--direct_calls"};
  return args;
}

TEST_CASE("without --direct_calls the worker does not advertise direct calls "
          "and refuses a hand-over with STATUS 14") {
  Worker worker;
  REQUIRE_OK_AND_ASSIGN(Frame ready, worker.Next(absl::Seconds(20)));
  REQUIRE(ready.type == FrameType::kReady);
  CHECK(!ready.direct);
  Host host(worker, 7, "client-a");
  CHECK(host.Status() == 14);
  AwaitClosed(worker, 7);
}

TEST_CASE("the worker advertises direct calls and serves a noop") {
  Worker worker(DirectWorker());
  REQUIRE_OK_AND_ASSIGN(Frame ready, worker.Next(absl::Seconds(20)));
  REQUIRE(ready.type == FrameType::kReady);
  CHECK(ready.direct);
  Host host(worker, 1, "client-a");
  host.Start("noop-1", "worker_fixture::echo",
             OneArg([](auto& p) { p.pack_nil(); }));
  std::string value;
  SandboxEvent end = host.Terminal(&value);
  REQUIRE(end.has_result());
  CHECK(end.result().call_id() == "noop-1");
  CHECK(value == Packed([](auto& p) { p.pack_nil(); }));
  // The link saw no frame of the call: its result went to the host only.
  host.HalfClose();
  CHECK(host.Status() == 0);
  Frame closed = AwaitClosed(worker, 1);
  CHECK(!closed.detail.empty());
}

TEST_CASE("pre-read bytes, a 9 MiB echo in chunks, both ways") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  const std::string big(9 << 20, 'z');
  const std::string args = OneArg([&](auto& p) {
    p.pack_bin(big.size());
    p.pack_bin_body(big.data(), big.size());
  });
  // The first StartCall came with HELLO's read: it is in `pre`.
  const std::string first = Host::StartFrame(
      "pre-1", "worker_fixture::echo", OneArg([](auto& p) { p.pack(7); }));
  Host host(worker, 2, "client-b", first);
  SandboxEvent end = host.Terminal();
  REQUIRE(end.has_result());
  CHECK(end.result().call_id() == "pre-1");

  // 9 MiB of arguments in one StartCall and a chunk, as a host uploads.
  CallsRequest start;
  auto* s = start.add_events()->mutable_start();
  s->set_call_id("big-1");
  s->set_callable("worker_fixture::echo");
  s->set_encoding(runtime::v1::ENCODING_MSGPACK);
  s->set_arguments(args.substr(0, 3 << 20));
  s->set_arguments_size(args.size());
  host.Send(start);
  for (size_t off = 3 << 20; off < args.size(); off += 3 << 20) {
    CallsRequest chunk;
    auto* c = chunk.add_events()->mutable_argument_chunk();
    c->set_call_id("big-1");
    c->set_data(args.substr(off, 3 << 20));
    c->set_offset(off);
    host.Send(chunk);
  }
  std::string value;
  end = host.Terminal(&value);
  REQUIRE(end.has_result());
  CHECK(end.result().call_id() == "big-1");
  CHECK(value == Packed([&](auto& p) {
          p.pack_bin(big.size());
          p.pack_bin_body(big.data(), big.size());
        }));
}

// Starts `id` with `args` uploaded in pieces cut at `cuts` (increasing
// offsets inside it), as a host uploads: the first in the StartCall, the
// others in argument chunks.
void Upload(Host& host, const std::string& id, const std::string& args,
            const std::vector<size_t>& cuts) {
  CallsRequest start;
  auto* s = start.add_events()->mutable_start();
  s->set_call_id(id);
  s->set_callable("worker_fixture::echo");
  s->set_encoding(runtime::v1::ENCODING_PICKLE);
  s->set_arguments(args.substr(0, cuts.front()));
  s->set_arguments_size(args.size());
  host.Send(start);
  for (size_t i = 0; i < cuts.size(); ++i) {
    const size_t end = i + 1 < cuts.size() ? cuts[i + 1] : args.size();
    CallsRequest chunk;
    auto* c = chunk.add_events()->mutable_argument_chunk();
    c->set_call_id(id);
    c->set_data(args.substr(cuts[i], end - cuts[i]));
    c->set_offset(cuts[i]);
    host.Send(chunk);
  }
}

TEST_CASE("pickled arguments cut at every byte around their large values "
          "land intact; over-long ones are refused") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  Host host(worker, 12, "client-pieces");
  // Two values the intake takes out of the stream (BINBYTES8, BYTEARRAY8:
  // 64 KiB or more) between small ones.
  const std::string value =
      "(1, bytes(range(256)) * 1024, 'x', bytearray(b'y' * 100000), 2)";
  const std::string args = Pickle("((" + value + ",), {})");
  const std::string expected = Pickle(value);
  std::string first_value(256, '\0');
  for (int i = 0; i < 256; ++i) first_value[i] = static_cast<char>(i);
  const size_t bytes_at = args.find(first_value);
  const size_t bytearray_at = args.find(std::string(1000, 'y'));
  REQUIRE(bytes_at != std::string::npos);
  REQUIRE(bytearray_at != std::string::npos);
  // Every cut from before each value's opcode and 8-byte length to its
  // first bytes, around its end, and at the stream's last bytes; each with
  // a one-byte piece after it.
  std::vector<size_t> at;
  for (size_t v : {bytes_at, bytearray_at}) {
    for (size_t k = v - 12; k <= v + 2; ++k) at.push_back(k);
  }
  for (size_t k = bytes_at + (256 << 10) - 2; k <= bytes_at + (256 << 10) + 2;
       ++k) {
    at.push_back(k);
  }
  for (size_t k = args.size() - 3; k < args.size() - 1; ++k) at.push_back(k);
  int n = 0;
  for (size_t k : at) {
    const std::string id = absl::StrCat("piece-", n++);
    INFO("cut at " << k << " of " << args.size());
    Upload(host, id, args, {k, k + 1});
    std::string got;
    SandboxEvent end = host.Terminal(&got);
    REQUIRE(end.has_result());
    CHECK(end.result().call_id() == id);
    CHECK(got == expected);
  }

  // One byte more than announced: refused, and the next call is served.
  CallsRequest start;
  auto* s = start.add_events()->mutable_start();
  s->set_call_id("over-1");
  s->set_callable("worker_fixture::echo");
  s->set_encoding(runtime::v1::ENCODING_PICKLE);
  s->set_arguments(args.substr(0, bytes_at));
  s->set_arguments_size(args.size());
  host.Send(start);
  CallsRequest chunk;
  auto* c = chunk.add_events()->mutable_argument_chunk();
  c->set_call_id("over-1");
  c->set_data(args.substr(bytes_at) + "!");
  c->set_offset(bytes_at);
  host.Send(chunk);
  SandboxEvent end = host.Terminal();
  REQUIRE(end.has_error());
  CHECK(end.error().call_id() == "over-1");
  CHECK(end.error().error().type() == "BadRequest");
  Upload(host, "after-over", args, {bytes_at});
  std::string got;
  end = host.Terminal(&got);
  REQUIRE(end.has_result());
  CHECK(got == expected);
}

TEST_CASE("a stream with window 2 waits for the host's acks") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  Host host(worker, 3, "client-c");
  host.Start("gen-1", "worker_fixture::gen_count",
             OneArg([](auto& p) { p.pack(5); }), /*window=*/2);
  std::vector<uint64_t> seen;
  for (int i = 0; i < 2; ++i) {
    SandboxEvent event = host.NextEvent();
    REQUIRE(event.has_stream_item());
    seen.push_back(event.stream_item().index());
  }
  CHECK(seen == std::vector<uint64_t>{0, 1});
  // Nothing more until acked.
  pollfd nothing{-1, 0, 0};
  ::poll(&nothing, 0, 200);
  host.StreamAck("gen-1", 2);
  for (int i = 2; i < 5; ++i) {
    SandboxEvent event = host.NextEvent();
    REQUIRE(event.has_stream_item());
    CHECK(event.stream_item().index() == static_cast<uint64_t>(i));
    if (i == 3) host.StreamAck("gen-1", 4);
  }
  host.StreamAck("gen-1", 5);
  SandboxEvent end = host.Terminal();
  CHECK(end.has_result());
}

TEST_CASE("cancel, an exception, and a relayed call of a direct id") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  Host host(worker, 4, "client-d");
  host.Start("sleep-1", "worker_fixture::sleep_async",
             OneArg([](auto& p) { p.pack(30); }));
  // The relayed call of the same id is refused on the link: one owner.
  absl::SleepFor(absl::Milliseconds(200));
  worker.Call("sleep-1", "worker_fixture::echo", NoArgs(), 2);
  REQUIRE_OK_AND_ASSIGN(Frame refused, worker.Next(absl::Seconds(30)));
  REQUIRE(refused.type == FrameType::kError);
  CHECK(refused.call_id == "sleep-1");
  CHECK(refused.error.type == "CallIdInUse");
  host.Cancel("sleep-1");
  SandboxEvent end = host.Terminal();
  REQUIRE(end.has_error());
  CHECK(end.error().error().cancelled());

  host.Start("fail-1", "worker_fixture::gen_then_fail",
             OneArg([](auto& p) { p.pack(0); }), 4);
  end = host.Terminal();
  REQUIRE(end.has_error());
  CHECK(end.error().error().type() == "ValueError");
}

TEST_CASE("a second connection of the client resumes the first's call") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  {
    Host first(worker, 5, "client-e");
    first.Start("slow-1", "worker_fixture::sleep_sync",
                OneArg([](auto& p) { p.pack(1); }));
    absl::SleepFor(absl::Milliseconds(100));
    first.Close();  // the host's connection is cut
  }
  Frame closed = AwaitClosed(worker, 5);
  CHECK(absl::StrContains(closed.detail, "UNAVAILABLE"));
  Host second(worker, 6, "client-e");
  second.Resume("slow-1");
  SandboxEvent end = second.Terminal();
  REQUIRE(end.has_result());
  CHECK(end.result().call_id() == "slow-1");
}

TEST_CASE("shutdown ends a running direct call, then STATUS 14") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  Host host(worker, 7, "client-f");
  host.Start("sleep-2", "worker_fixture::sleep_sync",
             OneArg([](auto& p) { p.pack(30); }));
  absl::SleepFor(absl::Milliseconds(200));
  worker.Shutdown();
  SandboxEvent end = host.Terminal();
  INFO(end.DebugString());
  REQUIRE(end.has_error());
  CHECK(end.error().call_id() == "sleep-2");
  CHECK(host.Status() == 14);
}

// The session_state pieces answering a collapse, decoded (other frames,
// e.g. direct_closed, skipped).
ipc::SessionState AwaitSessionState(Worker& worker, const std::string& client) {
  ipc::SessionState state;
  while (true) {
    REQUIRE_OK_AND_ASSIGN(Frame frame, worker.Next(absl::Seconds(30)));
    if (frame.type != FrameType::kSessionState) continue;
    CHECK(frame.direct_conn.client == client);
    REQUIRE_OK(ipc::DecodeSessionStatePiece(frame.record, state));
    if (frame.last) return state;
  }
}

void SendCollapse(Worker& worker, const std::string& client) {
  Frame collapse;
  collapse.type = FrameType::kCollapse;
  collapse.direct_conn.client = client;
  worker.Send(collapse);
}

TEST_CASE("collapse: STATUS 14 to the client's connection, its session as "
          "session_state, a running call's later result on the link") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  Host host(worker, 8, "client-g");
  host.Start("done-1", "worker_fixture::echo",
             OneArg([](auto& p) { p.pack(3); }));
  SandboxEvent first = host.Terminal();
  REQUIRE(first.has_result());
  host.Start("slow-3", "worker_fixture::sleep_sync",
             OneArg([](auto& p) { p.pack(1); }));
  absl::SleepFor(absl::Milliseconds(200));
  SendCollapse(worker, "client-g");
  const ipc::SessionState state = AwaitSessionState(worker, "client-g");
  CHECK(host.Status() == 14);
  REQUIRE(state.calls.size() == 2);
  std::map<std::string, ipc::CollapsedCall> calls;
  for (const ipc::CollapsedCall& call : state.calls) calls[call.id] = call;
  REQUIRE(calls.count("done-1") == 1);
  CHECK(!calls["done-1"].running);
  REQUIRE(calls["done-1"].delivered.size() == 1);
  SandboxEvent retained;
  REQUIRE(retained.ParseFromString(calls["done-1"].delivered[0]));
  CHECK(retained.result().call_id() == "done-1");
  REQUIRE(calls.count("slow-3") == 1);
  CHECK(calls["slow-3"].running);
  // The daemon's now: its result comes on the link.
  while (true) {
    REQUIRE_OK_AND_ASSIGN(Frame frame, worker.Next(absl::Seconds(30)));
    if (frame.type != FrameType::kResult) continue;
    CHECK(frame.call_id == "slow-3");
    break;
  }
  // Another collapse of the client, or of one never seen: empty.
  SendCollapse(worker, "client-g");
  ipc::SessionState again = AwaitSessionState(worker, "client-g");
  CHECK(again.calls.empty());
  CHECK(again.finished.empty());
  SendCollapse(worker, "nobody");
  CHECK(AwaitSessionState(worker, "nobody").calls.empty());
}

TEST_CASE("acked ids come back as finished; a worker without --direct_calls "
          "answers an empty session_state") {
  SECTION("finished ids") {
    Worker worker(DirectWorker());
    worker.AwaitReady();
    Host host(worker, 9, "client-h");
    host.Start("acked-1", "worker_fixture::echo",
               OneArg([](auto& p) { p.pack(1); }));
    REQUIRE(host.Terminal().has_result());
    CallsRequest ack;
    ack.add_events()->mutable_ack()->set_call_id("acked-1");
    host.Send(ack);
    absl::SleepFor(absl::Milliseconds(200));
    SendCollapse(worker, "client-h");
    const ipc::SessionState state = AwaitSessionState(worker, "client-h");
    CHECK(state.calls.empty());
    CHECK(state.finished == std::vector<std::string>{"acked-1"});
  }
  SECTION("no direct calls") {
    Worker worker;
    worker.AwaitReady();
    SendCollapse(worker, "client-i");
    CHECK(AwaitSessionState(worker, "client-i").calls.empty());
  }
}

TEST_CASE("with a ledger in the payload area, a direct call is written in "
          "it and in the header's counters (stage 4)") {
  constexpr uint32_t kCallSlots = 16;
  constexpr uint32_t kFinishedSlots = 64;
  REQUIRE_OK_AND_ASSIGN(
      std::unique_ptr<ipc::PayloadArea> area,
      ipc::PayloadArea::Create(1 << 20, /*sealed=*/false,
                               ipc::LedgerBytes(kCallSlots, kFinishedSlots)));
  REQUIRE_OK(ipc::FormatLedger(area->Ledger(), kCallSlots, kFinishedSlots));
  // The daemon's table: client-b is slot 1.
  ipc::LedgerClients clients;
  REQUIRE_OK(clients.SlotOf("client-a").status());
  REQUIRE_OK_AND_ASSIGN(uint32_t slot, clients.SlotOf("client-b"));
  auto read = [&] {
    absl::StatusOr<ipc::LedgerContents> contents =
        ipc::ReadLedger(area->Ledger(), kCallSlots, kFinishedSlots, clients);
    REQUIRE(contents.ok());
    CHECK(contents->skipped == 0);
    return *contents;
  };
  WorkerArgs args = DirectWorker();
  args.payload_fd = area->fd();
  Worker worker(args);
  worker.AwaitReady();
  Host host(worker, 9, "client-b", "", slot);
  host.Start("slow-1", "worker_fixture::sleep_async",
             OneArg([](auto& p) { p.pack(0.5); }));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (area->DirectRunning() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  CHECK(area->DirectRunning() == 1);
  ipc::LedgerContents running = read();
  REQUIRE(running.calls.size() == 1);
  CHECK(running.calls[0].client == "client-b");
  CHECK(running.calls[0].id == "slow-1");
  CHECK(running.calls[0].running);

  REQUIRE(host.Terminal().has_result());
  CHECK(area->DirectRunning() == 0);
  CHECK(area->DirectLastEndNs() > 0);
  ipc::LedgerContents retained = read();
  REQUIRE(retained.calls.size() == 1);
  CHECK(!retained.calls[0].running);

  host.Ack("slow-1");
  host.HalfClose();
  CHECK(host.Status() == 0);  // after the ack was read
  ipc::LedgerContents finished = read();
  CHECK(finished.calls.empty());
  REQUIRE(finished.finished.size() == 1);
  CHECK(finished.finished[0].client == "client-b");
  CHECK(finished.finished[0].id == "slow-1");
}

}  // namespace
}  // namespace agentix::worker

namespace agentix::worker {
namespace {

// The calls-CPU answer a HELLO frame carries.
std::string CpuAnswerOf(const std::pair<FrameKind, std::string>& frame) {
  REQUIRE(frame.first == FrameKind::kHello);
  REQUIRE_OK_AND_ASSIGN(sandbox::FrameMetadata hello,
                        sandbox::DecodeHello(frame.second));
  const std::string* value = sandbox::FindMetadata(hello, sandbox::kFrameCallsCpuKey);
  REQUIRE(value != nullptr);
  return *value;
}

TEST_CASE("calls_cpu_answer reaches the hosts that follow changes, and one "
          "owed its first answer") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  Host changes(worker, 1, "a", "", /*client_slot=*/0, /*follow=*/2);
  Host first(worker, 2, "b", "", /*client_slot=*/0, /*follow=*/1);
  Host none(worker, 3, "c", "", /*client_slot=*/0, /*follow=*/0);
  const std::string nil = OneArg([](auto& p) { p.pack_nil(); });
  // Each connection is served before the answer comes.
  for (Host* host : {&changes, &first, &none}) {
    host->Start("n", "worker_fixture::echo", nil);
    REQUIRE(host->Terminal().has_result());
  }
  Frame answer;
  answer.type = FrameType::kCallsCpuAnswer;
  answer.detail = "off";
  worker.Send(answer);
  CHECK(CpuAnswerOf(changes.NextFrame()) == "off");
  CHECK(CpuAnswerOf(first.NextFrame()) == "off");
  answer.detail = "wait";
  worker.Send(answer);
  CHECK(CpuAnswerOf(changes.NextFrame()) == "wait");
  // Written to every connection at once: none is ahead of these results.
  for (Host* host : {&first, &none}) {
    host->Start("m", "worker_fixture::echo", nil);
    CHECK(host->NextFrame().first == FrameKind::kMessage);
  }
  // A connection handed over after a change hears the latest answer first.
  Host later(worker, 4, "d", "", /*client_slot=*/0, /*follow=*/2);
  CHECK(CpuAnswerOf(later.NextFrame()) == "wait");
}

}  // namespace
}  // namespace agentix::worker

namespace agentix::worker {
namespace {

// Stage 5: the test, as the daemon, answers the worker's barrier_ask.
TEST_CASE("a direct call that logs gets its records' seqs in its result") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  Host host(worker, 5, "client-a");
  const std::string nil = OneArg([](auto& p) { p.pack_nil(); });
  // A call that logged nothing asks nothing: its result comes at once.
  host.Start("n1", "worker_fixture::echo", nil);
  SandboxEvent quiet = host.Terminal();
  REQUIRE(quiet.has_result());
  CHECK(quiet.result().log_seq() == 0);

  host.Start("l1", "worker_fixture::log_warning", NoArgs());
  // On the link: the call's record, tagged with its connection, then the
  // ask (after it: the daemon numbers the record first).
  bool tagged = false;
  Frame ask;
  while (true) {
    REQUIRE_OK_AND_ASSIGN(Frame f, worker.NextAny(absl::Seconds(30)));
    if (f.type == FrameType::kLog) {
      LogRecord record;
      REQUIRE(record.ParseFromString(f.record));
      if (record.call_id() == "l1") {
        CHECK(f.direct_conn.conn == 5);
        tagged = true;
      }
      continue;
    }
    INFO("frame " << ipc::FrameTypeName(f.type));
    REQUIRE(f.type == FrameType::kBarrierAsk);
    ask = f;
    break;
  }
  CHECK(tagged);
  CHECK(ask.call_id == "l1");
  CHECK(!ask.untagged);
  Frame answer;
  answer.type = FrameType::kBarrier;
  answer.call_id = "l1";
  answer.log_seq = 77;
  answer.trace_seq = 3;
  worker.Send(answer);
  SandboxEvent end = host.Terminal();
  REQUIRE(end.has_result());
  CHECK(end.result().call_id() == "l1");
  CHECK(end.result().log_seq() == 77);
  CHECK(end.result().trace_seq() == 3);

  // The next quiet call asks nothing again.
  host.Start("n2", "worker_fixture::echo", nil);
  SandboxEvent after = host.Terminal();
  REQUIRE(after.has_result());
  CHECK(after.result().log_seq() == 0);
  host.HalfClose();
  CHECK(host.Status() == 0);
}

// A direct call's lines written to fds 1/2 (os.write, a child process) that
// are still in the capture pipe when it returns are read before its reply
// is given to its session: on the link, the lines and then its ask.
// Without that, a line the drainer thread had not read yet reached the
// daemon after the result reached the host (no ask: nothing counted yet).
TEST_CASE("a direct call's fd-level lines precede its barrier_ask") {
  Worker worker(DirectWorker());
  worker.AwaitReady();
  Host host(worker, 5, "client-a");
  // Reads the link up to the next barrier_ask; the stdout/stderr lines
  // before it go to `lines`.
  auto ask_after_lines = [&worker](std::set<std::string>& lines) {
    while (true) {
      REQUIRE_OK_AND_ASSIGN(Frame f, worker.NextAny(absl::Seconds(10)));
      if (f.type == FrameType::kLog) {
        LogRecord record;
        REQUIRE(record.ParseFromString(f.record));
        lines.insert(record.message());
        continue;
      }
      INFO("frame " << ipc::FrameTypeName(f.type));
      REQUIRE(f.type == FrameType::kBarrierAsk);
      return f;
    }
  };
  auto answer = [&worker](const std::string& id, uint64_t log_seq) {
    Frame barrier;
    barrier.type = FrameType::kBarrier;
    barrier.call_id = id;
    barrier.log_seq = log_seq;
    worker.Send(barrier);
  };
  // Many calls: each is one chance for the drainer to be late.
  for (int i = 0; i < 40; ++i) {
    const std::string id = absl::StrCat("fd", i);
    host.Start(id, "worker_fixture::fd_line",
               OneArg([i](auto& p) { p.pack(i); }));
    std::set<std::string> lines;
    const Frame ask = ask_after_lines(lines);
    INFO("call " << id);
    CHECK(lines.count(absl::StrCat("fd-line ", i)) == 1);
    CHECK(ask.call_id == id);
    CHECK(ask.untagged);
    answer(id, 1000 + i);
    SandboxEvent end = host.Terminal();
    REQUIRE(end.has_result());
    CHECK(end.result().call_id() == id);
    CHECK(end.result().log_seq() == static_cast<uint64_t>(1000 + i));
  }
  // A child's lines on both pipes.
  host.Start("ch", "worker_fixture::run_child", NoArgs());
  std::set<std::string> lines;
  const Frame ask = ask_after_lines(lines);
  CHECK(lines.count("hi") == 1);
  CHECK(lines.count("err") == 1);
  CHECK(ask.call_id == "ch");
  answer("ch", 2000);
  SandboxEvent end = host.Terminal();
  REQUIRE(end.has_result());
  CHECK(end.result().log_seq() == 2000);
  // A call that wrote nothing still asks nothing.
  host.Start("n1", "worker_fixture::echo",
             OneArg([](auto& p) { p.pack_nil(); }));
  SandboxEvent quiet = host.Terminal();
  REQUIRE(quiet.has_result());
  CHECK(quiet.result().log_seq() == 0);
  host.HalfClose();
  CHECK(host.Status() == 0);
}

}  // namespace
}  // namespace agentix::worker
