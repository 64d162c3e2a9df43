#include "base/populated_pool.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "testing/resident_pages.h"

namespace agentix::base {
namespace {

using agentix::testing::PagesTouched;
using agentix::testing::ResidentPages;

TEST_CASE("PopulatedPool: a chunk's pages are in memory before any block of it is written",
          "[populated_pool]") {
  PopulatedPool pool;
  // A block of its own chunk, larger than malloc's default mmap threshold:
  // fresh pages, none of which this test writes.
  constexpr size_t kBig = size_t{1} << 20;
  void* big = pool.Allocate(kBig, 64);
  REQUIRE(big != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(big) % 64 == 0);
  CHECK(ResidentPages(big, kBig) == PagesTouched(big, kBig));
  // A small block starts a shared chunk, all its pages in memory as well.
  void* small = pool.Allocate(24, 8);
  REQUIRE(small != nullptr);
  CHECK(ResidentPages(small, PopulatedPool::kFirstChunkBytes) ==
        PagesTouched(small, PopulatedPool::kFirstChunkBytes));
  CHECK(pool.chunks() == 2);
  CHECK(pool.chunk_bytes() == kBig + PopulatedPool::kFirstChunkBytes);
}

TEST_CASE("PopulatedPool: small blocks share a chunk, aligned, and do not overlap",
          "[populated_pool]") {
  PopulatedPool pool;
  std::vector<std::pair<char*, size_t>> blocks;
  size_t bytes = 0;
  for (size_t i = 0; bytes < PopulatedPool::kFirstChunkBytes / 2; ++i) {
    const size_t size = 1 + (i * 37) % 700;
    const size_t align = size_t{1} << (i % 7);  // 1 .. 64
    auto* block = static_cast<char*>(pool.Allocate(size, align));
    REQUIRE(block != nullptr);
    REQUIRE(reinterpret_cast<uintptr_t>(block) % align == 0);
    std::memset(block, static_cast<int>(i), size);
    blocks.emplace_back(block, size);
    bytes += size;
  }
  CHECK(pool.chunks() == 1);
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) {
    REQUIRE(blocks[i - 1].first + blocks[i - 1].second <= blocks[i].first);
  }
  // Past the chunk's end: a second one, twice its size, and so on up to
  // kChunkBytes.
  while (pool.chunks() < 2) REQUIRE(pool.Allocate(1024, 8) != nullptr);
  CHECK(pool.chunk_bytes() == 3 * PopulatedPool::kFirstChunkBytes);
  while (pool.chunks() < 5) REQUIRE(pool.Allocate(1024, 8) != nullptr);
  CHECK(pool.chunk_bytes() == 3 * PopulatedPool::kFirstChunkBytes + 3 * PopulatedPool::kChunkBytes);
}

TEST_CASE("PopulatedPool: a freed block is handed out again for its size only",
          "[populated_pool]") {
  PopulatedPool pool;
  void* a = pool.Allocate(100, 8);
  void* b = pool.Allocate(200, 8);
  pool.Deallocate(a, 100);
  void* c = pool.Allocate(200, 8);  // another size: not a's block
  CHECK(c != a);
  CHECK(c != b);
  void* d = pool.Allocate(100, 8);
  CHECK(d == a);
  // Last freed, first reused; then the chunk again.
  pool.Deallocate(b, 200);
  pool.Deallocate(c, 200);
  CHECK(pool.Allocate(200, 8) == c);
  CHECK(pool.Allocate(200, 8) == b);
  void* e = pool.Allocate(200, 8);
  CHECK(e != b);
  CHECK(e != c);
  CHECK(pool.chunks() == 1);
}

TEST_CASE("PopulatedPool refuses what it cannot give", "[populated_pool]") {
  PopulatedPool pool;
  CHECK(pool.Allocate(0, 8) == nullptr);
  CHECK(pool.Allocate(8, 128) == nullptr);  // past kMaxAlign
  CHECK(pool.Allocate(8, 12) == nullptr);   // not a power of two
  CHECK(pool.Allocate(8, 0) == nullptr);
  CHECK(pool.chunks() == 0);
  pool.Deallocate(nullptr, 8);  // nothing happens
}

TEST_CASE("PopulatedPoolAllocator backs absl hash sets; a table outgrown is reused",
          "[populated_pool]") {
  PopulatedPool pool;
  using Set = absl::flat_hash_set<uint32_t, absl::Hash<uint32_t>, std::equal_to<uint32_t>,
                                  PopulatedPoolAllocator<uint32_t>>;
  const PopulatedPoolAllocator<uint32_t> allocator(&pool);
  Set first(0, absl::Hash<uint32_t>{}, std::equal_to<uint32_t>{}, allocator);
  for (uint32_t v = 0; v < 50000; ++v) first.insert(v);
  for (uint32_t v = 0; v < 50000; v += 2) first.erase(v);
  for (uint32_t v = 0; v < 50000; ++v) {
    INFO("value " << v);
    REQUIRE(first.contains(v) == (v % 2 == 1));
  }
  // A second set growing through the sizes the first outgrew takes the
  // first's old tables: no new chunk.
  const size_t bytes = pool.chunk_bytes();
  Set second(0, absl::Hash<uint32_t>{}, std::equal_to<uint32_t>{}, allocator);
  for (uint32_t v = 0; v < 20000; ++v) second.insert(v * 7);
  CHECK(second.size() == 20000);
  CHECK(second.contains(7 * 19999));
  CHECK_FALSE(second.contains(1));
  CHECK(pool.chunk_bytes() == bytes);
}

}  // namespace
}  // namespace agentix::base
