#include "worker/python/large_buffers.h"

#include <Python.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace agentix::worker {
namespace {

size_t PageRound(size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) & ~(page - 1);
}

}  // namespace

absl::StatusOr<LargeBufferPool*> LargeBufferPool::Create(
    const LargeBufferOptions& options) {
  if (options.slots == 0 || options.slot_bytes == 0 ||
      options.threshold_bytes == 0 ||
      options.threshold_bytes > options.slot_bytes ||
      options.slot_bytes % static_cast<size_t>(sysconf(_SC_PAGESIZE)) != 0) {
    return absl::InvalidArgumentError(
        "large buffer pool: need slots >= 1 and page-sized slots of at least "
        "the threshold");
  }
  const size_t bytes = options.slots * options.slot_bytes;
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapped == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", bytes >> 20, " MiB for the large buffer pool"));
  }
  return new LargeBufferPool(options, reinterpret_cast<uintptr_t>(mapped));
}

LargeBufferPool::LargeBufferPool(const LargeBufferOptions& options,
                                 uintptr_t begin)
    : options_(options),
      begin_(begin),
      end_(begin + options.slots * options.slot_bytes),
      slots_(options.slots) {}

LargeBufferPool::~LargeBufferPool() {
  munmap(reinterpret_cast<void*>(begin_), end_ - begin_);
}

void* LargeBufferPool::Allocate(size_t size, bool zeroed) {
  if (size < options_.threshold_bytes || size > options_.slot_bytes) {
    return nullptr;
  }
  size_t dirty = 0;
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The idle slot with the most pages faulted in (the most recently freed
    // of those with enough): the fewest fresh pages to touch.
    Slot* best = nullptr;
    for (Slot& slot : slots_) {
      if (slot.in_use) continue;
      if (best == nullptr) {
        best = &slot;
        continue;
      }
      const bool fits = slot.faulted >= size;
      const bool best_fits = best->faulted >= size;
      if (fits != best_fits ? fits
                            : (fits ? slot.freed_at > best->freed_at
                                    : slot.faulted > best->faulted)) {
        best = &slot;
      }
    }
    if (best == nullptr) return nullptr;
    state_.idle_faulted -= best->faulted;
    dirty = best->faulted;
    best->in_use = true;
    best->size = size;
    best->faulted = std::max(best->faulted, PageRound(size));
    ++state_.in_use;
    ++state_.allocations;
    ptr = reinterpret_cast<void*>(
        begin_ + static_cast<size_t>(best - slots_.data()) * options_.slot_bytes);
  }
  // Pages never touched (or given back) read as zero already.
  if (zeroed) std::memset(ptr, 0, std::min(size, dirty));
  return ptr;
}

void LargeBufferPool::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[IndexOf(ptr)];
  if (!slot.in_use) return;  // cannot happen: freed twice
  slot.in_use = false;
  slot.size = 0;
  slot.freed_at = ++frees_;
  --state_.in_use;
  state_.idle_faulted += slot.faulted;
  TrimIdleLocked();
}

void LargeBufferPool::TrimIdleLocked() {
  while (state_.idle_faulted > options_.keep_idle_bytes) {
    Slot* oldest = nullptr;
    for (Slot& slot : slots_) {
      if (slot.in_use || slot.faulted == 0) continue;
      if (oldest == nullptr || slot.freed_at < oldest->freed_at) oldest = &slot;
    }
    if (oldest == nullptr) return;
    void* at = reinterpret_cast<void*>(
        begin_ +
        static_cast<size_t>(oldest - slots_.data()) * options_.slot_bytes);
    if (madvise(at, oldest->faulted, MADV_DONTNEED) != 0) return;
    state_.idle_faulted -= oldest->faulted;
    oldest->faulted = 0;
    ++state_.released;
  }
}

void* LargeBufferPool::ResizeInPlace(void* ptr, size_t size) {
  if (size < options_.threshold_bytes || size > options_.slot_bytes) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[IndexOf(ptr)];
  slot.size = size;
  slot.faulted = std::max(slot.faulted, PageRound(size));
  return ptr;
}

size_t LargeBufferPool::SizeOf(const void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[IndexOf(ptr)].size;
}

LargeBufferPool::State LargeBufferPool::state() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

namespace {

LargeBufferPool* g_pool = nullptr;  // set once, never freed
PyMemAllocatorEx g_fallback{};

void* RawMalloc(void* ctx, size_t size) {
  if (void* ptr = static_cast<LargeBufferPool*>(ctx)->Allocate(size, false)) {
    return ptr;
  }
  return g_fallback.malloc(g_fallback.ctx, size);
}

void* RawCalloc(void* ctx, size_t nelem, size_t elsize) {
  size_t size = 0;
  if (!__builtin_mul_overflow(nelem, elsize, &size)) {
    if (void* ptr = static_cast<LargeBufferPool*>(ctx)->Allocate(size, true)) {
      return ptr;
    }
  }
  return g_fallback.calloc(g_fallback.ctx, nelem, elsize);
}

void* RawRealloc(void* ctx, void* ptr, size_t size) {
  auto* pool = static_cast<LargeBufferPool*>(ctx);
  if (ptr == nullptr) return RawMalloc(ctx, size);
  // A malloc block stays there (glibc may grow it in place).
  if (!pool->Owns(ptr)) return g_fallback.realloc(g_fallback.ctx, ptr, size);
  if (void* same = pool->ResizeInPlace(ptr, size)) return same;
  // Out of the pool's range now: the bytes move to malloc.
  void* moved = g_fallback.malloc(g_fallback.ctx, size);
  if (moved == nullptr) return nullptr;  // ptr stays valid, as realloc's
  std::memcpy(moved, ptr, std::min(pool->SizeOf(ptr), size));
  pool->Free(ptr);
  return moved;
}

void RawFree(void* ctx, void* ptr) {
  auto* pool = static_cast<LargeBufferPool*>(ctx);
  if (pool->Owns(ptr)) {
    pool->Free(ptr);
    return;
  }
  g_fallback.free(g_fallback.ctx, ptr);
}

}  // namespace

absl::Status InstallLargeBufferPool(const LargeBufferOptions& options) {
  if (g_pool != nullptr) {
    return absl::FailedPreconditionError("InstallLargeBufferPool called twice");
  }
  absl::StatusOr<LargeBufferPool*> pool = LargeBufferPool::Create(options);
  if (!pool.ok()) return pool.status();
  g_pool = *pool;
  pthread_atfork([] { g_pool->LockForFork(); },
                 [] { g_pool->UnlockAfterFork(); },
                 [] { g_pool->UnlockAfterFork(); });
  PyMem_GetAllocator(PYMEM_DOMAIN_RAW, &g_fallback);
  PyMemAllocatorEx ours{g_pool, RawMalloc, RawCalloc, RawRealloc, RawFree};
  PyMem_SetAllocator(PYMEM_DOMAIN_RAW, &ours);
  return absl::OkStatus();
}

LargeBufferPool* InstalledLargeBufferPool() { return g_pool; }

}  // namespace agentix::worker
