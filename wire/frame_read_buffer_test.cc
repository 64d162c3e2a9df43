#include "wire/frame_read_buffer.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "wire/frame_codec.h"

namespace agentix::sandbox {
namespace {

struct Pair {
  Pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    reader = base::UniqueFd(fds[0]);
    writer = base::UniqueFd(fds[1]);
  }
  void Write(const std::string& bytes, const std::vector<int>& fds = {}) {
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    if (!fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    REQUIRE(::sendmsg(writer.get(), &msg, 0) ==
            static_cast<ssize_t>(bytes.size()));
  }
  base::UniqueFd reader;
  base::UniqueFd writer;
};

std::vector<int> Kept(FrameReadBuffer& buffer, int fd,
                      FrameReadBuffer::ReadOutcome* outcome = nullptr) {
  std::vector<int> kept;
  const FrameReadBuffer::ReadOutcome got = buffer.Read(
      fd, 1u << 30, [&kept](int received) { kept.push_back(received); });
  if (outcome != nullptr) *outcome = got;
  return kept;
}

TEST_CASE("the read buffer starts with the bytes read past HELLO and adds "
          "what the socket has; consumed bytes go, the rest stays") {
  Pair pair;
  FrameReadBuffer buffer("pre");
  CHECK(buffer.buffered() == "pre");
  pair.Write("-more");
  FrameReadBuffer::ReadOutcome outcome;
  CHECK(Kept(buffer, pair.reader.get(), &outcome).empty());
  CHECK(outcome.open);
  CHECK(!outcome.descriptors_truncated);
  CHECK(buffer.buffered() == "pre-more");
  buffer.Consume(4);
  CHECK(buffer.buffered() == "more");
  buffer.Consume(4);
  CHECK(buffer.empty());
  // Nothing to read is not the end of the stream; EOF is.
  CHECK(Kept(buffer, pair.reader.get(), &outcome).empty());
  CHECK(outcome.open);
  pair.writer = base::UniqueFd();
  Kept(buffer, pair.reader.get(), &outcome);
  CHECK(!outcome.open);
}

TEST_CASE("a frame in progress gets room for all of it; the grown buffer "
          "shrinks back only once empty") {
  Pair pair;
  int size = 4 << 20;
  REQUIRE(::setsockopt(pair.writer.get(), SOL_SOCKET, SO_SNDBUF, &size,
                       sizeof(size)) == 0);
  REQUIRE(::setsockopt(pair.reader.get(), SOL_SOCKET, SO_RCVBUF, &size,
                       sizeof(size)) == 0);
  const std::string payload(1u << 20, 'x');
  const std::string frame = EncodeFrame(FrameKind::kMessage, payload);
  FrameReadBuffer buffer;
  // The header first: the next read asks for the rest of the frame at once.
  pair.Write(frame.substr(0, kFrameHeaderBytes));
  Kept(buffer, pair.reader.get());
  CHECK(buffer.buffered().size() == kFrameHeaderBytes);
  pair.Write(frame.substr(kFrameHeaderBytes));
  Kept(buffer, pair.reader.get());
  CHECK(buffer.buffered() == frame);  // one read, not 16 of kChunkBytes
  CHECK(!buffer.idle_and_large());
  buffer.Shrink();  // holding a frame: kept
  CHECK(buffer.buffered() == frame);
  buffer.Consume(frame.size());
  CHECK(buffer.idle_and_large());
  buffer.Shrink();
  CHECK(!buffer.idle_and_large());
  pair.Write("after");
  Kept(buffer, pair.reader.get());
  CHECK(buffer.buffered() == "after");
}

TEST_CASE("descriptors that come with the bytes go to the taker; more than "
          "the control buffer holds are reported cut off") {
  Pair pair;
  FrameReadBuffer buffer;
  base::UniqueFd sent(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  REQUIRE(sent.valid());
  pair.Write("a", {sent.get()});
  FrameReadBuffer::ReadOutcome outcome;
  std::vector<int> kept = Kept(buffer, pair.reader.get(), &outcome);
  REQUIRE(kept.size() == 1);
  CHECK(kept[0] != sent.get());
  CHECK((::fcntl(kept[0], F_GETFD) & FD_CLOEXEC) != 0);
  CHECK(!outcome.descriptors_truncated);
  ::close(kept[0]);
  pair.Write("b", std::vector<int>(8, sent.get()));
  kept = Kept(buffer, pair.reader.get(), &outcome);
  CHECK(kept.size() <= 4);
  CHECK(outcome.descriptors_truncated);
  for (int fd : kept) ::close(fd);
  CHECK(buffer.buffered() == "ab");
}

}  // namespace
}  // namespace agentix::sandbox
