#include "base/populated_pool.h"

#include <algorithm>
#include <cstdlib>

#include "base/fresh_pages.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define AGX_POOL_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define AGX_POOL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define AGX_POOL_POISON(p, n) ((void)(p), (void)(n))
#define AGX_POOL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace agentix::base {
namespace {

constexpr size_t kMinBlock = 16;  // holds a FreeBlock; keeps blocks 16-aligned

}  // namespace

PopulatedPool::PopulatedPool() {
  // Room for the usual number of each, so that they seldom grow later.
  chunks_.reserve(16);
  free_.reserve(32);
}

PopulatedPool::~PopulatedPool() {
  for (const auto& [chunk, size] : chunks_) {
    AGX_POOL_UNPOISON(chunk, size);
    std::free(chunk);
  }
}

size_t PopulatedPool::Rounded(size_t bytes) {
  return (bytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

char* PopulatedPool::NewChunk(size_t bytes) {
  // From malloc, so that what the blocks point to stays visible to leak
  // checkers, aligned to kMaxAlign only: a page alignment would leave up to
  // a page of slack, and malloc's header in it, beside every chunk.
  const size_t size = (bytes + kMaxAlign - 1) / kMaxAlign * kMaxAlign;
  auto* chunk = static_cast<char*>(std::aligned_alloc(kMaxAlign, size));
  if (chunk == nullptr) return nullptr;
  // Every page the chunk touches, in one system call (the edge pages are
  // shared with malloc's neighbours, mapped as well). On a kernel without it
  // the blocks' first writes fault the pages in as before.
  PopulateCoveringForWrite(chunk, size);
  AGX_POOL_POISON(chunk, size);
  chunks_.emplace_back(chunk, size);
  chunk_bytes_ += size;
  return chunk;
}

PopulatedPool::FreeBlock*& PopulatedPool::FreeListOf(size_t bytes) {
  for (auto& [size, head] : free_) {
    if (size == bytes) return head;
  }
  free_.emplace_back(bytes, nullptr);
  return free_.back().second;
}

void* PopulatedPool::Allocate(size_t bytes, size_t align) {
  if (bytes == 0 || align == 0 || align > kMaxAlign || (align & (align - 1)) != 0) {
    return nullptr;
  }
  const size_t size = Rounded(bytes);
  FreeBlock*& head = FreeListOf(size);
  if (head != nullptr && reinterpret_cast<uintptr_t>(head) % align == 0) {
    FreeBlock* block = head;
    AGX_POOL_UNPOISON(block, size);
    head = block->next;
    return block;
  }
  // A block of a quarter chunk or more gets a chunk of its own, so the
  // current one's rest is not thrown away for it.
  if (size >= kChunkBytes / 4) {
    char* chunk = NewChunk(size);
    if (chunk != nullptr) AGX_POOL_UNPOISON(chunk, size);
    return chunk;
  }
  auto at = (reinterpret_cast<uintptr_t>(next_) + align - 1) & ~(uintptr_t{align} - 1);
  if (next_ == nullptr || at + size > reinterpret_cast<uintptr_t>(end_)) {
    const size_t chunk_bytes = next_chunk_bytes_;
    char* chunk = NewChunk(chunk_bytes);
    if (chunk == nullptr) return nullptr;
    next_chunk_bytes_ = std::min(2 * chunk_bytes, kChunkBytes);
    next_ = chunk;
    end_ = chunk + chunk_bytes;
    at = reinterpret_cast<uintptr_t>(chunk);  // kMaxAlign-aligned
  }
  auto* block = reinterpret_cast<char*>(at);
  next_ = block + size;
  AGX_POOL_UNPOISON(block, size);
  return block;
}

void PopulatedPool::Deallocate(void* block, size_t bytes) {
  if (block == nullptr || bytes == 0) return;
  const size_t size = Rounded(bytes);
  FreeBlock*& head = FreeListOf(size);
  auto* freed = static_cast<FreeBlock*>(block);
  freed->next = head;
  head = freed;
  // The link stays readable for the next Allocate, which unpoisons it.
  AGX_POOL_POISON(static_cast<char*>(block) + sizeof(FreeBlock), size - sizeof(FreeBlock));
}

}  // namespace agentix::base
