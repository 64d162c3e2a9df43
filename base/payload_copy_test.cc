#include "base/payload_copy.h"

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace agentix::base {
namespace {

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  uint32_t x = 2463534242u;
  for (char& c : s) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return s;
}

TEST_CASE("CopyPayload copies every byte, whatever the size and alignment") {
  const std::string source = Pattern(kPayloadCopyStreamBytes * 2 + 200);
  const size_t sizes[] = {0, 1, 63, 64, 4095, kPayloadCopyStreamBytes - 1,
                          kPayloadCopyStreamBytes, kPayloadCopyStreamBytes + 1,
                          kPayloadCopyStreamBytes + 63,
                          kPayloadCopyStreamBytes * 2 + 7};
  for (size_t size : sizes) {
    for (size_t dst_offset : {0, 1, 17, 63}) {
      for (size_t src_offset : {0, 5, 64}) {
        // Guard bytes on both sides must stay untouched.
        std::vector<char> out(size + dst_offset + 128, '\x5a');
        CopyPayload(out.data() + dst_offset, source.data() + src_offset, size);
        CAPTURE(size, dst_offset, src_offset);
        REQUIRE(std::string(out.data() + dst_offset, size) ==
                source.substr(src_offset, size));
        for (size_t i = 0; i < dst_offset; ++i) REQUIRE(out[i] == '\x5a');
        for (size_t i = dst_offset + size; i < out.size(); ++i) {
          REQUIRE(out[i] == '\x5a');
        }
      }
    }
  }
}

TEST_CASE("CopyPayloadToHeap copies every byte into small and fresh-mapping-sized buffers") {
  const std::string source = Pattern(kPayloadCopyStreamBytes + 100);
  for (size_t buffer : {kPayloadCopyStreamBytes + 100, kPayloadCopyFreshBytes}) {
    std::vector<char> out(source.size() + 2, '\x5a');
    CopyPayloadToHeap(out.data() + 1, source.data(), source.size(), buffer);
    CAPTURE(buffer);
    REQUIRE(std::string(out.data() + 1, source.size()) == source);
    REQUIRE(out.front() == '\x5a');
    REQUIRE(out.back() == '\x5a');
  }
}

}  // namespace
}  // namespace agentix::base
