// Memory for a structure that keeps growing on a call's path, faulted in a
// chunk at a time rather than a page at a time (issue 25's tail).
//
// On these VMs the first touch of a fresh 4 KiB page costs ~11 µs (a fault
// and a trip through the hypervisor), against ~1 µs a page when the kernel
// fills a range at once (MADV_POPULATE_WRITE, base/fresh_pages.h). A
// structure that grows by a few dozen bytes a call — the finished call ids
// a session remembers, 65,536 of them — then makes one call in ~40 pay a
// fault. Taking its memory from a pool whose chunks are filled whole when
// made moves that to one call in hundreds or more, paying ~10-20 µs.
//
// Blocks are handed out from the current chunk; a freed block is kept on a
// list of its exact size and handed out again for that size (a hash table
// that doubles frees tables of the sizes the next one to double asks for).
// Nothing goes back to malloc until the pool is destroyed. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

namespace agentix::base {

class PopulatedPool {
 public:
  // Bytes of a chunk (16 pages); the first is kFirstChunkBytes, and each
  // next one twice the last up to this, so a pool that holds a few blocks
  // holds little. A block of a quarter chunk or more is a chunk of its own.
  static constexpr size_t kChunkBytes = size_t{64} << 10;
  static constexpr size_t kFirstChunkBytes = size_t{16} << 10;
  // Every block starts at a multiple of this; larger alignments are not
  // supported (Allocate returns nullptr for them).
  static constexpr size_t kMaxAlign = 64;

  PopulatedPool();
  ~PopulatedPool();
  PopulatedPool(const PopulatedPool&) = delete;
  PopulatedPool& operator=(const PopulatedPool&) = delete;

  // `bytes` (> 0) aligned to `align` (a power of two ≤ kMaxAlign), or
  // nullptr when malloc has no memory for a new chunk or `align` is
  // unsupported.
  void* Allocate(size_t bytes, size_t align);
  // Returns a block of this pool, `bytes` as it was allocated with.
  void Deallocate(void* block, size_t bytes);

  // Chunks made so far, and their bytes (tests, benchmarks).
  size_t chunks() const { return chunks_.size(); }
  size_t chunk_bytes() const { return chunk_bytes_; }

 private:
  struct FreeBlock {
    FreeBlock* next;
  };
  static size_t Rounded(size_t bytes);  // up to a multiple of 16
  char* NewChunk(size_t bytes);
  FreeBlock*& FreeListOf(size_t bytes);

  std::vector<std::pair<char*, size_t>> chunks_;  // and their bytes
  size_t chunk_bytes_ = 0;
  size_t next_chunk_bytes_ = kFirstChunkBytes;
  char* next_ = nullptr;  // the current chunk's unused part: [next_, end_)
  char* end_ = nullptr;
  // Freed blocks by exact (rounded) size; a table doubles through a few
  // sizes only, so a short list searched in order.
  std::vector<std::pair<size_t, FreeBlock*>> free_;
};

// A standard allocator over a PopulatedPool (for absl's hash sets); the
// pool must outlive every container using it.
template <typename T>
class PopulatedPoolAllocator {
 public:
  using value_type = T;

  explicit PopulatedPoolAllocator(PopulatedPool* pool) : pool_(pool) {}
  template <typename U>
  PopulatedPoolAllocator(const PopulatedPoolAllocator<U>& other)  // NOLINT: rebinding
      : pool_(other.pool()) {}

  T* allocate(size_t n) {
    void* block = pool_->Allocate(n * sizeof(T), alignof(T));
    if (block == nullptr) throw std::bad_alloc();  // as std::allocator does
    return static_cast<T*>(block);
  }
  void deallocate(T* block, size_t n) { pool_->Deallocate(block, n * sizeof(T)); }

  PopulatedPool* pool() const { return pool_; }

  friend bool operator==(const PopulatedPoolAllocator& a, const PopulatedPoolAllocator& b) {
    return a.pool_ == b.pool_;
  }
  friend bool operator!=(const PopulatedPoolAllocator& a, const PopulatedPoolAllocator& b) {
    return a.pool_ != b.pool_;
  }

 private:
  PopulatedPool* pool_;
};

}  // namespace agentix::base
