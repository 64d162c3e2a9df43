#include "base/fresh_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "testing/resident_pages.h"

namespace agentix::base {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

using Step = PageSizeChooser::Step;

// The explorations among the next `steps` choices, each recorded at the
// cost per MiB its size has in `huge_ns` / `small_ns`; the steps taken by
// huge pages in `huge_steps`.
int Explorations(PageSizeChooser& chooser, int steps, uint64_t huge_ns, uint64_t small_ns, int* huge_steps) {
  int explorations = 0;
  *huge_steps = 0;
  for (int i = 0; i < steps; ++i) {
    const Step step = chooser.Next();
    explorations += step.explore ? 1 : 0;
    *huge_steps += step.huge ? 1 : 0;
    chooser.Record(step, step.huge ? huge_ns : small_ns, kMiB);
  }
  return explorations;
}

TEST_CASE("PageSizeChooser measures both page sizes first, then takes the cheaper") {
  PageSizeChooser chooser;
  const Step first = chooser.Next();
  REQUIRE(first.huge);
  REQUIRE(first.explore);
  chooser.Record(first, 250000, 2 * kMiB);
  const Step second = chooser.Next();
  REQUIRE_FALSE(second.huge);
  REQUIRE(second.explore);
  chooser.Record(second, 1000000, 2 * kMiB);
  REQUIRE(chooser.huge_ns_per_mib() == 125000);
  REQUIRE(chooser.small_ns_per_mib() == 500000);
  const Step third = chooser.Next();
  REQUIRE(third.huge);
  REQUIRE_FALSE(third.explore);
}

TEST_CASE("PageSizeChooser tries the dearer size less often while it stays dearer, and follows a change") {
  PageSizeChooser chooser;
  int huge_steps = 0;
  // Huge pages cheaper all along: small ones tried after 16 steps, then 32,
  // 64, ... (15 + 1 + 31 + 1 + 63 + 1 + 127 + 1 = 240 steps: four tries).
  REQUIRE(Explorations(chooser, 2, 100000, 400000, &huge_steps) == 2);
  REQUIRE(Explorations(chooser, 240, 100000, 400000, &huge_steps) == 4);
  REQUIRE(huge_steps == 236);
  REQUIRE(chooser.explore_every() == 256);

  // Huge pages turn dear (the hypervisor's reported blocks): the first step
  // taken in them measures it (a quarter of the weight: 100 -> 825 µs a MiB)
  // and the choice flips to small pages; huge ones are tried again after 16
  // steps, then 32, 64, ... while they stay dear.
  Explorations(chooser, 5, 3000000, 400000, &huge_steps);
  REQUIRE(huge_steps == 1);
  REQUIRE(chooser.huge_ns_per_mib() == 825000);
  REQUIRE(Explorations(chooser, 100, 3000000, 400000, &huge_steps) == 2);  // steps 12 and 44
  REQUIRE(huge_steps == 2);
  REQUIRE(chooser.explore_every() == 64);

  // And back: one cheap try of huge pages resets the interval, a few flip it.
  for (int i = 0; i < 2000 && chooser.huge_ns_per_mib() > chooser.small_ns_per_mib(); ++i) {
    const Step step = chooser.Next();
    chooser.Record(step, step.huge ? 100000 : 400000, kMiB);
  }
  REQUIRE(chooser.huge_ns_per_mib() <= chooser.small_ns_per_mib());
  REQUIRE(chooser.Next().huge);
}

TEST_CASE("PageSizeChooser ignores an empty step") {
  PageSizeChooser chooser;
  chooser.Record(chooser.Next(), 5, 0);
  REQUIRE(chooser.huge_ns_per_mib() == 0);
}

using agentix::testing::ResidentPages;

TEST_CASE("PopulateForWrite faults in exactly the range it is given") {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* base = static_cast<char*>(mmap(nullptr, 8 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(base != MAP_FAILED);
  REQUIRE(PopulateForWrite(base + 2 * page, 3 * page));  // Linux >= 5.14
  REQUIRE(ResidentPages(base, 2 * page) == 0);
  REQUIRE(ResidentPages(base + 2 * page, 3 * page) == 3);
  REQUIRE(ResidentPages(base + 5 * page, 3 * page) == 0);
  munmap(base, 8 * page);
}

TEST_CASE("PopulateForWrite and the covering populate change no byte of pages already written") {
  // The worker populates its executable's data while the boot writes it,
  // and PopulateForWrite reads each page after the fill (stop 56): neither
  // may change what is there.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* base = static_cast<char*>(mmap(nullptr, 6 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(base != MAP_FAILED);
  for (size_t i = 0; i < 3 * page; ++i) base[i] = static_cast<char>(i * 7 + 1);
  REQUIRE(PopulateForWrite(base, 4 * page));
  REQUIRE(PopulateCoveringForWrite(base + page / 2, 4 * page));
  REQUIRE(ResidentPages(base, 6 * page) == 5);  // before the reads below map the last
  for (size_t i = 0; i < 3 * page; ++i) REQUIRE(base[i] == static_cast<char>(i * 7 + 1));
  for (size_t i = 3 * page; i < 5 * page; ++i) REQUIRE(base[i] == 0);
  munmap(base, 6 * page);
}

TEST_CASE("PopulateFreshForWrite fills the whole pages inside a fresh buffer, and leaves a recycled one alone") {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* base = static_cast<char*>(mmap(nullptr, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(base != MAP_FAILED);
  SECTION("fresh: the pages wholly inside, not the partial ones at its edges") {
    REQUIRE(PopulateFreshForWrite(base + 100, 6 * page));  // pages 1-5 whole; 0 and 6 partial
    REQUIRE(ResidentPages(base, page) == 0);
    REQUIRE(ResidentPages(base + page, 5 * page) == 5);
    REQUIRE(ResidentPages(base + 6 * page, 10 * page) == 0);
  }
  SECTION("recycled: its middle whole page is resident, so nothing is filled") {
    base[3 * page] = 1;
    REQUIRE_FALSE(PopulateFreshForWrite(base + 100, 6 * page));
    REQUIRE(ResidentPages(base + page, 5 * page) == 1);
    REQUIRE(base[3 * page] == 1);
  }
  SECTION("fresh with its ends written (an allocator's fill, a terminator): filled") {
    base[page] = 1;
    base[5 * page] = 2;
    REQUIRE(PopulateFreshForWrite(base + 100, 6 * page));
    REQUIRE(ResidentPages(base + page, 5 * page) == 5);
    REQUIRE(base[page] == 1);
    REQUIRE(base[5 * page] == 2);
  }
  SECTION("no whole page inside: nothing") {
    REQUIRE_FALSE(PopulateFreshForWrite(base + 100, page));
    REQUIRE(ResidentPages(base, 2 * page) == 0);
  }
  munmap(base, 16 * page);
}

TEST_CASE("PrefaultForWrite fills the whole huge pages inside a large buffer, and nothing of a small one") {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = 40 * kMiB;
  char* base = static_cast<char*>(mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(base != MAP_FAILED);
  const uintptr_t at = reinterpret_cast<uintptr_t>(base);
  char* aligned = reinterpret_cast<char*>((at + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1));

  SECTION("a buffer below kPrefaultMinBytes is left alone") {
    const PrefaultResult got = PrefaultForWrite(aligned, kPrefaultMinBytes - 1);
    REQUIRE(got.huge_bytes + got.small_bytes == 0);
    REQUIRE(ResidentPages(aligned, kPrefaultMinBytes) == 0);
  }
  SECTION("an unaligned 30 MiB: the 2 MiB pages inside it, in steps, the head and tail not") {
    char* data = aligned + 12345;  // the first whole page starts at aligned + 2 MiB
    const size_t n = 30 * kMiB;    // ... and the last one ends at aligned + 30 MiB
    const PrefaultResult got = PrefaultForWrite(data, n);
    REQUIRE(got.huge_bytes + got.small_bytes == 28 * kMiB);
    REQUIRE(ResidentPages(aligned + kHugePageBytes, 28 * kMiB) == 28 * kMiB / page);
    REQUIRE(ResidentPages(aligned, kHugePageBytes) == 0);
    REQUIRE(ResidentPages(aligned + 30 * kMiB, kHugePageBytes) == 0);
    // The pages read as zero, and take writes as before.
    for (size_t i = 0; i < n; i += page) REQUIRE(data[i] == 0);
    data[n - 1] = 7;
    REQUIRE(data[n - 1] == 7);
  }
  SECTION("a step whose last page is resident already is skipped (reused memory)") {
    char* data = aligned;
    for (size_t i = 0; i < kPrefaultStepBytes; i += page) data[i] = 1;  // a reused first 8 MiB
    const PrefaultResult got = PrefaultForWrite(data, 3 * kPrefaultStepBytes);
    // The first step (2 MiB when the chooser explores, else 8) is left as
    // it was; every other one is filled, the second half on its own thread.
    const size_t done = got.huge_bytes + got.small_bytes;
    REQUIRE(done >= 2 * kPrefaultStepBytes);
    REQUIRE(done <= 3 * kPrefaultStepBytes - kHugePageBytes);
    REQUIRE(ResidentPages(data, 3 * kPrefaultStepBytes) == 3 * kPrefaultStepBytes / page);
    for (size_t i = 0; i < kPrefaultStepBytes; i += page) REQUIRE(data[i] == 1);
  }
  SECTION("a fresh buffer whose first page alone was written (a header) is filled whole") {
    char* data = aligned;
    data[0] = 1;
    const PrefaultResult got = PrefaultForWrite(data, 3 * kPrefaultStepBytes);
    REQUIRE(got.huge_bytes + got.small_bytes == 3 * kPrefaultStepBytes);
    REQUIRE(ResidentPages(data, 3 * kPrefaultStepBytes) == 3 * kPrefaultStepBytes / page);
    REQUIRE(data[0] == 1);
  }
  SECTION("a buffer whose second half is in memory already has only its first half filled") {
    // (on this thread alone: a resident middle page means reused memory)
    char* data = aligned;
    const size_t n = 24 * kMiB;
    for (size_t i = n / 2; i < n; i += page) data[i] = 3;
    const PrefaultResult got = PrefaultForWrite(data, n);
    // Whole steps: the one that crosses the middle is filled or skipped
    // with its last page, which is resident.
    const size_t done = got.huge_bytes + got.small_bytes;
    REQUIRE(done + kPrefaultStepBytes >= n / 2);
    REQUIRE(done <= n / 2);
    REQUIRE(ResidentPages(data, done) == done / page);
    for (size_t i = n / 2; i < n; i += page) REQUIRE(data[i] == 3);
  }
  munmap(base, mapped);
}

}  // namespace
}  // namespace agentix::base
