// FinishedIds takes no memory from the heap for an id of a usual length: its
// ring and its sets' tables come from its pool (base/populated_pool.h), whose
// chunks are faulted in whole, so a client's first 65,536 calls do not each
// risk a fresh page of malloc's (issue 25's tail, stop 49).
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "wire/finished_ids.h"

namespace {
// Heap allocations through operator new in this binary (the test reads it
// around the code it measures only).
size_t g_news = 0;
}  // namespace

// Every form, so that each block is freed by the same kind of call that
// made it (ASan checks; Catch2 uses the nothrow ones).
namespace {
void* Counted(size_t n) {
  ++g_news;
  return std::malloc(n == 0 ? 1 : n);
}
void* CountedAligned(size_t n, std::align_val_t align) {
  ++g_news;
  const auto a = static_cast<size_t>(align);
  return std::aligned_alloc(a, (n + a - 1) / a * a);
}
}  // namespace

void* operator new(size_t n) {
  if (void* p = Counted(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  if (void* p = Counted(n)) return p;
  throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept { return Counted(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return Counted(n); }
void* operator new(size_t n, std::align_val_t align) {
  if (void* p = CountedAligned(n, align)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t align) {
  if (void* p = CountedAligned(n, align)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace agentix::sandbox {
namespace {

// Python hosts' ids: 32 hex chars.
std::string IdOf(size_t i) {
  return absl::StrCat(absl::Hex(i * 0x9E3779B97F4A7C15ULL, absl::kZeroPad16),
                      absl::Hex(i, absl::kZeroPad16));
}

TEST_CASE("FinishedIds remembers 32-char ids, and forgets them, with no heap allocation "
          "an id", "[finished_ids]") {
  constexpr size_t kCapacity = 3 * FinishedIds::kFirstBlockEntries + 100;
  std::vector<std::string> ids;
  for (size_t i = 0; i < 2 * kCapacity; ++i) ids.push_back(IdOf(i));
  FinishedIds finished(kCapacity);

  size_t before = g_news;
  for (size_t i = 0; i < kCapacity; ++i) finished.Remember(ids[i]);  // fills
  const size_t filling = g_news - before;
  before = g_news;
  for (size_t i = kCapacity; i < ids.size(); ++i) finished.Remember(ids[i]);  // reuses
  const size_t reusing = g_news - before;

  // Filling: only the lists of blocks and chunks grow (a few times in all;
  // one allocation an id before stop 49, and the blocks and tables too).
  CHECK(filling <= 16);
  CHECK(reusing == 0);
  CHECK(finished.size() == kCapacity);
  CHECK(finished.Contains(ids.back()));
  CHECK_FALSE(finished.Contains(ids[kCapacity - 1]));
  CHECK(finished.pool().chunks() > 0);
}

TEST_CASE("FinishedIds: an id past kInlineIdBytes takes one buffer", "[finished_ids]") {
  FinishedIds finished(16);
  finished.Remember("warm");  // the first block and table
  const std::string inline_id(FinishedIds::kInlineIdBytes, 'a');
  const std::string long_id(FinishedIds::kInlineIdBytes + 1, 'b');
  const size_t before = g_news;
  finished.Remember(inline_id);
  const size_t after_inline = g_news;
  finished.Remember(long_id);
  const size_t after_long = g_news;
  CHECK(after_inline - before == 0);
  CHECK(after_long - after_inline == 1);
  CHECK(finished.Contains(inline_id));
  CHECK(finished.Contains(long_id));
}

}  // namespace
}  // namespace agentix::sandbox
