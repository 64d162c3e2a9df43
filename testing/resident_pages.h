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

// The pages [begin, begin + n) touches, whatever its alignment.
inline size_t PagesTouched(const void* begin, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t from = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  const uintptr_t to = (reinterpret_cast<uintptr_t>(begin) + n + page - 1) & ~(page - 1);
  return static_cast<size_t>((to - from) / page);
}

// Of those pages, the ones in memory now.
inline size_t ResidentPages(const void* begin, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t from = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  std::vector<unsigned char> in_core(PagesTouched(begin, n));
  if (in_core.empty()) return 0;
  REQUIRE(mincore(reinterpret_cast<void*>(from), in_core.size() * page, in_core.data()) == 0);
  size_t resident = 0;
  for (unsigned char c : in_core) resident += c & 1;
  return resident;
}

}  // namespace agentix::testing
