#include "sandbox/finished_ids.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/str_cat.h"

namespace agentix::sandbox {
namespace {

TEST_CASE("FinishedIds forgets the oldest id first", "[finished_ids]") {
  FinishedIds ids(3);
  for (const char* id : {"a", "b", "c", "d"}) ids.Remember(id);
  CHECK_FALSE(ids.Contains("a"));
  CHECK(ids.Contains("b"));
  CHECK(ids.Contains("c"));
  CHECK(ids.Contains("d"));
  CHECK(ids.size() == 3);
  // Remembering a remembered id does not count twice or refresh it.
  ids.Remember("b");
  CHECK(ids.size() == 3);
  ids.Remember("e");
  CHECK_FALSE(ids.Contains("b"));
  CHECK(ids.Contains("e"));
}

TEST_CASE("FinishedIds keeps short and long ids exactly across reuse",
          "[finished_ids]") {
  // Short ids live inside the string object, long ones on the heap; reused
  // slots alternate between both, and every key must still match its id.
  FinishedIds ids(64);
  for (int i = 0; i < 10000; ++i) {
    const std::string id = i % 3 == 0
                               ? absl::StrCat("s", i)
                               : absl::StrCat(std::string(40, 'x'), i);
    ids.Remember(id);
    REQUIRE(ids.Contains(id));
    REQUIRE(ids.size() <= 64);
  }
  for (int i = 10000 - 64; i < 10000; ++i) {
    const std::string id = i % 3 == 0
                               ? absl::StrCat("s", i)
                               : absl::StrCat(std::string(40, 'x'), i);
    CHECK(ids.Contains(id));
  }
  CHECK_FALSE(ids.Contains(absl::StrCat(std::string(40, 'x'), 10000 - 65)));
  CHECK_FALSE(ids.Contains(""));
}

}  // namespace
}  // namespace agentix::sandbox
