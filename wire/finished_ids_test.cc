#include "wire/finished_ids.h"

#include <catch2/catch.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace agentix::sandbox {
namespace {

TEST_CASE("FinishedIds forgets the oldest id first", "[finished_ids]") {
  // Sharded (the daemon's) and one set (the benchmark's baseline).
  const int shard_bits = GENERATE(as<int>{}, FinishedIds::kShardBits, 0);
  FinishedIds ids(3, shard_bits);
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
  // Ids up to kInlineIdBytes live inside their entry, longer ones in a
  // buffer of their own (41-45 chars here: both sides of the line, and 300);
  // reused entries alternate between all of them, and every key must still
  // match its id.
  FinishedIds ids(64);
  auto id_of = [](int i) {
    return i % 3 == 0   ? absl::StrCat("s", i)
           : i % 7 == 0 ? absl::StrCat(std::string(300, 'y'), i)
                        : absl::StrCat(std::string(40, 'x'), i);
  };
  for (int i = 0; i < 10000; ++i) {
    const std::string id = id_of(i);
    ids.Remember(id);
    REQUIRE(ids.Contains(id));
    REQUIRE(ids.size() <= 64);
  }
  for (int i = 10000 - 64; i < 10000; ++i) CHECK(ids.Contains(id_of(i)));
  std::vector<std::string> kept;
  ids.ForEach([&](std::string_view id) { kept.emplace_back(id); });
  REQUIRE(kept.size() == 64);
  for (int i = 0; i < 64; ++i) CHECK(kept[i] == id_of(10000 - 64 + i));
  CHECK_FALSE(ids.Contains(absl::StrCat(std::string(40, 'x'), 10000 - 65)));
  CHECK_FALSE(ids.Contains(""));
}

TEST_CASE("FinishedIds at the daemon's capacity: every id until forgotten, "
          "spread over its shards", "[finished_ids]") {
  // Python hosts' ids: 32 hex chars. The session manager remembers 65,536.
  constexpr size_t kCapacity = 65536;
  FinishedIds ids(kCapacity);
  auto id_of = [](size_t i) {
    return absl::StrCat(absl::Hex(i * 0x9E3779B97F4A7C15ULL, absl::kZeroPad16),
                        absl::Hex(i, absl::kZeroPad16));
  };
  const size_t total = kCapacity + kCapacity / 2;
  for (size_t i = 0; i < total; ++i) ids.Remember(id_of(i));
  CHECK(ids.size() == kCapacity);
  for (size_t i = 0; i < total; ++i) {
    INFO("id " << i);
    REQUIRE(ids.Contains(id_of(i)) == (i >= total - kCapacity));
  }
  // A set grows by moving all it holds (under the session lock): no shard
  // may hold much more than its share.
  CHECK(ids.largest_shard() < 2 * kCapacity / FinishedIds::kShards);
  // Forgetting keeps the shards' views valid: the oldest ids go in order.
  ids.Remember("one more");
  CHECK_FALSE(ids.Contains(id_of(total - kCapacity)));
  CHECK(ids.Contains(id_of(total - kCapacity + 1)));
  CHECK(ids.Contains("one more"));
}

TEST_CASE("FinishedIds' ring: made up to its capacity, then reused; oldest "
          "first across the wrap", "[finished_ids]") {
  // A capacity past one block and not a multiple of it: the last block is
  // short, and the ring wraps inside it.
  constexpr size_t kCapacity = FinishedIds::kFirstBlockEntries + 7;
  FinishedIds ids(kCapacity);
  CHECK(ids.blocks() == 0);
  ids.Remember("0");
  CHECK(ids.blocks() == 1);
  for (size_t i = 1; i < kCapacity; ++i) ids.Remember(absl::StrCat(i));
  CHECK(ids.blocks() == 2);
  const size_t total = 3 * kCapacity + 5;
  for (size_t i = kCapacity; i < total; ++i) ids.Remember(absl::StrCat(i));
  CHECK(ids.blocks() == 2);  // no entry made once full
  CHECK(ids.size() == kCapacity);
  std::vector<std::string> order;
  ids.ForEach([&](std::string_view id) { order.emplace_back(id); });
  REQUIRE(order.size() == kCapacity);
  for (size_t i = 0; i < kCapacity; ++i) {
    INFO("position " << i);
    REQUIRE(order[i] == absl::StrCat(total - kCapacity + i));
  }
  CHECK_FALSE(ids.Contains(absl::StrCat(total - kCapacity - 1)));
  CHECK(ids.Contains(absl::StrCat(total - kCapacity)));
}

TEST_CASE("FinishedIds' ring: blocks double up to the largest, then stay; every "
          "id is found in them, and forgotten oldest first", "[finished_ids]") {
  // Past the doubling blocks (256, 256, 512, 1,024, 2,048) into two full
  // 4,096-entry ones and a short last one.
  constexpr size_t kLargest = FinishedIds::kLargestBlockEntries;
  constexpr size_t kCapacity = 3 * kLargest + 100;
  FinishedIds ids(kCapacity);
  // Blocks made once the ids up to each count are remembered.
  const std::vector<std::pair<size_t, size_t>> expected = {
      {1, 1},    {256, 1},  {257, 2},  {512, 2},  {513, 3},  {1024, 3},
      {1025, 4}, {2048, 4}, {2049, 5}, {4096, 5}, {4097, 6}, {8192, 6},
      {8193, 7}, {3 * kLargest, 7}, {3 * kLargest + 1, 8}, {kCapacity, 8}};
  size_t made = 0;
  for (const auto& [count, blocks] : expected) {
    for (; made < count; ++made) ids.Remember(absl::StrCat("id-", made));
    INFO("after " << count << " ids");
    CHECK(ids.blocks() == blocks);
  }
  for (size_t i = 0; i < kCapacity; ++i) {
    INFO("id " << i);
    REQUIRE(ids.Contains(absl::StrCat("id-", i)));
  }
  // Wrapping: the oldest go first, through every block.
  const size_t total = kCapacity + 5000;
  for (size_t i = kCapacity; i < total; ++i) ids.Remember(absl::StrCat("id-", i));
  CHECK(ids.blocks() == 8);
  CHECK(ids.size() == kCapacity);
  for (size_t i = 0; i < total; ++i) {
    INFO("id " << i);
    REQUIRE(ids.Contains(absl::StrCat("id-", i)) == (i >= total - kCapacity));
  }
  std::vector<std::string> order;
  ids.ForEach([&](std::string_view id) { order.emplace_back(id); });
  REQUIRE(order.size() == kCapacity);
  CHECK(order.front() == absl::StrCat("id-", total - kCapacity));
  CHECK(order.back() == absl::StrCat("id-", total - 1));
}

TEST_CASE("FinishedIds' default ring of 65,536 ids is 20 blocks", "[finished_ids]") {
  FinishedIds ids(65536);
  for (size_t i = 0; i < 65536; ++i) ids.Remember(absl::StrCat(i));
  CHECK(ids.blocks() == 20);
  CHECK(ids.Contains("0"));
  CHECK(ids.Contains("65535"));
}

TEST_CASE("FinishedIds of capacity 0 remembers nothing", "[finished_ids]") {
  FinishedIds ids(0);
  ids.Remember("a");
  CHECK_FALSE(ids.Contains("a"));
  CHECK(ids.size() == 0);
  CHECK(ids.blocks() == 0);
}

}  // namespace
}  // namespace agentix::sandbox
