#include "base/utf8.h"

#include <catch2/catch.hpp>
#include <string>
#include <string_view>

namespace agentix::base {
namespace {

TEST_CASE("UTF-8 validation follows RFC 3629", "[utf8]") {
  for (const char* valid : {"", "ascii", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80",
                            "\xe2\x82\xac", "\xed\x9f\xbf", "\xee\x80\x80",
                            "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf"}) {
    CAPTURE(std::string(valid));
    CHECK(IsValidUtf8(valid));
  }
  for (const char* invalid :
       {"\x80", "\xbf", "\xc0\x80", "\xc1\xbf", "\xc2", "\xc2\x41",
        "\xe0\x80\x80", "\xe0\x9f\xbf", "\xed\xa0\x80", "\xed\xbf\xbf",
        "\xe2\x82", "\xf0\x80\x80\x80", "\xf0\x8f\xbf\xbf", "\xf4\x90\x80\x80",
        "\xf5\x80\x80\x80", "\xff", "ok\xe2\x28\xa1"}) {
    CAPTURE(std::string(invalid));
    CHECK_FALSE(IsValidUtf8(invalid));
  }
}

TEST_CASE("Sequences inside long ASCII text are judged the same", "[utf8]") {
  // IsValidUtf8 skips ASCII eight bytes at a time: put each sequence at
  // every offset of a longer ASCII text, and a cut one at its end.
  const std::string ascii = "0123456789abcdefghijklmnopqrstu";
  for (const char* valid : {"\xc2\x80", "\xe2\x82\xac", "\xf4\x8f\xbf\xbf"}) {
    for (size_t at = 0; at <= ascii.size(); ++at) {
      const std::string text = ascii.substr(0, at) + valid + ascii.substr(at);
      CAPTURE(at, text);
      CHECK(IsValidUtf8(text));
      CHECK_FALSE(IsValidUtf8(text.substr(0, at + 1)));  // cut inside it
    }
  }
  for (const char* invalid : {"\x80", "\xc0\x80", "\xed\xa0\x80", "\xff"}) {
    for (size_t at = 0; at <= ascii.size(); ++at) {
      const std::string text = ascii.substr(0, at) + invalid + ascii.substr(at);
      CAPTURE(at, text);
      CHECK_FALSE(IsValidUtf8(text));
    }
  }
  CHECK(IsValidUtf8(ascii + ascii));
}

TEST_CASE("A sequence's length, and the invalid prefix Python replaces",
          "[utf8]") {
  size_t invalid = 0;
  CHECK(Utf8SequenceLength("a") == 1);
  CHECK(Utf8SequenceLength("\xe2\x82\xac tail") == 3);
  CHECK(Utf8SequenceLength("\xf0\x9d\x84\x9e") == 4);
  CHECK(Utf8SequenceLength("") == 0);
  // (first bytes, length of the prefix CPython's errors="replace" turns
  // into one U+FFFD)
  for (const auto& [bytes, prefix] :
       {std::pair<std::string_view, size_t>{"\xff", 1},
        {"\x80\x80", 1},
        {"\xc0\x80", 1},
        {"\xe2\x82(", 2},
        {"\xe2\x82", 2},
        {"\xed\xa0\x80", 1},
        {"\xf0\x9d\x84", 3},
        {"\xf4\x90\x80\x80", 1}}) {
    CAPTURE(std::string(bytes));
    invalid = 0;
    CHECK(Utf8SequenceLength(bytes, &invalid) == 0);
    CHECK(invalid == prefix);
  }
}

}  // namespace
}  // namespace agentix::base
