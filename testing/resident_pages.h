// Tests: which pages of a range the kernel has mapped for this process
// (mincore), for checks that memory was faulted in ahead of its writes.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace agentix::testing {

struct PageSpan {
  uintptr_t first;  // address of the first page
  size_t pages;
  size_t page_bytes;
};

// The pages [begin, begin + n) touches, whatever its alignment.
inline PageSpan PagesOf(const void* begin, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t from = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  const uintptr_t to = (reinterpret_cast<uintptr_t>(begin) + n + page - 1) & ~(page - 1);
  return {from, static_cast<size_t>((to - from) / page), static_cast<size_t>(page)};
}

inline size_t PagesTouched(const void* begin, size_t n) { return PagesOf(begin, n).pages; }

// Of those pages, the ones in memory now.
inline size_t ResidentPages(const void* begin, size_t n) {
  const PageSpan span = PagesOf(begin, n);
  if (span.pages == 0) return 0;
  std::vector<unsigned char> in_core(span.pages);
  REQUIRE(mincore(reinterpret_cast<void*>(span.first), span.pages * span.page_bytes,
                  in_core.data()) == 0);
  size_t resident = 0;
  for (unsigned char c : in_core) resident += c & 1;
  return resident;
}

}  // namespace agentix::testing
