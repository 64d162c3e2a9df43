// Faulting in a large fresh buffer ahead of the write that fills it (issue
// 25, the 64 MiB echo).
//
// A 64 MiB value decoded into a fresh mapping faults in 16,384 zeroed 4 KiB
// pages as it is copied: on these VMs ~30 of the host's ~37 ms decode. The
// kernel can fill the range at once instead (MADV_POPULATE_WRITE), in 4 KiB
// pages or, advised MADV_HUGEPAGE first, in 2 MiB ones: ~7 ms for 64 MiB
// instead of ~35 on warm memory. But on a VM whose free memory the
// hypervisor takes back (virtio-balloon free page reporting, which reports
// free 2 MiB blocks: this machine), a huge page from a reported block costs
// ~4x the 4 KiB pages of the same bytes (~140 ms for 64 MiB), and which
// blocks the kernel hands out changes from one moment to the next
// (docs/PERFORMANCE.md, "stop-44: a large result's pages"). So the range is
// filled in steps, each as huge pages or as small ones by whichever has
// been faster per byte in this process lately, trying the other now and
// then. A step's cost includes the read of each page after the fill
// (PopulateForWrite): on this VM small pages fill at ~0.2 ms a MiB and then
// cost ~1.5 ms a MiB more at their first access, which the chooser did not
// see until stop 56 — it took small pages for every step of a 64 MiB value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace agentix::base {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Buffers smaller than this are left to the writes' own faults.
inline constexpr size_t kPrefaultMinBytes = size_t{4} << 20;

// The range filled by one step of PrefaultForWrite (an exploring step:
// kHugePageBytes).
inline constexpr size_t kPrefaultStepBytes = size_t{8} << 20;

// Ranges this large are filled in two halves at once, one on a thread of
// their own.
inline constexpr size_t kPrefaultSplitBytes = size_t{16} << 20;

// Chooses, step by step, huge pages or small ones from the cost per byte
// each has measured lately. Each is first measured on one huge page's worth
// of bytes; then steps take the cheaper, and now and then one huge page's
// worth is given to the other (costs change as the kernel's free blocks do):
// after kMinExploreSteps steps, twice as many each time the other is still
// the dearer (up to kMaxExploreSteps), kMinExploreSteps again when it was
// cheaper or the choice changed. Not thread-safe: the process-wide one is
// used under a lock.
class PageSizeChooser {
 public:
  static constexpr uint64_t kMinExploreSteps = 16;
  static constexpr uint64_t kMaxExploreSteps = 1024;

  struct Step {
    bool huge = true;
    bool explore = false;  // a measurement of the dearer size: one huge page's worth
  };
  Step Next();
  // What a step cost: `nanos` to fill `bytes`.
  void Record(const Step& step, uint64_t nanos, size_t bytes);

  // Recent cost per MiB in nanoseconds (0: not measured yet).
  uint64_t huge_ns_per_mib() const { return huge_ns_per_mib_; }
  uint64_t small_ns_per_mib() const { return small_ns_per_mib_; }
  uint64_t explore_every() const { return explore_every_; }

 private:
  uint64_t huge_ns_per_mib_ = 0;
  uint64_t small_ns_per_mib_ = 0;
  uint64_t explore_every_ = kMinExploreSteps;
  uint64_t since_explore_ = 0;
  bool huge_was_cheaper_ = true;
};

// Reads one byte of each page of [begin, begin + n) (page-aligned): on this
// VM the first access to a page, even one the kernel has filled, traps to
// the hypervisor (below); made here, that trip is off whoever touches the
// page next. Reads only: no byte changes, and other threads may be writing
// the range meanwhile.
void ReadEachPage(const void* begin, size_t n);

// Faults in the pages of [begin, begin + n) (page-aligned) for writing in
// one system call (MADV_POPULATE_WRITE), then reads one byte of each page.
// The read is for VMs like this one, where the guest's page tables being
// filled is not the end of it: the first access after the populate still
// traps to the hypervisor, ~6 µs a 4 KiB page (a 2 MiB page: one trip), as
// much as the populate saved; made here, that trip is off the writes and in
// the cost a caller measures (docs/PERFORMANCE.md, "stop-56"). On bare metal
// the reads are a TLB walk a page. False if the kernel did not populate: on
// one without MADV_POPULATE_WRITE (Linux < 5.14, EINVAL) this and every later
// call return false at once, nothing is read, and the writes fault the pages
// in as before.
bool PopulateForWrite(void* begin, size_t n);

// PopulateForWrite over the whole pages inside [data, data + n) (any
// alignment) of a buffer about to be written in full, unless the middle one
// is resident already: then the buffer is recycled memory (a heap block
// malloc handed out again) and is left as it is. True if it filled the pages.
// For buffers below kPrefaultMinBytes or outside a kept pool's reach (a
// fresh chunk buffer, a large frame's receive buffer); larger ones take
// PrefaultForWrite, which may use huge pages.
bool PopulateFreshForWrite(void* data, size_t n);

// The populate alone, for every page [begin, begin + n) touches, whatever
// its alignment (the pages at the edges must be mapped writable, as they are
// when the range lies inside one mapping; filling a page changes none of its
// bytes). n == 0: nothing. No read of the pages: for structures that grow
// on a call's path (base/populated_pool, the worker's ledger), where
// reading a chunk's 16 pages at once would put their hypervisor trips
// (~0.1 ms here) into the one call that makes it, a call past p99, instead
// of ~6 µs into each of the next calls that touch them (stop 56: a tail A/B
// with the reads had p99 1.08x); and for ranges whose pages are not all
// written soon (the worker's image data at boot).
bool PopulateCoveringForWrite(const void* begin, size_t n);

struct PrefaultResult {
  size_t huge_bytes = 0;   // filled after MADV_HUGEPAGE (huge pages where the kernel had them)
  size_t small_bytes = 0;  // filled in 4 KiB pages
};

// Faults in the whole 2 MiB pages inside [data, data + n) (the head and the
// tail are left to the writes), kPrefaultStepBytes at a time, each step in
// the page size the process-wide PageSizeChooser picks; a step whose last
// page is resident already (reused heap memory) is skipped. From
// kPrefaultSplitBytes on, the second half is filled on a thread started for
// it while the caller fills the first. Nothing when n <
// kPrefaultMinBytes, or on a kernel without MADV_POPULATE_WRITE (Linux <
// 5.14): the writes fault the pages in as before. For a buffer about to be
// written in full; its bytes are not changed (fresh pages read as zero).
PrefaultResult PrefaultForWrite(void* data, size_t n);

}  // namespace agentix::base
