// libFuzzer target for the read side of a Calls connection served after
// HELLO (wire/frame_connection.h, docs/DIRECT-CALLS.md stage 3): the bytes a
// host sends once the daemon handed its connection over, through a real
// socketpair, part as the bytes read past HELLO (`pre`) and the rest written
// in pieces, with or without the host's payload ring.
//
// The first input byte chooses: bit 0 a payload ring (a fixed 64 KiB area
// the "host" filled), bit 1 a max_message_bytes of 1024, bits 2-7 how much
// goes as `pre` and how the rest is cut (pieces of 1 + byte % 64 ... bytes).
//
// Asserts: OnEnd is called exactly once, after the host's EOF at the latest;
// a connection that ends with a STATUS ends with 3 (the only one the read
// side writes), which is then the last frame the host reads, its details
// OnEnd's message; everything the host reads parses as whole frames, MESSAGE
// (BadRequest errors) or that STATUS; every request handed over is one
// protobuf accepts once its bulk views are put back, the views lying in the
// read bytes' buffer or the ring; nothing is handed over after the end.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "wire/frame_codec.h"
#include "wire/frame_connection.h"
#include "wire/frame_splice.h"
#include "worker/ipc/payload_area.h"

namespace {

using namespace agentix::sandbox;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "frame_connection_fuzzer: %s\n", what);
  std::abort();
}

// The host's side of a payload area, its ring filled with known bytes.
agentix::ipc::PayloadArea& HostRing() {
  static agentix::ipc::PayloadArea* const area = [] {
    auto created = agentix::ipc::PayloadArea::Create(64u << 10, /*sealed=*/true);
    if (!created.ok()) Fail("payload area");
    std::string bytes(64u << 10, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
    if (!(*created)->Put(bytes).has_value()) Fail("ring put");
    return created->release();
  }();
  return *area;
}

class Checker : public FrameConnectionConsumer {
 public:
  void OnRequest(SplicedRequest& request) override {
    if (ended) Fail("a request after the end");
    if (request.bulk.size() != static_cast<size_t>(request.request.events_size())) {
      Fail("one bulk entry per event");
    }
    agentix::runtime::v1::CallsRequest whole = request.request;
    for (int i = 0; i < whole.events_size(); ++i) {
      const auto& bulk = request.bulk[static_cast<size_t>(i)];
      if (!bulk) continue;
      auto* event = whole.mutable_events(i);
      if (event->has_start()) {
        event->mutable_start()->set_arguments(std::string(*bulk));
      } else if (event->has_argument_chunk()) {
        event->mutable_argument_chunk()->set_data(std::string(*bulk));
      } else {
        Fail("a bulk view for an event without a bulk field");
      }
    }
    agentix::runtime::v1::CallsRequest reparsed;
    if (!reparsed.ParseFromString(whole.SerializeAsString())) {
      Fail("a request protobuf refuses");
    }
  }
  void OnHalfClose() override {
    if (ended) Fail("HALF_CLOSE after the end");
    ++half_closes;
  }
  void OnEnd(absl::Status why) override {
    if (ended) Fail("OnEnd twice");
    ended = true;
    status = std::move(why);
  }

  bool ended = false;
  int half_closes = 0;
  absl::Status status;
};

std::string ReadAll(int fd) {
  std::string out;
  char buffer[8192];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n <= 0) return out;
    out.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  const int host = fds[0];
  Checker checker;
  FrameConnectionOptions options;
  if (mode & 2) options.max_message_bytes = 1024;
  const size_t pre_bytes = std::min(input.size(), static_cast<size_t>((mode >> 2) & 7) * 97);
  const int ring_fd = (mode & 1) ? ::dup(HostRing().fd()) : -1;
  auto connection = FrameConnection::Create(
      fds[1], input.substr(0, pre_bytes), ring_fd, &checker, options);
  if (!connection.ok()) Fail("Create refused a sealed ring");
  (*connection)->Start();
  const size_t piece = 1 + (mode >> 5) * 37;
  for (size_t at = pre_bytes; at < input.size() && !checker.ended; at += piece) {
    const std::string bytes = input.substr(at, piece);
    if (::send(host, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(bytes.size())) {
      break;  // the connection ended and shut its side down
    }
    (*connection)->ReadReady();
  }
  ::shutdown(host, SHUT_WR);  // the host's EOF
  for (int i = 0; i < 4 && !checker.ended; ++i) {
    pollfd p{(*connection)->fd(), (*connection)->PollEvents(), 0};
    (void)::poll(&p, 1, 100);
    (*connection)->ReadReady();
    (*connection)->WriteReady();
  }
  if (!checker.ended || !(*connection)->Done()) Fail("no end after the host's EOF");

  // What the host reads: whole frames, MESSAGEs then at most one STATUS.
  const std::string read = ReadAll(host);
  absl::string_view rest = read;
  std::optional<FrameStatus> status;
  while (!rest.empty()) {
    absl::StatusOr<FrameView> frame = ParseFrame(rest);
    if (!frame.ok() || frame->frame_bytes == 0) Fail("the host read a bad frame");
    if (status.has_value()) Fail("a frame after the STATUS");
    if (frame->kind == FrameKind::kStatus) {
      absl::StatusOr<FrameStatus> decoded = DecodeStatus(frame->payload);
      if (!decoded.ok()) Fail("a bad STATUS");
      status = *decoded;
    } else if (frame->kind == FrameKind::kMessage) {
      agentix::runtime::v1::CallsResponse response;
      if (!response.ParseFromArray(frame->payload.data(),
                                   static_cast<int>(frame->payload.size())) ||
          response.events_size() != 1 ||
          response.events(0).error().error().type() != "BadRequest") {
        Fail("a MESSAGE other than a BadRequest");
      }
    } else {
      Fail("a frame of another kind");
    }
    rest.remove_prefix(frame->frame_bytes);
  }
  if (status.has_value()) {
    if (status->code != 3 || checker.status.code() != absl::StatusCode::kInvalidArgument ||
        status->details != checker.status.message()) {
      Fail("a STATUS other than the refusal OnEnd reported");
    }
  } else if (checker.status.code() == absl::StatusCode::kInvalidArgument) {
    Fail("a refusal without its STATUS");
  }
  connection->reset();
  ::close(host);
  return 0;
}
