#include "providers/core/journal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "testing/status_matchers.h"

namespace agentix::providers {
namespace {

std::string TempDir() {
  std::string tmpl = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                     "/journal-XXXXXX";
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

JournalRecord Rec(uint8_t type, std::string key, std::vector<std::string> fields,
                  bool erase = false) {
  JournalRecord r;
  r.type = type;
  r.key = std::move(key);
  r.fields = std::move(fields);
  r.erase = erase;
  return r;
}

TEST_CASE("Journal: records come back in order; the last of a key wins; erase removes",
          "[journal]") {
  std::string dir = TempDir();
  {
    Journal::Loaded loaded;
    REQUIRE_OK_AND_ASSIGN(auto j, Journal::Open(dir, false, &loaded));
    CHECK(loaded.records.empty());
    REQUIRE_OK(j->Append(Rec(1, "a", {"v1", std::string("\0bin\xff", 5)})));
    REQUIRE_OK(j->Append(Rec(1, "b", {"b1"})));
    REQUIRE_OK(j->Append(Rec(1, "a", {"v2"})));
    REQUIRE_OK(j->Append(Rec(2, "a", {"other type"})));
    REQUIRE_OK(j->Append(Rec(1, "b", {}, true)));
  }
  Journal::Loaded loaded;
  REQUIRE_OK_AND_ASSIGN(auto j, Journal::Open(dir, false, &loaded));
  REQUIRE(loaded.records.size() == 5);
  CHECK(loaded.records[0].fields[1] == std::string("\0bin\xff", 5));
  auto live = Journal::Fold(loaded.records);
  REQUIRE(live.size() == 2);
  CHECK(live[0].type == 1);
  CHECK(live[0].fields == std::vector<std::string>{"v2"});
  CHECK(live[1].type == 2);
}

TEST_CASE("Journal: a torn or corrupt tail is dropped, not fatal, and truncated", "[journal]") {
  std::string dir = TempDir();
  {
    Journal::Loaded loaded;
    REQUIRE_OK_AND_ASSIGN(auto j, Journal::Open(dir, false, &loaded));
    REQUIRE_OK(j->Append(Rec(1, "keep", {"x"})));
    REQUIRE_OK(j->Append(Rec(1, "keep2", {"y"})));
  }
  std::string torn = Journal::Encode(Rec(1, "torn", {"zzzzzzzz"}));
  {
    std::ofstream out(dir + "/journal", std::ios::app | std::ios::binary);
    out << torn.substr(0, torn.size() - 3);  // kill -9 mid-write
  }
  {
    Journal::Loaded loaded;
    REQUIRE_OK_AND_ASSIGN(auto j, Journal::Open(dir, false, &loaded));
    REQUIRE(loaded.records.size() == 2);
    CHECK(loaded.dropped_bytes == static_cast<int64_t>(torn.size() - 3));
    // Appends after a torn tail are readable again.
    REQUIRE_OK(j->Append(Rec(1, "after", {"z"})));
  }
  {
    Journal::Loaded loaded;
    REQUIRE_OK_AND_ASSIGN(auto j, Journal::Open(dir, false, &loaded));
    REQUIRE(loaded.records.size() == 3);
    CHECK(loaded.records[2].key == "after");
  }
  // A flipped byte inside a record: that record and the rest are dropped.
  {
    std::fstream f(dir + "/journal", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x7f');
  }
  Journal::Loaded loaded;
  REQUIRE_OK_AND_ASSIGN(auto j, Journal::Open(dir, false, &loaded));
  CHECK(loaded.records.empty());
  CHECK(loaded.dropped_bytes > 0);
}

TEST_CASE("Journal: Rewrite compacts to the live set and appends continue", "[journal]") {
  std::string dir = TempDir();
  Journal::Loaded loaded;
  REQUIRE_OK_AND_ASSIGN(auto j, Journal::Open(dir, false, &loaded));
  for (int i = 0; i < 1000; ++i) REQUIRE_OK(j->Append(Rec(1, "k", {std::to_string(i)})));
  off_t before = 0, after = 0;
  {
    std::ifstream in(dir + "/journal", std::ios::ate | std::ios::binary);
    before = in.tellg();
  }
  REQUIRE_OK(j->Rewrite({Rec(1, "k", {"999"})}));
  REQUIRE_OK(j->Append(Rec(1, "k2", {"new"})));
  {
    std::ifstream in(dir + "/journal", std::ios::ate | std::ios::binary);
    after = in.tellg();
  }
  CHECK(after < before / 100);
  j.reset();
  Journal::Loaded again;
  REQUIRE_OK_AND_ASSIGN(auto j2, Journal::Open(dir, false, &again));
  REQUIRE(again.records.size() == 2);
  CHECK(again.records[0].fields[0] == "999");
  CHECK(again.records[1].key == "k2");
}

}  // namespace
}  // namespace agentix::providers
