// Descriptors on the worker link: direct_conn's SCM_RIGHTS, matched to the
// frame that carries them; every other arrival is refused and closed.
#include "worker/ipc/descriptors.h"

#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "testing/status_matchers.h"
#include "worker/ipc/io.h"

namespace agentix::ipc {
namespace {

size_t OpenFds() {
  size_t count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  REQUIRE(dir != nullptr);
  while (readdir(dir) != nullptr) ++count;
  ::closedir(dir);
  return count;
}

std::string Encode(const Frame& f) {
  std::string out;
  REQUIRE_OK(AppendFrame(f, out));
  return out;
}

Frame DirectConn(uint64_t conn, bool ring) {
  Frame f;
  f.type = FrameType::kDirectConn;
  f.direct_conn.conn = conn;
  f.direct_conn.client = "client-1";
  f.direct_conn.ring = ring;
  f.direct_conn.follow = 2;
  f.direct_conn.max_payload = 1 << 30;
  f.direct_conn.upload_idle_ms = 60000;
  f.direct_conn.max_retained = 4096;
  f.direct_conn.max_retained_bytes = uint64_t{512} << 20;
  f.direct_conn.max_stream_window = 1024;
  f.direct_conn.stalled_ms = 20000;
  f.data = std::string("\x05\x00\x00\x00\x02rest", 9);
  return f;
}

// Sends `bytes` with `fds` on the first byte, as a hostile or buggy daemon
// could (any count, any frame).
void SendRaw(int fd, const std::string& bytes, const std::vector<int>& fds) {
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))] = {};
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  REQUIRE(::sendmsg(fd, &msg, 0) == static_cast<ssize_t>(bytes.size()));
}

struct Link {
  Link() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    daemon.Reset(fds[0]);
    worker.Reset(fds[1]);
    REQUIRE(::fcntl(worker.get(), F_SETFL, O_NONBLOCK) == 0);
  }
  // Reads everything sent so far (in reads of at most `step` bytes) and
  // returns the frames with their descriptors, or the first error.
  absl::Status Drain(std::vector<std::pair<Frame, std::vector<base::UniqueFd>>>& out,
                     size_t step = 1 << 20) {
    while (true) {
      const ssize_t n = fds.ReadFrom(worker.get(), reader, step);
      if (n < 0) break;  // EAGAIN: all read
      REQUIRE(n > 0);
      while (true) {
        auto next = reader.Next();
        if (!next.ok()) return next.status();
        if (!next->has_value()) break;
        auto taken = fds.TakeFor(**next, reader);
        if (!taken.ok()) return taken.status();
        out.emplace_back(std::move(**next), std::move(*taken));
      }
      if (absl::Status settled = fds.Settle(reader); !settled.ok()) return settled;
    }
    return absl::OkStatus();
  }
  base::UniqueFd daemon, worker;
  FrameReader reader;
  DescriptorReader fds;
};

TEST_CASE("direct_conn, direct_closed and ready's capability round-trip",
          "[ipc][direct]") {
  FrameReader reader;
  const Frame sent = DirectConn(7, true);
  const std::string wire = Encode(sent);
  reader.Append(wire.data(), wire.size());
  auto next = reader.Next();
  REQUIRE(next.ok());
  const Frame& got = **next;
  CHECK(got.type == FrameType::kDirectConn);
  CHECK(got.direct_conn.conn == 7);
  CHECK(got.direct_conn.client == "client-1");
  CHECK(got.direct_conn.ring);
  CHECK(got.direct_conn.follow == 2);
  CHECK(got.direct_conn.max_payload == sent.direct_conn.max_payload);
  CHECK(got.direct_conn.upload_idle_ms == 60000);
  CHECK(got.direct_conn.max_retained == 4096);
  CHECK(got.direct_conn.max_retained_bytes == sent.direct_conn.max_retained_bytes);
  CHECK(got.direct_conn.max_stream_window == 1024);
  CHECK(got.direct_conn.stalled_ms == 20000);
  CHECK(got.data == sent.data);
  CHECK(DescriptorsCarried(got) == 2);
  CHECK(reader.last_frame_bytes() == wire.size());

  Frame closed;
  closed.type = FrameType::kDirectClosed;
  closed.direct_conn.conn = 9;
  closed.detail = "eof";
  const std::string closed_wire = Encode(closed);
  reader.Append(closed_wire.data(), closed_wire.size());
  next = reader.Next();
  REQUIRE(next.ok());
  CHECK((*next)->type == FrameType::kDirectClosed);
  CHECK((*next)->direct_conn.conn == 9);
  CHECK((*next)->detail == "eof");
  CHECK(DescriptorsCarried(**next) == 0);

  Frame ready;
  ready.type = FrameType::kReady;
  ready.pid = 12;
  for (bool direct : {false, true}) {
    ready.direct = direct;
    const std::string ready_wire = Encode(ready);
    reader.Append(ready_wire.data(), ready_wire.size());
    next = reader.Next();
    REQUIRE(next.ok());
    CHECK((*next)->direct == direct);
  }
}

TEST_CASE("A direct_conn frame brings its socket and ring memfd",
          "[ipc][direct]") {
  Link link;
  int host[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, host) == 0);
  base::UniqueFd host_end(host[0]), handed(host[1]);
  base::UniqueFd memfd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  // Frames before and after it, in the same reads or byte by byte.
  Frame cancel;
  cancel.type = FrameType::kCancel;
  cancel.call_id = "c";
  const size_t step = GENERATE(size_t{1} << 20, size_t{3});
  REQUIRE_OK(WriteAll(link.daemon.get(), Encode(cancel)));
  const int sent[] = {handed.get(), memfd.get()};
  REQUIRE_OK(SendWithDescriptors(link.daemon.get(), Encode(DirectConn(1, true)),
                                 sent));
  REQUIRE_OK(WriteAll(link.daemon.get(), Encode(cancel)));
  std::vector<std::pair<Frame, std::vector<base::UniqueFd>>> frames;
  REQUIRE_OK(link.Drain(frames, step));
  REQUIRE(frames.size() == 3);
  CHECK(frames[0].second.empty());
  CHECK(frames[2].second.empty());
  REQUIRE(frames[1].second.size() == 2);
  CHECK(link.fds.held() == 0);
  // The received socket is the host's connection, close-on-exec.
  const int got = frames[1].second[0].get();
  CHECK((::fcntl(got, F_GETFD) & FD_CLOEXEC) != 0);
  REQUIRE(::write(got, "hi", 2) == 2);
  char buffer[2];
  REQUIRE(::read(host_end.get(), buffer, 2) == 2);
  CHECK(std::string(buffer, 2) == "hi");
}

TEST_CASE("Descriptors that do not match their frame are refused and closed",
          "[ipc][direct]") {
  base::UniqueFd a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  base::UniqueFd b(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  base::UniqueFd c(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const size_t before = OpenFds();
  std::vector<std::pair<Frame, std::vector<base::UniqueFd>>> frames;
  absl::Status status;
  {
    Link link;
    SECTION("a direct_conn frame without descriptors") {
      REQUIRE_OK(WriteAll(link.daemon.get(), Encode(DirectConn(1, false))));
      status = link.Drain(frames);
      CHECK(absl::StrContains(status.message(), "without its descriptors"));
    }
    SECTION("extra descriptors") {
      SendRaw(link.daemon.get(), Encode(DirectConn(1, false)),
              {a.get(), b.get(), c.get()});
      status = link.Drain(frames);
      CHECK(absl::StrContains(status.message(), "came with 3 descriptors"));
    }
    SECTION("a missing ring memfd") {
      SendRaw(link.daemon.get(), Encode(DirectConn(1, true)), {a.get()});
      status = link.Drain(frames);
      CHECK(absl::StrContains(status.message(), "came with 1 descriptors"));
    }
    SECTION("descriptors with a frame that carries none") {
      Frame shutdown;
      shutdown.type = FrameType::kShutdown;
      SendRaw(link.daemon.get(), Encode(shutdown), {a.get(), b.get()});
      status = link.Drain(frames);
      CHECK(absl::StrContains(status.message(), "frames that carry none"));
    }
    SECTION("more descriptors than a read takes") {
      const std::vector<int> many(8, a.get());
      SendRaw(link.daemon.get(), Encode(DirectConn(1, false)), many);
      status = link.Drain(frames);
      CHECK(absl::IsInvalidArgument(status));
    }
    CHECK(absl::IsInvalidArgument(status));
    CHECK(link.fds.held() == 0);
    frames.clear();
  }
  // Nothing received is left open (the link's two ends are closed too).
  CHECK(OpenFds() == before);
}

TEST_CASE("SendWithDescriptors checks its arguments", "[ipc][direct]") {
  Link link;
  const std::string wire = Encode(DirectConn(1, false));
  CHECK(absl::IsInvalidArgument(SendWithDescriptors(link.daemon.get(), wire, {})));
  const int three[] = {0, 1, 2};
  CHECK(absl::IsInvalidArgument(
      SendWithDescriptors(link.daemon.get(), wire, three)));
  const int one[] = {0};
  CHECK(absl::IsInvalidArgument(SendWithDescriptors(link.daemon.get(), "", one)));
}

}  // namespace
}  // namespace agentix::ipc
