#include "base/fresh_pages.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <system_error>
#include <thread>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels say EINVAL
#endif

namespace agentix::base {
namespace {

uint64_t MonotonicNanos() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
}

// A new measurement weighs a quarter: one odd step does not flip the choice.
uint64_t Blend(uint64_t old_value, uint64_t sample) {
  return old_value == 0 ? sample : (3 * old_value + sample) / 4;
}

struct ProcessChooser {
  std::mutex mu;
  PageSizeChooser chooser;
};

ProcessChooser& TheChooser() {
  static ProcessChooser* chooser = new ProcessChooser;  // never destroyed: used from any thread
  return *chooser;
}

std::atomic<bool> populate_unsupported{false};

// Whether the page at `at` is in memory (or cannot be told: then it is
// left alone).
bool Resident(void* at) {
  unsigned char resident = 0;
  return mincore(at, 1, &resident) != 0 || (resident & 1) != 0;
}

// MADV_POPULATE_WRITE alone (page-aligned range).
bool Populate(void* begin, size_t n) {
  if (populate_unsupported.load(std::memory_order_relaxed)) return false;
  if (madvise(begin, n, MADV_POPULATE_WRITE) == 0) return true;
  if (errno == EINVAL) populate_unsupported.store(true, std::memory_order_relaxed);
  return false;
}

}  // namespace

// Not instrumented: the range is whole pages of its caller's mapping, which
// other threads may be writing (the worker's prefault runs beside its boot)
// and ASan may have poisoned in part (a string's capacity); a read changes
// none of it.
__attribute__((no_sanitize("address", "thread"))) void ReadEachPage(const void* begin, size_t n) {
  static const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const auto* bytes = static_cast<const volatile char*>(begin);
  for (size_t at = 0; at < n; at += page) (void)bytes[at];
}

bool PopulateForWrite(void* begin, size_t n) {
  if (!Populate(begin, n)) return false;
  ReadEachPage(begin, n);
  return true;
}

bool PopulateFreshForWrite(void* data, size_t n) {
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t last = (reinterpret_cast<uintptr_t>(data) + n) & ~(page - 1);
  // The middle page is the witness: allocators and terminators write a
  // buffer's ends (ASan fills its first 4 KiB; a bytearray's NUL follows its
  // last byte), while recycled memory is resident throughout.
  if (last <= first || Resident(reinterpret_cast<void*>(first + (last - first) / page / 2 * page))) {
    return false;
  }
  return PopulateForWrite(reinterpret_cast<void*>(first), last - first);
}

bool PopulateCoveringForWrite(const void* begin, size_t n) {
  if (n == 0) return true;
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t from = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  const uintptr_t to = (reinterpret_cast<uintptr_t>(begin) + n + page - 1) & ~(page - 1);
  return Populate(reinterpret_cast<void*>(from), to - from);
}

PageSizeChooser::Step PageSizeChooser::Next() {
  if (huge_ns_per_mib_ == 0) return {true, true};
  if (small_ns_per_mib_ == 0) return {false, true};
  const bool huge_cheaper = huge_ns_per_mib_ <= small_ns_per_mib_;
  if (huge_cheaper != huge_was_cheaper_) {  // costs changed: look back soon
    huge_was_cheaper_ = huge_cheaper;
    explore_every_ = kMinExploreSteps;
    since_explore_ = 0;
  }
  if (++since_explore_ >= explore_every_) {
    since_explore_ = 0;
    return {!huge_cheaper, true};
  }
  return {huge_cheaper, false};
}

void PageSizeChooser::Record(const Step& step, uint64_t nanos, size_t bytes) {
  if (bytes == 0) return;
  const uint64_t per_mib = std::max<uint64_t>(1, nanos * (uint64_t{1} << 20) / bytes);
  uint64_t& rate = step.huge ? huge_ns_per_mib_ : small_ns_per_mib_;
  const uint64_t other = step.huge ? small_ns_per_mib_ : huge_ns_per_mib_;
  const bool both_measured = rate != 0 && other != 0;  // not a first measurement
  rate = Blend(rate, per_mib);
  if (step.explore && both_measured) {
    explore_every_ = per_mib < other ? kMinExploreSteps : std::min(2 * explore_every_, kMaxExploreSteps);
  }
}

namespace {

// Fills [first, last) (2 MiB-aligned) step by step; see PrefaultForWrite.
PrefaultResult PrefaultRange(uintptr_t first, uintptr_t last) {
  PrefaultResult result;
  ProcessChooser& process = TheChooser();
  for (uintptr_t at = first; at < last;) {
    PageSizeChooser::Step choice;
    {
      std::lock_guard<std::mutex> lock(process.mu);
      choice = process.chooser.Next();
    }
    const size_t size = std::min<uintptr_t>(choice.explore ? kHugePageBytes : kPrefaultStepBytes, last - at);
    void* const step = reinterpret_cast<void*>(at);
    at += size;
    // A step whose last page is there already is reused memory (a heap
    // buffer malloc kept): nothing to fault in, and huge-page advice there
    // would outlive the value (khugepaged may collapse the range later). Its
    // last page, not its first: a heap grows at the top, so a buffer that
    // is recycled below and fresh above is the common mix (docs/DECISIONS.md
    // "stop-59").
    static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    if (Resident(reinterpret_cast<void*>(at - page))) continue;
    // Refused (a kernel without THP): the step is filled in small pages,
    // and measured as such.
    if (choice.huge && madvise(step, size, MADV_HUGEPAGE) != 0) choice.huge = false;
    const uint64_t start = MonotonicNanos();
    if (!PopulateForWrite(step, size)) break;  // the writes fault the rest in
    const uint64_t took = MonotonicNanos() - start;
    {
      std::lock_guard<std::mutex> lock(process.mu);
      process.chooser.Record(choice, took, size);
    }
    (choice.huge ? result.huge_bytes : result.small_bytes) += size;
  }
  return result;
}

}  // namespace

PrefaultResult PrefaultForWrite(void* data, size_t n) {
  if (n < kPrefaultMinBytes || populate_unsupported.load(std::memory_order_relaxed)) return {};
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  const uintptr_t last = (begin + n) & ~(uintptr_t{kHugePageBytes} - 1);
  if (last - first < kPrefaultSplitBytes) return PrefaultRange(first, last);
  // Two halves side by side: the kernel's filling runs on both CPUs when the
  // other is idle (64 MiB in small pages: ~12 ms against ~21 here), and
  // costs a thread's start when it is not.
  const uintptr_t middle = first + ((last - first) / 2 & ~(uintptr_t{kHugePageBytes} - 1));
  // A second half that starts on a resident page is reused memory (a kept
  // buffer): its steps are skipped at a mincore each, not worth a thread.
  if (Resident(reinterpret_cast<void*>(middle))) return PrefaultRange(first, last);
  PrefaultResult second;
  std::thread helper;
  try {
    helper = std::thread([&second, middle, last] { second = PrefaultRange(middle, last); });
  } catch (const std::system_error&) {  // no thread to be had: one after the other
    second = PrefaultRange(middle, last);
  }
  PrefaultResult result = PrefaultRange(first, middle);
  if (helper.joinable()) helper.join();
  result.huge_bytes += second.huge_bytes;
  result.small_bytes += second.small_bytes;
  return result;
}

}  // namespace agentix::base
