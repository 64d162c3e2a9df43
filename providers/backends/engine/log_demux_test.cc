#include "providers/backends/engine/log_demux.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace agentix::providers::engine {
namespace {

std::string Frame(int stream, const std::string& payload) {
  std::string out(8, '\0');
  out[0] = static_cast<char>(stream);
  uint32_t n = static_cast<uint32_t>(payload.size());
  out[4] = static_cast<char>(n >> 24);
  out[5] = static_cast<char>(n >> 16);
  out[6] = static_cast<char>(n >> 8);
  out[7] = static_cast<char>(n);
  return out + payload;
}

struct Collected {
  std::string out, err;
};

Collected FeedInChunks(const std::string& wire, size_t chunk) {
  LogDemuxer demux;
  Collected got;
  for (size_t i = 0; i < wire.size(); i += chunk) {
    REQUIRE(demux.Feed(absl::string_view(wire).substr(i, chunk), [&](int stream, absl::string_view p) {
      (stream == 2 ? got.err : got.out).append(p.data(), p.size());
      return true;
    }));
  }
  return got;
}

TEST_CASE("frames are split into stdout and stderr whatever the read sizes") {
  std::string big(70000, 'x');  // size needs more than the low header byte
  std::string wire = Frame(1, "hello\n") + Frame(2, "oops\n") + Frame(1, big) + Frame(1, "") +
                     Frame(2, "bye\n");
  for (size_t chunk : {1, 3, 7, 8, 9, 4096, 1 << 20}) {
    Collected got = FeedInChunks(wire, chunk);
    CHECK(got.out == "hello\n" + big);
    CHECK(got.err == "oops\nbye\n");
  }
}

TEST_CASE("a stream that is not framed (a TTY container) passes through as stdout") {
  LogDemuxer demux;
  std::string out;
  demux.Feed("plain text log line\nand more", [&](int stream, absl::string_view p) {
    CHECK(stream == 1);
    out.append(p.data(), p.size());
    return true;
  });
  CHECK(demux.raw());
  CHECK(out == "plain text log line\nand more");
}

TEST_CASE("the consumer can stop the feed mid-frame") {
  LogDemuxer demux;
  int calls = 0;
  std::string wire = Frame(1, "first") + Frame(1, "second");
  bool more = demux.Feed(wire, [&](int, absl::string_view) { return ++calls < 1; });
  CHECK_FALSE(more);
  CHECK(calls == 1);
}

TEST_CASE("a partial frame waits for the rest") {
  LogDemuxer demux;
  std::string out;
  std::string wire = Frame(1, "abcdef");
  auto sink = [&](int, absl::string_view p) {
    out.append(p.data(), p.size());
    return true;
  };
  demux.Feed(wire.substr(0, 10), sink);
  CHECK(out == "ab");
  CHECK(demux.pending() == 4);
  demux.Feed(wire.substr(10), sink);
  CHECK(out == "abcdef");
  CHECK(demux.pending() == 0);
}

}  // namespace
}  // namespace agentix::providers::engine
