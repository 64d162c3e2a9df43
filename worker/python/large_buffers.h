// Keeps the interpreter's large buffers' pages faulted in across calls.
//
// A large argument's bytes are allocated by whichever thread reads its frame,
// and each thread allocates from its own glibc arena. A thread arena that
// grew a new heap for a 16 MiB buffer deletes that heap whole when the buffer
// is freed (glibc does so whatever the trim threshold), so the next large
// payload there touches ~4,000 fresh pages again (~11 µs each on these VMs).
// The pool serves CPython's raw allocations from `threshold_bytes` up to
// `slot_bytes` from a few fixed slots of one reserved mapping instead: a freed
// slot keeps its pages (up to `keep_idle_bytes` over all idle slots), whichever
// thread frees it. Smaller and larger allocations go to malloc as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace agentix::worker {

// A 64 MiB value's allocation: its bytes, the object's header and a
// pickle's or msgpack's few bytes around them (an upload's buffer) fit in
// this; with 64 MiB exactly they went to malloc, past its mmap threshold, and
// each 64 MiB argument faulted in 16,384 fresh pages.
inline constexpr size_t kLargeBufferSlotBytes = (size_t{64} << 20) + (64 << 10);

struct LargeBufferOptions {
  size_t threshold_bytes = size_t{1} << 20;      // smaller: malloc
  size_t slot_bytes = kLargeBufferSlotBytes;     // larger: malloc
  size_t slots = 4;                              // all in use: malloc
  // Idle slots keep at most this many faulted-in bytes (one 64 MiB value's
  // slot); a freed slot beyond it gives its pages back (MADV_DONTNEED), the
  // longest-idle first.
  size_t keep_idle_bytes = kLargeBufferSlotBytes;
};

class LargeBufferPool {
 public:
  // Reserves slots * slot_bytes of address space (no memory until touched).
  static absl::StatusOr<LargeBufferPool*> Create(const LargeBufferOptions& options);
  ~LargeBufferPool();
  LargeBufferPool(const LargeBufferPool&) = delete;
  LargeBufferPool& operator=(const LargeBufferPool&) = delete;

  // A slot for `size` bytes, or nullptr when the size is outside
  // [threshold, slot_bytes] or every slot is in use. `zeroed`: as calloc.
  void* Allocate(size_t size, bool zeroed);
  // Whether `ptr` points into the pool's mapping (one comparison).
  bool Owns(const void* ptr) const {
    return reinterpret_cast<uintptr_t>(ptr) - begin_ < end_ - begin_;
  }
  // Gives back the slot that Allocate returned as `ptr`.
  void Free(void* ptr);
  // For a slot's `ptr`: `ptr` itself when `size` still belongs in the pool
  // (the slot is kept), else nullptr (the caller moves the bytes out).
  void* ResizeInPlace(void* ptr, size_t size);
  // The bytes last asked for in the slot of `ptr`.
  size_t SizeOf(const void* ptr);

  struct State {
    size_t in_use = 0;        // slots handed out
    size_t idle_faulted = 0;  // bytes idle slots keep faulted in
    size_t allocations = 0;   // served by the pool so far
    size_t released = 0;      // slots whose pages were given back
  };
  State state();
  const LargeBufferOptions& options() const { return options_; }

  // Locked around fork() so a child never inherits a held lock.
  void LockForFork() { mu_.lock(); }
  void UnlockAfterFork() { mu_.unlock(); }

 private:
  struct Slot {
    size_t size = 0;     // bytes asked for; 0: idle
    size_t faulted = 0;  // page-rounded bytes possibly faulted in
    uint64_t freed_at = 0;  // idle order
    bool in_use = false;
  };
  LargeBufferPool(const LargeBufferOptions& options, uintptr_t begin);
  size_t IndexOf(const void* ptr) const {
    return (reinterpret_cast<uintptr_t>(ptr) - begin_) / options_.slot_bytes;
  }
  void TrimIdleLocked();

  const LargeBufferOptions options_;
  const uintptr_t begin_;
  const uintptr_t end_;
  std::mutex mu_;
  std::vector<Slot> slots_;
  uint64_t frees_ = 0;
  State state_;
};

// Creates the pool and routes CPython's raw allocator (PyMem_RawMalloc and
// the object allocator's large blocks) through it. Call once, before the
// interpreter starts. An error leaves CPython's allocator as it was.
absl::Status InstallLargeBufferPool(const LargeBufferOptions& options);
// The installed pool, or nullptr.
LargeBufferPool* InstalledLargeBufferPool();

}  // namespace agentix::worker
