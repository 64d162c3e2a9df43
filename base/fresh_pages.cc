#include "base/fresh_pages.h"

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>

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

}  // namespace

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

PrefaultResult PrefaultForWrite(void* data, size_t n) {
  PrefaultResult result;
  if (n < kPrefaultMinBytes || populate_unsupported.load(std::memory_order_relaxed)) return result;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  const uintptr_t last = (begin + n) & ~(uintptr_t{kHugePageBytes} - 1);
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
    // A step whose first page is there already is reused memory (a heap
    // buffer malloc kept): nothing to fault in, and huge-page advice there
    // would outlive the value (khugepaged may collapse the range later).
    unsigned char resident = 0;
    if (mincore(step, 1, &resident) != 0 || (resident & 1) != 0) continue;
    // Refused (a kernel without THP): the step is filled in small pages,
    // and measured as such.
    if (choice.huge && madvise(step, size, MADV_HUGEPAGE) != 0) choice.huge = false;
    const uint64_t start = MonotonicNanos();
    if (madvise(step, size, MADV_POPULATE_WRITE) != 0) {
      if (errno == EINVAL) populate_unsupported.store(true, std::memory_order_relaxed);
      break;  // the writes fault the rest in
    }
    const uint64_t took = MonotonicNanos() - start;
    {
      std::lock_guard<std::mutex> lock(process.mu);
      process.chooser.Record(choice, took, size);
    }
    (choice.huge ? result.huge_bytes : result.small_bytes) += size;
  }
  return result;
}

}  // namespace agentix::base
