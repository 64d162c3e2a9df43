#include "base/string_resize.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

namespace agentix::base {
namespace {

TEST_CASE("ResizeUninitialized grows to the size asked, keeping the prefix") {
  for (size_t start : {size_t{0}, size_t{5}, size_t{40}}) {
    std::string s(start, 'a');
    ResizeUninitialized(s, 3 << 20);
    REQUIRE(s.size() == size_t{3} << 20);
    REQUIRE(s.capacity() >= s.size());
    CHECK(s.compare(0, start, std::string(start, 'a')) == 0);
    CHECK(s.c_str()[s.size()] == '\0');
    // The caller fills the rest; the string then holds exactly that.
    std::memset(s.data() + start, 'b', s.size() - start);
    CHECK(s == std::string(start, 'a') + std::string(s.size() - start, 'b'));
  }
}

TEST_CASE("ResizeUninitialized shrinks and sizes to zero like resize") {
  std::string s(1000, 'z');
  ResizeUninitialized(s, 10);
  CHECK(s == std::string(10, 'z'));
  ResizeUninitialized(s, 0);
  CHECK(s.empty());
  CHECK(s.c_str()[0] == '\0');
}

#if defined(__GLIBCXX__) && _GLIBCXX_USE_CXX11_ABI
TEST_CASE("ResizeUninitialized does not write the new bytes (libstdc++)") {
  std::string s(100, 'x');
  s.resize(10);  // keeps the buffer: bytes 11..99 still hold 'x'
  ResizeUninitialized(s, 50);
  REQUIRE(s.size() == 50);
  // resize would have zero-filled 10..49; only the old terminator at 10 and
  // the new one at 50 are written.
  CHECK(s[10] == '\0');
  CHECK(s.compare(11, 39, std::string(39, 'x')) == 0);
  CHECK(s.c_str()[50] == '\0');
}
#endif

}  // namespace
}  // namespace agentix::base
